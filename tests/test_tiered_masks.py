"""The tiered key loop's masks as bounds, and `softcap_loops` (the key loops twice, with and
without the softcap), on the adapter.

Every tiered kernel computes the causal and sliding-window masks once, as the absolute
positions of the first and last key the query attends (`open_keys`), and tests each key with
two comparisons; a masked key still scores MASKED_SCORE and counts in the sum (the "mean_v"
contract). With `softcap_loops` the step functions come in two copies, `*_capped` beside the
plain ones (sharing their prefetch registers), and u.attn_softcap picks the loops once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import MANY_SPLITS, REPO_ROOT, edit, render_variant, subgroup_device
from gpu_support import adapter_problem

from doppler_gen.backends import Device
from doppler_gen.families.attention import CaseSpec
from doppler_gen.families.tiered import tiered_specs
from doppler_gen.runtime.runner import KernelRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

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
    # one dispatch, f16 rows as vec4<f16>, shipped with softcap_loops
    ("attention_decode_tiered_f16_sg", None),
    # one dispatch, int4 words, shipped with softcap_loops
    ("attention_decode_tiered_int4_f16kv_sg", None),
]
# split pass, four heads a workgroup, many splits (shipped with softcap_loops; the int8 split
# kernel compiles twice as long on lavapipe and shares these step functions but the loads)
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
    yield from subgroup_device(name for name, _ in [*CONFIGS, SPLIT])


def test_every_tiered_kernel_tests_keys_against_bounds_computed_once() -> None:
    for name in ("attention_decode_tiered_f16", "attention_decode_tiered_split_int8_f16kv"):
        text = render_variant(REPO_ROOT, name)[0].passes[0].text
        assert "is_masked" not in text
        assert "fn open_keys() -> vec2<u32>" in text
        assert "open_first = open.x;" in text and "open_last = open.y;" in text
        assert "let open0 = abs0 >= open_first && abs0 <= open_last;" in text
        assert "select(MASKED_SCORE, " in text


def test_softcap_loops_render_capped_copies_that_share_the_plain_fetches() -> None:
    kernel, _ = render_variant(REPO_ROOT, "attention_decode_tiered_split_int8_f16kv")
    text = kernel.passes[0].text
    plain = re.search(r"\nfn finish_score\(.*?\n}\n", text, re.S)
    assert plain is not None and "attn_softcap" not in plain.group(0)
    assert "fn finish_score_capped(dot: f32, open: bool) -> f32" in text
    for step in ("cold_step", "hot_step", "hot_step_aligned"):
        body = re.search(rf"\nfn {step}_capped\(.*?\n}}\n", text, re.S)
        assert body is not None, step
        assert f"{step}_fetch(first + 2u * num_groups);" in body.group(0)
        assert "finish_score_capped(" in body.group(0)
        assert f"{step}_capped_fetch" not in text and f"var<private> {step}_capped_" not in text
    assert re.search(r"if \(u\.attn_softcap > 0\.0\) \{\n\s+if \(head_dim % DIMS_PER_LANE", text)
    single, _ = render_variant(
        REPO_ROOT, "attention_decode_tiered_split_int8_f16kv", {"softcap_loops": False}
    )
    assert "_capped" not in single.passes[0].text
    assert "if (u.attn_softcap > 0.0) {\n        s = tanh" in single.passes[0].text


@pytest.mark.parametrize(("name", "constants"), CONFIGS)
def test_both_loop_forms_pass_the_mask_and_softcap_cases_alike(
    device: Device, name: str, constants: dict | None
) -> None:
    """The shipped (two-loop) kernel and its one-loop form pass the default tier's mask and
    softcap cases and a long capped case, with the same outputs."""
    outputs = []
    for loops in (True, False):
        kernel, entry = render_variant(REPO_ROOT, name, {"softcap_loops": loops})
        runner = KernelRunner(device, kernel, entry, constants)
        cases = _cases(entry["params"]["cold"], entry["params"]["max_head_dim"])
        results = [runner.run_case(c, keep_output=True) for c in cases]
        assert all(r.passed for r in results), [(r.verdict, r.refused) for r in results]
        outputs.append([r.output for r in results])
    for two, one in zip(*outputs, strict=True):
        np.testing.assert_allclose(two, one, rtol=0, atol=1e-6)


def test_the_split_pass_passes_the_mask_and_softcap_cases(device: Device) -> None:
    """Its splits cut both tiers (8 splits of the long case's 3,100 keys), each walking the
    capped or plain copies of the step functions over its own key range."""
    assert _failures(device, REPO_ROOT, SPLIT[0], {}, SPLIT[1]) == []


PLANTED = [
    # the softcap loops score without the softcap
    (
        "lib/tiered_decode.wgsl.j2",
        "finish_score{{ capped }}(dots",
        "finish_score(dots",
        {"softcap", LONG_CAPPED.name},
    ),
    # the capped loops walk the hot tier with the plain step functions (no softcap there)
    (
        "lib/tiered_decode.wgsl.j2",
        "{{ tier }}_step{{ suffix }}{{ capped }}(first, shuffle_width);",
        '{{ tier }}_step{{ suffix }}{{ capped if tier == "cold" }}(first, shuffle_width);',
        {"softcap"},
    ),
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
    ids=["uncapped-scores", "hot-tier-uncapped", "own-key-masked", "window-late"],
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
