"""The implementation-neutral GPU runtime interface.

Kernels are validated on more than one WebGPU implementation (wgpu-py/naga now, Dawn/Tint
later), because a browser runs whichever one it ships. Everything here speaks WebGPU terms only
(kebab-case feature and limit names, bind group 0, ``layout: 'auto'``) so that callers never
learn which implementation they hold; nothing in this module may import an implementation.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

import numpy as np

from doppler_gen.errors import BackendUnavailable, DopplerGenError, GpuTimeout

_T = TypeVar("_T")

# How long one wait for GPU work (a submit, a buffer read) may take before the kernel is taken
# for one that never finishes. Generous: lavapipe runs the large tier's biggest cases for tens
# of seconds. The same limit for every backend (Dawn's wgpuInstanceWaitAny, wgpu's waits).
GPU_WAIT_S = 600.0
GPU_WAIT_VARIABLE = "DOPPLER_GEN_GPU_TIMEOUT"


# why a GPU wait of this process ran out of time: its kernel may still be running, so the
# process opens no other device (wgpu-native blocked a new device's request behind it for ever)
_SPENT: list[str] = []


def mark_process_spent(reason: str) -> None:
    """Record that a wait of this process timed out (``reason``); see ``process_spent``."""
    _SPENT.append(reason)


def process_spent() -> str | None:
    """Why this process may open no more devices (None: it may)."""
    return _SPENT[0] if _SPENT else None


def sliced_wait(
    finished: Callable[[], bool], doing: str, who: str, spend: Callable[[str], None]
) -> None:
    """Call ``finished`` (which waits one short slice, then says whether the work is done)
    until it is True: Ctrl-C gets through between slices, and after ``gpu_wait_seconds``
    GpuTimeout. Either way the work may still be running, so the caller's device is spent
    (``spend(reason)``) and so is the process (``process_spent``)."""
    limit = gpu_wait_seconds()
    deadline = time.monotonic() + limit
    reason = None
    try:
        while not finished():
            if time.monotonic() >= deadline:
                reason = f"{who} did not finish {doing} within {limit:g} s"
                raise GpuTimeout(f"{reason} (an endless loop? {GPU_WAIT_VARIABLE} sets the limit)")
    except KeyboardInterrupt:
        reason = f"interrupted while {doing}"
        raise
    finally:
        if reason is not None:
            spend(reason)
            mark_process_spent(reason)


def leave_if_spent(code: int) -> None:
    """End the process now with ``code`` when a GPU wait of it was abandoned (timed out or
    interrupted): the kernel may still run, and the interpreter's exit would release the
    device's objects, which waits for that kernel for ever. stdout and stderr are flushed
    first; nothing else is left to run by then. Returns when no wait was abandoned."""
    if not _SPENT:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def gpu_wait_seconds() -> float:
    """The time limit of one wait for GPU work: ``$DOPPLER_GEN_GPU_TIMEOUT`` seconds if set
    (a positive number; anything else is an error naming the variable), else GPU_WAIT_S."""
    text = os.environ.get(GPU_WAIT_VARIABLE, "").strip()
    if not text:
        return GPU_WAIT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise DopplerGenError(f"{GPU_WAIT_VARIABLE}={text!r}: must be a positive number of seconds")
    return seconds


LAVAPIPE_HINT = (
    "install Mesa's lavapipe (a Vulkan driver running on the CPU): "
    "apt-get install mesa-vulkan-drivers"
)

# The WebGPU specification's default limits: what a browser grants a page that asks for
# nothing. A kernel that fits these runs everywhere; one that needs more fails on some machines.
WEBGPU_DEFAULT_LIMITS: dict[str, int] = {
    "max-texture-dimension-1d": 8192,
    "max-texture-dimension-2d": 8192,
    "max-texture-dimension-3d": 2048,
    "max-texture-array-layers": 256,
    "max-bind-groups": 4,
    "max-bind-groups-plus-vertex-buffers": 24,
    "max-bindings-per-bind-group": 1000,
    "max-dynamic-uniform-buffers-per-pipeline-layout": 8,
    "max-dynamic-storage-buffers-per-pipeline-layout": 4,
    "max-sampled-textures-per-shader-stage": 16,
    "max-samplers-per-shader-stage": 16,
    "max-storage-buffers-per-shader-stage": 8,
    "max-storage-textures-per-shader-stage": 4,
    "max-uniform-buffers-per-shader-stage": 12,
    "max-uniform-buffer-binding-size": 65536,
    "max-storage-buffer-binding-size": 134217728,
    "min-uniform-buffer-offset-alignment": 256,
    "min-storage-buffer-offset-alignment": 256,
    "max-vertex-buffers": 8,
    "max-buffer-size": 268435456,
    "max-vertex-attributes": 16,
    "max-vertex-buffer-array-stride": 2048,
    "max-inter-stage-shader-variables": 16,
    "max-color-attachments": 8,
    "max-color-attachment-bytes-per-sample": 32,
    "max-compute-workgroup-storage-size": 16384,
    "max-compute-invocations-per-workgroup": 256,
    "max-compute-workgroup-size-x": 256,
    "max-compute-workgroup-size-y": 256,
    "max-compute-workgroup-size-z": 64,
    "max-compute-workgroups-per-dimension": 65535,
}

# For these two limits a *smaller* value is the more capable one.
ALIGNMENT_LIMITS = frozenset(
    {"min-uniform-buffer-offset-alignment", "min-storage-buffer-offset-alignment"}
)

LIMIT_PROFILES = ("adapter", "webgpu-default")

# Adapter types as WebGPU implementations name them; "gpu" in a `want` string means either.
_GPU_TYPES = frozenset({"discretegpu", "integratedgpu", "virtualgpu"})
_WANT_TYPES = {
    "gpu": _GPU_TYPES,
    "discrete": frozenset({"discretegpu"}),
    "integrated": frozenset({"integratedgpu"}),
    "virtual": frozenset({"virtualgpu"}),
    "cpu": frozenset({"cpu"}),
}


@dataclass(frozen=True)
class AdapterInfo:
    """What one WebGPU adapter is and offers, in implementation-neutral terms.

    ``index`` is the adapter's position in its backend's enumeration: the handle a user types
    (``--adapter 0``) and the backend uses to find the adapter again.
    """

    index: int
    name: str
    backend: str
    adapter_type: str
    vendor: str
    driver: str
    features: frozenset[str] = frozenset()
    limits: Mapping[str, int] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        # Frozen means frozen: a shared adapter's limits must not be edited by one caller.
        object.__setattr__(self, "limits", MappingProxyType(dict(self.limits)))

    @property
    def is_cpu(self) -> bool:
        """True for software rasterisers (lavapipe, SwiftShader, WARP): correct but slow."""
        return self.adapter_type.lower() == "cpu"

    @property
    def is_gpu(self) -> bool:
        """True for real hardware, the adapter a browser would normally run on."""
        return self.adapter_type.lower() in _GPU_TYPES

    def describe(self) -> str:
        """One line naming the adapter, for logs, errors and the doctor report."""
        driver = f", driver {self.driver}" if self.driver else ""
        return f"{self.name} — {self.backend} {self.adapter_type}{driver}"

    def short(self) -> str:
        """A compact ``[index] name (backend type)`` used when listing many adapters."""
        return f"[{self.index}] {self.name} ({self.backend} {self.adapter_type})"


def _list_adapters(adapters: Sequence[AdapterInfo]) -> str:
    return "; ".join(a.short() for a in adapters) if adapters else "none"


def _default_adapter(adapters: Sequence[AdapterInfo]) -> AdapterInfo | None:
    """A Vulkan GPU, else Vulkan on the CPU (lavapipe).

    OpenGL adapters are skipped: wgpu's GL backend lacks shader-f16 and is not what any
    browser runs compute on, so a pass there would prove nothing.
    """
    vulkan = [a for a in adapters if a.backend.lower() == "vulkan"]
    for candidate in (a for a in vulkan if a.is_gpu):
        return candidate
    for candidate in (a for a in vulkan if a.is_cpu):
        return candidate
    return None


def _matches(adapter: AdapterInfo, want: str) -> bool:
    """Whether ``want`` (an index, type, backend or name fragment) names ``adapter``."""
    key = want.strip().lower()
    if key.isdigit():
        return adapter.index == int(key)
    if key in _WANT_TYPES:
        return adapter.adapter_type.lower() in _WANT_TYPES[key]
    if key == adapter.backend.lower():
        return True
    return key in adapter.name.lower()


def select_adapter(adapters: Sequence[AdapterInfo], want: str | None) -> AdapterInfo:
    """Pick the adapter kernels run on.

    ``want=None`` applies the default rule (Vulkan GPU, else Vulkan CPU, never OpenGL). A
    ``want`` string is an index ("0"), a type ("gpu", "cpu", "discrete", "integrated"), a
    backend ("vulkan") or a case-insensitive substring of the adapter name. Among several
    matches, the one the default rule prefers wins, then the first; so ``want="llvmpipe"``
    picks lavapipe's Vulkan adapter over its OpenGL twin, while ``want="opengl"`` is the
    only way to reach the latter.
    """
    if want is None or not want.strip():
        chosen = _default_adapter(adapters)
        if chosen is None:
            raise BackendUnavailable(
                f"no Vulkan adapter found (adapters: {_list_adapters(adapters)}); {LAVAPIPE_HINT}"
            )
        return chosen
    matches = [a for a in adapters if _matches(a, want)]
    if not matches:
        raise BackendUnavailable(
            f"no adapter matches {want!r}; available: {_list_adapters(adapters)}"
        )
    return _default_adapter(matches) or matches[0]


def effective_limits(adapter: AdapterInfo, profile: str) -> dict[str, int]:
    """The limits to request for ``profile``.

    "adapter" asks for everything the adapter can do (what wgpu-py does by default, and why a
    kernel can pass in Python yet fail in a browser); "webgpu-default" asks for what a browser
    grants by default, lowered where the adapter cannot even reach that. Only WebGPU limits
    are returned, so the result means the same thing to every implementation.
    """
    if profile not in LIMIT_PROFILES:
        raise BackendUnavailable(
            f"unknown limit profile {profile!r}; choose one of: {', '.join(LIMIT_PROFILES)}"
        )
    limits: dict[str, int] = {}
    for name, default in WEBGPU_DEFAULT_LIMITS.items():
        offered = adapter.limits.get(name)
        if offered is None:
            limits[name] = default
        elif profile == "adapter":
            limits[name] = int(offered)
        elif name in ALIGNMENT_LIMITS:
            limits[name] = max(default, int(offered))
        else:
            limits[name] = min(default, int(offered))
    return limits


def as_bytes(data: bytes | bytearray | memoryview | np.ndarray) -> bytes:
    """The raw bytes of a buffer's contents (numpy arrays in C order)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).tobytes()
    return bytes(data)


