"""Streaming prefill with subgroups (templates.attention_streaming_sg in variants.toml).

The shipped variants split head_dim over one 32-lane subgroup (scores = "subgroup_dims"), which
lavapipe (4 to 16 lanes) cannot run: the validator skips them with the reason, and this file
validates the same code path at the widths lavapipe has. A workgroup wider than its subgroup
must store NaN, never a plausible answer. The lane-per-key path (scores = "subgroup"), a
tunable, is validated on workgroups narrower and wider than a subgroup. Planted bugs fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT, edit, render_variant, subgroup_lanes
from gpu_support import adapter_problem

from doppler_gen.backends import Device, get_backend, select_adapter
from doppler_gen.errors import DopplerGenError
from doppler_gen.families.tiled import CaseSpec
from doppler_gen.runtime.runner import KernelRunner
from doppler_gen.runtime.verify import validate_variant
from doppler_gen.validate import open_run_device

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

SHIPPED = [f"attention_streaming_sg_d128{s}" for s in ("", "_f16", "_f16kv")]
STREAMING = "templates/attention_streaming.wgsl.j2"


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    kernels = [render_variant(REPO_ROOT, name)[0] for name in SHIPPED]
    dev = open_run_device(get_backend("wgpu"), kernels, None, "adapter")
    if "subgroups" not in dev.features:
        dev.close()
        pytest.skip("the adapter offers no subgroups")
    yield dev
    dev.close()


def test_on_lavapipe_the_skip_says_a_gpu_is_needed(device: Device) -> None:
    """lavapipe cannot make 32-lane subgroups (16 at most): the reason says so instead of
    suggesting an LP_NATIVE_VECTOR_WIDTH it does not have."""
    if "llvmpipe" not in device.adapter.describe().lower():
        pytest.skip("not lavapipe: the hint is lavapipe's")
    kernel, entry = render_variant(REPO_ROOT, SHIPPED[0])
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "SKIP"
    assert "subgroups are at most 16 wide" in report.reason and "needs a GPU" in report.reason


def test_shipped_variants_record_their_32_lane_subgroup() -> None:
    for name in SHIPPED + [n.replace("_d128", "_d64") for n in SHIPPED]:
        kernel, entry = render_variant(REPO_ROOT, name)
        assert entry["min_subgroup_size"] == 32
        assert "const MIN_SUBGROUP_SIZE: u32 = 32u;" in kernel.text


@pytest.mark.parametrize(
    ("name", "fraction", "groups"),
    [(name, 1, 1) for name in SHIPPED]
    # the head_dim-64 twins: narrow key groups unroll MAX_HEAD_DIM / lanes elements a lane
    + [(SHIPPED[2].replace("_d128", "_d64"), 2, 1), (SHIPPED[1].replace("_d128", "_d64"), 1, 4)],
)
def test_split_head_dim_passes_at_and_below_the_subgroup_width(
    device: Device, name: str, fraction: int, groups: int
) -> None:
    """The shipped kernel with its workgroup as wide as this adapter's subgroups, or half, in
    one key group or four (interleaved keys, merged at the end)."""
    width = subgroup_lanes(device) // fraction
    params = {"workgroup_size": width, "lanes_per_key": width // groups}
    kernel, entry = render_variant(REPO_ROOT, name, params)
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "PASS", [(c.spec.name, c.verdict) for c in report.cases]
    assert len(report.cases) >= 10


def test_split_head_dim_covers_odd_head_dims_and_chunk_tails(device: Device) -> None:
    """head_dim not a multiple of the lanes (a lane's last element past the row), spans that
    end inside a chunk, paged KV."""
    width = subgroup_lanes(device)
    params = {"workgroup_size": width, "lanes_per_key": width // 2, "block_k": 3}
    kernel, entry = render_variant(REPO_ROOT, SHIPPED[2], params)
    runner = KernelRunner(device, kernel, entry)
    cases = [
        CaseSpec("head_dim 6, GQA 2", num_heads=4, num_kv_heads=2, query_len=37, kv_len=50,
                 start_pos=13, head_dim=6, seed=1),
        CaseSpec("head_dim 62, paged", query_len=40, kv_len=90, start_pos=50,
                 kv_layout="paged", page_size=3, head_dim=62, seed=4),
        CaseSpec("head_dim 127, window 9", num_heads=2, num_kv_heads=1, query_len=70,
                 kv_len=70, sliding_window=9, head_dim=127, seed=2),
    ]  # fmt: skip
    for spec in cases:
        assert runner.run_case(spec).passed, spec.name


def test_a_workgroup_wider_than_its_subgroup_is_skipped_and_stores_nan(device: Device) -> None:
    """Twice the adapter's subgroup width: the validator skips it with the measured width, and
    run anyway every output element is NaN (a host that ignores min_subgroup_size gets a loud
    failure, not partial dot products)."""
    width = subgroup_lanes(device)
    params = {"workgroup_size": 2 * width, "lanes_per_key": width}
    kernel, entry = render_variant(REPO_ROOT, SHIPPED[1], params)
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "SKIP"
    assert f"needs at least {2 * width} (min_subgroup_size" in report.reason
    spec = CaseSpec("causal", num_heads=4, num_kv_heads=2, query_len=20, kv_len=20, head_dim=64)
    result = KernelRunner(device, kernel, entry).run_case(spec, keep_output=True)
    assert result.output is not None and np.isnan(result.output).all()
    assert not result.passed


@pytest.mark.parametrize(
    "params",
    [
        # 4 invocations: a chunk is min(subgroup, 4) lanes wide; 3 keys a lane (ragged chunks)
        {"scores": "subgroup", "workgroup_size": 4, "block_k": 3},
        # 64 invocations: several subgroups repeat the chunk's scores, each owns its columns
        {"scores": "subgroup", "workgroup_size": 64, "block_k": 1},
    ],
)
def test_lane_per_key_path_passes_on_narrow_and_wide_workgroups(
    device: Device, params: dict
) -> None:
    for name in (SHIPPED[1], SHIPPED[2]):
        kernel, entry = render_variant(REPO_ROOT, name, {**params, "max_head_dim": 256})
        report = validate_variant(device, kernel, entry, quick=True, seed=0)
        assert report.status == "PASS", (name, [(c.spec.name, c.verdict) for c in report.cases])


MUTATIONS = [
    # split head_dim: a lane's partial dot product taken as the score
    ("score-not-reduced", "dot{{ k }} = dot{{ k }} + subgroupShuffleXor(dot{{ k }}, {{ mask }}u);",
     "dot{{ k }} = dot{{ k }};", "subgroup_dims"),
    # split head_dim: the other key group's sum dropped from the merge
    ("merge-drops-a-group-sum", "l = l * mine + subgroupShuffleXor(l, {{ mask }}u) * other;",
     "l = l * mine;", "subgroup_dims"),
    # split head_dim: the running sum not rescaled when the max grows
    ("sum-not-rescaled", "l = l * correction + {% for k in range(block_k) %}",
     "l = l + {% for k in range(block_k) %}", "subgroup_dims"),
    # lane per key: the weight taken from the neighbouring lane
    ("weight-from-the-wrong-lane", "let p = subgroupShuffle(p{{ k }}, src);",
     "let p = subgroupShuffle(p{{ k }}, (src + 1u) % width);", "subgroup"),
    # lane per key: the chunk's sum is this lane's share only
    ("chunk-sum-not-reduced", "l = l * correction + subgroupAdd(", "l = l * correction + (",
     "subgroup"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "scores"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_planted_bugs_fail_validation(
    device: Device, project_copy: Path, old: str, new: str, scores: str
) -> None:
    edit(project_copy / STREAMING, old, new)
    width = subgroup_lanes(device)
    params = {"scores": scores, "workgroup_size": width, "lanes_per_key": width // 2, "block_k": 2}
    kernel, entry = render_variant(project_copy, SHIPPED[2], params)
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "FAIL"


def _dawn_problem() -> str | None:
    try:
        select_adapter(get_backend("dawn").adapters(), None)
    except DopplerGenError as error:
        return f"no Dawn adapter: {error}"
    return None


@pytest.mark.skipif(_dawn_problem() is not None, reason=str(_dawn_problem()))
def test_split_head_dim_passes_on_tint(device: Device) -> None:
    """Tint's uniformity analysis (Chrome's compiler) accepts the shuffles and the merge: the
    shipped kernel in two key groups at this adapter's subgroup width, through Dawn."""
    width = subgroup_lanes(device)
    params = {"workgroup_size": width, "lanes_per_key": width // 2}
    kernel, entry = render_variant(REPO_ROOT, SHIPPED[0], params)
    dawn = open_run_device(get_backend("dawn"), [kernel], None, "adapter")
    try:
        report = validate_variant(dawn, kernel, entry, quick=True, seed=0)
    finally:
        dawn.close()
    assert report.status == "PASS", (
        report.reason,
        [(c.spec.name, c.verdict) for c in report.cases],
    )
