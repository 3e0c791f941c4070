"""The wgpu-py (wgpu-native + naga) implementation of the GPU runtime interface.

wgpu-py 0.32 has no error scopes (``push_error_scope`` raises NotImplementedError). Instead it
wraps every wgpu-native call: an error reported during the call is raised as
``GPUValidationError`` (or another ``GPUError``) by that call, e.g. by
``create_shader_module``, ``create_compute_pipeline``, ``create_bind_group`` or, for errors
recorded in a command encoder, by ``GPUCommandEncoder.finish``. Errors arriving outside a call
(device loss, the poller thread) are only *logged* to the "wgpu" logger; so every operation
here also watches that logger and raises what it logs at ERROR level.

wgpu is imported lazily: importing doppler_gen must not pay for (or require) it.
"""

from __future__ import annotations

import logging
import numbers
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

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
    sliced_wait,
    warmup_batches,
)
from doppler_gen.errors import (
    BackendUnavailable,
    DopplerGenError,
    GpuTimeout,
    ShaderCompileError,
)

_R = TypeVar("_R")

BACKEND_NAME = "wgpu"
# wgpu-native names the WebGPU "subgroups" feature "subgroup"; we report both so callers can
# ask with the WebGPU name (wgpu-py translates "subgroups" back when requesting a device).
_FEATURE_ALIASES = {"subgroup": "subgroups"}
# naga 0.32 rejects `enable subgroups;` ("not yet supported") yet compiles the subgroup builtins
# on a device with the native "subgroup" feature; Tint requires the directive. Generated kernels
# carry what browsers need, and compile() drops the name from enable directives for naga.
_NAGA_UNSUPPORTED_ENABLES = ("subgroups",)
_ENABLE = re.compile(r"^(?P<indent>[ \t]*)enable\s+(?P<names>[^;]*);", re.MULTILINE)
# wgpu-core refuses query sets above 4096 queries; two timestamps per timed pass.
_MAX_TIMED_PASSES_PER_SUBMIT = 1024
# How often the waiting (main) thread wakes to run Python's signal handlers (Ctrl-C).
_WAKE_S = 0.1


def _import_wgpu() -> Any:
    """Import wgpu-py, turning its absence into an error that says how to get it."""
    try:
        import wgpu
        import wgpu.backends.wgpu_native  # the only wgpu-py backend that runs outside a browser
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BackendUnavailable(
            f"wgpu-py is not importable ({exc}); install it: pip install wgpu==0.32.0"
        ) from None
    return wgpu


# --------------------------------------------------------------------------- error capture


class _ErrorLogCapture(logging.Filter):
    """Collects (and withholds) ERROR records from the "wgpu" logger during one operation."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            self.messages.append(record.getMessage())
            return False
        return True


@contextmanager
def _watch_wgpu_log() -> Iterator[list[str]]:
    """Yield the list of errors wgpu logs (instead of raising) while the block runs.

    Records are withheld from stderr: either the block raises the same error as an exception
    (wgpu sometimes logs a duplicate), or the caller raises what was collected.
    """
    logger = logging.getLogger("wgpu")
    capture = _ErrorLogCapture()
    logger.addFilter(capture)
    try:
        yield capture.messages
    finally:
        logger.removeFilter(capture)


# Lines of wgpu's error text that carry no information for a user.
_NOISE = re.compile(r"^(Validation Error|Caused by:|In wgpu\w+.*)$")
# codespan-reporting layout used by naga: location header, gutter, source, markers, notes.
_LOCATION = re.compile(r"┌─ (?P<file>.*):(?P<line>\d+):(?P<col>\d+)[ \t]*$", re.MULTILINE)
_SOURCE = re.compile(r"^\s*(?P<line>\d+)\s+│")
_MARKER = re.compile(r"^(?P<gutter>\s*│)(?P<pad>\s*)[\^-]+\s*(?P<label>.*)$")
_NOTE = re.compile(r"^\s*=\s*(?:note:\s*)?(?P<note>.*)$")
_SNIPPET = re.compile(r"^\s*(┌─|│|\d+\s+│|=\s)")
_SHADER_PREFIX = re.compile(r"^Shader (?:'[^']*' )?(?=\w+ error: )")


def _summary_lines(text: str) -> list[str]:
    """The message lines of a wgpu error: the cause chain and naga's notes, deduplicated."""
    lines: list[str] = []
    for raw in text.splitlines():
        stripped = raw.strip()
        note = _NOTE.match(raw) if raw.lstrip().startswith("=") else None
        if note:
            stripped = note.group("note").strip()
        elif not stripped or _NOISE.match(stripped) or _SNIPPET.match(raw):
            continue
        stripped = _SHADER_PREFIX.sub("", stripped)
        if stripped and stripped not in lines:
            lines.append(stripped)
    return lines


