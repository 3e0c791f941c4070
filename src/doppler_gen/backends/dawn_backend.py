"""The Dawn (Tint) implementation of the GPU runtime interface, through pydawn's ctypes bindings.

Chrome compiles WGSL with Tint inside Dawn; Firefox with naga inside wgpu. A kernel that one
accepts and the other rejects (or computes differently) is a production bug, so kernels are
validated on both. pydawn (``dawn-python`` 0.3.0, Dawn of Chromium 133) ships ``libwebgpu_dawn``
and raw ctypes bindings of its ``webgpu.h`` (``pydawn.webgpu``); its ``utils`` helpers assert,
print or drop errors, so only the raw bindings are used here.

Errors are never dropped. Every operation runs inside three error scopes (validation,
out-of-memory, internal) whose errors are raised; the device's uncaptured-error, device-lost
and logging callbacks record anything arriving outside a scope, and the next operation raises
it. Shader errors come from the module's compilation info (Tint's own line:column) or, failing
that, from Tint's text (``:12:5 error: ...``), so they map to template lines like naga's.

Asynchronous calls use the ``...2`` entry points (the older ones print deprecation warnings)
with ``WaitAnyOnly`` callbacks, completed by ``wgpuInstanceWaitAny``; callbacks only copy their
arguments (a string view dies with its callback) because ctypes cannot raise out of them.

pydawn is imported lazily: importing doppler_gen must not pay for (or require) it.
"""

from __future__ import annotations

import ctypes
import numbers
import re
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import numpy as np

from doppler_gen.backends.base import (
    ALIGNMENT_LIMITS,
    AdapterInfo,
    Backend,
    Buffer,
    Device,
    PassTimes,
    Pipeline,
    Step,
    as_bytes,
    effective_limits,
    owned,
    pad_bytes,
    pass_times,
)
from doppler_gen.errors import BackendUnavailable, DopplerGenError, ShaderCompileError

BACKEND_NAME = "dawn"
INSTALL_HINT = "pydawn is not installed: pip install 'doppler-gen[dawn]' (dawn-python 0.3.0)"
# The Chromium release whose Dawn each pydawn release bundles (pydawn does not say at runtime).
_DAWN_OF = {"0.3.0": "Chromium 133"}
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
# wgpuInstanceWaitAny timeout: a kernel on lavapipe can take long, a hang must not be forever.
_WAIT_NS = 600 * 1_000_000_000
# Dawn refuses query sets above 4096 queries; two timestamps per timed pass.
_MAX_TIMED_PASSES_PER_SUBMIT = 1024
# ctypes callbacks handed to Dawn must outlive every possible call; a device's few are kept
# for the process's life (Dawn may report device loss after the Python object is gone).
_KEEP_ALIVE: list[Any] = []


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
    return webgpu


# --------------------------------------------------------------------------- Tint's text

# A Tint diagnostic header: "FILE:LINE:COL severity: message"; FILE is empty for WGSL given as
# a string, and Dawn may prefix the first one ("Error while parsing WGSL: :5:9 error: ...").
_DIAGNOSTIC = re.compile(
    r"(?:^|\s|^[^\s:]*)(?P<file>[^\s:]*):(?P<line>\d+):(?P<col>\d+)\s+"
    r"(?P<severity>error|warning|note|info):\s*(?P<message>.*)$"
)
_CARETS = re.compile(r"^\s*\^+\s*$")
_CONTEXT = re.compile(r"^\s*-\s+While\b")
_PREFIX = re.compile(r"^(Error while parsing WGSL|Tint WGSL reader failure):\s*")


@dataclass(frozen=True)
class TintMessage:
    """One diagnostic of Tint's: where (1-based), how bad, what."""

    line: int
    column: int
    severity: str
    message: str

    def describe(self) -> str:
        """The message, with the severity spelled out for everything but errors."""
        return self.message if self.severity == "error" else f"{self.severity}: {self.message}"


