"""A Dawn WGPUDevice behind the neutral Device interface: compile, buffers, runs, timing.

Errors are never dropped: every operation runs inside error scopes whose errors are raised.
"""

from __future__ import annotations

import ctypes
import numbers
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np

from doppler_gen.backends.base import (
    AdapterInfo,
    Buffer,
    Device,
    PassTimes,
    Pipeline,
    Step,
    as_bytes,
    owned,
    pad_bytes,
    pass_times,
    warmup_batches,
)
from doppler_gen.backends.dawn.ffi import (
    F16_REFUSED,
    DawnRuntime,
    Events,
    enum_short,
    release_handle,
)
from doppler_gen.backends.dawn.tint import BACKEND_NAME, TintMessage, compile_error, one_line
from doppler_gen.errors import DopplerGenError, GpuTimeout, ShaderCompileError

# Dawn refuses query sets above 4096 queries; two timestamps per timed pass.
_MAX_TIMED_PASSES_PER_SUBMIT = 1024


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
        weakref.finalize(self, release_handle, release, native)


class DawnPipeline(Pipeline):
    """A Pipeline holding a Dawn WGPUComputePipeline."""

    def __init__(
        self, native: Any, label: str, entry_point: str, release: Callable[[Any], None]
    ) -> None:
        super().__init__(label, entry_point)
        self.native = native
        weakref.finalize(self, release_handle, release, native)


class DawnDevice(Device):
    """A Dawn WGPUDevice behind the neutral Device interface."""

    backend_name = "Dawn"

    def __init__(
        self, runtime: DawnRuntime, adapter: AdapterInfo, native: Any, events: Events
    ) -> None:
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
    def spent(self) -> str:
        """What did not finish in time on this device's instance ('' when all did): the
        validate worker holding it exits after its report (``runtime.workers``)."""
        return self._dawn.spent

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
            raise compile_error(text, label, located)
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
            raise compile_error("\n".join(errors), label, stage="compute pipeline")
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
        """Encode the steps as the dispatches of one compute pass, in order, and submit it."""
        label = " + ".join(s.pipeline.label for s in steps)
        with self._scoped(f"dispatching {label!r}"), self._bind_groups(steps) as encoded:
            encoder = self._w.wgpuDeviceCreateCommandEncoder(self.native, None)
            self._encode_pass(encoder, encoded)
            self._submit(encoder)

    def timed_run(
        self, steps: Sequence[Step], *, repeats: int, warmup: int, split_passes: bool = False
    ) -> list[PassTimes]:
        """Timestamps around every run of the sequence, runs back to back: one compute pass
        per run, or with ``split_passes`` a compute pass per step, each timestamped.

        Dawn resolves timestamps to nanoseconds itself; the device is opened with
        timestamp quantization off (Chrome rounds to 100 µs by default), so values are exact.
        """
        self._check_timing_request(steps, repeats, warmup)
        self._require_timestamps()
        label = " + ".join(s.pipeline.label for s in steps)
        runs: list[PassTimes] = []
        with self._scoped(f"timing {label!r}"), self._bind_groups(steps) as encoded:
            groups = [[step] for step in encoded] if split_passes else [encoded]
            for batch in warmup_batches(warmup):  # bounded command buffers, however many
                encoder = self._w.wgpuDeviceCreateCommandEncoder(self.native, None)
                for _ in range(batch):
                    for group in groups:
                        self._encode_pass(encoder, group)
                self._submit(encoder)
            per_submit = max(1, _MAX_TIMED_PASSES_PER_SUBMIT // len(groups))
            while len(runs) < repeats:
                count = min(repeats - len(runs), per_submit)
                runs.extend(self._timed_batch(groups, count))
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

    def _timed_batch(
        self, groups: list[list[tuple[Any, Any, tuple]]], count: int
    ) -> list[PassTimes]:
        """``count`` timestamped runs in one submit (a compute pass per group of dispatches)."""
        w = self._w
        queries = 2 * count * len(groups)
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
                for group in groups:
                    writes = w.WGPUComputePassTimestampWrites()
                    writes.querySet = query_set
                    writes.beginningOfPassWriteIndex = index
                    writes.endOfPassWriteIndex = index + 1
                    self._encode_pass(encoder, group, writes)
                    index += 2
            w.wgpuCommandEncoderResolveQuerySet(encoder, query_set, 0, queries, resolved, 0)
            self._submit(encoder)
            ticks = np.frombuffer(self._read(resolved, 8 * queries, "timestamps"), np.uint64)
        finally:
            w.wgpuQuerySetDestroy(query_set)
            w.wgpuQuerySetRelease(query_set)
            w.wgpuBufferDestroy(resolved)
            w.wgpuBufferRelease(resolved)
        return pass_times(ticks, len(groups))

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
            release_handle(w.wgpuBindGroupRelease, group)
            release_handle(w.wgpuBindGroupLayoutRelease, layout)

    def _encode_pass(
        self, encoder: Any, dispatches: Sequence[tuple[Any, Any, tuple]], writes: Any = None
    ) -> None:
        """One compute pass holding ``dispatches`` in order (WebGPU makes each dispatch its own
        usage scope, so a dispatch sees what the ones before it wrote)."""
        w = self._w
        descriptor = w.WGPUComputePassDescriptor()
        if writes is not None:
            descriptor.timestampWrites = ctypes.pointer(writes)
        compute_pass = w.wgpuCommandEncoderBeginComputePass(encoder, ctypes.byref(descriptor))
        for pipeline, group, workgroups in dispatches:
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
        except GpuTimeout:  # the scopes cannot be popped: that waits on the spent instance
            raise
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
                name = enum_short(w.WGPUErrorType__enumvalues, error_type, "WGPUErrorType_")
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
        if self.native is not None and not self.spent:  # a spent one would wait for ever
            self._events.closing = True
            self._w.wgpuQueueRelease(self.queue)
            self._w.wgpuDeviceDestroy(self.native)
            self._w.wgpuDeviceRelease(self.native)
            self.native = None


# --------------------------------------------------------------------------- backend