def one_line(text: str) -> str:
    """Collapse wgpu's multi-line error text into one line a user can read in a log."""
    lines = _summary_lines(text)
    return ": ".join(lines) if lines else " ".join(text.split())


def parse_diagnostics(text: str) -> list[tuple[int, int, str]]:
    """``(line, column, message)`` for every location naga marks in ``text``.

    naga prints codespan snippets: a header ``┌─ FILE:LINE:COL`` (FILE is ``wgsl`` for parse
    errors and the module label for validation errors), then source lines with their line
    numbers and marker lines (``^^^ label``). The header gives the primary location; each
    marker adds one, its column measured from the gutter. Lines and columns are 1-based.
    """
    summary = one_line(text)
    found: list[tuple[int, int, str]] = []
    header = _LOCATION.search(text)
    if header:
        found.append((int(header["line"]), int(header["col"]), summary))
    source_line: int | None = None
    for raw in text.splitlines():
        src = _SOURCE.match(raw)
        if src:
            source_line = int(src["line"])
            continue
        marker = _MARKER.match(raw)
        if marker and source_line is not None:
            column = len(marker["pad"])  # one space follows the gutter bar
            label = marker["label"].strip()
            _add_marker(found, source_line, column, f"{summary} ({label})" if label else summary)
    return found


def _add_marker(found: list[tuple[int, int, str]], line: int, col: int, message: str) -> None:
    """Record a marker; one at the header's location labels the header's entry instead."""
    places = [(d[0], d[1]) for d in found]
    if (line, col) not in places:
        found.append((line, col, message))
    elif places.index((line, col)) == 0:
        found[0] = (line, col, message)


def _hint(text: str) -> str:
    """The fix for errors whose cause is the device, not the WGSL."""
    if "`f16` extension is not supported" in text:
        return " (open the device with features=['shader-f16'])"
    return ""


def _compile_error(text: str, label: str) -> ShaderCompileError:
    """A one-line ShaderCompileError from wgpu's error text, with naga's locations."""
    diagnostics = parse_diagnostics(text)
    where = f" at line {diagnostics[0][0]}:{diagnostics[0][1]}" if diagnostics else ""
    name = f" {label!r}" if label else ""
    message = f"wgpu rejected kernel{name}{where}: {one_line(text)}{_hint(text)}"
    return ShaderCompileError(message, diagnostics=diagnostics, backend=BACKEND_NAME)


# --------------------------------------------------------------------------- conversions


def _neutral_features(features: Iterable[str]) -> frozenset[str]:
    names = set(features)
    names.update(alias for native, alias in _FEATURE_ALIASES.items() if native in names)
    return frozenset(names)


def _adapter_info(index: int, native: Any) -> AdapterInfo:
    """Describe a wgpu GPUAdapter in the neutral vocabulary."""
    info = native.info
    vendor = info.get("vendor") or f"0x{int(info.get('vendor_id', 0)):04x}"
    return AdapterInfo(
        index=index,
        name=info.get("device") or info.get("description") or "unknown adapter",
        backend=info.get("backend_type") or "Unknown",
        adapter_type=info.get("adapter_type") or "Unknown",
        vendor=vendor,
        driver=info.get("description") or "",
        features=_neutral_features(native.features),
        limits={name: int(value) for name, value in native.limits.items()},
    )


