"""The split-KV decode variants with many splits per case.

The validator's cases hold at most a few hundred keys (one holds 1500), so most
cases fit in one or two splits of at least MIN_SPLIT_KEYS keys. These tests rerun the matrix
with MIN_SPLIT_KEYS 1 and KV_SPLITS 8 and 40, so that every case spans many splits with real
keys, and run an MQA case whose 24 query heads need several head chunks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import MANY_SPLITS, REPO_ROOT, edit, render_variant, subgroup_device
from gpu_support import adapter_problem

from doppler_gen.backends import Device
from doppler_gen.config import load_project
from doppler_gen.families.tiled import CaseSpec
from doppler_gen.render import Renderer, TemplateError
from doppler_gen.runtime.runner import KernelRunner
from doppler_gen.runtime.session import subgroup_width
from doppler_gen.runtime.verify import validate_variant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

VARIANTS = ("attention_decode_split_d128", "attention_decode_split_d64_f16")


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    yield from subgroup_device(VARIANTS)


@pytest.mark.parametrize("splits", [8, 40])
@pytest.mark.parametrize("name", VARIANTS)
def test_quick_matrix_over_many_splits(device: Device, name: str, splits: int) -> None:
    kernel, entry = render_variant(REPO_ROOT, name)
    report = validate_variant(
        device,
        kernel,
        entry,
        quick=True,
        seed=0,
        constants={"KV_SPLITS": splits, "MIN_SPLIT_KEYS": 1},
    )
    assert report.status == "PASS", [(c.spec.name, c.verdict, c.refused) for c in report.cases]
    assert len(report.cases) >= 10


def test_mqa_heads_in_chunks_over_forty_splits(device: Device) -> None:
    """24 query heads on one KV head (several head chunks) over 40 splits of 8 keys."""
    kernel, entry = render_variant(REPO_ROOT, "attention_decode_split_d128")
    runner = KernelRunner(
        device, kernel, entry, {"KV_SPLITS": 40, "MIN_SPLIT_KEYS": 8, "WORKGROUP_SIZE": 64}
    )
    spec = CaseSpec("mqa", num_heads=24, num_kv_heads=1, head_dim=32, kv_len=317, start_pos=316)
    for case in (spec, replace(spec, sliding_window=50), replace(spec, kv_len_source=1)):
        result = runner.run_case(case)
        assert result.passed, (case, result.verdict, result.refused)


@pytest.mark.parametrize(
    ("slots", "per_group"), [(1, 4), (1, 1), (2, 2), (4, 1)], ids=lambda v: str(v)
)
def test_head_slots_cover_groups_wider_and_narrower_than_a_chunk(
    device: Device, slots: int, per_group: int
) -> None:
    """head_slots x heads_per_group heads at once is fixed at render time: MQA's 24 heads take
    several chunks, MHA's one head leaves slots idle, and every head must still be right."""
    kernel, entry = render_variant(
        REPO_ROOT,
        "attention_decode_split_d64_f16",
        {"head_slots": slots, "heads_per_group": per_group},
    )
    assert f"const HEAD_SLOTS: u32 = {slots}u;" in kernel.passes[0].text
    runner = KernelRunner(device, kernel, entry, {"KV_SPLITS": 8, "MIN_SPLIT_KEYS": 16})
    mqa = CaseSpec("mqa", num_heads=24, num_kv_heads=1, head_dim=64, kv_len=301, start_pos=300)
    mha = replace(mqa, name="mha", num_heads=6, num_kv_heads=6)
    gqa = replace(mqa, name="gqa", num_heads=12, num_kv_heads=4, sliding_window=90)
    for case in (mqa, mha, gqa):
        result = runner.run_case(case)
        assert result.passed, (case.name, result.verdict, result.refused)