def tint_messages(text: str) -> list[TintMessage]:
    """Every ``:LINE:COL severity: message`` header in a Dawn error text, in order."""
    found = []
    for raw in text.splitlines():
        match = _DIAGNOSTIC.search(_PREFIX.sub("", raw.strip()))
        if match:
            found.append(
                TintMessage(
                    int(match["line"]),
                    int(match["col"]),
                    match["severity"],
                    match["message"].strip(),
                )
            )
    return found


def _summary_lines(text: str) -> list[str]:
    """Dawn's error text without the source echoes, caret lines and "- While ..." context."""
    lines: list[str] = []
    echo = False  # a diagnostic header is followed by its source line and a caret line
    for raw in text.splitlines():
        stripped = _PREFIX.sub("", raw.strip())
        match = _DIAGNOSTIC.search(stripped)
        if match:
            severity = match["severity"]
            message = match["message"].strip()
            stripped = message if severity == "error" else f"{severity}: {message}"
            echo = True
        elif echo and _CARETS.match(raw):
            echo = False
            continue
        elif echo or not stripped or _CONTEXT.match(raw):
            continue
        if stripped not in lines:
            lines.append(stripped)
    return lines


def one_line(text: str) -> str:
    """Collapse Dawn's multi-line error text into one readable line."""
    lines = _summary_lines(text)
    return "; ".join(lines) if lines else " ".join(text.split())


def parse_diagnostics(text: str) -> list[tuple[int, int, str]]:
    """``(line, column, message)`` for Tint's diagnostics in ``text``: errors, then notes.

    Errors come first because the validator shows (and maps to template lines) the first
    few; notes (e.g. "control flow depends on possibly non-uniform value") follow.
    """
    messages = tint_messages(text)
    return _ordered(messages)


def _ordered(messages: Iterable[TintMessage]) -> list[tuple[int, int, str]]:
    ranked = sorted(messages, key=lambda m: m.severity != "error")  # stable: keeps text order
    return [(m.line, m.column, m.describe()) for m in ranked]


def _compile_error(
    text: str, label: str, messages: list[TintMessage] | None = None, stage: str = "shader module"
) -> ShaderCompileError:
    """A one-line ShaderCompileError from Dawn's text; locations from ``messages`` or the text."""
    diagnostics = _ordered(messages) if messages else parse_diagnostics(text)
    where = f" at line {diagnostics[0][0]}:{diagnostics[0][1]}" if diagnostics else ""
    name = f" {label!r}" if label else ""
    summary = "; ".join(d[2] for d in diagnostics) if diagnostics else one_line(text)
    message = f"dawn rejected kernel{name} ({stage}){where}: {summary}{_hint(text)}"
    return ShaderCompileError(message, diagnostics=diagnostics, backend=BACKEND_NAME)


def _hint(text: str) -> str:
    """The fix for errors whose cause is the device, not the WGSL."""
    if "extension 'f16' is not allowed" in text:
        return " (open the device with features=['shader-f16'])"
    return ""


# --------------------------------------------------------------------------- names


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


def _enum_short(names: Mapping[int, str], value: int, prefix: str) -> str:
    return names.get(value, f"{prefix}Unknown").removeprefix(prefix)


# --------------------------------------------------------------------------- the runtime


class _Dawn:
    """pydawn's bindings plus one Dawn instance; the helpers every object here shares."""

    def __init__(self) -> None:
        self.w = _import_pydawn()
        descriptor = self.w.WGPUInstanceDescriptor()
        descriptor.features.timedWaitAnyEnable = True  # WaitAny with a timeout
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

    def wait(self, future: Any, doing: str) -> None:
        """Block until ``future`` completes (its WaitAnyOnly callback runs inside)."""
        wait_info = self.w.WGPUFutureWaitInfo()
        wait_info.future = future
        status = self.w.wgpuInstanceWaitAny(self.instance, 1, ctypes.byref(wait_info), _WAIT_NS)
        if status != self.w.WGPUWaitStatus_Success:
            name = _enum_short(self.w.WGPUWaitStatus__enumvalues, status, "WGPUWaitStatus_")
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
            backend = _enum_short(
                w.WGPUBackendType__enumvalues, info.backendType, "WGPUBackendType_"
            )
            kind = _enum_short(w.WGPUAdapterType__enumvalues, info.adapterType, "WGPUAdapterType_")
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