def _override_value(name: str, value: Any) -> bool | int | float:
    """Plain Python numbers for wgpu (it asserts on numpy scalars)."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise ShaderCompileError(
        f"override constant {name!r} must be a number, got {value!r}",
        diagnostics=[],
        backend=BACKEND_NAME,
    )


def naga_source(wgsl: str) -> str:
    """``wgsl`` with the enable-extensions naga rejects removed (same line numbers).

    An enable directive left with no name becomes a comment on the same line, so naga's error
    locations still point at the generated file's lines.
    """

    def adapt(match: re.Match[str]) -> str:
        names = [n.strip() for n in match["names"].split(",") if n.strip()]
        kept = [n for n in names if n not in _NAGA_UNSUPPORTED_ENABLES]
        if kept == names:
            return match.group(0)
        if not kept:
            return f"{match['indent']}// {match.group(0).strip()} (removed for naga)"
        return f"{match['indent']}enable {', '.join(kept)};"

    return _ENABLE.sub(adapt, wgsl)


def native_features(features: Iterable[str]) -> list[str]:
    """Feature names as wgpu-native knows them: WebGPU's "subgroups" is its "subgroup".

    wgpu-py 0.32 maps "subgroups" to the standard enum value, which wgpu-native ignores, so a
    device requested with it cannot run subgroup builtins ("requires capability SUBGROUP").
    """
    native = {alias: name for name, alias in _FEATURE_ALIASES.items()}
    return sorted({native.get(f, f) for f in features})


def _check_request(adapter: AdapterInfo, features: list[str], limits: Mapping[str, int]) -> None:
    """Refuse, with the name, a feature or limit the adapter cannot grant."""
    missing = [f for f in features if f not in adapter.features]
    if missing:
        raise BackendUnavailable(
            f"adapter {adapter.short()} lacks feature(s) {', '.join(missing)}; "
            "pick another adapter (--adapter) or do not require them"
        )
    for name, value in limits.items():
        offered = adapter.limits.get(name)
        if offered is None:
            raise BackendUnavailable(f"wgpu does not know the limit {name!r}")
        too_good = value < offered if name in ALIGNMENT_LIMITS else value > offered
        if too_good:
            raise BackendUnavailable(
                f"adapter {adapter.short()} offers {name} = {offered}, {value} was requested"
            )


# --------------------------------------------------------------------------- objects


class WgpuBuffer(Buffer):
    """A Buffer holding a wgpu GPUBuffer (allocated ``padded_size`` bytes)."""

    def __init__(self, native: Any, size: int, kind: str, *, read_write: bool, label: str) -> None:
        super().__init__(size, kind, read_write=read_write, label=label)
        self.native = native
        self.padded_size = int(native.size)


class WgpuPipeline(Pipeline):
    """A Pipeline holding a wgpu GPUComputePipeline."""

    def __init__(self, native: Any, label: str, entry_point: str) -> None:
        super().__init__(label, entry_point)
        self.native = native


class WgpuDevice(Device):
    """A wgpu GPUDevice behind the neutral Device interface."""

    backend_name = "wgpu"

    def __init__(self, adapter: AdapterInfo, native: Any) -> None:
        self._wgpu = _import_wgpu()
        self.adapter = adapter
        self.native = native
        self.features = _neutral_features(native.features)
        self.limits = {name: int(value) for name, value in native.limits.items()}
        self.spent = ""  # what did not finish in time: the device takes no more work

    # -- compile

    def compile(
        self,
        wgsl: str,
        *,
        entry_point: str = "main",
        constants: Mapping[str, float | int] | None = None,
        label: str = "",
    ) -> WgpuPipeline:
        """Create module and pipeline; any error wgpu reports becomes ShaderCompileError."""
        stage: dict[str, Any] = {"entry_point": entry_point}
        if constants:
            stage["constants"] = {k: _override_value(k, v) for k, v in constants.items()}
        with _watch_wgpu_log() as logged:
            try:
                stage["module"] = self.native.create_shader_module(
                    code=naga_source(wgsl), label=label
                )
                native = self.native.create_compute_pipeline(
                    label=label, layout="auto", compute=stage
                )
            except self._wgpu.GPUError as exc:
                raise _compile_error(str(exc), label) from None
        if logged:
            raise _compile_error("\n".join(logged), label)
        return WgpuPipeline(native, label, entry_point)

    # -- buffers

    def storage_buffer(
        self, data: bytes | np.ndarray, *, read_write: bool = False, label: str = ""
    ) -> WgpuBuffer:
        usage = self._wgpu.BufferUsage
        flags = usage.STORAGE | usage.COPY_DST | usage.COPY_SRC
        return self._buffer(data, flags, "storage", 4, read_write=read_write, label=label)

    def uniform_buffer(self, data: bytes, label: str = "") -> WgpuBuffer:
        usage = self._wgpu.BufferUsage
        flags = usage.UNIFORM | usage.COPY_DST | usage.COPY_SRC
        return self._buffer(data, flags, "uniform", 16, read_write=False, label=label)

    def _buffer(
        self, data: Any, flags: int, kind: str, multiple: int, *, read_write: bool, label: str
    ) -> WgpuBuffer:
        raw = as_bytes(data)
        with self._gpu_errors(f"creating {kind} buffer {label!r}"):
            native = self.native.create_buffer_with_data(
                label=label, data=pad_bytes(raw, multiple), usage=flags
            )
        return WgpuBuffer(native, len(raw), kind, read_write=read_write, label=label)

    def write_buffer(self, buffer: Buffer, data: bytes | np.ndarray) -> None:
        target = self._own(buffer)
        raw = as_bytes(data)
        if len(raw) > target.size:
            raise DopplerGenError(
                f"{len(raw)} bytes do not fit buffer {target.label!r} of {target.size} bytes"
            )
        doing = f"writing buffer {target.label!r}"
        with self._gpu_errors(doing):
            padded = pad_bytes(raw, 4)
            self._waited(doing, lambda: self.native.queue.write_buffer(target.native, 0, padded))

    def read_buffer(self, buffer: Buffer) -> bytes:
        source = self._own(buffer)
        doing = f"reading buffer {source.label!r}"
        with self._gpu_errors(doing):
            data = self._waited(doing, lambda: self.native.queue.read_buffer(source.native))
        return bytes(data)[: source.size]

    def _submit(self, encoder: Any, doing: str) -> None:
        """Submit one command buffer (wgpu-native blocks here while earlier work runs)."""
        commands = encoder.finish()
        self._waited(doing, lambda: self.native.queue.submit([commands]))

    def _spend(self, reason: str) -> None:
        """A wait was abandoned (``sliced_wait``): nothing more runs here."""
        self.spent = reason

    def _waited(self, doing: str, work: Callable[[], _R]) -> _R:
        """``work()``, run on a helper thread while this one waits for it.

        wgpu-native blocks inside ``queue.submit`` and ``queue.read_buffer`` while the GPU is
        busy, with no timeout, and Python runs a signal handler only between bytecodes: a
        kernel that never finishes held the main thread there for ever, deaf to Ctrl-C.
        Waiting here in short slices lets Ctrl-C through, and after ``gpu_wait_seconds`` the
        wait ends with GpuTimeout. The device is then spent (its kernel may run on; wgpu-py
        has no way to cancel it), and every later call on it raises at once.
        """
        if self.spent:
            raise GpuTimeout(f"the device cannot be used again: {self.spent}")
        done = threading.Event()
        result: list[Any] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                result.append(work())
            except BaseException as error:  # handed to the waiting thread
                failure.append(error)
            finally:
                done.set()

        threading.Thread(target=run, name="doppler-gen-gpu-wait", daemon=True).start()
        sliced_wait(lambda: done.wait(_WAKE_S), doing, "the GPU", self._spend)
        if failure:
            raise failure[0]
        return result[0]

    # -- dispatch

    def run(self, steps: Sequence[Step]) -> None:
        """Encode the steps as the dispatches of one compute pass, in order, and submit it."""
        label = self._label(steps)
        doing = f"dispatching {label!r}"
        with self._gpu_errors(doing):
            encoded = self._encoded(steps)
            encoder = self.native.create_command_encoder()
            self._encode_pass(encoder, encoded)
            self._submit(encoder, doing)

    def timed_run(
        self, steps: Sequence[Step], *, repeats: int, warmup: int, split_passes: bool = False
    ) -> list[PassTimes]:
        """Timestamps around every run of the sequence, runs back to back: one compute pass
        per run, or with ``split_passes`` a compute pass per step, each timestamped."""
        self._check_timing_request(steps, repeats, warmup)
        self._require_timestamps()
        label = self._label(steps)
        with self._gpu_errors(f"timing {label!r}"):
            encoded = self._encoded(steps)
            groups = [[step] for step in encoded] if split_passes else [encoded]
            for batch in warmup_batches(warmup):  # bounded command buffers, however many
                encoder = self.native.create_command_encoder()
                for _ in range(batch):
                    for group in groups:
                        self._encode_pass(encoder, group)
                self._submit(encoder, f"timing {label!r}")
            runs: list[PassTimes] = []
            per_submit = max(1, _MAX_TIMED_PASSES_PER_SUBMIT // len(groups))
            while len(runs) < repeats:
                count = min(repeats - len(runs), per_submit)
                runs.extend(self._timed_batch(groups, count))
        return runs

    def _encoded(self, steps: Sequence[Step]) -> list[tuple[WgpuPipeline, Any, tuple]]:
        """(pipeline, bind group, workgroups) of each step; bind groups are made once."""
        encoded = []
        for step in steps:
            pipeline = self._own_pipeline(step.pipeline)
            encoded.append((pipeline, self._bind_group(pipeline, step.bindings), step.workgroups))
        return encoded

    @staticmethod
    def _label(steps: Sequence[Step]) -> str:
        return " + ".join(s.pipeline.label for s in steps)

    def _timed_batch(
        self, groups: list[list[tuple[WgpuPipeline, Any, tuple]]], count: int
    ) -> list[PassTimes]:
        """``count`` timestamped runs in one submit (a compute pass per group of dispatches)."""
        usage = self._wgpu.BufferUsage
        queries = 2 * count * len(groups)
        query_set = self.native.create_query_set(type="timestamp", count=queries)
        resolved = self.native.create_buffer(
            size=8 * queries, usage=usage.QUERY_RESOLVE | usage.COPY_SRC
        )
        encoder = self.native.create_command_encoder()
        index = 0
        for _ in range(count):
            for group in groups:
                writes = {
                    "query_set": query_set,
                    "beginning_of_pass_write_index": index,
                    "end_of_pass_write_index": index + 1,
                }
                self._encode_pass(encoder, group, writes)
                index += 2
        encoder.resolve_query_set(query_set, 0, queries, resolved, 0)
        self._submit(encoder, "timed runs")
        read = self._waited("reading timestamps", lambda: self.native.queue.read_buffer(resolved))
        ticks = np.frombuffer(read, np.uint64)
        query_set.destroy()
        resolved.destroy()
        return pass_times(ticks, len(groups), self.timestamp_period())

    def timestamp_period(self) -> float:
        """Nanoseconds per timestamp tick.

        wgpu-py 0.32 has no public accessor and does not enable wgpu-native's automatic
        timestamp normalisation, so resolved values are raw ticks; the period comes from the
        C function ``wgpuQueueGetTimestampPeriod`` through wgpu-py's private cffi handle
        (1.0 on lavapipe and on NVIDIA/Vulkan). Falls back to 1.0 if that handle moved.
        """
        try:
            from wgpu.backends.wgpu_native._ffi import lib

            return float(lib.wgpuQueueGetTimestampPeriod(self.native.queue._internal))
        except (ImportError, AttributeError):  # pragma: no cover - other wgpu-py versions
            return 1.0

    def _bind_group(self, pipeline: WgpuPipeline, bindings: Mapping[int, Buffer]) -> Any:
        entries = []
        for slot, buffer in sorted(bindings.items()):
            native = self._own(buffer)
            resource = {"buffer": native.native, "offset": 0, "size": native.padded_size}
            entries.append({"binding": int(slot), "resource": resource})
        layout = pipeline.native.get_bind_group_layout(0)
        return self.native.create_bind_group(layout=layout, entries=entries)

    @staticmethod
    def _encode_pass(
        encoder: Any,
        dispatches: Sequence[tuple[WgpuPipeline, Any, tuple]],
        timestamp_writes: dict[str, Any] | None = None,
    ) -> None:
        """One compute pass holding ``dispatches`` in order (WebGPU makes each dispatch its own
        usage scope, so a dispatch sees what the ones before it wrote)."""
        compute_pass = encoder.begin_compute_pass(timestamp_writes=timestamp_writes)
        for pipeline, bind_group, workgroups in dispatches:
            compute_pass.set_pipeline(pipeline.native)
            compute_pass.set_bind_group(0, bind_group)
            x, y, z = (int(n) for n in workgroups)
            compute_pass.dispatch_workgroups(x, y, z)
        compute_pass.end()

    # -- plumbing

    @contextmanager
    def _gpu_errors(self, doing: str) -> Iterator[None]:
        """Raise wgpu's errors (thrown or merely logged) as one-line DopplerGenErrors."""
        with _watch_wgpu_log() as logged:
            try:
                yield
            except self._wgpu.GPUError as exc:
                raise DopplerGenError(f"wgpu error while {doing}: {one_line(str(exc))}") from None
        if logged:
            raise DopplerGenError(f"wgpu error while {doing}: {one_line(logged[0])}")

    def _own(self, buffer: Buffer) -> WgpuBuffer:
        return owned(buffer, WgpuBuffer, "wgpu", "created")

    @staticmethod
    def _own_pipeline(pipeline: Pipeline) -> WgpuPipeline:
        return owned(pipeline, WgpuPipeline, "wgpu", "compiled")

    def close(self) -> None:
        """Destroy the wgpu device (stopping its poller thread); a spent one is only dropped:
        destroying it would wait for the kernel that never finishes."""
        if self.native is not None and not self.spent:
            self.native.destroy()
        self.native = None


