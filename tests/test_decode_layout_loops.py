"""`layout_loops` in the decode kernels: the key loop for linear K/V rows, on the adapter.

With `layout_loops` a decode kernel's key loop comes twice: one copy addresses row kv_start +
key directly, and runs where kv_rows_linear() holds (contiguous rows, or a ring without a
window); the other goes through get_kv_pos for every layout (ring with a window, paged). The
validator's matrix has contiguous, ring and paged cases, so both copies run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MANY_SPLITS, REPO_ROOT, edit, render_variant, subgroup_device
from gpu_support import adapter_problem

from doppler_gen.backends import Device
from doppler_gen.families import get_family
from doppler_gen.runtime.verify import validate_variant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

LIB = "templates/lib/attention_decode.wgsl.j2"
LOOP = "for (var it: u32 = 0u; it < iterations;"
# shipped with layout_loops: one dispatch with prefetch and subgroups; the split pass with
# softcap_loops (four loops) over many splits; the workgroup-memory kernel
CONFIGS = [
    ("attention_decode_sg_d64_f16", None),
    ("attention_decode_split_d64_f16kv", MANY_SPLITS),
    ("attention_decode_wg_d64_f16kv", None),
]


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    yield from subgroup_device(name for name, _ in CONFIGS)


def _loops(text: str) -> list[str]:
    """The key loops of a kernel's text, each up to the next loop or the end."""
    starts = [m.start() for m in re.finditer(re.escape(LOOP), text)]
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def test_layout_loops_render_a_linear_copy_of_each_key_loop() -> None:
    text = render_variant(REPO_ROOT, "attention_decode_split_d64_f16kv")[0].passes[0].text
    assert "fn kv_rows_linear() -> bool" in text and "if (kv_rows_linear()) {" in text
    loops = _loops(text)
    assert len(loops) == 4  # (linear, any layout) x (capped, plain)
    linear = [loop for loop in loops if "get_kv_pos(" not in loop]
    assert len(linear) == 2
    assert all("(u.kv_start + min(key_0, keys.y - 1u))" in loop for loop in linear)
    plain = (
        render_variant(REPO_ROOT, "attention_decode_split_d64_f16kv", {"layout_loops": False})[0]
        .passes[0]
        .text
    )
    assert "kv_rows_linear" not in plain and len(_loops(plain)) == 2


def test_the_default_tier_runs_both_copies() -> None:
    """`validate` (the CI's main job) runs every shipped variant's default tier: its cases
    must reach both copies, contiguous rows and the ring and paged layouts."""
    for name, _ in CONFIGS:
        kernel, entry = render_variant(REPO_ROOT, name)
        assert entry["params"]["layout_loops"] is True
        family = get_family(kernel.variant.template.family)
        layouts = {spec.kv_layout for spec in family.specs(entry, "default", 0)}
        assert {"contiguous", "ring", "paged"} <= layouts, name


PLANTED = [
    # every layout taken for linear: ring and paged rows read as contiguous ones
    ("    return !(({{ ring_rows }}) || {{ paged_rows }});",
     "    return true;"),
    # the linear rows forget kv_start
    ("((u.kv_start + min({{ key }}, keys.y - 1u)) * u.num_kv_heads",
     "((min({{ key }}, keys.y - 1u)) * u.num_kv_heads"),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new"), PLANTED, ids=["all-linear", "linear-kv-start-dropped"])
def test_planted_layout_loop_bugs_fail(
    device: Device, project_copy: Path, old: str, new: str
) -> None:
    edit(project_copy / LIB, old, new)
    name, constants = CONFIGS[0]
    kernel, entry = render_variant(project_copy, name)
    report = validate_variant(
        device, kernel, entry, quick=False, seed=0, constants=constants, fail_fast=True
    )
    assert report.status == "FAIL", [(c.spec.name, c.verdict) for c in report.cases]