def pad_bytes(data: bytes, multiple: int) -> bytes:
    """Pad to a non-zero multiple of ``multiple``: WebGPU copies and bindings need 4 B units."""
    size = max(multiple, -(-len(data) // multiple) * multiple)
    return data + bytes(size - len(data))


def owned(value: object, kind: type[_T], backend: str, made: str) -> _T:
    """``value`` as this backend's own ``kind``; another backend's object is a programming error."""
    if not isinstance(value, kind):
        raise TypeError(f"{value!r} was not {made} by a {backend} device")
    return value


class Buffer:
    """A GPU buffer. ``size`` is the caller's byte count; the allocation may be padded.

    Implementations subclass it to carry their native handle; callers only read the fields.
    """

    def __init__(self, size: int, kind: str, *, read_write: bool = False, label: str = "") -> None:
        self.size = size
        self.kind = kind  # "storage" or "uniform"
        self.read_write = read_write
        self.label = label

    def __repr__(self) -> str:
        access = " read_write" if self.read_write else ""
        return f"<{type(self).__name__} {self.kind}{access} {self.size} B {self.label!r}>"


class Pipeline:
    """A compute pipeline with layout "auto": its bind group 0 follows from the WGSL.

    Implementations subclass it to carry their native handle; callers only read the fields.
    """

    def __init__(self, label: str, entry_point: str) -> None:
        self.label = label
        self.entry_point = entry_point

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label!r} entry {self.entry_point!r}>"


# Passes encoded into one command buffer at most: a million warm-up passes in one buffer grow
# host memory without bound, so warm-ups are submitted in batches of this many.
MAX_PASSES_PER_COMMAND_BUFFER = 256


def warmup_batches(warmup: int) -> list[int]:
    """Sizes of the command buffers ``warmup`` untimed passes are encoded into, in order."""
    full, rest = divmod(max(0, warmup), MAX_PASSES_PER_COMMAND_BUFFER)
    return [MAX_PASSES_PER_COMMAND_BUFFER] * full + ([rest] if rest else [])


@dataclass(frozen=True)
class Step:
    """One dispatch of a run: a pipeline, its bind group 0 and its workgroup count."""

    pipeline: Pipeline
    bindings: Mapping[int, Buffer]
    workgroups: tuple[int, int, int]


@dataclass(frozen=True)
class PassTimes:
    """One timed run of a dispatch sequence, in ns: the whole (first compute pass's begin to
    last compute pass's end timestamp, so gaps between passes count) and each compute pass's
    own begin/end span (one pass holding every dispatch, or a pass per dispatch)."""

    total_ns: float
    passes_ns: tuple[float, ...]


def pass_times(ticks: np.ndarray, passes: int, period: float = 1.0) -> list[PassTimes]:
    """Resolved begin/end timestamps (2 per pass, runs back to back) as PassTimes per run."""
    spans = ticks.astype(np.int64).reshape(-1, passes, 2)
    return [
        PassTimes(
            float(run[-1, 1] - run[0, 0]) * period,
            tuple(float(end - begin) * period for begin, end in run),
        )
        for run in spans
    ]


class Device(ABC):
    """An open WebGPU device: compile, move bytes, dispatch, time.

    Errors the implementation reports are raised, never logged and dropped: a kernel that
    silently failed to compile would otherwise be "validated" against stale output.
    """

    adapter: AdapterInfo
    limits: Mapping[str, int]
    features: frozenset[str]
    backend_name = "WebGPU"

    def _require_timestamps(self) -> None:
        """Timing needs timestamp queries; say whether to request them or to use another adapter."""
        if "timestamp-query" in self.features:
            return
        offered = "timestamp-query" in self.adapter.features
        fix = (
            "open the device with features=['timestamp-query']"
            if offered
            else f"this adapter does not offer it under {self.backend_name}; time on another adapter"
        )
        raise BackendUnavailable(
            f"GPU timing needs the timestamp-query feature, which the {self.backend_name} device "
            f"on {self.adapter.short()} lacks: {fix}"
        )

    @abstractmethod
    def compile(
        self,
        wgsl: str,
        *,
        entry_point: str = "main",
        constants: Mapping[str, float | int] | None = None,
        label: str = "",
    ) -> Pipeline:
        """Create the shader module and its compute pipeline; raise ShaderCompileError."""

    @abstractmethod
    def storage_buffer(
        self, data: bytes | np.ndarray, *, read_write: bool = False, label: str = ""
    ) -> Buffer:
        """A storage buffer holding ``data`` (padded to a multiple of 4 bytes)."""

    @abstractmethod
    def uniform_buffer(self, data: bytes, label: str = "") -> Buffer:
        """A uniform buffer holding ``data`` (padded to a multiple of 16 bytes)."""

    @abstractmethod
    def write_buffer(self, buffer: Buffer, data: bytes | np.ndarray) -> None:
        """Overwrite the start of ``buffer`` with ``data``."""

    @abstractmethod
    def read_buffer(self, buffer: Buffer) -> bytes:
        """The buffer's ``size`` bytes, after all submitted work finished."""

    @abstractmethod
    def run(self, steps: Sequence[Step]) -> None:
        """Encode the steps as the dispatches of one compute pass, in order; submit.

        One pass, as a host records a multi-pass kernel: WebGPU makes each dispatch its own
        usage scope, so a pass sees what the passes before it wrote, and consecutive
        dispatches of one compute pass cost less GPU time than a compute pass each.
        """

    @abstractmethod
    def timed_run(
        self, steps: Sequence[Step], *, repeats: int, warmup: int, split_passes: bool = False
    ) -> list[PassTimes]:
        """``repeats`` timed runs of the whole sequence after ``warmup`` untimed ones: each run
        one timestamped compute pass (as ``run`` encodes it), or with ``split_passes`` a
        timestamped compute pass per step (each step's own time, plus the gaps between)."""

    def dispatch(
        self,
        pipeline: Pipeline,
        bindings: Mapping[int, Buffer],
        workgroups: tuple[int, int, int],
    ) -> None:
        """Run ``pipeline`` once with ``bindings`` as bind group 0."""
        self.run([Step(pipeline, bindings, workgroups)])

    def timed_dispatch(
        self,
        pipeline: Pipeline,
        bindings: Mapping[int, Buffer],
        workgroups: tuple[int, int, int],
        *,
        repeats: int,
        warmup: int,
    ) -> list[float]:
        """GPU nanoseconds of each of ``repeats`` dispatches, after ``warmup`` untimed ones."""
        runs = self.timed_run(
            [Step(pipeline, bindings, workgroups)], repeats=repeats, warmup=warmup
        )
        return [r.total_ns for r in runs]

    @staticmethod
    def _check_timing_request(steps: Sequence[Step], repeats: int, warmup: int) -> None:
        if repeats < 1 or warmup < 0:
            raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
        if not steps:
            raise ValueError("nothing to time: no passes")

    @abstractmethod
    def close(self) -> None:
        """Release the device; the object is unusable afterwards."""

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Backend(ABC):
    """One WebGPU implementation (wgpu-py, pydawn): enumerates adapters and opens devices."""

    name: str

    @abstractmethod
    def version(self) -> str:
        """Human-readable version of the implementation, for reports and bug triage."""

    @abstractmethod
    def adapters(self) -> list[AdapterInfo]:
        """Every adapter the implementation sees, ``index`` in enumeration order."""

    @abstractmethod
    def open_device(
        self,
        adapter: AdapterInfo,
        *,
        features: Iterable[str] = (),
        limits: Mapping[str, int] | None = None,
    ) -> Device:
        """Open a device with exactly ``features`` and ``limits``.

        Limits not named get the WebGPU default (capped by the adapter), as in a browser;
        pass ``effective_limits(adapter, "adapter")`` to ask for the adapter's maxima.
        Raises BackendUnavailable naming a feature or limit the adapter cannot grant.
        """
