"""`doppler-gen doctor`: what this machine can validate kernels on, and whether f16 really works.

Adapter listings alone are not enough: an adapter can advertise shader-f16 and still fail to
compile or miscompute an f16 kernel (old lavapipe did). So the report ends with a live probe
on the adapter the default rule picks. Nothing here raises for a missing feature or adapter:
the doctor's job is to report such problems, not to stop at the first one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from doppler_gen.backends.base import AdapterInfo, Backend, select_adapter
from doppler_gen.errors import DopplerGenError

# Writes four known f16 constants, then four values computed in f16 from an input buffer:
# checks f16 storage loads, stores and arithmetic, not just that `enable f16;` parses.
F16_PROBE_WGSL = """enable f16;

@group(0) @binding(0) var<storage, read> inp: array<f16>;
@group(0) @binding(1) var<storage, read_write> out: array<f16>;

@compute @workgroup_size(4)
fn main(@builtin(local_invocation_index) i: u32) {
    var known = array<f16, 4>(1.5h, -2.25h, 65504.0h, 0.0009765625h);
    out[i] = known[i];
    out[i + 4u] = inp[i] * 2.0h + 0.5h;
}
"""
F16_PROBE_INPUT = np.array([1.0, -0.5, 3.25, 100.0], dtype=np.float16)
F16_PROBE_EXPECTED = np.array(
    [1.5, -2.25, 65504.0, 0.0009765625, 2.5, -0.5, 7.0, 200.5], dtype=np.float16
)

# (report key, label, WebGPU limit name, unit) for the limits that bound attention kernels.
_LIMITS = (
    ("max_workgroup_storage", "workgroup storage", "max-compute-workgroup-storage-size", " B"),
    ("max_invocations", "invocations/workgroup", "max-compute-invocations-per-workgroup", ""),
    ("max_storage_binding", "storage binding", "max-storage-buffer-binding-size", " B"),
    ("max_buffer_size", "buffer", "max-buffer-size", " B"),
)
_FEATURES = (
    ("shader_f16", "shader-f16"),
    ("subgroups", "subgroups"),
    ("timestamp_query", "timestamp-query"),
)


def _has_feature(adapter: AdapterInfo, feature: str) -> bool:
    # Implementations disagree on "subgroup" vs the WebGPU spec's "subgroups".
    names = {feature, feature.rstrip("s")} if feature == "subgroups" else {feature}
    return bool(names & adapter.features)


def _adapter_entry(adapter: AdapterInfo) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "index": adapter.index,
        "name": adapter.name,
        "backend": adapter.backend,
        "type": adapter.adapter_type,
        "vendor": adapter.vendor,
        "driver": adapter.driver,
        "description": adapter.describe(),
    }
    entry.update({key: _has_feature(adapter, name) for key, name in _FEATURES})
    entry.update({key: adapter.limits.get(name) for key, _, name, _ in _LIMITS})
    return entry


def run_f16_probe(backend: Backend, adapter: AdapterInfo) -> dict[str, Any]:
    """Compile and run F16_PROBE_WGSL on ``adapter``; ``ok`` says whether the output matched."""
    result: dict[str, Any] = {"adapter": adapter.index, "ok": False, "detail": ""}
    if not _has_feature(adapter, "shader-f16"):
        result["detail"] = "adapter does not offer shader-f16"
        return result
    device = None
    try:
        device = backend.open_device(adapter, features=["shader-f16"], limits={})
        pipeline = device.compile(F16_PROBE_WGSL, label="doctor_f16_probe")
        source = device.storage_buffer(F16_PROBE_INPUT, label="probe_in")
        target = device.storage_buffer(
            np.zeros_like(F16_PROBE_EXPECTED), read_write=True, label="probe_out"
        )
        device.dispatch(pipeline, {0: source, 1: target}, (1, 1, 1))
        got = np.frombuffer(device.read_buffer(target), dtype=np.float16)
        result["ok"] = bool(np.array_equal(got, F16_PROBE_EXPECTED))
        result["detail"] = "" if result["ok"] else f"wrong values {got.tolist()}"
    except DopplerGenError as exc:
        result["detail"] = str(exc)
    except Exception as exc:  # a doctor reports; the bug shows in the detail
        result["detail"] = f"unexpected {type(exc).__name__}: {exc}"
    finally:
        if device is not None:
            device.close()
    return result


def doctor_report(backend: Backend) -> dict[str, Any]:
    """Everything `doctor` knows about ``backend``, as JSON-able data."""
    report: dict[str, Any] = {
        "backend": backend.name,
        "version": backend.version(),
        "adapters": [],
        "default_adapter": None,
        "default_adapter_error": None,
        "f16_probe": None,
    }
    try:
        adapters = backend.adapters()
    except DopplerGenError as exc:
        report["default_adapter_error"] = str(exc)
        return report
    report["adapters"] = [_adapter_entry(a) for a in adapters]
    try:
        picked = select_adapter(adapters, None)
    except DopplerGenError as exc:
        report["default_adapter_error"] = str(exc)
        return report
    report["default_adapter"] = picked.index
    report["f16_probe"] = run_f16_probe(backend, picked)
    return report


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _format_adapter(entry: dict[str, Any]) -> list[str]:
    features = "  ".join(f"{name}: {_yes(entry[key])}" for key, name in _FEATURES)
    limits = "  ".join(
        f"{label}: {'?' if entry[key] is None else f'{entry[key]}{unit}'}"
        for key, label, _, unit in _LIMITS
    )
    return [f"  {entry['index']}: {entry['description']}", f"      {features}", f"      {limits}"]


def format_doctor(report: dict[str, Any]) -> str:
    """The human-readable form of ``doctor_report``'s result."""
    lines = [f"backend: {report['backend']} — {report['version']}", "adapters:"]
    if not report["adapters"]:
        lines.append("  none")
    for entry in report["adapters"]:
        lines.extend(_format_adapter(entry))
    index = report["default_adapter"]
    if index is None:
        lines.append(f"default adapter: none ({report['default_adapter_error']})")
        return "\n".join(lines)
    picked = next(e for e in report["adapters"] if e["index"] == index)
    lines.append(f"default adapter: {index}: {picked['description']}")
    if picked["type"].lower() == "cpu":
        lines.append("  (a CPU adapter: results are checked, but its timings mean nothing)")
    probe = report["f16_probe"]
    reason = f" ({probe['detail']})" if probe["detail"] else ""
    lines.append(f"f16 kernel compiles and runs: {_yes(probe['ok'])}{reason}")
    return "\n".join(lines)