class WgpuBackend(Backend):
    """wgpu-py: naga compiles WGSL, wgpu-native runs it on Vulkan/Metal/DX12/GL."""

    name = BACKEND_NAME

    def __init__(self) -> None:
        self._wgpu = _import_wgpu()
        self._natives: list[Any] | None = None

    def version(self) -> str:
        native = getattr(self._wgpu.backends.wgpu_native, "__version__", "unknown")
        return f"wgpu-py {self._wgpu.__version__} (wgpu-native {native})"

    def _native_adapters(self) -> list[Any]:
        """wgpu's adapters, enumerated once: enumeration costs ~1 s on lavapipe."""
        if self._natives is None:
            self._natives = list(self._wgpu.gpu.enumerate_adapters_sync())
        return self._natives

    def adapters(self) -> list[AdapterInfo]:
        return [_adapter_info(i, a) for i, a in enumerate(self._native_adapters())]

    def _native_for(self, adapter: AdapterInfo) -> Any:
        natives = self._native_adapters()
        if 0 <= adapter.index < len(natives):
            native = natives[adapter.index]
            info = _adapter_info(adapter.index, native)
            if (info.name, info.backend) == (adapter.name, adapter.backend):
                return native
        raise BackendUnavailable(f"adapter {adapter.short()} is not one wgpu enumerates here")

    def open_device(
        self,
        adapter: AdapterInfo,
        *,
        features: Iterable[str] = (),
        limits: Mapping[str, int] | None = None,
    ) -> WgpuDevice:
        """Request exactly ``features``; unnamed limits get WebGPU defaults, not maxima.

        wgpu-py on its own requests the adapter's maximum for every limit not given, which
        hides kernels that exceed browser defaults; filling in the defaults here keeps the
        device as strict as a browser's unless the caller asks otherwise.
        """
        native = self._native_for(adapter)
        wanted = sorted(set(features))
        requested = effective_limits(adapter, "webgpu-default")
        requested.update({name: int(value) for name, value in (limits or {}).items()})
        _check_request(adapter, wanted, requested)
        with _watch_wgpu_log() as logged:
            try:
                device = native.request_device_sync(
                    label="doppler-gen",
                    required_features=native_features(wanted),
                    required_limits=requested,
                )
            except (RuntimeError, self._wgpu.GPUError) as exc:
                raise BackendUnavailable(
                    f"wgpu could not open {adapter.short()}: {one_line(str(exc))}"
                ) from None
        if logged:
            raise BackendUnavailable(f"wgpu could not open {adapter.short()}: {logged[0]}")
        return WgpuDevice(adapter, device)