def test_head_slots_beyond_the_merge_rows_are_refused_at_render() -> None:
    """head_slots x heads_per_group rows of the merge buffer must exist: d256 has 8."""
    project = load_project(REPO_ROOT)
    variant = project.variant("attention_decode_split_d256")
    variant = replace(variant, params={**variant.params, "head_slots": 4, "heads_per_group": 4})
    with pytest.raises(TemplateError, match=r"head_slots \(4\) x heads_per_group \(4\)"):
        Renderer(project).render(variant)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("attention_decode_split_d128_f16", {"lanes_per_key": 32, "heads_per_group": 4}),
        ("attention_decode_split_d64", {"lanes_per_key": 16, "heads_per_group": 2}),
        ("attention_decode_sg_d128_f16", {"lanes_per_key": 32, "keys_per_iter": 4}),
        ("attention_decode_sg_d64", {"lanes_per_key": 16}),
    ],
)
def test_key_groups_wider_than_the_subgroup_reduce_through_workgroup_memory(
    device: Device, name: str, params: dict
) -> None:
    """lanes_per_key 16 or 32 on an adapter whose subgroups are narrower (lavapipe: 8) takes
    the workgroup-memory fallback; on a wider one (the H200: 32) the shuffles. Both must pass."""
    kernel, entry = render_variant(REPO_ROOT, name, params)
    constants = MANY_SPLITS if "split" in name else None
    report = validate_variant(device, kernel, entry, quick=True, seed=0, constants=constants)
    assert report.status == "PASS", [(c.spec.name, c.verdict, c.refused) for c in report.cases]
    assert len(report.cases) >= 10


# the int4 partials pass in its earlier, simpler shape (lavapipe compiles it in 16 s, the
# shipped one in 29): this test is about the reduce pass the two share
SIMPLE_INT4 = {"dims_per_lane": 16, "keys_per_step": 1, "heads_per_workgroup": 2}


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("attention_decode_split_d64_f16", {}),
        ("attention_decode_tiered_split_int4_f16kv", SIMPLE_INT4),
    ],
)
def test_every_reduce_scan_passes_over_many_splits(device: Device, name: str, extra: dict) -> None:
    """reduce_scan "tree" (barrier trees), "flat" (every invocation scans the splits) and
    "merge" (one trip to memory, parts merged behind one barrier) are a tunable of the shared
    reduce pass: each must combine 8 splits of real keys correctly."""
    # merge at 32 invocations: 2 elements of head_dim 64 per invocation, 1 part
    for scan, size in (("tree", 256), ("flat", 256), ("merge", 256), ("merge", 32)):
        params = {"reduce_scan": scan, "reduce_workgroup_size": size, **extra}
        kernel, entry = render_variant(REPO_ROOT, name, params)
        reduce_pass = next(p for p in kernel.passes if p.spec.name == "reduce")
        assert ("fn tree_reduce" in reduce_pass.text) == (scan == "tree")
        assert ("var<workgroup> red_m:" in reduce_pass.text) == (scan == "merge")
        constants = MANY_SPLITS
        report = validate_variant(device, kernel, entry, quick=True, seed=0, constants=constants)
        assert report.status == "PASS", (
            params,
            [(c.spec.name, c.verdict) for c in report.failures],
        )


UNWRITTEN_CASE = CaseSpec(
    "a partial left unwritten", num_heads=8, num_kv_heads=2, head_dim=64, kv_len=300
)
# 300 keys in splits of ceil(300 / 7) = 43: 7 used splits, not a multiple of 4, so the flat
# scan's scalar tail runs too
SEVEN_SPLITS = {"KV_SPLITS": 7, "MIN_SPLIT_KEYS": 1}
HEAD = 3  # the query head whose partial is left unwritten


def _rows(output: np.ndarray) -> np.ndarray:
    """The decode output as (head, element) rows."""
    return np.asarray(output, dtype=np.float32).reshape(UNWRITTEN_CASE.num_heads, -1)


def _run_unwritten(device: Device, root: Path, name: str, params: dict) -> np.ndarray:
    kernel, entry = render_variant(root, name, params)
    result = KernelRunner(device, kernel, entry, SEVEN_SPLITS).run_case(
        UNWRITTEN_CASE, keep_output=True
    )
    assert result.output is not None
    return _rows(result.output)


def _assert_only_head_spoiled(spoiled: np.ndarray, usual: np.ndarray) -> None:
    """Every element of HEAD's row NaN; every other row bit-identical to the usual run."""
    assert np.isnan(spoiled[HEAD]).all(), spoiled[HEAD]
    others = [h for h in range(len(usual)) if h != HEAD]
    assert np.array_equal(spoiled[others], usual[others])


