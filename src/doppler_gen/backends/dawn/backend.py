"""The Dawn backend: adapters and device creation through pydawn."""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Any

from doppler_gen.backends.base import (
    ALIGNMENT_LIMITS,
    AdapterInfo,
    Backend,
    effective_limits,
)
from doppler_gen.backends.dawn.device import DawnDevice
from doppler_gen.backends.dawn.ffi import (
    DAWN_OF,
    F16_REFUSED,
    KEEP_ALIVE,
    Events,
    enum_short,
    runtime,
)
from doppler_gen.backends.dawn.tint import BACKEND_NAME, one_line
from doppler_gen.errors import BackendUnavailable


def _check_request(adapter: AdapterInfo, features: list[str], limits: Mapping[str, int]) -> None:
    """Refuse, with the name, a feature or limit the adapter cannot grant."""
    missing = [f for f in features if f not in adapter.features]
    if missing:
        why = f" ({F16_REFUSED})" if "shader-f16" in missing else ""
        raise BackendUnavailable(
            f"adapter {adapter.short()} lacks feature(s) {', '.join(missing)} under Dawn{why}; "
            "pick another adapter (--adapter) or do not require them"
        )
    for name, value in limits.items():
        offered = adapter.limits.get(name)
        if offered is None:
            raise BackendUnavailable(f"Dawn does not know the limit {name!r}")
        too_good = value < offered if name in ALIGNMENT_LIMITS else value > offered
        if too_good:
            raise BackendUnavailable(
                f"adapter {adapter.short()} offers {name} = {offered}, {value} was requested"
            )


