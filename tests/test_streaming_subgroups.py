"""Streaming prefill with subgroups (templates.attention_streaming_sg in variants.toml).

The shipped variants split head_dim over one 32-lane subgroup (scores = "subgroup_dims"), read
K/V as vec4s (kv_vec4) and reduce-scatter the scores (dot_reduce = "scatter"), which lavapipe
(4 to 16 lanes) cannot run at 32 lanes: the validator skips them with the reason, and this file
validates the same code paths at the widths lavapipe has, the tunable scalar and butterfly paths
beside them. A workgroup wider than its subgroup must store NaN, never a plausible answer. The
lane-per-key path (scores = "subgroup"), a tunable, is validated on workgroups narrower and wider
than a subgroup. Planted bugs fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT, edit, render_variant, subgroup_device, subgroup_lanes
from gpu_support import adapter_problem, open_run_device

from doppler_gen.backends import Device, get_backend, select_adapter
from doppler_gen.errors import DopplerGenError
from doppler_gen.export import export_variant
from doppler_gen.families.tiled import CaseSpec
from doppler_gen.runtime.runner import KernelRunner
from doppler_gen.runtime.verify import validate_variant

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

SHIPPED = [f"attention_streaming_sg_d128{s}" for s in ("", "_f16", "_f16kv")]
STREAMING = "templates/attention_streaming.wgsl.j2"
# the tunable paths beside the shipped one: scalar K/V loads, every lane sums every score
SCALAR = {"kv_vec4": False}
BUTTERFLY = {"kv_vec4": False, "dot_reduce": "butterfly"}


def split_params(name: str, width: int, lanes: int) -> dict:
    """The shipped kernel at `width` invocations in key groups of `lanes`: its block_k, raised
    to `lanes` where the reduce-scatter needs a multiple of the group."""
    shipped = render_variant(REPO_ROOT, name)[1]["params"]["block_k"]
    return {"workgroup_size": width, "lanes_per_key": lanes, "block_k": max(shipped, lanes)}


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    yield from subgroup_device(SHIPPED)


def test_on_lavapipe_the_skip_says_a_gpu_is_needed(device: Device) -> None:
    """lavapipe cannot make 32-lane subgroups (16 at most): the reason says so instead of
    suggesting an LP_NATIVE_VECTOR_WIDTH it does not have."""
    if "llvmpipe" not in device.adapter.describe().lower():
        pytest.skip("not lavapipe: the hint is lavapipe's")
    kernel, entry = render_variant(REPO_ROOT, SHIPPED[0])
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "SKIP"
    assert "subgroups are at most 16 wide" in report.reason and "needs a GPU" in report.reason


def test_shipped_variants_record_their_32_lane_subgroup_and_vec4_head_dims() -> None:
    """min_subgroup_size 32, and K/V bound as vec4s: the manifest's binding type and the
    Doppler export's headDimMultiple tell a host that head_dim must be a multiple of 4."""
    for name in SHIPPED + [n.replace("_d128", "_d64") for n in SHIPPED]:
        kernel, entry = render_variant(REPO_ROOT, name)
        assert entry["min_subgroup_size"] == 32
        assert "const MIN_SUBGROUP_SIZE: u32 = 32u;" in kernel.text
        types = {b["name"]: b["type"] for b in entry["bindings"]}
        assert types["K"].startswith("array<vec4<") and types["V"].startswith("array<vec4<")
        exported = export_variant(name, entry)
        assert exported is not None and exported.fields["variantMetadata"]["headDimMultiple"] == 4


