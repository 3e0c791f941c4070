"""Tiled prefill with row maxima and sums by subgroup shuffles (templates.attention_prefill_sg).

The shipped variants need subgroups as wide as their COLS key columns (4, 8 or 16 lanes;
`min_subgroup_size`): lavapipe runs the 16-lane ones at 16 lanes in `.ci/setup`, and here the
code path runs at its default width with the tiles cut to fit. Narrower subgroups store NaN;
planted bugs fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT, edit, render_variant, subgroup_device, subgroup_lanes
from gpu_support import adapter_problem

from doppler_gen.backends import Device
from doppler_gen.config import load_project
from doppler_gen.families.tiled import CaseSpec
from doppler_gen.manifest import parse_kernel
from doppler_gen.runtime.runner import KernelRunner
from doppler_gen.runtime.verify import validate_variant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

PREFILL = "templates/attention_prefill.wgsl.j2"
SMALL = "attention_prefill_small_sg_d64_f16"  # 32-key tiles (64-query blocks as shipped)


def _cols(width: int) -> dict:
    """Tiles of the small variant whose query groups have ``width`` key columns: 32-query
    blocks of 4 queries an invocation (whatever the shipped block_q and tile_q), so 32 / 4 = 8
    query groups."""
    return {"block_q": 32, "tile_q": 4, "workgroup_size": 8 * width}


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    yield from subgroup_device([SMALL])


def test_shipped_variants_record_their_key_columns_as_min_subgroup_size() -> None:
    project = load_project(REPO_ROOT)
    names = [v.name for v in project.variants if v.template.name == "attention_prefill_sg"]
    assert len(names) == 5
    for name in names:
        kernel, entry = render_variant(REPO_ROOT, name)
        cols = int(parse_kernel(kernel)[0].constants["COLS"])
        assert entry["min_subgroup_size"] == cols
        assert "row_part" not in kernel.text  # no workgroup memory for the row reductions


@pytest.mark.parametrize("fraction", [1, 2])
def test_row_reductions_by_shuffles_pass(device: Device, fraction: int) -> None:
    """Query groups as wide as this adapter's subgroups, or half (two groups a subgroup)."""
    kernel, entry = render_variant(REPO_ROOT, SMALL, _cols(subgroup_lanes(device) // fraction))
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "PASS", [(c.spec.name, c.verdict) for c in report.cases]
    assert len(report.cases) >= 10


# large_sg_d64_f16's tiles: K/V in f32, rows unpadded with their vec4 columns XOR-ed by the row
SWIZZLED = {"tile_layout": "swizzled", "tile_dtype": "kv_f32"}


def _swizzled(project: Path, device: Device) -> tuple:
    """The small variant on this adapter's subgroups with large_sg_d64_f16's tile layout."""
    return render_variant(project, SMALL, {**_cols(subgroup_lanes(device)), **SWIZZLED})


def test_swizzled_f32_kv_tiles_pass_the_default_tier(device: Device) -> None:
    """The code path of large_sg_d64_f16 (validated at its own size on 16-lane lavapipe by
    .ci/setup) at this adapter's width: 16-vec4 rows, no padding, f32 K/V tiles."""
    kernel, entry = _swizzled(REPO_ROOT, device)
    assert "const ROW4: u32 = 16u;" in kernel.text
    assert "var<workgroup> tile_kv: array<vec4<f32>, 512>;" in kernel.text
    report = validate_variant(device, kernel, entry, tier="default", seed=0)
    assert report.status == "PASS", [(c.spec.name, c.verdict) for c in report.cases]


SWIZZLE_MUTATIONS = [
    # tiles read at the unswizzled column (Q, K and V): each row's vec4s come back permuted
    ("reads-not-swizzled",
     "(({{ col }}) ^ ({{ r }} & (ROW4 - 1u)))",
     "({{ col }})"),
    # tiles stored at the unswizzled slot
    ("stores-not-swizzled",
     "({{ idx }}) ^ ((({{ idx }}) / ROW4) & (ROW4 - 1u))",
     "{{ idx }}"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new"), [m[1:] for m in SWIZZLE_MUTATIONS], ids=[m[0] for m in SWIZZLE_MUTATIONS]
)
def test_swizzle_planted_bugs_fail(device: Device, project_copy: Path, old: str, new: str) -> None:
    edit(project_copy / PREFILL, old, new)
    kernel, entry = _swizzled(project_copy, device)
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "FAIL"


def test_too_narrow_subgroups_are_skipped_and_store_nan(device: Device) -> None:
    width = subgroup_lanes(device)
    kernel, entry = render_variant(REPO_ROOT, SMALL, _cols(2 * width))
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "SKIP"
    assert f"needs at least {2 * width} (min_subgroup_size" in report.reason
    spec = CaseSpec("causal", num_heads=4, num_kv_heads=2, query_len=40, kv_len=40, head_dim=64)
    result = KernelRunner(device, kernel, entry).run_case(spec, keep_output=True)
    assert result.output is not None and np.isnan(result.output).all()


MUTATIONS = [
    # the row max of one lane's keys only: every lane rescales by its own max
    ("row-max-not-reduced",
     "tile_max{{ i }} = max(tile_max{{ i }}, subgroupShuffleXor(tile_max{{ i }}, {{ mask }}u));",
     "tile_max{{ i }} = tile_max{{ i }};"),
    # the row sum of one lane's share only
    ("row-sum-not-reduced",
     "total{{ i }} = total{{ i }} + subgroupShuffleXor(total{{ i }}, {{ mask }}u);",
     "total{{ i }} = total{{ i }};"),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS])
def test_planted_bugs_fail_validation(
    device: Device, project_copy: Path, old: str, new: str
) -> None:
    edit(project_copy / PREFILL, old, new)
    kernel, entry = render_variant(project_copy, SMALL, _cols(subgroup_lanes(device)))
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "FAIL"


@pytest.mark.parametrize("fraction", [1, 2])
def test_subgroups_numbered_otherwise_store_nan_not_a_wrong_answer(
    device: Device, project_copy: Path, fraction: int
) -> None:
    """WGSL does not say which invocations share a subgroup. The kernel checks its layout and
    stores NaN where the check fails. Simulated here: invocations 3 and width + 3 trade their
    local index, so the first two subgroups each hold one query-group member of the other,
    at the lane number it would have had. The old check (lane == t % subgroup size) passed
    that, and the shuffles summed other queries' shares into rows stored as finite, wrong
    values. Now those rows are NaN and every other row is the kernel's usual answer."""
    width = subgroup_lanes(device)
    traded = f"select(local_id.x, local_id.x ^ {width}u, local_id.x % {width}u == 3u && local_id.x < {2 * width}u)"
    spec = CaseSpec("causal", num_heads=4, num_kv_heads=2, query_len=40, kv_len=40, head_dim=64)
    outputs = []
    for project, local in ((REPO_ROOT, "local_id.x"), (project_copy, traded)):
        if local != "local_id.x":
            edit(project_copy / PREFILL, "let t = local_id.x;", f"let t = {local};")
        kernel, entry = render_variant(project, SMALL, _cols(width // fraction))
        result = KernelRunner(device, kernel, entry).run_case(spec, keep_output=True)
        assert result.output is not None
        outputs.append(result.output.astype(np.float64))
    usual, traded_out = outputs
    assert np.isfinite(usual).all()
    nan = np.isnan(traded_out)
    assert np.array_equal(traded_out[~nan], usual[~nan])
    assert nan.any() and not nan.all()
