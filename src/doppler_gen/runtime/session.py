"""Adapter choice, device opening and static skips: shared by validate, bench and tune."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from doppler_gen.backends import AdapterInfo, Backend, Device, effective_limits, select_adapter
from doppler_gen.backends.base import process_spent
from doppler_gen.errors import (
    BackendUnavailable,
    DopplerGenError,
    GpuTimeout,
    ShaderCompileError,
)

# Progress reports: (what is being done, how many cases it just finished; 0 for a status line).
Progress = Callable[[str, int], None]


class CpuAdapterRefused(DopplerGenError):
    """The chosen adapter is a CPU rasteriser: timing it would mislead anyone choosing GPU code."""


def refuse_cpu(adapter: AdapterInfo, allow_cpu: bool, command: str) -> None:
    """Refuse a CPU adapter before anything runs, unless the user accepted CPU numbers."""
    if adapter.is_cpu and not allow_cpu:
        raise CpuAdapterRefused(
            f"{command} measures GPUs; {adapter.name} is a CPU adapter — timings would say nothing "
            f"about GPU performance; pass --allow-cpu to run anyway (results labelled CPU)"
        )


def choose_adapter(
    backend: Backend, want: str | None, allow_cpu: bool = True, command: str = ""
) -> AdapterInfo:
    """The adapter ``want`` names (or the default rule's); a CPU one only if ``allow_cpu``."""
    adapter = select_adapter(backend.adapters(), want)
    refuse_cpu(adapter, allow_cpu, command)
    return adapter


def open_device(
    backend: Backend,
    adapter: AdapterInfo,
    requires: Iterable[str],
    limits: str,
    *,
    timing: bool = False,
) -> Device:
    """A device with every required feature the adapter has (and timestamps when ``timing``).

    Features the adapter lacks are left out: the variants needing them are skipped with the
    reason (``static_skip``), not the whole run.
    """
    spent = process_spent()
    if spent:  # bench and tune run in one process: later rows fail at once, never hang
        raise GpuTimeout(
            f"not run: an earlier kernel of this run did not finish ({spent}) and may still "
            "hold the GPU; no device is opened after that"
        )
    wanted = {f for f in requires if f in adapter.features}
    if timing:
        if "timestamp-query" not in adapter.features:
            raise BackendUnavailable(
                f"{adapter.short()} does not offer timestamp-query; timing needs GPU timestamps"
            )
        wanted.add("timestamp-query")
    return backend.open_device(
        adapter, features=sorted(wanted), limits=effective_limits(adapter, limits)
    )


def static_skip(
    entry: Mapping[str, Any], device: Device, *, storage_overrun: bool = False
) -> tuple[str | None, str]:
    """(why the device cannot run this variant, or None; a note to show when it runs anyway)."""
    missing = [f for f in entry["requires"] if f not in device.features]
    if missing:
        return _missing_features(missing, device), ""
    need = entry.get("min_subgroup_size")
    if need:
        width = subgroup_width(device)
        if width is not None and width < need:
            return (
                f"the adapter's subgroups are {width} invocations wide (measured); the variant "
                f"needs at least {need} (min_subgroup_size: narrower subgroups store NaN)"
                f"{lavapipe_width_hint(device, need)}"
            ), ""
    storage, limit = storage_need(entry, device)
    if storage > limit:
        if not storage_overrun:
            return f"needs {storage} B workgroup storage; limit {limit}", ""
        note = (
            f"ran beyond the device limit: {storage} B workgroup storage > {limit} B "
            "(--storage-overrun)"
        )
        return None, note
    invocations = max(pass_invocations(p) for p in entry.get("passes") or [entry])
    limit = device.limits.get("max-compute-invocations-per-workgroup", 256)
    if invocations > limit:
        return f"needs {invocations} invocations per workgroup; limit {limit}", ""
    return None, ""


# One invocation per lane of a 256-invocation workgroup records the subgroup size it sees.
_SUBGROUP_PROBE = """enable subgroups;
@group(0) @binding(0) var<storage, read_write> sizes: array<u32>;
@compute @workgroup_size(256, 1, 1)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) size: u32) {
    sizes[lid] = size;
}
"""
_subgroup_widths: dict[str, int | None] = {}


LAVAPIPE_MAX_VECTOR_BITS = 512  # LP_NATIVE_VECTOR_WIDTH's largest value: 16-lane subgroups


def lavapipe_width_hint(device: Device, need: int) -> str:
    """How to get ``need``-wide subgroups from lavapipe, whose subgroups are as wide as its
    SIMD vectors (LP_NATIVE_VECTOR_WIDTH bits / 32; any CPU can emulate 512 bits), or that it
    cannot (wider than 16 lanes): '' on other adapters."""
    if "llvmpipe" not in device.adapter.describe().lower():
        return ""
    if 32 * need > LAVAPIPE_MAX_VECTOR_BITS:
        return (
            f"; lavapipe's subgroups are at most {LAVAPIPE_MAX_VECTOR_BITS // 32} wide "
            f"(LP_NATIVE_VECTOR_WIDTH={LAVAPIPE_MAX_VECTOR_BITS}): this variant needs a GPU"
        )
    return f"; lavapipe has {need}-wide subgroups with LP_NATIVE_VECTOR_WIDTH={32 * need}"


def subgroup_width(device: Device) -> int | None:
    """The narrowest subgroup a 256-invocation compute pipeline gets on ``device`` (None without
    the subgroups feature). Measured, because wgpu-py's adapter info reports placeholder sizes;
    a driver may pick another width for another pipeline, so a variant that needs a minimum
    also guards itself (it stores NaN where its subgroups are too narrow)."""
    key = device.adapter.describe()
    if key not in _subgroup_widths:
        width = None
        if "subgroups" in device.features:
            pipeline = device.compile(_SUBGROUP_PROBE, label="subgroup-width probe")
            sizes = device.storage_buffer(bytes(4 * 256), read_write=True, label="sizes")
            device.dispatch(pipeline, {0: sizes}, (1, 1, 1))
            width = int(np.frombuffer(device.read_buffer(sizes), dtype=np.uint32).min())
        _subgroup_widths[key] = width
    return _subgroup_widths[key]


def pass_invocations(record: Mapping[str, Any]) -> int:
    """Invocations per workgroup of one pass with its recorded pipeline constants: a variant
    that sets WORKGROUP_SIZE = 1024 needs 1024, whatever the WGSL default."""
    constants = record.get("pipeline_constants", {})
    invocations = 1
    for expression, default in zip(
        record["workgroup_size"], record["workgroup_size_default"], strict=True
    ):
        invocations *= int(constants.get(str(expression), default))
    return invocations


def _missing_features(missing: list[str], device: Device) -> str:
    """Why the device lacks features: opened without them, or the adapter never offered them.

    A backend may explain an absence (``feature_notes``): pydawn 0.3 offers no shader-f16 on
    the H200 where wgpu does, and "the device was opened without it" would hide that.
    """
    needs = f"needs {', '.join(missing)}"
    adapter = getattr(device, "adapter", None)
    absent = [f for f in missing if adapter is not None and f not in adapter.features]
    if not absent:
        return f"{needs}; the device was opened without it"
    notes: dict[str, str] = getattr(device, "feature_notes", {})
    explained = [notes[f] for f in absent if f in notes]
    if explained:
        return f"{needs}: {'; '.join(dict.fromkeys(explained))}"
    return f"{needs}; adapter {adapter.name} does not offer {', '.join(absent)}"


def storage_need(entry: Mapping[str, Any], device: Device) -> tuple[int, int]:
    """(workgroup storage the largest pass declares, the device's limit) in bytes."""
    limit = device.limits.get("max-compute-workgroup-storage-size", 16384)
    return entry["workgroup_storage_bytes"], limit


# The part of a compile error after "<backend> rejected kernel 'name' (stage): ".
_REJECTION = re.compile(r"rejected kernel[^:]*:\s*(?P<why>.*)$", re.DOTALL)


def limit_refusal(error: ShaderCompileError) -> str | None:
    """The implementation's own message when it refused a kernel for its workgroup storage.

    Only a refusal without source locations counts: that is a limit check at pipeline
    creation (Dawn enforces its limits; wgpu-native does not), whereas a WGSL error the
    compiler places at a line stays a failure even in a variant run past the limit.
    """
    if error.diagnostics or "workgroup storage" not in error.message:
        return None
    match = _REJECTION.search(error.message)
    return (match["why"] if match else error.message).strip()


def timestamp_period(device: Device) -> float | None:
    """ns per tick, where the backend can say (already applied to timings)."""
    getter = getattr(device, "timestamp_period", None)
    return float(getter()) if callable(getter) else None