@pytest.mark.parametrize("split", [0, 6])
@pytest.mark.parametrize("scan", ["tree", "flat", "merge"])
def test_a_partial_left_unwritten_makes_the_row_nan_not_a_wrong_answer(
    device: Device, project_copy: Path, scan: str, split: int
) -> None:
    """The partials pass is made to skip the sum (l) of one head in the first or the last of 7
    splits, so the reduce pass reads the scratch's NaN poison there. By arithmetic alone that
    row would come out a finite, wrong 0 (a NaN sum fails l > 0, and the total is scaled by
    0); the reduce pass tests what it reads for NaN by its bits and stores NaN in that row,
    and only there. Removing that test must give the finite wrong answer, or this test proves
    nothing."""
    name, params = "attention_decode_split_d64_f16", {"reduce_scan": scan}
    usual = KernelRunner(device, *render_variant(REPO_ROOT, name, params), SEVEN_SPLITS)
    assert usual.run_case(UNWRITTEN_CASE).passed
    usual_rows = _run_unwritten(device, REPO_ROOT, name, params)
    slot = split * UNWRITTEN_CASE.num_heads + HEAD  # decode: one query
    edit(
        project_copy / "templates/attention_decode_split_partials.wgsl.j2",
        'partial_ml[2u * slot_out + 1u] = {{ decode.poisoned("l_h") }};',
        f"if (slot_out != {slot}u) "
        '{ partial_ml[2u * slot_out + 1u] = {{ decode.poisoned("l_h") }}; }',
    )
    _assert_only_head_spoiled(_run_unwritten(device, project_copy, name, params), usual_rows)
    edit(
        project_copy / "templates/attention_decode_split_reduce.wgsl.j2",
        "let spoiled = atomicLoad(&read_nan_any) != 0u;",
        "let spoiled = false;",
    )
    unchecked = _run_unwritten(device, project_copy, name, params)
    assert np.isfinite(unchecked).all()
    assert not np.allclose(unchecked[HEAD], usual_rows[HEAD], atol=1e-2), (
        "the unwritten sum must matter, or this test proves nothing"
    )


@pytest.mark.parametrize("scan", ["tree", "flat", "merge"])
def test_a_nan_accumulator_in_a_later_chunk_spoils_the_chunks_stored_before_it(
    device: Device, project_copy: Path, scan: str
) -> None:
    """With 32 reduce invocations a head_dim 64 row is combined in two chunks, the first
    stored before the second is read. One accumulator element of the second chunk (element
    40) is left unwritten: the whole row, the first chunk included, must be NaN. Without the
    up-front test of the row's accumulators the first chunk comes out finite."""
    name = "attention_decode_split_d64_f16"
    params = {"reduce_scan": scan, "reduce_workgroup_size": 32}
    usual_rows = _run_unwritten(device, REPO_ROOT, name, params)
    assert np.isfinite(usual_rows).all()
    edit(
        project_copy / "templates/attention_decode_split_partials.wgsl.j2",
        'partial_acc[slot_out * head_dim + d] = {{ decode.poisoned("total") }};',
        f"if (slot_out * head_dim + d != {HEAD * 64 + 40}u) "
        '{ partial_acc[slot_out * head_dim + d] = {{ decode.poisoned("total") }}; }',
    )
    _assert_only_head_spoiled(_run_unwritten(device, project_copy, name, params), usual_rows)
    edit(
        project_copy / "templates/attention_decode_split_reduce.wgsl.j2",
        "if (head_dim > REDUCE_WORKGROUP_SIZE) {",
        "if (false) {",
    )
    unscanned = _run_unwritten(device, project_copy, name, params)
    assert np.isfinite(unscanned[HEAD, :32]).all(), "the first chunk must be stored first"
    assert np.isnan(unscanned[HEAD, 32:]).all()


TIERED_UNWRITTEN_CASE = CaseSpec(
    "a tiered partial left unwritten",
    num_heads=8,
    num_kv_heads=2,
    cold_len=300,
    hot_len=20,
    hot_start=300,
    hot_window=32,
    start_pos=319,
    head_dim=64,
)


