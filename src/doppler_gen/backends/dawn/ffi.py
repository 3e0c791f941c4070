"""pydawn's raw webgpu.h bindings: loading, names, callbacks and waits (no WebGPU objects).

pydawn is imported lazily: importing doppler_gen must not pay for (or require) it.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from doppler_gen.backends.base import (
    AdapterInfo,
    sliced_wait,
)
from doppler_gen.backends.dawn.tint import one_line
from doppler_gen.errors import BackendUnavailable, DopplerGenError, GpuTimeout

INSTALL_HINT = "pydawn is not installed: pip install 'doppler-gen[dawn]' (dawn-python 0.3.0)"
# The Chromium release whose Dawn each pydawn release bundles (pydawn does not say at runtime).
DAWN_OF = {"0.3.0": "Chromium 133"}
# On the H200 (NVIDIA, Vulkan) pydawn 0.3's Dawn gives no shader-f16: f16 kernels skip there.
F16_REFUSED = "pydawn 0.3 (Dawn of Chromium 133) refuses shader-f16 on this adapter"

# Dawn's feature enum names (WGPUFeatureName_X) for the WebGPU spec names; others are kebab-cased.
_SPEC_FEATURES = {
    "DepthClipControl": "depth-clip-control",
    "Depth32FloatStencil8": "depth32float-stencil8",
    "TimestampQuery": "timestamp-query",
    "TextureCompressionBC": "texture-compression-bc",
    "TextureCompressionETC2": "texture-compression-etc2",
    "TextureCompressionASTC": "texture-compression-astc",
    "IndirectFirstInstance": "indirect-first-instance",
    "ShaderF16": "shader-f16",
    "RG11B10UfloatRenderable": "rg11b10ufloat-renderable",
    "BGRA8UnormStorage": "bgra8unorm-storage",
    "Float32Filterable": "float32-filterable",
    "Float32Blendable": "float32-blendable",
    "Subgroups": "subgroups",
    "SubgroupsF16": "subgroups-f16",
    "ClipDistances": "clip-distances",
    "DualSourceBlending": "dual-source-blending",
}
# Limits of this Dawn that are not WebGPU limits (deprecated or Dawn-only): never reported.
_NON_SPEC_LIMITS = frozenset({"maxInterStageShaderComponents"})
# wgpuInstanceWaitAny waits in slices this long, so that Python runs its signal handlers
# (Ctrl-C) between them; the whole wait ends at backends.base.gpu_wait_seconds, as wgpu's does.
_WAIT_SLICE_NS = 100_000_000
# ctypes callbacks handed to Dawn must outlive every possible call; a device's few are kept
# for the process's life (Dawn may report device loss after the Python object is gone).
KEEP_ALIVE: list[Any] = []


def _import_pydawn() -> Any:
    """Import ``pydawn.webgpu`` (which loads libwebgpu_dawn), or say in one line how to get it."""
    try:
        from pydawn import webgpu
    except ImportError:
        raise BackendUnavailable(INSTALL_HINT) from None
    except OSError as exc:  # pragma: no cover - the bundled library failed to load
        raise BackendUnavailable(
            f"pydawn is installed but its Dawn library does not load here: {one_line(str(exc))}"
        ) from None
    return _Bindings(webgpu)


class _Bindings:
    """pydawn's ``webgpu`` module, a name it lacks being an environment error (exit 2).

    Another pydawn release may rename or drop a symbol; that is the installation's fault,
    not a bug here, so it gets the install line rather than an AttributeError. A name found
    is kept on the instance, so later lookups are plain attribute reads.
    """

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        try:
            value = getattr(self._module, name)
        except AttributeError:
            raise BackendUnavailable(
                f"this pydawn has no {name}: doppler-gen is written against dawn-python 0.3.0 "
                "(pip install 'doppler-gen[dawn]')"
            ) from None
        setattr(self, name, value)
        return value


# --------------------------------------------------------------------------- Tint's text


def feature_name(enum_name: str) -> str:
    """The WebGPU name of a Dawn feature enum name (``WGPUFeatureName_ShaderF16``)."""
    short = enum_name.removeprefix("WGPUFeatureName_")
    if short in _SPEC_FEATURES:
        return _SPEC_FEATURES[short]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", short).lower()


def limit_field(name: str) -> str:
    """The WGPULimits field of a WebGPU limit (``max-texture-dimension-1d`` → ``...1D``)."""
    head, *rest = name.split("-")
    camel = head + "".join(part[:1].upper() + part[1:] for part in rest)
    return re.sub(r"(\d)d$", r"\1D", camel)


def limit_name(field_name: str) -> str:
    """The WebGPU name of a WGPULimits field (inverse of ``limit_field``)."""
    kebab = re.sub(r"(?<=[a-z])(?=[A-Z0-9])", "-", field_name).lower()
    return re.sub(r"(\d)-d$", r"\1d", kebab)


def enum_short(names: Mapping[int, str], value: int, prefix: str) -> str:
    return names.get(value, f"{prefix}Unknown").removeprefix(prefix)


# --------------------------------------------------------------------------- the runtime


class DawnRuntime:
    """pydawn's bindings plus one Dawn instance; the helpers every object here shares."""

    def __init__(self) -> None:
        self.w = _import_pydawn()
        descriptor = self.w.WGPUInstanceDescriptor()
        descriptor.features.timedWaitAnyEnable = True  # WaitAny with a timeout
        self.spent = ""  # what did not finish in time (``wait``)
        self.instance = self.w.wgpuCreateInstance(descriptor)
        if not self.instance:
            raise BackendUnavailable("Dawn could not create a WebGPU instance")

    # -- strings

    def view(self, text: str) -> tuple[Any, Any]:
        """A WGPUStringView of ``text`` and the buffer that must outlive it."""
        raw = text.encode("utf-8")
        buffer = ctypes.create_string_buffer(raw)
        view = self.w.WGPUStringView()
        view.data = ctypes.cast(buffer, ctypes.POINTER(ctypes.c_char))
        view.length = len(raw)
        return view, buffer

    @staticmethod
    def text(view: Any) -> str:
        """The Python string of a WGPUStringView (copied: Dawn may free it right after)."""
        if not view.data:
            return ""
        length = view.length
        if length >= (1 << 63):  # WGPU_STRLEN: NUL-terminated
            return ctypes.string_at(view.data).decode("utf-8", "replace")
        return ctypes.string_at(view.data, length).decode("utf-8", "replace")

    # -- callbacks and futures

    def callback_info(
        self, struct_name: str, on_call: Callable[..., None], mode: str = "WaitAnyOnly"
    ) -> tuple[Any, Any]:
        """A ``WGPU...CallbackInfo2`` whose callback runs ``on_call``; also the C thunk to keep."""
        info = getattr(self.w, struct_name)()
        if hasattr(info, "mode"):
            info.mode = getattr(self.w, f"WGPUCallbackMode_{mode}")
        thunk = dict(type(info)._fields_)["callback"](on_call)
        info.callback = thunk
        return info, thunk

    def _spend(self, reason: str) -> None:
        """A wait was abandoned (``sliced_wait``): nothing more runs here."""
        self.spent = reason

    def wait(self, future: Any, doing: str) -> None:
        """Block until ``future`` completes (its WaitAnyOnly callback runs inside), in slices
        that let Ctrl-C through, for at most ``gpu_wait_seconds``: then GpuTimeout, and this
        instance is spent (the work may still run; nothing more is waited for on it)."""
        if self.spent:
            raise GpuTimeout(f"the device cannot be used again: {self.spent}")
        wait_info = self.w.WGPUFutureWaitInfo()
        wait_info.future = future
        statuses: list[int] = []

        def finished() -> bool:
            statuses.append(
                self.w.wgpuInstanceWaitAny(
                    self.instance, 1, ctypes.byref(wait_info), _WAIT_SLICE_NS
                )
            )
            return statuses[-1] != self.w.WGPUWaitStatus_TimedOut

        sliced_wait(finished, doing, "Dawn", self._spend)
        status = statuses[-1]
        if status != self.w.WGPUWaitStatus_Success:
            name = enum_short(self.w.WGPUWaitStatus__enumvalues, status, "WGPUWaitStatus_")
            raise DopplerGenError(f"Dawn did not finish {doing}: wait status {name}")

    def request(
        self,
        start: Callable[[Any], Any],
        struct_name: str,
        doing: str,
        convert: Callable[..., tuple[Any, ...]] | None = None,
    ) -> tuple[Any, ...]:
        """Run an asynchronous Dawn call to completion and return its callback's arguments.

        String views are turned into ``str`` inside the callback (they die with it); the two
        trailing userdata pointers are dropped. ``convert`` replaces that default.
        """
        results: list[tuple[Any, ...]] = []

        def on_call(*args: Any) -> None:
            results.append(convert(*args) if convert else self._plain(args))

        info, thunk = self.callback_info(struct_name, on_call)
        self.wait(start(info), doing)
        del thunk  # the callback has run (WaitAnyOnly); only now may the thunk go
        if not results:
            raise DopplerGenError(f"Dawn never answered while {doing}")
        return results[0]

    def _plain(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        values = args[:-2]  # the userdata1 / userdata2 pointers
        return tuple(
            self.text(a) if isinstance(a, self.w.struct_WGPUStringView) else a for a in values
        )

    # -- enumeration

    def request_adapter(self, backend_type: int, power: int) -> Any | None:
        """The adapter Dawn picks for these options, or None when it has none."""
        options = self.w.WGPURequestAdapterOptions()
        options.backendType = backend_type
        options.powerPreference = power
        status, adapter, _message = self.request(
            lambda info: self.w.wgpuInstanceRequestAdapter2(self.instance, options, info),
            "WGPURequestAdapterCallbackInfo2",
            "requesting an adapter",
        )
        return adapter if status == self.w.WGPURequestAdapterStatus_Success and adapter else None

    def adapter_info(self, index: int, adapter: Any) -> AdapterInfo:
        """Describe a Dawn adapter in the neutral vocabulary."""
        w = self.w
        info = w.WGPUAdapterInfo()
        w.wgpuAdapterGetInfo(adapter, ctypes.byref(info))
        try:
            name = self.text(info.device) or self.text(info.description) or "unknown adapter"
            vendor = self.text(info.vendor) or f"0x{int(info.vendorID):04x}"
            driver = self.text(info.description)
            backend = enum_short(
                w.WGPUBackendType__enumvalues, info.backendType, "WGPUBackendType_"
            )
            kind = enum_short(w.WGPUAdapterType__enumvalues, info.adapterType, "WGPUAdapterType_")
        finally:
            w.wgpuAdapterInfoFreeMembers(info)
        limits = w.WGPUSupportedLimits()
        w.wgpuAdapterGetLimits(adapter, ctypes.byref(limits))
        return AdapterInfo(
            index=index,
            name=name,
            backend=backend,
            adapter_type=kind,
            vendor=vendor,
            driver=driver,
            features=self.features(w.wgpuAdapterGetFeatures, adapter),
            limits=self.limits_of(limits.limits),
        )

    def features(self, getter: Callable[[Any, Any], Any], owner: Any) -> frozenset[str]:
        """WebGPU names of the features an adapter or device reports."""
        supported = self.w.WGPUSupportedFeatures()
        getter(owner, ctypes.byref(supported))
        try:
            names = self.w.WGPUFeatureName__enumvalues
            values = [supported.features[i] for i in range(supported.featureCount)]
            return frozenset(feature_name(names.get(v, f"WGPUFeatureName_{v}")) for v in values)
        finally:
            self.w.wgpuSupportedFeaturesFreeMembers(supported)

    @staticmethod
    def limits_of(native: Any) -> dict[str, int]:
        """WebGPU-named limits of a WGPULimits struct."""
        return {
            limit_name(name): int(getattr(native, name))
            for name, _ in native._fields_
            if not name.startswith("PADDING") and name not in _NON_SPEC_LIMITS
        }

    def required_limits(self, limits: Mapping[str, int]) -> Any:
        """A WGPURequiredLimits asking for ``limits``; every other field "undefined" (default)."""
        required = self.w.WGPURequiredLimits()
        native = required.limits
        for name, kind in native._fields_:
            if not name.startswith("PADDING"):  # all ones: WGPU_LIMIT_U32/U64_UNDEFINED
                setattr(native, name, (1 << (8 * ctypes.sizeof(kind))) - 1)
        for name, value in limits.items():
            target = limit_field(name)
            if target in _NON_SPEC_LIMITS or not hasattr(native, target):
                raise BackendUnavailable(f"Dawn does not know the limit {name!r}")
            setattr(native, target, int(value))
        return required

    def feature_enum(self, name: str) -> int:
        """Dawn's enum value for a WebGPU feature name."""
        for value, enum_name in self.w.WGPUFeatureName__enumvalues.items():
            if feature_name(enum_name) == name:
                return value
        raise BackendUnavailable(f"Dawn does not know the feature {name!r}")


_RUNTIME: DawnRuntime | None = None


def runtime() -> DawnRuntime:
    """The process's one Dawn instance: adapters and devices must share it to be waited on."""
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = DawnRuntime()
    return _RUNTIME


# --------------------------------------------------------------------------- helpers


@dataclass
class Events:
    """What Dawn reported outside an error scope: raised by the next operation."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    lost: str | None = None
    closing: bool = False


def release_handle(release: Callable[[Any], None], handle: Any) -> None:
    """Drop our reference to a Dawn object (the GC's finalizer; never raises)."""
    if handle:
        release(handle)


# --------------------------------------------------------------------------- objects
