"""The tiered key loop's tunables: `prefetch` (each step requests the next step's rows) and
`narrow_subgroups = "nan"` (shuffles only, no barrier in the loop), on the adapter.

The quick matrix covers GQA 1 to 8, windows, softcap, paged/ring tiers and odd head_dims; the
long case below walks 5,100 keys (hundreds of steps) across the cold-to-hot boundary.
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
from doppler_gen.render import TemplateError
from doppler_gen.runtime.runner import KernelRunner
from doppler_gen.runtime.session import subgroup_width
from doppler_gen.runtime.verify import validate_variant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

LONG = CaseSpec(
    "long cold tier, GQA 4, head_dim 128",
    num_heads=8,
    num_kv_heads=2,
    cold_len=5000,
    hot_len=100,
    hot_start=5000,
    hot_window=128,
    start_pos=5099,
    head_dim=128,
    seed=11,
)


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    yield from subgroup_device(["attention_decode_tiered_split_int4_f16kv"])


PREFETCH = [
    # workgroup-memory reduction, four keys a step
    ("attention_decode_tiered_f16", {"prefetch": True, "keys_per_step": 4}, None),
    # f16 rows as vec4<f16>, subgroup shuffles
    ("attention_decode_tiered_f16_sg", {"prefetch": True}, None),
    # int4 words, shipped with prefetch
    ("attention_decode_tiered_int4_f16kv_sg", {}, None),
    # split pass, int8 words, four heads a workgroup, many splits (shipped with prefetch)
    ("attention_decode_tiered_split_int8_f16kv", {}, MANY_SPLITS),
]


@pytest.mark.parametrize(("name", "params", "constants"), PREFETCH)
def test_prefetch_passes_the_matrix_and_a_long_cold_tier(
    device: Device, name: str, params: dict, constants: dict | None
) -> None:
    """Each step's rows come from the previous step's fetch (the first from the one before
    the loop): the quick matrix and 5,100 keys across both tiers give the reference result."""
    kernel, entry = render_variant(REPO_ROOT, name, params)
    text = kernel.passes[0].text
    assert "fn cold_step_fetch(first: u32)" in text or "fn cold_step_aligned_fetch(" in text
    assert re.search(r"hot_step(_aligned)?_fetch\(first \+ \du \* num_groups\);", text)
    report = validate_variant(device, kernel, entry, quick=True, seed=0, constants=constants)
    assert report.status == "PASS", [(c.spec.name, c.refused) for c in report.cases]
    result = KernelRunner(device, kernel, entry, constants).run_case(LONG)
    assert result.passed, (result.refused, result.verdict)


PREFETCH_BUGS = [
    # every step fetches its own rows again instead of the next step's
    ("    {{ name }}_fetch(first + {{ n }}u * num_groups);", "    {{ name }}_fetch(first);"),
    # the loop's first rows are never requested (its priming fetch reads the tier's end)
    (
        "{{ indent }}    {{ tier }}_step{{ suffix }}_fetch({{ span[0] }});",
        "{{ indent }}    {{ tier }}_step{{ suffix }}_fetch({{ span[1] }});",
    ),
]


@pytest.mark.parametrize(("old", "new"), PREFETCH_BUGS, ids=["same-rows-again", "not-primed"])
@pytest.mark.parametrize(
    "name", ["attention_decode_tiered_int4_f16kv_sg", "attention_decode_tiered_f16_sg"]
)
def test_prefetch_planted_bugs_fail(
    device: Device, project_copy: Path, name: str, old: str, new: str
) -> None:
    edit(project_copy / "templates/lib/tiered_decode.wgsl.j2", old, new)
    kernel, entry = render_variant(project_copy, name, {"prefetch": True})
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    # the quick tier's "many key steps" case walks its tiers in a dozen steps or more
    assert report.status == "FAIL"
    failed = {c.spec.name for c in report.cases if not (c.verdict and c.verdict.passed)}
    assert "many key steps, GQA 4" in failed
    assert not KernelRunner(device, kernel, entry).run_case(LONG).passed


def test_shuffles_only_passes_where_the_groups_fit_and_has_no_barrier_in_the_loop(
    device: Device,
) -> None:
    """narrow_subgroups "nan" at 16 elements a lane: 8-lane groups at head_dim 128 (lavapipe's
    default 256-bit vectors give 8-lane subgroups, the H200 32). The manifest says so; neither
    the reduction nor the step functions of the key loop hold a barrier."""
    width = subgroup_width(device)
    if width is None or width < 8:
        pytest.skip(f"this adapter's subgroups are {width} wide: an 8-lane group does not fit")
    params = {"narrow_subgroups": "nan", "max_head_dim": 128, "dims_per_lane": 16}
    kernel, entry = render_variant(REPO_ROOT, "attention_decode_tiered_int4_f16kv_sg", params)
    assert entry["min_subgroup_size"] == 8
    text = kernel.passes[0].text
    loop = re.findall(r"\nfn (?:group_reduce|(?:cold|hot)_step\w*)\(.*?\n}\n", text, re.S)
    # group_reduce; cold_step, hot_step, hot_step_aligned, their fetches and _capped copies
    assert len(loop) == 10
    assert all("workgroupBarrier" not in body for body in loop)
    assert "subgroupShuffleXor" in loop[0]
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "PASS", [(c.spec.name, c.refused) for c in report.cases]
    assert KernelRunner(device, kernel, entry).run_case(LONG).passed


def test_shuffles_only_stores_nan_where_a_group_is_wider_than_the_subgroup(
    device: Device,
) -> None:
    """32-lane groups (head_dim 256 at 8 elements a lane) on narrower subgroups: the validator
    skips the variant naming the width, and run anyway every output element is NaN (the split
    variant's through its reduce pass, which combines NaN partials), so a host that ignores
    min_subgroup_size gets a loud failure."""
    width = subgroup_width(device)
    assert width is not None
    if width >= 32:
        pytest.skip(f"this adapter's subgroups are {width} wide: a 32-lane group fits")
    for name in ("attention_decode_tiered_f16_sg", "attention_decode_tiered_split_f16"):
        kernel, entry = render_variant(REPO_ROOT, name, {"narrow_subgroups": "nan"})
        assert entry["min_subgroup_size"] == 32
        report = validate_variant(device, kernel, entry, quick=True, seed=0)
        assert report.status == "SKIP"
        assert "needs at least 32 (min_subgroup_size" in report.reason
        spec = CaseSpec(
            "head_dim 256",
            num_heads=4,
            num_kv_heads=2,
            cold_len=300,
            hot_len=20,
            hot_start=300,
            hot_window=32,
            start_pos=319,
            head_dim=256,
        )
        result = KernelRunner(device, kernel, entry).run_case(spec, keep_output=True)
        assert result.output is not None and np.isnan(result.output).all(), name
        assert not result.passed


def test_shuffles_only_without_subgroups_is_refused_at_render() -> None:
    with pytest.raises(TemplateError, match="drops the workgroup-memory reduction: it needs"):
        render_variant(REPO_ROOT, "attention_decode_tiered_f16", {"narrow_subgroups": "nan"})


UNROLLED = [
    "attention_decode_tiered_f16_sg",  # one dispatch, f16 rows as vec4<f16>
    # split pass, four heads a workgroup (its reduction is the int8 kernel's, which compiles
    # twice as long); the case's 760 keys make 6 splits of the shipped MIN_SPLIT_KEYS (128),
    # so the unrolled kernel is the one `validate` compiled
    "attention_decode_tiered_split_f16",
]


def _narrow_case(head_dim: int) -> CaseSpec:
    """A case whose lane groups (head_dim / 8 lanes) are narrower than the widest group at
    MAX_HEAD_DIM 256 (32 lanes), so that the unrolled reduction runs rounds that add zero."""
    return CaseSpec(
        f"GQA 4, head_dim {head_dim}, softcap",
        num_heads=8,
        num_kv_heads=2,
        cold_len=700,
        hot_len=60,
        hot_start=700,
        hot_window=64,
        start_pos=759,
        head_dim=head_dim,
        softcap=30.0,
        seed=5,
    )


@pytest.mark.parametrize("name", UNROLLED)
def test_unrolled_shuffles_give_the_loops_sums_bit_for_bit(device: Device, name: str) -> None:
    """unrolled_shuffles: one shuffle per constant mask below the widest group instead of a
    loop over width / 2 .. 1; a round at or above the group's width adds zero, so the output
    is the loop's exactly, at head dims whose groups fit the subgroup (8 and 4 lanes)."""
    width = subgroup_width(device)
    if width is None or width < 8:
        pytest.skip(f"this adapter's subgroups are {width} wide: an 8-lane group does not fit")
    unrolled, entry = render_variant(REPO_ROOT, name, {"unrolled_shuffles": True})
    looped, looped_entry = render_variant(REPO_ROOT, name, {"unrolled_shuffles": False})
    reduce = re.search(r"\nfn group_reduce\(.*?\n}\n", unrolled.passes[0].text, re.S)
    assert reduce is not None and "for (var mask" not in reduce.group(0)
    assert "subgroupShuffleXor(total, 16u), 16u < width)" in reduce.group(0)
    assert "for (var mask: u32 = width / 2u;" in looped.passes[0].text
    fast = KernelRunner(device, unrolled, entry)
    slow = KernelRunner(device, looped, looped_entry)
    for head_dim in (64, 32):
        a = fast.run_case(_narrow_case(head_dim), keep_output=True)
        b = slow.run_case(_narrow_case(head_dim), keep_output=True)
        assert a.passed and b.passed, (a.verdict, b.verdict)
        assert np.array_equal(a.output, b.output), head_dim


def test_unrolled_rounds_that_add_the_neighbours_fail(device: Device, project_copy: Path) -> None:
    """Teeth: a round at or above the group's width must add zero; adding the shuffled value
    there (the neighbouring group's partial dot) fails the quick matrix."""
    width = subgroup_width(device)
    if width is None or width < 8:
        pytest.skip(f"this adapter's subgroups are {width} wide: an 8-lane group does not fit")
    edit(
        project_copy / "templates/lib/tiered_decode.wgsl.j2",
        "subgroupShuffleXor(total, {{ mask }}u), {{ mask }}u < width)",
        "subgroupShuffleXor(total, {{ mask }}u), {{ mask }}u <= width)",
    )
    kernel, entry = render_variant(project_copy, "attention_decode_tiered_f16_sg")
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "FAIL"
    assert not KernelRunner(device, kernel, entry).run_case(_narrow_case(64)).passed


TRADE_CASE = CaseSpec(
    "GQA 4, head_dim 32 (lane groups of 4 or 8, within the subgroup)",
    num_heads=8,
    num_kv_heads=2,
    cold_len=300,
    hot_len=20,
    hot_start=300,
    hot_window=32,
    start_pos=319,
    head_dim=32,
    seed=3,
)


@pytest.mark.parametrize(
    "name", ["attention_decode_tiered_f16_sg", "attention_decode_tiered_split_short_f16"]
)
def test_subgroups_laid_out_otherwise_store_nan_not_a_wrong_answer(
    device: Device, project_copy: Path, name: str
) -> None:
    """WGSL does not say which invocations share a subgroup; the shuffles need runs of
    consecutive invocations. Simulated: invocations 3 and width + 3 trade their local index,
    keeping their lane numbers (lane == index % width still holds). Without the layout check
    the shuffles mix two key groups' dots and the kernel stores finite, wrong values; with it,
    every element is NaN (the split variant's through its reduce pass). Untraded, the answer
    passes as usual."""
    width = subgroup_width(device)
    if width is None or width < 8:
        pytest.skip(
            f"this adapter's subgroups are {width} wide: the case's 8-lane groups do not fit"
        )
    usual = KernelRunner(device, *render_variant(REPO_ROOT, name)).run_case(
        TRADE_CASE, keep_output=True
    )
    assert usual.passed and np.isfinite(usual.output).all()
    traded = (
        f"select(local_id.x, local_id.x ^ {width}u, "
        f"local_id.x % {width}u == 3u && local_id.x < {2 * width}u)"
    )
    edit(
        project_copy / "templates/attention_decode_tiered.wgsl.j2",
        'tiered.init_lane("local_id.x"',
        f'tiered.init_lane("{traded}"',
    )
    checked = KernelRunner(device, *render_variant(project_copy, name)).run_case(
        TRADE_CASE, keep_output=True
    )
    assert checked.output is not None and np.isnan(checked.output).all()
    assert not checked.passed
    edit(
        project_copy / "templates/lib/tiered_decode.wgsl.j2",
        "let misplaced = shuffle_width > 0u && !laid_out;",
        "let misplaced = false;",
    )
    unchecked = KernelRunner(device, *render_variant(project_copy, name)).run_case(
        TRADE_CASE, keep_output=True
    )
    assert unchecked.output is not None and np.isfinite(unchecked.output).all()
    assert not unchecked.passed, "the trade must matter, or this test proves nothing"


def test_a_workgroup_ending_in_a_partial_lane_group_is_not_flagged(device: Device) -> None:
    """A workgroup that is not whole lane groups ends in a subgroup whose lane count is not a
    multiple of the lane group; its last, partial group is in no key group, so that subgroup is
    laid out as the shuffles need and must not make the row NaN. Here 62 invocations on 8-lane
    subgroups with 4-lane groups (head_dim 32): the last subgroup holds lanes 56..61, among them
    the representative of the group at 56."""
    width = subgroup_width(device)
    if width is None or width < 8:
        pytest.skip(f"this adapter's subgroups are {width} wide: the case's 4-lane groups need 8")
    kernel, entry = render_variant(REPO_ROOT, "attention_decode_tiered_f16_sg")
    size = 8 * width - 2  # 62 on 8 lanes: the trailing subgroup holds 6 of them
    result = KernelRunner(device, kernel, entry, {"WORKGROUP_SIZE": size}).run_case(
        TRADE_CASE, keep_output=True
    )
    assert result.output is not None and np.isfinite(result.output).all()
    assert result.passed, result.verdict
