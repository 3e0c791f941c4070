"""The decode kernels' masks as bounds, on the adapter.

Every decode kernel (one dispatch or split, subgroup or workgroup memory) computes the causal
and sliding-window masks once per query, as the kv_start-relative key range [x, y) that the
query attends (`key_range`), and its key loops walk only that range: no key is tested against
the masks. So `key_range` alone decides which keys count, and a bug in it must fail
validation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MANY_SPLITS, REPO_ROOT, edit, render_variant, subgroup_device
from gpu_support import adapter_problem

from doppler_gen.backends import Device
from doppler_gen.config import load_project
from doppler_gen.runtime.verify import validate_variant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

LIB = "templates/lib/attention_decode.wgsl.j2"
# one dispatch (subgroups) and the split pass over many splits, so a bound cuts inside a split
CONFIGS = [
    ("attention_decode_sg_d64_f16", None),
    ("attention_decode_split_d64_f16kv", MANY_SPLITS),
]


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    yield from subgroup_device(name for name, _ in CONFIGS)


def test_no_decode_key_is_tested_against_the_masks() -> None:
    names = [
        v.name
        for v in load_project(REPO_ROOT).variants
        if re.fullmatch(r"attention_decode_(sg|wg|split)_.*", v.name)
    ]
    assert len(names) >= 27, names
    for name in names:
        for compiled in render_variant(REPO_ROOT, name)[0].passes:
            text = compiled.text
            assert "is_masked" not in text, name
            valid = re.findall(r"let valid_\d+ = (.*);", text)
            if compiled.spec.name == "reduce":
                assert "key_range" not in text and not valid, name
                continue
            assert "fn key_range(query_pos: u32, kv_len: u32) -> vec2<u32>" in text, name
            assert valid and all(re.fullmatch(r"(\w+ && )?key_\d+ < keys\.y", v) for v in valid), (
                name,
                valid,
            )


PLANTED = [
    # the causal bound excludes the query's own key
    (
        "min(kv_len, abs_query - u.kv_start + 1u)",
        "min(kv_len, abs_query - u.kv_start)",
    ),
    # the causal bound forgets kv_start (keys after the query count when kv_start > 0)
    (
        "min(kv_len, abs_query - u.kv_start + 1u)",
        "min(kv_len, abs_query + 1u)",
    ),
    # the window starts one key late
    (
        "key_begin = min(first - u.kv_start, key_end);",
        "key_begin = min(first - u.kv_start + 1u, key_end);",
    ),
    # the window's first key is taken as kv_start-relative already
    (
        "key_begin = min(first - u.kv_start, key_end);",
        "key_begin = min(first, key_end);",
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "config"),
    [(old, new, CONFIGS[k % 2]) for k, (old, new) in enumerate(PLANTED)],
    ids=["own-key-masked", "causal-kv-start-ignored", "window-late", "window-kv-start-ignored"],
)
def test_planted_key_range_bugs_fail(
    device: Device, project_copy: Path, old: str, new: str, config: tuple[str, dict | None]
) -> None:
    """Each bug fails the default tier (its causal, window and kv_start cases), in the one
    dispatch kernel or the split pass (alternately: the two share key_range)."""
    name, constants = config
    edit(project_copy / LIB, old, new)
    kernel, entry = render_variant(project_copy, name)
    assert new in kernel.passes[0].text
    report = validate_variant(
        device, kernel, entry, quick=False, seed=0, constants=constants, fail_fast=True
    )
    assert report.status == "FAIL", [(c.spec.name, c.verdict) for c in report.cases]