_RUNTIME: _Dawn | None = None


def _runtime() -> _Dawn:
    """The process's one Dawn instance: adapters and devices must share it to be waited on."""
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = _Dawn()
    return _RUNTIME


# --------------------------------------------------------------------------- helpers


def _override_value(name: str, value: Any) -> float:
    """WebGPU passes every override constant as a double."""
    if isinstance(value, bool | np.bool_):
        return float(bool(value))
    if isinstance(value, numbers.Real):
        return float(value)
    raise ShaderCompileError(
        f"override constant {name!r} must be a number, got {value!r}",
        diagnostics=[],
        backend=BACKEND_NAME,
    )


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


@dataclass
class _Events:
    """What Dawn reported outside an error scope: raised by the next operation."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    lost: str | None = None
    closing: bool = False


def _release(release: Callable[[Any], None], handle: Any) -> None:
    """Drop our reference to a Dawn object (the GC's finalizer; never raises)."""
    if handle:
        release(handle)


# --------------------------------------------------------------------------- objects


class DawnBuffer(Buffer):
    """A Buffer holding a Dawn WGPUBuffer (allocated ``padded_size`` bytes)."""

    def __init__(
        self,
        native: Any,
        padded_size: int,
        size: int,
        kind: str,
        *,
        read_write: bool,
        label: str,
        release: Callable[[Any], None],
    ) -> None:
        super().__init__(size, kind, read_write=read_write, label=label)
        self.native = native
        self.padded_size = padded_size
        weakref.finalize(self, _release, release, native)


class DawnPipeline(Pipeline):
    """A Pipeline holding a Dawn WGPUComputePipeline."""

    def __init__(
        self, native: Any, label: str, entry_point: str, release: Callable[[Any], None]
    ) -> None:
        super().__init__(label, entry_point)
        self.native = native
        weakref.finalize(self, _release, release, native)


class DawnDevice(Device):
    """A Dawn WGPUDevice behind the neutral Device interface."""

    backend_name = "Dawn"

    def __init__(self, runtime: _Dawn, adapter: AdapterInfo, native: Any, events: _Events) -> None:
        self._dawn = runtime
        self._w = runtime.w
        self.adapter = adapter
        self.native = native
        self._events = events
        self.queue = self._w.wgpuDeviceGetQueue(native)
        self.features = runtime.features(self._w.wgpuDeviceGetFeatures, native)
        limits = self._w.WGPUSupportedLimits()
        self._w.wgpuDeviceGetLimits(native, ctypes.byref(limits))
        self.limits = runtime.limits_of(limits.limits)
        # Why a feature the kernels may need is absent, for skip reasons (validate.static_skip).
        self.feature_notes = {} if "shader-f16" in adapter.features else {"shader-f16": F16_REFUSED}

    @property
    def warnings(self) -> list[str]:
        """Warnings Dawn logged (deprecations and the like): kept for reports, not raised."""
        return list(self._events.warnings)

    # -- compile

    def compile(
        self,
        wgsl: str,
        *,
        entry_point: str = "main",
        constants: Mapping[str, float | int] | None = None,
        label: str = "",
    ) -> DawnPipeline:
        """Create module (Tint parses and validates) and pipeline (limits, overrides, layout)."""
        values = {k: _override_value(k, v) for k, v in (constants or {}).items()}
        module = self._shader_module(wgsl, label)
        try:
            native = self._compute_pipeline(module, entry_point, values, label)
        finally:
            self._w.wgpuShaderModuleRelease(module)
        return DawnPipeline(native, label, entry_point, self._w.wgpuComputePipelineRelease)

    def _shader_module(self, wgsl: str, label: str) -> Any:
        """The shader module, or ShaderCompileError with Tint's locations."""
        w = self._w
        source = w.WGPUShaderSourceWGSL()
        source.chain.sType = w.WGPUSType_ShaderSourceWGSL
        source.code, code_buffer = self._dawn.view(wgsl)
        descriptor = w.WGPUShaderModuleDescriptor()
        descriptor.nextInChain = ctypes.cast(
            ctypes.pointer(source), ctypes.POINTER(w.struct_WGPUChainedStruct)
        )
        descriptor.label, label_buffer = self._dawn.view(label)
        with self._scoped("creating shader module", raise_errors=False) as errors:
            module = w.wgpuDeviceCreateShaderModule(self.native, ctypes.byref(descriptor))
        del code_buffer, label_buffer
        messages = self._compilation_messages(module)
        failed = [m for m in messages if m.severity == "error"]
        self._events.warnings.extend(
            f"{label}:{m.line}:{m.column}: {m.message}" for m in messages if m.severity == "warning"
        )
        if errors or failed:
            w.wgpuShaderModuleRelease(module)
            text = "\n".join(errors) or "\n".join(m.message for m in failed)
            located = [m for m in messages if m.severity in ("error", "note")]
            raise _compile_error(text, label, located)
        return module

    def _compilation_messages(self, module: Any) -> list[TintMessage]:
        """Tint's messages for ``module`` (errors, warnings, notes) with 1-based positions."""
        w = self._w
        severities = {
            w.WGPUCompilationMessageType_Error: "error",
            w.WGPUCompilationMessageType_Warning: "warning",
            w.WGPUCompilationMessageType_Info: "note",
        }

        def convert(status: int, info: Any, *_userdata: Any) -> tuple[Any, ...]:
            if status != w.WGPUCompilationInfoRequestStatus_Success or not info:
                return (status, [])
            compiled = info.contents
            found = []
            for i in range(compiled.messageCount):
                m = compiled.messages[i]
                text = " ".join(self._dawn.text(m.message).split())  # Tint may list candidates
                severity = severities.get(m.type, "error")
                found.append(TintMessage(int(m.lineNum), int(m.linePos), severity, text))
            return (status, found)

        status, messages = self._dawn.request(
            lambda info: w.wgpuShaderModuleGetCompilationInfo2(module, info),
            "WGPUCompilationInfoCallbackInfo2",
            "reading compilation info",
            convert,
        )
        if status != w.WGPUCompilationInfoRequestStatus_Success:
            raise DopplerGenError(f"Dawn could not report compilation info (status {status})")
        return messages

    def _compute_pipeline(
        self, module: Any, entry_point: str, constants: Mapping[str, float], label: str
    ) -> Any:
        """The compute pipeline with layout "auto"; Dawn checks limits and overrides here."""
        w = self._w
        keep: list[Any] = []
        descriptor = w.WGPUComputePipelineDescriptor()
        descriptor.label, buffer = self._dawn.view(label)
        keep.append(buffer)
        descriptor.compute.module = module
        descriptor.compute.entryPoint, buffer = self._dawn.view(entry_point)
        keep.append(buffer)
        entries = (w.WGPUConstantEntry * max(1, len(constants)))()
        for slot, (name, value) in enumerate(sorted(constants.items())):
            entries[slot].key, buffer = self._dawn.view(name)
            entries[slot].value = value
            keep.append(buffer)
        descriptor.compute.constantCount = len(constants)
        descriptor.compute.constants = ctypes.cast(entries, ctypes.POINTER(w.WGPUConstantEntry))
        with self._scoped("creating compute pipeline", raise_errors=False) as errors:
            native = w.wgpuDeviceCreateComputePipeline(self.native, ctypes.byref(descriptor))
        del keep
        if errors:
            if native:
                w.wgpuComputePipelineRelease(native)
            raise _compile_error("\n".join(errors), label, stage="compute pipeline")
        return native

    # -- buffers

    def storage_buffer(
        self, data: bytes | np.ndarray, *, read_write: bool = False, label: str = ""
    ) -> DawnBuffer:
        w = self._w
        usage = w.WGPUBufferUsage_Storage | w.WGPUBufferUsage_CopyDst | w.WGPUBufferUsage_CopySrc
        raw = as_bytes(data)
        return self._buffer(raw, usage, "storage", 4, read_write=read_write, label=label)

    def uniform_buffer(self, data: bytes, label: str = "") -> DawnBuffer:
        w = self._w
        usage = w.WGPUBufferUsage_Uniform | w.WGPUBufferUsage_CopyDst | w.WGPUBufferUsage_CopySrc
        return self._buffer(as_bytes(data), usage, "uniform", 16, read_write=False, label=label)

    def _buffer(
        self, raw: bytes, usage: int, kind: str, multiple: int, *, read_write: bool, label: str
    ) -> DawnBuffer:
        padded = pad_bytes(raw, multiple)
        with self._scoped(f"creating {kind} buffer {label!r}"):
            native = self._create_buffer(len(padded), usage, label, mapped=True)
            mapped = self._w.wgpuBufferGetMappedRange(native, 0, len(padded))
            if not mapped:
                self._w.wgpuBufferRelease(native)
                raise DopplerGenError(f"Dawn could not map new {kind} buffer {label!r}")
            ctypes.memmove(mapped, padded, len(padded))
            self._w.wgpuBufferUnmap(native)
        return DawnBuffer(
            native,
            len(padded),
            len(raw),
            kind,
            read_write=read_write,
            label=label,
            release=self._w.wgpuBufferRelease,
        )

    def _create_buffer(self, size: int, usage: int, label: str, *, mapped: bool = False) -> Any:
        descriptor = self._w.WGPUBufferDescriptor()
        descriptor.label, buffer = self._dawn.view(label)
        descriptor.size = size
        descriptor.usage = usage
        descriptor.mappedAtCreation = mapped
        native = self._w.wgpuDeviceCreateBuffer(self.native, ctypes.byref(descriptor))
        del buffer
        return native

    def write_buffer(self, buffer: Buffer, data: bytes | np.ndarray) -> None:
        target = self._own(buffer)
        raw = as_bytes(data)
        if len(raw) > target.size:
            raise DopplerGenError(
                f"{len(raw)} bytes do not fit buffer {target.label!r} of {target.size} bytes"
            )
        padded = pad_bytes(raw, 4)
        with self._scoped(f"writing buffer {target.label!r}"):
            self._w.wgpuQueueWriteBuffer(self.queue, target.native, 0, padded, len(padded))

    def read_buffer(self, buffer: Buffer) -> bytes:
        source = self._own(buffer)
        return self._read(source.native, source.padded_size, source.label)[: source.size]

    def _read(self, native: Any, size: int, label: str) -> bytes:
        """Copy ``size`` bytes into a mappable buffer, wait for the queue, map and copy out."""
        w = self._w
        with self._scoped(f"reading buffer {label!r}"):
            usage = w.WGPUBufferUsage_MapRead | w.WGPUBufferUsage_CopyDst
            staging = self._create_buffer(size, usage, f"{label} readback")
            try:
                encoder = w.wgpuDeviceCreateCommandEncoder(self.native, None)
                w.wgpuCommandEncoderCopyBufferToBuffer(encoder, native, 0, staging, 0, size)
                self._submit(encoder)
                status, message = self._dawn.request(
                    lambda info: w.wgpuBufferMapAsync2(staging, w.WGPUMapMode_Read, 0, size, info),
                    "WGPUBufferMapCallbackInfo2",
                    f"reading buffer {label!r}",
                )
                if status != w.WGPUMapAsyncStatus_Success:
                    why = one_line(message)
                    raise DopplerGenError(f"Dawn could not map buffer {label!r}: {why}")
                data = ctypes.string_at(w.wgpuBufferGetConstMappedRange(staging, 0, size), size)
                w.wgpuBufferUnmap(staging)
            finally:
                w.wgpuBufferDestroy(staging)
                w.wgpuBufferRelease(staging)
        return data

    # -- dispatch

    def run(self, steps: Sequence[Step]) -> None:
        """Encode every step as a compute pass of one command buffer and submit it."""
        label = " + ".join(s.pipeline.label for s in steps)
        with self._scoped(f"dispatching {label!r}"), self._bind_groups(steps) as encoded:
            encoder = self._w.wgpuDeviceCreateCommandEncoder(self.native, None)
            for pipeline, group, workgroups in encoded:
                self._encode_pass(encoder, pipeline, group, workgroups)
            self._submit(encoder)

    def timed_run(self, steps: Sequence[Step], *, repeats: int, warmup: int) -> list[PassTimes]:
        """Begin/end-of-pass timestamps around every pass of every run, runs back to back.

        Dawn resolves timestamps to nanoseconds itself; the device is opened with
        timestamp quantization off (Chrome rounds to 100 µs by default), so values are exact.
        """
        self._check_timing_request(steps, repeats, warmup)
        self._require_timestamps()
        label = " + ".join(s.pipeline.label for s in steps)
        runs: list[PassTimes] = []
        with self._scoped(f"timing {label!r}"), self._bind_groups(steps) as encoded:
            if warmup:
                encoder = self._w.wgpuDeviceCreateCommandEncoder(self.native, None)
                for _ in range(warmup):
                    for pipeline, group, workgroups in encoded:
                        self._encode_pass(encoder, pipeline, group, workgroups)
                self._submit(encoder)
            per_submit = max(1, _MAX_TIMED_PASSES_PER_SUBMIT // len(encoded))
            while len(runs) < repeats:
                count = min(repeats - len(runs), per_submit)
                runs.extend(self._timed_batch(encoded, count))
        return runs

    @contextmanager
    def _bind_groups(self, steps: Sequence[Step]) -> Iterator[list[tuple[Any, Any, tuple]]]:
        """(pipeline, bind group, workgroups) per step, the bind groups released after use."""
        with ExitStack() as stack:
            encoded = []
            for step in steps:
                pipeline = self._own_pipeline(step.pipeline)
                group = stack.enter_context(self._bind_group(pipeline, step.bindings))
                encoded.append((pipeline, group, step.workgroups))
            yield encoded

    def _timed_batch(self, encoded: list[tuple[Any, Any, tuple]], count: int) -> list[PassTimes]:
        """``count`` timestamped runs in one submit."""
        w = self._w
        queries = 2 * count * len(encoded)
        descriptor = w.WGPUQuerySetDescriptor()
        descriptor.type = w.WGPUQueryType_Timestamp
        descriptor.count = queries
        query_set = w.wgpuDeviceCreateQuerySet(self.native, ctypes.byref(descriptor))
        resolved = self._create_buffer(
            8 * queries, w.WGPUBufferUsage_QueryResolve | w.WGPUBufferUsage_CopySrc, "timestamps"
        )
        try:
            encoder = w.wgpuDeviceCreateCommandEncoder(self.native, None)
            index = 0
            for _ in range(count):
                for pipeline, group, workgroups in encoded:
                    writes = w.WGPUComputePassTimestampWrites()
                    writes.querySet = query_set
                    writes.beginningOfPassWriteIndex = index
                    writes.endOfPassWriteIndex = index + 1
                    self._encode_pass(encoder, pipeline, group, workgroups, writes)
                    index += 2
            w.wgpuCommandEncoderResolveQuerySet(encoder, query_set, 0, queries, resolved, 0)
            self._submit(encoder)
            ticks = np.frombuffer(self._read(resolved, 8 * queries, "timestamps"), np.uint64)
        finally:
            w.wgpuQuerySetDestroy(query_set)
            w.wgpuQuerySetRelease(query_set)
            w.wgpuBufferDestroy(resolved)
            w.wgpuBufferRelease(resolved)
        return pass_times(ticks, len(encoded))

    @contextmanager
    def _bind_group(self, pipeline: DawnPipeline, bindings: Mapping[int, Buffer]) -> Iterator[Any]:
        """Bind group 0 of ``pipeline``'s auto layout holding ``bindings``, released after use."""
        w = self._w
        ordered = sorted(bindings.items())
        entries = (w.WGPUBindGroupEntry * max(1, len(ordered)))()
        for slot, (binding, buffer) in enumerate(ordered):
            native = self._own(buffer)
            entries[slot].binding = int(binding)
            entries[slot].buffer = native.native
            entries[slot].offset = 0
            entries[slot].size = native.padded_size
        layout = w.wgpuComputePipelineGetBindGroupLayout(pipeline.native, 0)
        descriptor = w.WGPUBindGroupDescriptor()
        descriptor.layout = layout
        descriptor.entryCount = len(ordered)
        descriptor.entries = ctypes.cast(entries, ctypes.POINTER(w.WGPUBindGroupEntry))
        group = w.wgpuDeviceCreateBindGroup(self.native, ctypes.byref(descriptor))
        try:
            yield group
        finally:
            _release(w.wgpuBindGroupRelease, group)
            _release(w.wgpuBindGroupLayoutRelease, layout)

    def _encode_pass(
        self,
        encoder: Any,
        pipeline: DawnPipeline,
        group: Any,
        workgroups: tuple[int, int, int],
        writes: Any = None,
    ) -> None:
        w = self._w
        descriptor = w.WGPUComputePassDescriptor()
        if writes is not None:
            descriptor.timestampWrites = ctypes.pointer(writes)
        compute_pass = w.wgpuCommandEncoderBeginComputePass(encoder, ctypes.byref(descriptor))
        w.wgpuComputePassEncoderSetPipeline(compute_pass, pipeline.native)
        w.wgpuComputePassEncoderSetBindGroup(compute_pass, 0, group, 0, None)
        x, y, z = (int(n) for n in workgroups)
        w.wgpuComputePassEncoderDispatchWorkgroups(compute_pass, x, y, z)
        w.wgpuComputePassEncoderEnd(compute_pass)
        w.wgpuComputePassEncoderRelease(compute_pass)

    def _submit(self, encoder: Any) -> None:
        """Finish ``encoder`` and submit its commands (errors land in the enclosing scope)."""
        w = self._w
        commands = w.wgpuCommandEncoderFinish(encoder, None)
        w.wgpuCommandEncoderRelease(encoder)
        array = (w.WGPUCommandBuffer * 1)(commands)
        w.wgpuQueueSubmit(self.queue, 1, array)
        w.wgpuCommandBufferRelease(commands)

    # -- error capture

    @contextmanager
    def _scoped(self, doing: str, *, raise_errors: bool = True) -> Iterator[list[str]]:
        """Run the block inside validation, out-of-memory and internal error scopes.

        Yields the list the scopes' errors are put in once the block ends; with
        ``raise_errors`` (the default) a non-empty list is raised as one DopplerGenError.
        Errors Dawn reported outside any scope before or during the block are raised too.
        """
        self._raise_events(doing)
        w = self._w
        filters = (
            w.WGPUErrorFilter_Validation,
            w.WGPUErrorFilter_OutOfMemory,
            w.WGPUErrorFilter_Internal,
        )
        for error_filter in filters:
            w.wgpuDevicePushErrorScope(self.native, error_filter)
        errors: list[str] = []
        try:
            yield errors
        except Exception:
            # A scope's error (say, a failed copy) explains a later failure (say, the map).
            caught = self._pop_scopes(len(filters), doing)
            if caught:
                raise DopplerGenError(f"Dawn error while {doing}: {one_line(caught[0])}") from None
            raise
        errors.extend(self._pop_scopes(len(filters), doing))
        self._raise_events(doing)
        if errors and raise_errors:
            raise DopplerGenError(f"Dawn error while {doing}: {one_line(errors[0])}")

    def _pop_scopes(self, count: int, doing: str) -> list[str]:
        """Pop ``count`` error scopes; the messages of those that caught an error."""
        w = self._w
        found = []
        for _ in range(count):
            status, error_type, message = self._dawn.request(
                lambda info: w.wgpuDevicePopErrorScope2(self.native, info),
                "WGPUPopErrorScopeCallbackInfo2",
                f"{doing} (error scope)",
            )
            if status != w.WGPUPopErrorScopeStatus_Success:
                raise DopplerGenError(f"Dawn lost an error scope while {doing} (status {status})")
            if error_type != w.WGPUErrorType_NoError:
                name = _enum_short(w.WGPUErrorType__enumvalues, error_type, "WGPUErrorType_")
                found.append(message or f"{name} error without a message")
        return found[::-1]  # innermost scope first is the last popped; report in push order

    def _raise_events(self, doing: str) -> None:
        """Raise what arrived outside a scope: device loss or an uncaptured error."""
        events = self._events
        if events.lost is not None:
            why = one_line(events.lost)
            raise DopplerGenError(f"Dawn device lost (noticed while {doing}): {why}")
        if events.errors:
            first = events.errors.pop(0)
            events.errors.clear()
            raise DopplerGenError(f"Dawn error (noticed while {doing}): {one_line(first)}")

    # -- plumbing

    def _own(self, buffer: Buffer) -> DawnBuffer:
        return owned(buffer, DawnBuffer, "Dawn", "created")

    @staticmethod
    def _own_pipeline(pipeline: Pipeline) -> DawnPipeline:
        return owned(pipeline, DawnPipeline, "Dawn", "compiled")

    def close(self) -> None:
        """Destroy the Dawn device; its loss (reason "destroyed") is expected, not an error."""
        if self.native is not None:
            self._events.closing = True
            self._w.wgpuQueueRelease(self.queue)
            self._w.wgpuDeviceDestroy(self.native)
            self._w.wgpuDeviceRelease(self.native)
            self.native = None


# --------------------------------------------------------------------------- backend


class DawnBackend(Backend):
    """pydawn: Tint compiles WGSL (as in Chrome), Dawn runs it on Vulkan/Metal/D3D12."""

    name = BACKEND_NAME

    def __init__(self) -> None:
        self._dawn = _runtime()
        self._natives: list[Any] | None = None

    def version(self) -> str:
        try:
            version = metadata.version("dawn-python")
        except metadata.PackageNotFoundError:  # pragma: no cover - a source checkout of pydawn
            version = "unknown"
        return f"pydawn {version} (Dawn of {_DAWN_OF.get(version, 'an unknown Chromium')})"

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
        events = _Events()
        device = self._request_device(native, adapter, wanted, requested, events)
        return DawnDevice(self._dawn, adapter, device, events)

    def _request_device(
        self,
        adapter_native: Any,
        adapter: AdapterInfo,
        features: list[str],
        limits: Mapping[str, int],
        events: _Events,
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

    def _wire_callbacks(self, descriptor: Any, events: _Events) -> None:
        """Device-lost and uncaptured-error callbacks that record into ``events``."""
        dawn, w = self._dawn, self._dawn.w

        def lost(_device: Any, reason: int, message: Any, *_userdata: Any) -> None:
            if not (events.closing or reason == w.WGPUDeviceLostReason_Destroyed):
                names = w.WGPUDeviceLostReason__enumvalues
                why = _enum_short(names, reason, "WGPUDeviceLostReason_")
                events.lost = f"{why}: {dawn.text(message)}"

        def uncaptured(_device: Any, error_type: int, message: Any, *_userdata: Any) -> None:
            events.errors.append(dawn.text(message) or f"error type {error_type}")

        lost_info, lost_thunk = dawn.callback_info(
            "WGPUDeviceLostCallbackInfo2", lost, mode="AllowSpontaneous"
        )
        error_info, error_thunk = dawn.callback_info("WGPUUncapturedErrorCallbackInfo2", uncaptured)
        descriptor.deviceLostCallbackInfo2 = lost_info
        descriptor.uncapturedErrorCallbackInfo2 = error_info
        _KEEP_ALIVE.extend([lost_thunk, error_thunk])

    def _wire_logging(self, device: Any, events: _Events) -> None:
        """Dawn's log: errors are raised by the next operation, warnings kept, the rest dropped."""
        dawn, w = self._dawn, self._dawn.w

        def log(level: int, message: Any, _userdata: Any) -> None:
            text = dawn.text(message)
            if level == w.WGPULoggingType_Error:
                events.errors.append(text)
            elif level == w.WGPULoggingType_Warning:
                events.warnings.append(text)

        thunk = w.WGPULoggingCallback(log)
        _KEEP_ALIVE.append(thunk)
        w.wgpuDeviceSetLoggingCallback(device, thunk, None)