class DawnBackend(Backend):
    """pydawn: Tint compiles WGSL (as in Chrome), Dawn runs it on Vulkan/Metal/D3D12."""

    name = BACKEND_NAME

    def __init__(self) -> None:
        self._dawn = runtime()
        self._natives: list[Any] | None = None

    def version(self) -> str:
        try:
            version = metadata.version("dawn-python")
        except metadata.PackageNotFoundError:  # pragma: no cover - a source checkout of pydawn
            version = "unknown"
        return f"pydawn {version} (Dawn of {DAWN_OF.get(version, 'an unknown Chromium')})"

    def _native_adapters(self) -> list[Any]:
        """Every distinct adapter Dawn offers, asked per backend and power preference.

        The C API has no enumeration: requestAdapter returns one adapter per set of options,
        so Vulkan and the platform default are asked for high-performance and low-power
        adapters and duplicates dropped. Dawn's Null backend (which computes nothing) is left out.
        """
        if self._natives is None:
            w = self._dawn.w
            seen: dict[tuple[Any, ...], Any] = {}
            for backend in (w.WGPUBackendType_Vulkan, w.WGPUBackendType_Undefined):
                for power in (
                    w.WGPUPowerPreference_HighPerformance,
                    w.WGPUPowerPreference_LowPower,
                ):
                    adapter = self._dawn.request_adapter(backend, power)
                    if adapter is None:
                        continue
                    info = self._dawn.adapter_info(0, adapter)
                    key = (info.name, info.backend, info.adapter_type, info.driver)
                    if info.backend == "Null" or key in seen:
                        self._dawn.w.wgpuAdapterRelease(adapter)
                        continue
                    seen[key] = adapter
            self._natives = list(seen.values())
        return self._natives

    def adapters(self) -> list[AdapterInfo]:
        return [self._dawn.adapter_info(i, a) for i, a in enumerate(self._native_adapters())]

    def _native_for(self, adapter: AdapterInfo) -> Any:
        natives = self._native_adapters()
        if 0 <= adapter.index < len(natives):
            native = natives[adapter.index]
            info = self._dawn.adapter_info(adapter.index, native)
            if (info.name, info.backend) == (adapter.name, adapter.backend):
                return native
        raise BackendUnavailable(f"adapter {adapter.short()} is not one Dawn offers here")

    def open_device(
        self,
        adapter: AdapterInfo,
        *,
        features: Iterable[str] = (),
        limits: Mapping[str, int] | None = None,
    ) -> DawnDevice:
        """Request exactly ``features`` and ``limits``; unnamed limits get WebGPU defaults.

        The limits are *required* limits: the device enforces exactly them, with Dawn's own
        checks and messages, as Chrome does for a page that asked for them.
        """
        native = self._native_for(adapter)
        wanted = sorted(set(features))
        requested = effective_limits(adapter, "webgpu-default")
        requested.update({name: int(value) for name, value in (limits or {}).items()})
        _check_request(adapter, wanted, requested)
        events = Events()
        device = self._request_device(native, adapter, wanted, requested, events)
        return DawnDevice(self._dawn, adapter, device, events)

    def _request_device(
        self,
        adapter_native: Any,
        adapter: AdapterInfo,
        features: list[str],
        limits: Mapping[str, int],
        events: Events,
    ) -> Any:
        """wgpuAdapterRequestDevice2 with error, loss and logging callbacks wired to ``events``."""
        dawn, w = self._dawn, self._dawn.w
        keep: list[Any] = []
        descriptor = w.WGPUDeviceDescriptor()
        descriptor.label, buffer = dawn.view("doppler-gen")
        keep.append(buffer)
        values = [dawn.feature_enum(f) for f in features]
        enums = (w.WGPUFeatureName * max(1, len(values)))(*values)
        descriptor.requiredFeatureCount = len(features)
        descriptor.requiredFeatures = ctypes.cast(enums, ctypes.POINTER(w.WGPUFeatureName))
        required = dawn.required_limits(limits)
        descriptor.requiredLimits = ctypes.pointer(required)
        toggles = self._toggles(keep)
        descriptor.nextInChain = ctypes.cast(
            ctypes.pointer(toggles), ctypes.POINTER(w.struct_WGPUChainedStruct)
        )
        self._wire_callbacks(descriptor, events)
        status, device, message = dawn.request(
            lambda info: w.wgpuAdapterRequestDevice2(adapter_native, descriptor, info),
            "WGPURequestDeviceCallbackInfo2",
            f"opening a device on {adapter.short()}",
        )
        if status != w.WGPURequestDeviceStatus_Success or not device:
            raise BackendUnavailable(f"Dawn could not open {adapter.short()}: {one_line(message)}")
        self._wire_logging(device, events)
        del keep
        return device

    def _toggles(self, keep: list[Any]) -> Any:
        """Dawn toggles: only timestamp quantization off (timing needs exact values).

        Notably *not* allow_unsafe_apis: the device must be exactly as strict as Chrome's.
        """
        w = self._dawn.w
        toggles = w.WGPUDawnTogglesDescriptor()
        toggles.chain.sType = w.WGPUSType_DawnTogglesDescriptor
        char_p = ctypes.POINTER(ctypes.c_char)
        name = ctypes.create_string_buffer(b"timestamp_quantization")
        names = (char_p * 1)(ctypes.cast(name, char_p))
        toggles.disabledToggleCount = 1
        toggles.disabledToggles = names
        keep.extend([name, names, toggles])
        return toggles

    def _wire_callbacks(self, descriptor: Any, events: Events) -> None:
        """Device-lost and uncaptured-error callbacks that record into ``events``."""
        dawn, w = self._dawn, self._dawn.w

        def lost(_device: Any, reason: int, message: Any, *_userdata: Any) -> None:
            if not (events.closing or reason == w.WGPUDeviceLostReason_Destroyed):
                names = w.WGPUDeviceLostReason__enumvalues
                why = enum_short(names, reason, "WGPUDeviceLostReason_")
                events.lost = f"{why}: {dawn.text(message)}"

        def uncaptured(_device: Any, error_type: int, message: Any, *_userdata: Any) -> None:
            events.errors.append(dawn.text(message) or f"error type {error_type}")

        lost_info, lost_thunk = dawn.callback_info(
            "WGPUDeviceLostCallbackInfo2", lost, mode="AllowSpontaneous"
        )
        error_info, error_thunk = dawn.callback_info("WGPUUncapturedErrorCallbackInfo2", uncaptured)
        descriptor.deviceLostCallbackInfo2 = lost_info
        descriptor.uncapturedErrorCallbackInfo2 = error_info
        KEEP_ALIVE.extend([lost_thunk, error_thunk])

    def _wire_logging(self, device: Any, events: Events) -> None:
        """Dawn's log: errors are raised by the next operation, warnings kept, the rest dropped."""
        dawn, w = self._dawn, self._dawn.w

        def log(level: int, message: Any, _userdata: Any) -> None:
            text = dawn.text(message)
            if level == w.WGPULoggingType_Error:
                events.errors.append(text)
            elif level == w.WGPULoggingType_Warning:
                events.warnings.append(text)

        thunk = w.WGPULoggingCallback(log)
        KEEP_ALIVE.append(thunk)
        w.wgpuDeviceSetLoggingCallback(device, thunk, None)
