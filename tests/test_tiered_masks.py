"""The tiered key loop's masks as bounds, on the adapter.

Every tiered kernel computes the causal and sliding-window masks once, as the absolute
positions of the first and last key the query attends (`open_keys`), and tests each key with
two comparisons; a masked key still scores MASKED_SCORE and counts in the sum (the "mean_v"
contract).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO_ROOT, edit, render_variant
from gpu_support import adapter_problem

from doppler_gen.backends import Device, get_backend
from doppler_gen.families.attention import CaseSpec
from doppler_gen.families.tiered import tiered_specs
from doppler_gen.runtime.runner import KernelRunner
from doppler_gen.validate import open_run_device

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

MANY_SPLITS = {"KV_SPLITS": 8, "MIN_SPLIT_KEYS": 1}
# The default tier's cases that exercise masks and the softcap (the quick tier keeps only some)
MASK_CASES = (
    "sliding window",
    "window edge",
    "softcap",
    "non-causal",
    "causal masks future hot keys",
    "fully masked row",
)
# Thousands of keys in both tiers with the softcap on: the window's first key (45) lies in the
# cold tier's first step and the causal bound cuts the hot tier's last 5 keys
LONG_CAPPED = CaseSpec(
    "long, softcap, window in the cold tier, future hot keys",
    num_heads=8,
    num_kv_heads=2,
    cold_len=3000,
    hot_len=100,
    hot_start=3000,
    hot_window=128,
    start_pos=3094,
    sliding_window=3050,
    softcap=30.0,
    logit_gain=4.0,
    head_dim=64,
    seed=17,
)
CONFIGS = [
    # one dispatch, f16 rows as vec4<f16>
    ("attention_decode_tiered_f16_sg", None),
    # one dispatch, int4 words
    ("attention_decode_tiered_int4_f16kv_sg", None),
]
# split pass, four heads a workgroup, many splits (the int8 split kernel compiles twice as long
# on lavapipe and shares these step functions but the loads)
SPLIT = ("attention_decode_tiered_split_f16", MANY_SPLITS)


def _cases(cold: str, head_dim: int) -> list[CaseSpec]:
    specs = tiered_specs(head_dim, 131072, cold=cold, quick=False, seed=0)
    chosen = [s for s in specs if s.name in MASK_CASES]
    assert {s.name for s in chosen} == set(MASK_CASES)
    return [*chosen, LONG_CAPPED]


def _failures(device: Device, root: Path, name: str, params: dict, constants) -> list[str]:
    kernel, entry = render_variant(root, name, params)
    runner = KernelRunner(device, kernel, entry, constants)
    cases = _cases(entry["params"]["cold"], entry["params"]["max_head_dim"])
    return [c.name for c in cases if not runner.run_case(c).passed]


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    kernels = [render_variant(REPO_ROOT, name)[0] for name, _ in [*CONFIGS, SPLIT]]
    dev = open_run_device(get_backend("wgpu"), kernels, None, "adapter")
    if "subgroups" not in dev.features:
        dev.close()
        pytest.skip("the adapter offers no subgroups")
    yield dev
    dev.close()


def test_every_tiered_kernel_tests_keys_against_bounds_computed_once() -> None:
    for name in ("attention_decode_tiered_f16", "attention_decode_tiered_split_int8_f16kv"):
        text = render_variant(REPO_ROOT, name)[0].passes[0].text
        assert "is_masked" not in text
        assert "fn open_keys() -> vec2<u32>" in text
        assert "open_first = open.x;" in text and "open_last = open.y;" in text
        assert "let open0 = abs0 >= open_first && abs0 <= open_last;" in text
        assert "select(MASKED_SCORE, " in text


@pytest.mark.parametrize(("name", "constants"), CONFIGS)
def test_the_shipped_kernels_pass_the_mask_and_softcap_cases(
    device: Device, name: str, constants: dict | None
) -> None:
    assert _failures(device, REPO_ROOT, name, {}, constants) == []


def test_the_split_pass_passes_the_mask_and_softcap_cases(device: Device) -> None:
    """Its splits cut both tiers (8 splits of the long case's 3,100 keys), each walking its own
    key range."""
    assert _failures(device, REPO_ROOT, SPLIT[0], {}, SPLIT[1]) == []


PLANTED = [
    # the causal bound excludes the query's own key
    ("lib/tiered_decode.wgsl.j2", "abs{{ s }} <= open_last", "abs{{ s }} < open_last", None),
    # the window starts one key late (one key of thousands is within the long case's tolerance)
    (
        "lib/attention_common.wgsl.j2",
        "first = {{ abs_query }} - u.sliding_window + 1u;",
        "first = {{ abs_query }} - u.sliding_window + 2u;",
        {"sliding window", "window edge"},
    ),
]


@pytest.mark.parametrize(
    ("path", "old", "new", "must_fail"),
    PLANTED,
    ids=["own-key-masked", "window-late"],
)
def test_planted_mask_and_softcap_bugs_fail(
    device: Device, project_copy: Path, path: str, old: str, new: str, must_fail: set | None
) -> None:
    edit(project_copy / "templates" / path, old, new, count=4)
    failed = set(_failures(device, project_copy, "attention_decode_tiered_f16_sg", {}, None))
    if must_fail is None:  # the query's own key is in nearly every case
        assert len(failed) >= len(MASK_CASES) - 1, failed
    else:
        assert must_fail <= failed, failed