@pytest.mark.parametrize("scan", ["flat", "merge"])
def test_a_tiered_split_partial_left_unwritten_makes_the_row_nan(
    device: Device, project_copy: Path, scan: str
) -> None:
    """The tiered split variants share the reduce pass: one head's sum left unwritten in
    split 0 makes that head's row NaN and leaves the others as they were."""
    name, params = "attention_decode_tiered_split_f16", {"reduce_scan": scan}
    kernel, entry = render_variant(REPO_ROOT, name, params)
    runner = KernelRunner(device, kernel, entry, MANY_SPLITS)
    usual = runner.run_case(TIERED_UNWRITTEN_CASE, keep_output=True)
    assert usual.passed and usual.output is not None
    edit(
        project_copy / "templates/lib/tiered_decode.wgsl.j2",
        "partial_ml[2u * partial_slot + 1u] = row_sum;",
        f"if (partial_slot != {HEAD}u) {{ partial_ml[2u * partial_slot + 1u] = row_sum; }}",
    )
    kernel, entry = render_variant(project_copy, name, params)
    spoiled = KernelRunner(device, kernel, entry, MANY_SPLITS).run_case(
        TIERED_UNWRITTEN_CASE, keep_output=True
    )
    assert spoiled.output is not None and not spoiled.passed
    _assert_only_head_spoiled(_rows(spoiled.output), _rows(usual.output))


@pytest.mark.parametrize(
    ("name", "heads", "extra"),
    [
        ("attention_decode_tiered_split_f16", 1, {}),
        ("attention_decode_tiered_split_f16", 2, {}),
        ("attention_decode_tiered_split_int8_f16kv", 2, {}),
        ("attention_decode_tiered_split_int4_f16kv", 2, {}),  # ships 4 (validate covers it)
    ],
)
def test_tiered_split_heads_per_workgroup_over_many_splits(
    device: Device, name: str, heads: int, extra: dict
) -> None:
    """A tiered partials workgroup serving `heads` query heads of one KV head (each slice loaded
    and unpacked once): the quick matrix (GQA groups 1 to 8) over 8 splits, and a group of 6,
    whose last chunk of 4 runs past the group and must store nothing for the missing heads."""
    kernel, entry = render_variant(REPO_ROOT, name, {"heads_per_workgroup": heads, **extra})
    partials = kernel.passes[0].text
    assert f"const HEADS_PER_WORKGROUP: u32 = {heads}u;" in partials
    assert ("head_live_h1" in partials) == (heads > 1) and "let head_live" in partials
    constants = MANY_SPLITS
    report = validate_variant(device, kernel, entry, quick=True, seed=0, constants=constants)
    assert report.status == "PASS", [(c.spec.name, c.verdict, c.refused) for c in report.cases]
    # the same constants, so the same pipeline (one compile): 170 keys in 8 splits of 22
    runner = KernelRunner(device, kernel, entry, constants)
    spec = CaseSpec(
        "group of 6",
        num_heads=12,
        num_kv_heads=2,
        cold_len=150,
        hot_len=20,
        hot_start=160,
        hot_window=32,
        start_pos=179,
        head_dim=64,
    )
    result = runner.run_case(spec)
    assert result.passed, (result.verdict, result.refused)


def test_tiered_heads_per_workgroup_outside_one_two_four_is_refused_at_render() -> None:
    project = load_project(REPO_ROOT)
    variant = project.variant("attention_decode_tiered_split_f16")
    variant = replace(variant, params={**variant.params, "heads_per_workgroup": 3})
    with pytest.raises(TemplateError, match="heads_per_workgroup must be 1, 2 or 4"):
        Renderer(project).render(variant)


@pytest.mark.parametrize(
    ("name", "constants", "params"),
    [
        ("attention_decode_split_d128_f16", MANY_SPLITS, {}),
        ("attention_decode_sg_d64_f16", None, {}),
        ("attention_decode_wg_d128", None, {}),
        # prefetched rows: a key past the end re-reads the last attended key's row
        ("attention_decode_wg_d128_f16", None, {"prefetch": True}),
        (
            "attention_decode_split_d64_f16",
            MANY_SPLITS,
            {"prefetch": True},
        ),
    ],
)
def test_rows_outside_the_window_may_hold_nan(
    device: Device,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    constants: dict | None,
    params: dict,
) -> None:
    """K/V rows a query may not attend (here: before its sliding window) can hold anything, NaN
    included, and must not reach the output. The decode kernels load every key of an iteration
    unconditionally, clamped to the attended range (so no load waits behind a branch): a key
    past it re-reads the last attended row and gets weight 0. The reference gets the finite
    rows."""
    kernel, entry = render_variant(REPO_ROOT, name, params)
    result = _run_over_nan_rows(KernelRunner(device, kernel, entry, constants), monkeypatch)
    assert result.passed, (result.verdict, result.refused)