def test_key_groups_are_numbered_by_subgroup_lane_not_by_local_index() -> None:
    """The shuffles address subgroup lanes, so a lane's key group and head-dim slice must come
    from subgroup_invocation_id: WGSL does not promise it equals local_invocation_index, and
    every adapter here (lavapipe, NVIDIA) numbers them alike, so a kernel that mixed the two
    would pass every case and fail on an adapter that does not. No statement may read the
    local id (the one-subgroup check proves the lanes are 0 .. WORKGROUP_SIZE - 1)."""
    for name in SHIPPED + [n.replace("_d128", "_d64") for n in SHIPPED]:
        kernel, _ = render_variant(REPO_ROOT, name)
        code = [line.split("//")[0] for line in kernel.text.splitlines()]
        readers = [line.strip() for line in code if "local_id" in line]
        assert readers == ["@builtin(local_invocation_id) local_id: vec3<u32>,"], (name, readers)
        assert "let g = lane / LANES_PER_KEY;" in kernel.text, name


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
    kernel, entry = render_variant(REPO_ROOT, name, split_params(name, width, width // groups))
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "PASS", [(c.spec.name, c.verdict) for c in report.cases]
    assert len(report.cases) >= 10


ODD_HEAD_DIMS = [
    CaseSpec("head_dim 6, GQA 2", num_heads=4, num_kv_heads=2, query_len=37, kv_len=50,
             start_pos=13, head_dim=6, seed=1),
    CaseSpec("head_dim 62, paged", query_len=40, kv_len=90, start_pos=50,
             kv_layout="paged", page_size=3, head_dim=62, seed=4),
    CaseSpec("head_dim 127, window 9", num_heads=2, num_kv_heads=1, query_len=70,
             kv_len=70, sliding_window=9, head_dim=127, seed=2),
]  # fmt: skip
# vec4 K/V: head_dims that leave some lanes no vec4 (12 = 3 vec4s over 4 or 8 lanes), or a
# partly used last one per lane (60, 124), spans ending inside a chunk, paged KV
VEC4_HEAD_DIMS = [
    CaseSpec("head_dim 12, GQA 2", num_heads=4, num_kv_heads=2, query_len=37, kv_len=50,
             start_pos=13, head_dim=12, seed=1),
    CaseSpec("head_dim 60, paged", query_len=40, kv_len=90, start_pos=50,
             kv_layout="paged", page_size=3, head_dim=60, seed=4),
    CaseSpec("head_dim 124, window 9", num_heads=2, num_kv_heads=1, query_len=70,
             kv_len=70, sliding_window=9, head_dim=124, seed=2),
]  # fmt: skip


@pytest.mark.parametrize(
    ("paths", "block_k", "cases"),
    [
        (BUTTERFLY, 3, ODD_HEAD_DIMS),  # ragged chunks of 3 keys
        # reduce-scatter, two keys a lane after it (head_dim <= 64: a smaller unrolled kernel)
        ({**SCALAR, "max_head_dim": 64}, 2, ODD_HEAD_DIMS[:2]),
        ({}, 1, VEC4_HEAD_DIMS),  # the shipped paths, one key a lane after the scatter
    ],
    ids=["butterfly-scalar", "scatter-scalar", "scatter-vec4"],
)
def test_split_head_dim_covers_odd_head_dims_and_chunk_tails(
    device: Device, paths: dict, block_k: int, cases: list[CaseSpec]
) -> None:
    """head_dim not a multiple of the lanes (a lane's last element or vec4 past the row), spans
    that end inside a chunk, paged KV; block_k is counted in key-group widths for the scatter."""
    width = subgroup_lanes(device)
    lanes = width // 2
    scale = 1 if paths.get("dot_reduce") == "butterfly" else lanes
    params = {**paths, "workgroup_size": width, "lanes_per_key": lanes, "block_k": block_k * scale}
    kernel, entry = render_variant(REPO_ROOT, SHIPPED[2], params)
    runner = KernelRunner(device, kernel, entry)
    for spec in cases:
        assert runner.run_case(spec).passed, spec.name


def test_scatter_refuses_a_block_k_that_is_no_multiple_of_the_group() -> None:
    with pytest.raises(
        DopplerGenError, match="block_k \\(6\\) to be a multiple of lanes_per_key \\(4\\)"
    ):
        render_variant(REPO_ROOT, SHIPPED[0], {"lanes_per_key": 4, "block_k": 6})


def test_a_workgroup_wider_than_its_subgroup_is_skipped_and_stores_nan(device: Device) -> None:
    """Twice the adapter's subgroup width: the validator skips it with the measured width, and
    run anyway every output element is NaN (a host that ignores min_subgroup_size gets a loud
    failure, not partial dot products). The head_dim-64 twin: the case is head_dim 64, and
    d128's unrolling only makes lavapipe compile longer."""
    width = subgroup_lanes(device)
    name = SHIPPED[1].replace("_d128", "_d64")
    kernel, entry = render_variant(REPO_ROOT, name, split_params(name, 2 * width, width))
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


DIMS = {"scores": "subgroup_dims", **BUTTERFLY}
SCATTER = {"scores": "subgroup_dims"}  # the shipped paths: reduce-scatter, vec4 K/V
MUTATIONS = [
    # split head_dim: a lane's partial dot product taken as the score
    ("score-not-reduced", "dot{{ k }} = dot{{ k }} + subgroupShuffleXor(dot{{ k }}, {{ mask }}u);",
     "dot{{ k }} = dot{{ k }};", DIMS),
    # split head_dim: the other key group's sum dropped from the merge
    ("merge-drops-a-group-sum", "l = l * mine + subgroupShuffleXor(l, {{ mask }}u) * other;",
     "l = l * mine;", DIMS),
    # split head_dim: the running sum not rescaled when the max grows
    ("sum-not-rescaled", "l = l * correction + {% for k in range(block_k) %}",
     "l = l + {% for k in range(block_k) %}", DIMS),
    # reduce-scatter: each exchange keeps the half it sends
    ("scatter-keeps-the-sent-half",
     "select({{ ns.cur[i] }}, {{ ns.cur[half + i] }}, upper{{ mask }}) + subgroupShuffleXor",
     "select({{ ns.cur[half + i] }}, {{ ns.cur[i] }}, upper{{ mask }}) + subgroupShuffleXor", SCATTER),
    # reduce-scatter: a key's weight taken from the next lane of the group
    ("scatter-weight-from-the-wrong-lane", "group_first + {{ k // per_lane }}u);",
     "group_first + ({{ k // per_lane + 1 }}u % LANES_PER_KEY));", SCATTER),
    # reduce-scatter: the chunk max is each lane's own (lanes rescale by different maxima)
    ("scatter-max-not-shared", "chunk_max = max(chunk_max, subgroupShuffleXor(chunk_max, {{ mask }}u));",
     "chunk_max = chunk_max;", SCATTER),
    # reduce-scatter: the lanes' partial sums never combined
    ("scatter-sums-not-combined", "l = l + subgroupShuffleXor(l, {{ mask }}u);", "l = l;", SCATTER),
    # vec4 K/V: the elements of each stored vec4 reversed
    ("vec4-store-reversed", "output[q_base + 4u * (r + {{ j * lanes }}u) + {{ e }}u]",
     "output[q_base + 4u * (r + {{ j * lanes }}u) + {{ 3 - e }}u]", SCATTER),
    # lane per key: the weight taken from the neighbouring lane
    ("weight-from-the-wrong-lane", "let p = subgroupShuffle(p{{ k }}, src);",
     "let p = subgroupShuffle(p{{ k }}, (src + 1u) % width);", {"scores": "subgroup"}),
    # lane per key: the chunk's sum is this lane's share only
    ("chunk-sum-not-reduced", "l = l * correction + subgroupAdd(", "l = l * correction + (",
     {"scores": "subgroup"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "paths"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_planted_bugs_fail_validation(
    device: Device, project_copy: Path, old: str, new: str, paths: dict
) -> None:
    edit(project_copy / STREAMING, old, new)
    width = subgroup_lanes(device)
    lanes = width // 2
    # the head_dim-64 kernel and short chunks: lavapipe compiles the unrolled loops per test
    block_k = lanes if paths is SCATTER else 2
    params = {**paths, "workgroup_size": width, "lanes_per_key": lanes, "block_k": block_k}
    kernel, entry = render_variant(project_copy, SHIPPED[2].replace("_d128", "_d64"), params)
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
    """Tint's uniformity analysis (Chrome's compiler) accepts the shuffles and the merge: a
    shipped kernel in two key groups at this adapter's subgroup width, through Dawn. The
    head_dim-64 twin has the same code; lavapipe compiles it in 3.6 s instead of 37 s (half the
    elements a lane unrolls), and the d128 kernels run at these widths on naga above."""
    width = subgroup_lanes(device)
    name = SHIPPED[0].replace("_d128", "_d64")
    kernel, entry = render_variant(REPO_ROOT, name, split_params(name, width, width // 2))
    dawn = open_run_device(get_backend("dawn"), [kernel], None, "adapter")
    try:
        report = validate_variant(dawn, kernel, entry, quick=True, seed=0)
    finally:
        dawn.close()
    assert report.status == "PASS", (
        report.reason,
        [(c.spec.name, c.verdict) for c in report.cases],
    )
