"""The Dawn (Tint) backend, and validating on both WebGPU implementations (`--backend all`).

Chrome compiles WGSL with Tint, Firefox with naga; these tests check Dawn's specifics (Tint's
text, Dawn's own limit checks, its version and names), that `--backend all` compares the two
implementations case by case, and that a missing pydawn only affects the Dawn backend. What
every backend must do is in tests/test_backend_contract.py. The first group needs no adapter
(recorded Tint text, synthetic outputs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    REPO_ROOT,
    copy_project,
    doppler_gen_command,
    line_of,
    representatives,
    run_cli,
)
from gpu_support import adapter_problem, dawn_problem

from doppler_gen.backends import (
    WEBGPU_DEFAULT_LIMITS,
    AdapterInfo,
    Backend,
    get_backend,
    select_adapter,
)
from doppler_gen.backends.dawn import (
    F16_REFUSED,
    INSTALL_HINT,
    feature_name,
    limit_field,
    limit_name,
    one_line,
    parse_diagnostics,
)
from doppler_gen.config import load_project
from doppler_gen.families.attention import CaseSpec
from doppler_gen.runtime.runner import CaseResult
from doppler_gen.runtime.session import static_skip
from doppler_gen.tolerance import Verdict
from doppler_gen.validate import (
    CrossRun,
    ValidationRun,
    VariantReport,
    compare_variant,
    format_report,
    output_difference,
    validate,
    validate_all,
)

SMALL = "attention_small_f16kv"

# --------------------------------------------------------------------------- Tint's text

# Recorded from pydawn 0.3.0 (Dawn of Chromium 133) on lavapipe: a shader-module error whose
# notes point at other lines, a parse error, and a pipeline-creation limit error (no location).
TINT_UNIFORMITY = (
    "Error while parsing WGSL: :6:9 error: 'workgroupBarrier' must only be called from uniform "
    "control flow\n        workgroupBarrier();\n        ^^^^^^^^^^^^^^^^\n\n"
    ":5:5 note: control flow depends on possibly non-uniform value\n    if (dst[i] > 0.0) {\n"
    "    ^^\n\n:5:13 note: builtin 'i' of 'main' may be non-uniform\n    if (dst[i] > 0.0) {\n"
    "            ^\n\n\n - While validating [ShaderModuleDescriptor]\n"
    " - While calling [Device].CreateShaderModule([ShaderModuleDescriptor]).\n"
)
TINT_PARSE = (
    "Error while parsing WGSL: :5:9 error: cannot initialize 'let' of type 'f32' with value of "
    "type 'u32'\n    let x: f32 = 1u;\n        ^\n\n\n"
    " - While validating [ShaderModuleDescriptor]\n"
    " - While calling [Device].CreateShaderModule([ShaderModuleDescriptor]).\n"
)
DAWN_STORAGE = (
    "The total use of workgroup storage (49152 bytes) is larger than the maximum allowed (16384 "
    'bytes).\n - While validating compute stage ([ShaderModule "attention"], entryPoint: "main").'
    '\n - While calling [Device].CreateComputePipeline([ComputePipelineDescriptor "attention"]).\n'
)


def test_parse_tint_error_then_notes_with_lines_and_columns() -> None:
    assert parse_diagnostics(TINT_UNIFORMITY) == [
        (6, 9, "'workgroupBarrier' must only be called from uniform control flow"),
        (5, 5, "note: control flow depends on possibly non-uniform value"),
        (5, 13, "note: builtin 'i' of 'main' may be non-uniform"),
    ]
    assert parse_diagnostics(TINT_PARSE) == [
        (5, 9, "cannot initialize 'let' of type 'f32' with value of type 'u32'")
    ]


def test_one_line_drops_source_echoes_carets_and_call_context() -> None:
    assert one_line(TINT_PARSE) == "cannot initialize 'let' of type 'f32' with value of type 'u32'"
    assert one_line(TINT_UNIFORMITY).startswith(
        "'workgroupBarrier' must only be called from uniform control flow; note: control flow"
    )
    assert one_line(DAWN_STORAGE) == (
        "The total use of workgroup storage (49152 bytes) is larger than the maximum allowed "
        "(16384 bytes)."
    )
    assert parse_diagnostics(DAWN_STORAGE) == []


def test_feature_and_limit_names_follow_the_webgpu_spec() -> None:
    assert feature_name("WGPUFeatureName_ShaderF16") == "shader-f16"
    assert feature_name("WGPUFeatureName_TimestampQuery") == "timestamp-query"
    assert feature_name("WGPUFeatureName_Subgroups") == "subgroups"
    assert feature_name("WGPUFeatureName_DawnNative") == "dawn-native"
    assert limit_field("max-texture-dimension-1d") == "maxTextureDimension1D"
    assert limit_field("max-compute-workgroup-storage-size") == "maxComputeWorkgroupStorageSize"
    for name in WEBGPU_DEFAULT_LIMITS:
        assert limit_name(limit_field(name)) == name


def test_every_webgpu_limit_is_a_field_of_dawns_limits_struct() -> None:
    webgpu = pytest.importorskip("pydawn.webgpu", reason="pydawn is not installed")
    fields = {name for name, _ in webgpu.WGPULimits._fields_}
    assert {limit_field(name) for name in WEBGPU_DEFAULT_LIMITS} <= fields


# --------------------------------------------------------------------------- skips and agreement


class _FakeDevice:
    """Just what static_skip reads."""

    def __init__(self, adapter_features: set[str], notes: dict[str, str] | None = None) -> None:
        self.adapter = AdapterInfo(
            0,
            "NVIDIA H200",
            "Vulkan",
            "DiscreteGPU",
            "nvidia",
            "",
            features=frozenset(adapter_features),
        )
        self.features: frozenset[str] = frozenset()
        self.limits = {"max-compute-workgroup-storage-size": 49152}
        if notes is not None:
            self.feature_notes = notes


def test_skip_reason_says_why_the_feature_is_missing() -> None:
    entry = {
        "requires": ["shader-f16"],
        "workgroup_storage_bytes": 0,
        "workgroup_size_default": [64, 1, 1],
    }
    opened_without = static_skip(entry, _FakeDevice({"shader-f16"}))[0]  # type: ignore[arg-type]
    assert opened_without == "needs shader-f16; the device was opened without it"
    refused = static_skip(entry, _FakeDevice(set(), {"shader-f16": F16_REFUSED}))[0]  # type: ignore[arg-type]
    assert refused == f"needs shader-f16: {F16_REFUSED}"
    assert "pydawn 0.3" in refused
    lacking = static_skip(entry, _FakeDevice(set()))[0]  # type: ignore[arg-type]
    assert lacking == "needs shader-f16; adapter NVIDIA H200 does not offer shader-f16"


def _report(
    name: str, status: str, outputs: dict[CaseSpec, np.ndarray], tolerance: float = 1e-3
) -> VariantReport:
    cases = [
        CaseResult(spec, Verdict(True, 0.0, 0.0, tolerance, (0,), 0, "test")) for spec in outputs
    ]
    return VariantReport(name, status, cases=cases)


def test_outputs_agree_within_the_case_tolerance_and_differ_beyond_it() -> None:
    spec = CaseSpec("c")
    a = {spec: np.array([1.0, 2.0])}
    near = {spec: np.array([1.0, 2.0 + 5e-4])}
    far = {spec: np.array([1.0, 2.0 + 5e-3])}
    agree = compare_variant(
        "v", [_report("v", "PASS", a), _report("v", "PASS", near)], [a, near], ["wgpu", "dawn"]
    )
    assert (agree.status, agree.compared) == ("AGREE", 1)
    assert agree.max_abs_diff == pytest.approx(5e-4) and agree.worst_ratio == pytest.approx(0.5)
    differ = compare_variant(
        "v", [_report("v", "PASS", a), _report("v", "PASS", far)], [a, far], ["wgpu", "dawn"]
    )
    assert differ.status == "DIFFER" and "|wgpu - dawn| = 0.005" in differ.reason


def test_nan_in_one_output_only_is_an_infinite_difference() -> None:
    assert output_difference(np.array([1.0, np.nan]), np.array([1.0, 1.0])) == np.inf
    assert output_difference(np.array([1.0, np.nan]), np.array([1.0, np.nan])) == 0.0
    assert output_difference(np.zeros(2), np.zeros(3)) == np.inf


def _run(backend: str, *variants: VariantReport) -> ValidationRun:
    return ValidationRun(backend, "adapter", "adapter", 0, True, list(variants), 0.0)


def test_a_skip_on_one_backend_is_not_a_pass() -> None:
    spec = CaseSpec("c")
    out = {spec: np.ones(2)}
    passed = _report("f16", "PASS", out)
    skipped = VariantReport("f16", "SKIP", f"needs shader-f16: {F16_REFUSED}")
    f32 = _report("f32", "PASS", out)
    agreements = [
        compare_variant("f16", [passed, skipped], [out, {}], ["wgpu", "dawn"]),
        compare_variant("f32", [f32, f32], [out, out], ["wgpu", "dawn"]),
    ]
    assert agreements[0].status == "-" and agreements[0].reason == "not compared: dawn SKIP"
    cross = CrossRun([_run("wgpu", passed, f32), _run("dawn", skipped, f32)], agreements, 0.0)
    text = format_report(cross)
    assert "1 of 2 variants passed on every backend and agreed" in text
    assert "not compared: dawn SKIP" in text and F16_REFUSED in text
    assert cross.ok  # skips are reported, not failures...
    only_skips = CrossRun([_run("wgpu", passed), _run("dawn", skipped)], agreements[:1], 0.0)
    assert not only_skips.ok  # ...but nothing compared proves nothing
    document = json.loads(json.dumps(cross.as_dict()))
    assert document["backends"] == ["wgpu", "dawn"]
    assert document["runs"]["dawn"]["variants"][0]["status"] == "SKIP"
    assert [a["status"] for a in document["agreement"]] == ["-", "AGREE"]


# --------------------------------------------------------------------------- without pydawn

# Makes `import pydawn` fail in a child process, as on a machine without the [dawn] extra.
NO_PYDAWN = 'import sys\nsys.modules["pydawn"] = None\n'


@pytest.fixture(scope="module")
def without_pydawn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    hook = tmp_path_factory.mktemp("no_pydawn")
    (hook / "sitecustomize.py").write_text(NO_PYDAWN)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _run_without_pydawn(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*doppler_gen_command(), "--root", str(REPO_ROOT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_missing_pydawn_fails_dawn_with_one_install_line(without_pydawn: dict[str, str]) -> None:
    for backend in ("dawn", "all"):
        result = _run_without_pydawn(without_pydawn, "validate", "--backend", backend, "--quick")
        assert result.returncode == 2, result.stderr
        assert result.stderr == f"error: {INSTALL_HINT}\n"
        assert result.stdout == ""
    doctor = _run_without_pydawn(without_pydawn, "doctor", "--backend", "dawn")
    assert doctor.returncode == 2, doctor.stderr
    # it named a driver as the fix, after the report had said pydawn was missing
    assert doctor.stderr == f"error: no WebGPU backend could be loaded (dawn: {INSTALL_HINT})\n"


def test_a_pydawn_without_a_needed_symbol_is_an_environment_error(tmp_path: Path) -> None:
    """Another pydawn release's API was reported as a bug in doppler-gen (exit 3)."""
    package = tmp_path / "pydawn"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "webgpu.py").write_text("x = 1\n")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    for args in (
        ("validate", "--backend", "dawn", "--quick", "attention_decode_tiered_f16"),
        ("doctor", "--backend", "dawn"),
    ):
        result = _run_without_pydawn(env, *args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr
        assert "this pydawn has no WGPUInstanceDescriptor" in result.stdout + result.stderr
        assert "Vulkan driver" not in result.stderr  # the fix is pydawn, not a driver


@pytest.mark.gpu
@pytest.mark.skipif(
    adapter_problem() is not None or dawn_problem() is not None,
    reason=str(adapter_problem() or dawn_problem()),
)
def test_a_symbol_missing_after_the_device_opened_ends_the_run(tmp_path: Path) -> None:
    """Hit while a variant ran, it was that variant's FAIL (exit 1): the kernel was blamed
    for the installation."""
    (tmp_path / "sitecustomize.py").write_text(
        "from pydawn import webgpu\ndel webgpu.wgpuCommandEncoderCopyBufferToBuffer\n"
    )
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    result = _run_without_pydawn(env, "validate", "--backend", "dawn", "--quick", "rmsnorm")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(
        "error: this pydawn has no wgpuCommandEncoderCopyBufferToBuffer"
    ), result.stderr
    assert "FAIL" not in result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
def test_missing_pydawn_leaves_wgpu_and_doctor_working(without_pydawn: dict[str, str]) -> None:
    result = _run_without_pydawn(
        without_pydawn, "validate", "--backend", "wgpu", "--quick", "attention_decode_tiered_f16kv"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 0 failed" in result.stdout
    doctor = _run_without_pydawn(without_pydawn, "doctor", "--json")
    assert doctor.returncode == 0, doctor.stderr
    reports = {r["backend"]: r for r in json.loads(doctor.stdout)["backends"]}
    assert reports["wgpu"]["available"] and reports["wgpu"]["f16_probe"] is not None
    assert reports["dawn"] == {"backend": "dawn", "available": False, "error": INSTALL_HINT}


# --------------------------------------------------------------------------- on an adapter


needs_dawn = pytest.mark.skipif(dawn_problem() is not None, reason=str(dawn_problem()))
needs_both = pytest.mark.skipif(
    adapter_problem() is not None or dawn_problem() is not None,
    reason=str(adapter_problem() or dawn_problem()),
)


@pytest.fixture(scope="module")
def backend() -> Backend:
    if dawn_problem():
        pytest.skip(str(dawn_problem()))
    return get_backend("dawn")


@pytest.fixture(scope="module")
def adapter(backend: Backend) -> AdapterInfo:
    return select_adapter(backend.adapters(), None)


@pytest.mark.gpu
def test_adapters_speak_webgpu_names(backend: Backend, adapter: AdapterInfo) -> None:
    assert backend.version().startswith("pydawn 0.3.0 (Dawn of Chromium 133)")
    assert adapter.backend == "Vulkan"
    assert "max-compute-workgroup-storage-size" in adapter.limits
    assert not any(name.startswith("WGPU") for name in adapter.features)


@pytest.mark.gpu
@needs_dawn
def test_webgpu_default_limits_are_enforced_by_dawn_itself() -> None:
    """With --storage-overrun the 48 KiB tile reaches Dawn, which refuses it with its own words."""
    run = validate(
        load_project(REPO_ROOT),
        ("attention",),
        backend_name="dawn",
        limits="webgpu-default",
        quick=True,
        storage_overrun=True,
    )
    report = run.variants[0]
    assert report.status == "SKIP" and not report.cases
    assert report.reason.startswith("needs 49152 B workgroup storage; limit 16384, enforced")
    assert (
        "The total use of workgroup storage (49152 bytes) is larger than the maximum allowed "
        "(16384 bytes)."
    ) in report.reason


@pytest.mark.gpu
@needs_both
def test_both_backends_agree_on_a_variant_of_every_kernel_body() -> None:
    project = load_project(REPO_ROOT)
    names = representatives(project)
    cross = validate_all(project, names, quick=True, storage_overrun=True)
    text = format_report(cross)
    assert cross.ok, text
    wgpu, dawn = cross.runs
    assert (wgpu.backend, dawn.backend) == ("wgpu", "dawn")
    assert [v.name for v in wgpu.variants] == list(names)
    narrow = {
        v.name for v in wgpu.variants if v.status == "SKIP" and "(min_subgroup_size" in v.reason
    }
    assert all(v.status == "PASS" and v.cases for v in wgpu.variants if v.name not in narrow), text
    storage = re.compile(r"workgroup storage \(\d+ bytes\) is larger than the maximum allowed")
    compared = []
    for report, agreement in zip(dawn.variants, cross.agreements, strict=True):
        if report.status == "SKIP":
            # Only what Dawn itself refuses may skip: tiles past the adapter's limit (lavapipe:
            # 32 KiB), or f16 where pydawn gives no shader-f16 (the H200); and a variant whose
            # subgroups are wider than the adapter's, on both (tests/test_streaming_subgroups.py
            # runs its code path on Tint at lavapipe's width)
            assert (
                storage.search(report.reason)
                or F16_REFUSED in report.reason
                or (report.name in narrow and "(min_subgroup_size" in report.reason)
            ), report.reason
            assert agreement.status == "-" and "dawn SKIP" in agreement.reason
            continue
        assert report.status == "PASS" and report.cases, (report.name, report.reason)
        assert agreement.status == "AGREE" and agreement.compared == len(report.cases), text
        assert agreement.worst_ratio is not None and agreement.worst_ratio <= 1.0
        compared.append(report.name)
    assert compared, text


# Constructs exactly one implementation rejects, planted into the tiled template after TILED_ANCHOR:
# (id, planted line, rejecting backend, its message). Both are harmless at run time.
TILED = "templates/attention.wgsl.j2"
TILED_ANCHOR = "    let thread_idx = local_id.x;\n"
F32_SMALL_VARIANT = """
[[variant]]
name = "attention_small_f32"
template = "attention"
output = "generated/attention_small_f32.wgsl"
params = { block_size = 16 }
"""

DIVERGENT = [
    # Tint's uniformity analysis rejects a barrier under a non-uniform condition (as Chrome
    # would); naga 0.32 has no uniformity analysis. Every invocation takes the branch anyway.
    (
        "barrier-in-non-uniform-flow",
        "    if (thread_idx != 0xffffffffu) { workgroupBarrier(); }\n",
        "dawn",
        "'workgroupBarrier' must only be called from uniform control flow",
    ),
    # naga 0.32 does not implement @diagnostic on a compound statement (as Firefox would
    # reject it); Tint does. The block is empty.
    (
        "diagnostic-attribute-on-block",
        "    @diagnostic(off, derivative_uniformity) { }\n",
        "wgpu",
        "`@diagnostic(…)` attribute(s) not yet implemented",
    ),
]


@pytest.mark.gpu
@needs_both
@pytest.mark.parametrize(
    ("planted", "rejecter", "message"), [d[1:] for d in DIVERGENT], ids=[d[0] for d in DIVERGENT]
)
def test_a_construct_one_implementation_rejects_is_reported_at_the_template_line(
    tmp_path: Path, planted: str, rejecter: str, message: str
) -> None:
    root = copy_project(tmp_path / "p")
    # an all-f32 tiled variant inside WebGPU's default limits: runs on both implementations on
    # any adapter (pydawn 0.3 has no shader-f16 on some GPUs, e.g. the H200)
    with (root / "variants.toml").open("a") as config:
        config.write(F32_SMALL_VARIANT)
    template = root / TILED
    text = template.read_text()
    assert TILED_ANCHOR in text, f"anchor gone from {TILED}"
    template.write_text(text.replace(TILED_ANCHOR, TILED_ANCHOR + planted, 1))
    line = line_of(template.read_text(), planted.strip())
    # a template being edited: validate the fresh render (generated/ is not regenerated)
    result = run_cli(
        root,
        "validate",
        "--backend",
        "all",
        "--quick",
        "--from-templates",
        "--json",
        "attention_small_f32",
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    accepter = next(b for b in report["backends"] if b != rejecter)
    accepted = report["runs"][accepter]["variants"][0]
    rejected = report["runs"][rejecter]["variants"][0]
    assert accepted["status"] == "PASS", accepted["reason"]
    assert rejected["status"] == "FAIL"
    assert rejected["reason"].startswith(f"compile error: {TILED}:{line} (generated/")
    assert message in rejected["reason"]
    assert report["agreement"][0]["reason"] == f"not compared: {rejecter} FAIL"


@pytest.mark.gpu
@needs_dawn
def test_doctor_reports_both_backends() -> None:
    result = run_cli(REPO_ROOT, "doctor")
    assert result.exit_code == 0, result.output
    assert "backend: wgpu — wgpu-py" in result.stdout
    assert "backend: dawn — pydawn 0.3.0 (Dawn of Chromium 133)" in result.stdout
    assert result.stdout.count("f16 kernel compiles and runs:") == 2


def test_unknown_backend_is_a_usage_error() -> None:
    result = run_cli(REPO_ROOT, "validate", "--backend", "naga")
    assert result.exit_code == 2 and "'naga' is not one of" in result.stderr