def _run_over_nan_rows(runner: KernelRunner, monkeypatch: pytest.MonkeyPatch) -> object:
    """A sliding-window decode case whose K/V rows before the window are NaN for the kernel."""
    window, kv_len = 37, 300
    build = runner.family.build

    def nan_before_the_window(spec: CaseSpec, entry: dict) -> object:
        data = build(spec, entry)
        for binding in ("K", "V"):
            rows = data.buffers[binding].copy()  # the reference keeps its own finite array
            rows[: kv_len - window] = np.nan
            data.buffers[binding] = rows
        return data

    monkeypatch.setattr(runner.family, "build", nan_before_the_window)
    spec = CaseSpec(
        "window over NaN rows",
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        kv_len=kv_len,
        start_pos=kv_len - 1,
        sliding_window=window,
    )
    return runner.run_case(spec)


@pytest.mark.parametrize(
    ("name", "constants"),
    [
        ("attention_decode_split_d64_f16", MANY_SPLITS),
        ("attention_decode_sg_d64", None),
    ],
)
def test_softcap_loops_renders_two_key_loops_and_passes(
    device: Device, name: str, constants: dict | None
) -> None:
    """softcap_loops (a tunable) emits the key loop twice, with the softcap and without, chosen
    by one branch outside the loop; both copies must pass the full matrix, softcap cases
    included."""
    # one layout loop (layout_loops, on in both shipped variants, doubles the loops again)
    kernel, entry = render_variant(REPO_ROOT, name, {"softcap_loops": True, "layout_loops": False})
    text = kernel.passes[0].text
    assert text.count("for (var it: u32 = 0u; it < iterations;") == 2
    assert "tanh(dot_0" in text and "if (u.attn_softcap > 0.0) {\n            let span" in text
    report = validate_variant(device, kernel, entry, quick=False, seed=0, constants=constants)
    assert report.status == "PASS", [(c.spec.name, c.verdict, c.refused) for c in report.cases]
    assert any(c.spec.softcap > 0 for c in report.cases)


NARROW = [
    ("attention_decode_split_d128_f16", MANY_SPLITS),
    ("attention_decode_sg_d64_f16", None),
]


@pytest.mark.parametrize(("name", "constants"), NARROW)
def test_narrow_subgroups_nan_drops_the_fallback_and_declares_its_width(
    name: str, constants: dict | None
) -> None:
    """narrow_subgroups = "nan": no workgroup-memory path in the key loop (no partial_dots, no
    subgroup_ok branch), MIN_SUBGROUP_SIZE = lanes_per_key in the WGSL, min_subgroup_size in
    the manifest; "fallback" (every shipped variant) declares no width."""
    kernel, entry = render_variant(
        REPO_ROOT, name, {"narrow_subgroups": "nan", "lanes_per_key": 16}
    )
    text = kernel.passes[0].text
    assert "partial_dots" not in text and "subgroup_ok" not in text
    assert "const MIN_SUBGROUP_SIZE: u32 = 16u;" in text
    assert entry["min_subgroup_size"] == 16
    shipped, shipped_entry = render_variant(REPO_ROOT, name)
    assert "subgroup_ok" in shipped.passes[0].text
    assert shipped_entry["min_subgroup_size"] is None


