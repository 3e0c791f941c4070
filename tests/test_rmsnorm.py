"""The rmsnorm family: its reference by hand, its interface checks, validation and bench."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT, edit, run_cli
from gpu_support import adapter_problem

from doppler_gen.config import load_project
from doppler_gen.errors import InterfaceError
from doppler_gen.families import get_family
from doppler_gen.families.base import CaseData
from doppler_gen.families.rmsnorm import RmsNormSpec
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.outputs import plan
from doppler_gen.render import Renderer
from doppler_gen.shapes import parse_shape
from doppler_gen.validate import validate

FAMILY = get_family("rmsnorm")
needs_adapter = pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))


def _entry(name: str = "rmsnorm") -> dict:
    project = load_project(REPO_ROOT)
    kernel = Renderer(project).render(project.variant(name))
    return variant_entry(kernel, parse_kernel(kernel))


def test_reference_by_hand() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    weight = np.array([1.0, 2.0], np.float32)
    data = CaseData(
        RmsNormSpec("hand"),
        {"size": 2, "num_rows": 2, "eps": 0.5, "_pad": 0},
        {"input": x, "weight": weight},
        {"x": x, "weight": weight},
    )
    y = FAMILY.reference(data, _entry())
    rms = math.sqrt((9 + 16) / 2 + 0.5)  # eps 0.5 is exact in f32
    assert y[0] == pytest.approx([3 / rms, 8 / rms], rel=1e-15)
    assert list(y[1]) == [0.0, 0.0]  # eps alone keeps an all-zero row finite


def test_inputs_are_rounded_to_the_storage_dtype_before_the_reference_sees_them() -> None:
    entry = _entry("rmsnorm_f16")
    spec = FAMILY.specs(entry, "default", 0)[5]
    data = FAMILY.build(spec, entry)
    assert data.buffers["input"].dtype == np.float16 and data.buffers["weight"].dtype == np.float16
    assert data.reference_inputs["x"] is data.buffers["input"]


def test_manifest_entry_and_roles() -> None:
    entry = _entry("rmsnorm_f16")
    assert entry["family"] == "rmsnorm" and entry["metadata"]["dtype"] == "f16"
    assert entry["metadata"]["dispatch"] == "num_rows"
    assert {b["name"]: b["role"] for b in entry["bindings"]} == {
        "u": "uniform",
        "input": "input",
        "weight": "input",
        "output": "output",
    }
    assert entry["workgroup_storage_bytes"] == 4 * 256
    assert [f["name"] for f in entry["uniforms"]["fields"]] == ["size", "num_rows", "eps", "_pad"]


def test_a_dtype_the_wgsl_does_not_bind_is_an_interface_error(project_copy: Path) -> None:
    edit(
        project_copy / "templates/rmsnorm.wgsl.j2",
        "var<storage, read> weight: array<{{ dtype }}>",
        "var<storage, read> weight: array<f32>",
    )
    with pytest.raises(
        InterfaceError, match="dtype = 'f16' but the WGSL binds weight as array<f32>"
    ):
        plan(load_project(project_copy))


def test_shapes_and_constraints() -> None:
    shape = parse_shape("rmsnorm:size=1024")
    assert shape.label == "rmsnorm:rows=2048,size=1024" and parse_shape(shape.label) == shape
    assert shape.flops() == 4 * 2048 * 1024
    entry = _entry()
    assert FAMILY.constraints(entry, {"WORKGROUP_SIZE": 128}) is None
    assert "power of two" in FAMILY.constraints(entry, {"WORKGROUP_SIZE": 96})
    assert "<= MAX_WORKGROUP_SIZE 256" in FAMILY.constraints(entry, {"WORKGROUP_SIZE": 512})


@needs_adapter
@pytest.mark.gpu
def test_both_variants_pass_every_tier_on_the_adapter() -> None:
    run = validate(load_project(REPO_ROOT), ("rmsnorm", "rmsnorm_f16"), tier="large")
    assert run.ok, [(v.name, v.status, v.reason) for v in run.variants]
    statuses = {v.name: v.status for v in run.variants}
    assert statuses["rmsnorm"] == "PASS"
    assert all(len(v.cases) >= 62 for v in run.variants if v.status == "PASS")


@needs_adapter
@pytest.mark.gpu
def test_bench_on_the_cpu_adapter_omits_torch_cleanly(tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    result = run_cli(
        REPO_ROOT,
        "bench",
        "rmsnorm",
        "--allow-cpu",
        "--adapter",
        "cpu",
        "--shape",
        "rmsnorm:rows=8,size=512",
        "--repeats",
        "20",
        "--warmup",
        "1",
        "--copy-mib",
        "0",
        "--output",
        str(output),
    )
    assert result.exit_code == 0, result.output
    document = json.loads(output.read_text(encoding="utf-8"))
    (row,) = document["rows"]
    assert row["status"] == "ok" and row["timing"]["runs"] == 20
    assert row["bytes"] == 4 * (8 * 512 + 512 + 8 * 512)  # input + weight + output, f32
    assert row["flops"] == 4 * 8 * 512
    try:
        import torch  # noqa: F401
    except ImportError:
        assert row["baseline"] is None and "torch is not importable" in document["baseline_status"]


def test_tune_reports_a_candidate_breaking_the_family_constraint_without_running_it() -> None:
    from doppler_gen.runtime.measure import Settings
    from doppler_gen.tune import Candidate, CandidateRenderer, evaluate

    project = load_project(REPO_ROOT)
    renderer = CandidateRenderer(project, project.variant("rmsnorm"))
    candidate = Candidate({}, {"WORKGROUP_SIZE": 96}, {"WORKGROUP_SIZE": 256})
    result = evaluate(
        None,  # never touched: the constraint refuses first
        renderer,
        candidate,
        "WORKGROUP_SIZE=96",
        parse_shape("rmsnorm:rows=4,size=64"),
        Settings(repeats=20, warmup=0),
        _entry()["metadata"],
        lambda: pytest.fail("a refused candidate must not open a device"),
    )
    assert result.validation == "invalid" and result.row is None
    assert result.reason == (
        "constraint: WORKGROUP_SIZE 96 must be a power of two <= MAX_WORKGROUP_SIZE 256"
    )