@pytest.mark.parametrize(("name", "constants"), NARROW)
def test_narrow_subgroups_nan_passes_where_the_subgroups_are_wide_enough(
    device: Device, name: str, constants: dict | None
) -> None:
    """Key groups no wider than the adapter's subgroups (lavapipe: 8, the H200: 32): the
    fallback-free kernel passes the quick matrix."""
    width = subgroup_width(device)
    assert width is not None and width >= 4
    lanes = min(8, width)
    kernel, entry = render_variant(
        REPO_ROOT, name, {"narrow_subgroups": "nan", "lanes_per_key": lanes}
    )
    report = validate_variant(device, kernel, entry, quick=True, seed=0, constants=constants)
    assert report.status == "PASS", [(c.spec.name, c.verdict, c.refused) for c in report.cases]
    assert len(report.cases) >= 10


@pytest.mark.parametrize(("name", "constants"), NARROW)
def test_narrow_subgroups_nan_stores_nan_where_the_subgroups_are_too_narrow(
    device: Device, name: str, constants: dict | None
) -> None:
    """Key groups twice as wide as the adapter's subgroups: the validator skips the variant
    with the measured width in the reason, and run anyway every output element is NaN (a host
    that ignores min_subgroup_size gets a loud failure, not a plausible answer)."""
    width = subgroup_width(device)
    assert width is not None
    if 2 * width > 32:
        pytest.skip(f"this adapter's subgroups are {width} wide: no key group is wider (<= 32)")
    params = {"narrow_subgroups": "nan", "lanes_per_key": 2 * width}
    kernel, entry = render_variant(REPO_ROOT, name, params)
    report = validate_variant(device, kernel, entry, quick=True, seed=0, constants=constants)
    assert report.status == "SKIP"
    assert f"subgroups are {width} invocations wide" in report.reason
    assert f"needs at least {2 * width} (min_subgroup_size" in report.reason
    runner = KernelRunner(device, kernel, entry, constants)
    spec = CaseSpec(
        "decode, GQA", num_heads=8, num_kv_heads=2, head_dim=64, kv_len=300, start_pos=299
    )
    result = runner.run_case(spec, keep_output=True)
    assert result.output is not None and np.isnan(result.output).all()
    assert not result.passed


# The numbering of the key groups' subgroups, served in an order a GPU may use (WGSL fixes
# none): the subgroups that are not full take their slots first, the full ones after a barrier
SERVE_PARTIAL_SUBGROUP_FIRST = re.compile(
    r"    if \(sg_lane == 0u\) \{\n        first_lane_slot = atomicAdd\(&subgroup_counter, (.*?)\);\n    \}\n"
)
PLANTED_ORDER = """    let full_subgroup = subgroupAdd(1u) == sg_size;
    if (sg_lane == 0u && !full_subgroup) {
        first_lane_slot = atomicAdd(&subgroup_counter, \\1);
    }
    workgroupBarrier();
    if (sg_lane == 0u && full_subgroup) {
        first_lane_slot = atomicAdd(&subgroup_counter, \\1);
    }
"""


@pytest.mark.parametrize(
    ("name", "params", "constants"),
    [
        ("attention_decode_sg_d64", {}, None),
        ("attention_decode_split_d64", {}, MANY_SPLITS),
        ("attention_decode_split_d64_f16", {"narrow_subgroups": "nan"}, MANY_SPLITS),
    ],
)
def test_a_partial_subgroup_served_first_keeps_the_key_groups(
    device: Device, project_copy: Path, name: str, params: dict, constants: dict | None
) -> None:
    """WORKGROUP_SIZE may be any multiple of LANES_PER_KEY: one and a half subgroups leave the
    second subgroup partial. The atomic that numbers the subgroups may serve it first (on a
    GPU the subgroups race; lavapipe runs them in order, so the test serves the partial one
    before a barrier and the full one after it). Numbered by subgroup count, the full
    subgroup then took key groups past the last and left one unwalked: wrong outputs."""
    width = subgroup_width(device)
    assert width is not None and width >= 4
    path = project_copy / "templates/lib/attention_decode.wgsl.j2"
    text, planted = SERVE_PARTIAL_SUBGROUP_FIRST.subn(PLANTED_ORDER, path.read_text())
    assert planted == 1
    path.write_text(text)
    lanes = width // 2
    kernel, entry = render_variant(project_copy, name, {**params, "lanes_per_key": lanes})
    assert "full_subgroup" in kernel.passes[0].text
    size = {"WORKGROUP_SIZE": width + lanes}
    report = validate_variant(
        device, kernel, entry, quick=True, seed=0, constants={**(constants or {}), **size}
    )
    assert report.status == "PASS", [(c.spec.name, c.verdict, c.refused) for c in report.cases]
    assert len(report.cases) >= 10


def test_the_long_context_variant_runs_on_16_lane_lavapipe(device: Device) -> None:
    """attention_decode_split_long_d128_f16 needs subgroups of 16 lanes (no fallback). Where
    lavapipe's are 8 (256-bit vectors), validate skips it and names the remedy; with
    LP_NATIVE_VECTOR_WIDTH=512, as `.ci/setup` runs it, it passes the quick matrix."""
    if "llvmpipe" not in device.adapter.describe().lower():
        pytest.skip(f"{device.adapter.short()} is not lavapipe, whose vectors set its subgroups")
    name = "attention_decode_split_long_d128_f16"
    kernel, entry = render_variant(REPO_ROOT, name)
    assert entry["min_subgroup_size"] == 16
    if (subgroup_width(device) or 0) < 16:
        report = validate_variant(device, kernel, entry, quick=True, seed=0)
        assert report.status == "SKIP"
        assert "with LP_NATIVE_VECTOR_WIDTH=512" in report.reason
    wide = subprocess.run(
        [sys.executable, "-m", "doppler_gen", "validate", "--quick", name],
        cwd=REPO_ROOT,
        env={**os.environ, "LP_NATIVE_VECTOR_WIDTH": "512"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert wide.returncode == 0, wide.stdout + wide.stderr
    assert "1 passed, 0 failed, 0 skipped" in wide.stdout and "512 bits" in wide.stdout


PREFETCH = [
    ("attention_decode_wg_d64_f16", None),
    ("attention_decode_sg_d64_f16", None),
    ("attention_decode_split_d64_f16", MANY_SPLITS),
]


@pytest.mark.parametrize(("name", "constants"), PREFETCH)
@pytest.mark.parametrize("keys", [1, 4])
def test_prefetch_passes_the_matrix(
    device: Device, name: str, constants: dict | None, keys: int
) -> None:
    """prefetch (a tunable): each iteration loads the next one's K/V rows before scoring its
    own; the first iteration's come before the loop, and the last loads the last key again.
    One and four keys an iteration, one dispatch and split (many splits, MQA chunks)."""
    params = {"prefetch": True, "keys_per_iter": keys}
    kernel, entry = render_variant(REPO_ROOT, name, params)
    assert "let next_row_0 = " in kernel.passes[0].text
    report = validate_variant(device, kernel, entry, quick=True, seed=0, constants=constants)
    assert report.status == "PASS", [(c.spec.name, c.verdict, c.refused) for c in report.cases]


def test_prefetch_without_v_with_k_is_refused_at_render() -> None:
    with pytest.raises(TemplateError, match="prefetch loads V with K: it needs v_with_k"):
        render_variant(REPO_ROOT, "attention_decode_sg_d64", {"prefetch": True, "v_with_k": False})


PREFETCH_BUGS = [
    # the rows of this iteration loaded again instead of the next one's
    ('{{ prefetch_rows("base + per_iter", nstreams, rows, "            ") }}',
     '{{ prefetch_rows("base", nstreams, rows, "            ") }}'),
    # the first iteration's rows never loaded (it scores zeros)
    ("        if (iterations > 0u) {\n{{ prefetch_rows(", "        if (false) {\n{{ prefetch_rows("),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new"), PREFETCH_BUGS, ids=["same-rows-again", "first-rows-not-loaded"]
)
def test_prefetch_planted_bugs_fail(
    device: Device,
    project_copy: Path,
    monkeypatch: pytest.MonkeyPatch,
    old: str,
    new: str,
) -> None:
    edit(project_copy / "templates/lib/attention_decode.wgsl.j2", old, new)
    # a shipped prefetch kernel; d128's twin has the same code and takes lavapipe 3x longer
    kernel, entry = render_variant(project_copy, "attention_decode_wg_d64_f16")
    assert "let next_row_0 = " in kernel.text
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    over_nan = _run_over_nan_rows(KernelRunner(device, kernel, entry), monkeypatch)
    assert report.status == "FAIL" or not over_nan.passed
