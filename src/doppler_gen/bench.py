"""`doppler-gen bench`: GPU time, bandwidth and throughput of each variant, next to torch SDPA.

People pick variants and tile sizes by speed, so the numbers must be the GPU's own: each dispatch
is timed with begin/end-of-pass timestamp queries (scaled by the queue's timestamp period), after
warm-up dispatches, on buffers created once per (variant, shape); the report gives the median and
the p10–p90 spread of at least 20 runs. Kernels are driven by ``harness.KernelRunner`` with the
inputs of a ``CaseSpec`` for the shape, so bench measures exactly what ``validate`` checks.

Before timing, each (variant, shape) is dispatched once on NaN-poisoned output and every output
element must be finite: that catches unwritten outputs and blow-ups at shapes far larger than the
validation cases, without the cost of a float64 reference at 2048×2048×32 heads. Correctness
against the reference is ``validate``'s job (and ``tune`` validates every candidate).

Definitions (also in the JSON under ``methodology``):

* bytes: every buffer the dispatch binds, read once at its storage dtype, plus the output written
  once. The inputs hold exactly the keys attended, so this is the compulsory traffic; a kernel
  that re-reads K/V from DRAM moves more, and its GB/s here is a lower bound of what it moved.
* FLOPs: ``4 · pairs · h · d`` (QKᵀ and PV, two per multiply-add) over the unmasked (query, key)
  pairs; causal prefill counts the triangle only (see ``shapes.Shape.attended_pairs``).
* % of peak bandwidth: of the matched device profile's HBM bandwidth, else of a copy bandwidth
  measured here (a WGSL copy kernel, read + write, timed the same way).

A CPU adapter (lavapipe) is refused unless ``--allow-cpu``; its timings say nothing about GPUs,
so with ``--allow-cpu`` every row is labelled CPU.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from doppler_gen.backends import (
    AdapterInfo,
    Backend,
    Device,
    effective_limits,
    get_backend,
    select_adapter,
)
from doppler_gen.cases import NUMPY_DTYPES
from doppler_gen.config import Project
from doppler_gen.errors import BackendUnavailable, DopplerGenError, ShaderCompileError, ShapeError
from doppler_gen.harness import KernelRunner
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.outputs import select
from doppler_gen.render import RenderedKernel, Renderer
from doppler_gen.shapes import FAMILY_OF_KIND, Shape

MIN_REPEATS = 20
SDPA_UNAVAILABLE = "torch+CUDA not available"
METHODOLOGY = {
    "timing": "GPU timestamps at begin/end of each compute pass, scaled by the queue's timestamp "
    "period; warm-up dispatches first; median and p10-p90 of the timed runs",
    "bytes": "every bound buffer read once at its storage dtype + the output written once "
    "(inputs hold exactly the attended keys): compulsory traffic, so GB/s is a lower bound",
    "flops": "4 * attended (query, key) pairs * heads * head_dim; causal prefill counts the "
    "unmasked triangle only; softmax not counted",
    "l2_resident": "working set <= the profile's L2 size: repeats may be served from L2, so GB/s "
    "can exceed HBM; torch SDPA is timed the same way (no cache flush)",
    "sdpa": "torch.nn.functional.scaled_dot_product_attention in the variant's K/V storage dtype "
    "(one dtype for Q, K, V; int8/int4 cold tiers compare with f16, torch has no quantized "
    "SDPA), causal only for prefill (bottom-right mask when q < kv), GQA via enable_gqa, CUDA "
    "events after a GPU sleep so launches queue back to back, warm-up, median",
}


class CpuAdapterRefused(DopplerGenError):
    """The chosen adapter is a CPU rasteriser: timing it would mislead anyone choosing GPU code."""


# -- device profiles ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceProfile:
    """Published peaks of a GPU, to say how far a kernel is from the hardware.

    ``fp32_tflops`` is the non-tensor FP32 peak (FMA = 2 FLOPs): WGSL cannot reach tensor cores,
    so that, not the f16 tensor-core peak, is the ceiling of these kernels' arithmetic.
    """

    name: str
    match: tuple[str, ...]  # lower-case substrings that must all occur in the adapter name
    hbm_gbps: float
    fp32_tflops: float
    l2_bytes: int
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hbm_gbps": self.hbm_gbps,
            "fp32_tflops": self.fp32_tflops,
            "l2_bytes": self.l2_bytes,
            "source": self.source,
        }


# Most specific first: "NVIDIA H100 PCIe" must not match the SXM entry.
PROFILES = (
    DeviceProfile(
        "H200", ("h200",), 4800.0, 67.0, 50 << 20, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e"
    ),
    DeviceProfile(
        "H100 PCIe", ("h100", "pcie"), 2000.0, 51.0, 50 << 20, "NVIDIA H100 PCIe: 2.0 TB/s HBM2e"
    ),
    DeviceProfile(
        "H100 NVL", ("h100", "nvl"), 3900.0, 60.0, 50 << 20, "NVIDIA H100 NVL: 3.9 TB/s HBM3"
    ),
    DeviceProfile("H100", ("h100",), 3350.0, 67.0, 50 << 20, "NVIDIA H100 SXM5: 3.35 TB/s HBM3"),
)
PROFILE_NAMES = tuple(p.name for p in PROFILES)


def match_profile(adapter_name: str) -> DeviceProfile | None:
    """The profile whose every match string occurs in the adapter's name, if any."""
    lowered = adapter_name.lower()
    return next((p for p in PROFILES if all(m in lowered for m in p.match)), None)


def profile_named(name: str) -> DeviceProfile:
    for profile in PROFILES:
        if profile.name.lower() == name.lower():
            return profile
    raise DopplerGenError(f"unknown device profile {name!r} (known: {', '.join(PROFILE_NAMES)})")


# -- timings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Per-dispatch GPU times in ns; summarised by median and p10–p90 (robust to stragglers)."""

    samples_ns: tuple[float, ...]

    @property
    def runs(self) -> int:
        return len(self.samples_ns)

    @property
    def median_ns(self) -> float:
        return float(statistics.median(self.samples_ns))

    def percentile_ns(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.samples_ns, np.float64), q))

    def as_dict(self) -> dict[str, Any]:
        return {
            "median_us": _us(self.median_ns),
            "p10_us": _us(self.percentile_ns(10)),
            "p90_us": _us(self.percentile_ns(90)),
            "min_us": _us(min(self.samples_ns)),
            "max_us": _us(max(self.samples_ns)),
            "runs": self.runs,
        }

    def spread_text(self) -> str:
        return f"{self.percentile_ns(10) / 1e3:.1f}–{self.percentile_ns(90) / 1e3:.1f}"


def _us(ns: float) -> float:
    return round(ns / 1e3, 3)


@dataclass(frozen=True)
class Settings:
    """How each measurement is taken; shared by bench and tune so their numbers compare."""

    repeats: int = 30
    warmup: int = 5
    seed: int = 0
    storage_overrun: bool = False

    def __post_init__(self) -> None:
        if self.repeats < MIN_REPEATS:
            raise DopplerGenError(
                f"--repeats {self.repeats}: at least {MIN_REPEATS} runs are needed for a median "
                "and spread"
            )
        if self.warmup < 0:
            raise DopplerGenError(f"--warmup {self.warmup} must not be negative")


# -- results -----------------------------------------------------------------------------------


@dataclass
class BenchRow:
    """One variant on one shape: timed (ok), not runnable (n/a, with why) or broken (FAIL)."""

    variant: str
    shape: str
    status: str  # ok | n/a | FAIL
    reason: str = ""
    timing: Timing | None = None
    bytes_moved: int = 0
    flops: int = 0
    sdpa_dtype: str | None = None  # the dtype torch SDPA runs in for this row

    @property
    def gbps(self) -> float | None:
        """Effective bandwidth: bytes per ns is GB/s."""
        return self.bytes_moved / self.timing.median_ns if _positive(self.timing) else None

    @property
    def tflops(self) -> float | None:
        return self.flops / self.timing.median_ns / 1e3 if _positive(self.timing) else None


def _positive(timing: Timing | None) -> bool:
    """A median a rate can be divided by (a coarse timer can report 0 ns for a tiny dispatch)."""
    return timing is not None and timing.median_ns > 0


@dataclass
class CopyBandwidth:
    """A large device-local copy timed like the kernels: the attainable streaming bandwidth."""

    bytes_moved: int  # read + write
    timing: Timing

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.timing.median_ns if _positive(self.timing) else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes_moved, "gbps": round(self.gbps, 1), **self.timing.as_dict()}


@dataclass
class SdpaResult:
    """torch SDPA on one (shape, dtype): the reference speed a variant is compared with."""

    dtype: str
    timing: Timing | None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        timing = self.timing.as_dict() if self.timing else None
        return {"dtype": self.dtype, "timing": timing, "note": self.note}


@dataclass
class BenchRun:
    """Everything one bench run measured, with what is needed to interpret it."""

    backend: str
    adapter: str  # AdapterInfo.describe()
    is_cpu: bool
    settings: Settings
    limits: str
    shapes: list[str]
    rows: list[BenchRow]
    timestamp_period: float | None = None
    profile: DeviceProfile | None = None
    copy: CopyBandwidth | None = None
    copy_note: str = ""
    sdpa_status: str = SDPA_UNAVAILABLE
    sdpa: dict[tuple[str, str], SdpaResult] = field(default_factory=dict)

    @property
    def peak_gbps(self) -> float | None:
        """The bandwidth % of peak refers to: the profile's HBM, else the measured copy."""
        if self.profile:
            return self.profile.hbm_gbps
        return self.copy.gbps if self.copy else None

    @property
    def peak_basis(self) -> str:
        if self.profile:
            return f"{self.profile.name} profile HBM {self.profile.hbm_gbps:.0f} GB/s"
        if self.copy:
            return f"measured copy {self.copy.gbps:.1f} GB/s"
        return "none (no profile matched and no copy bandwidth measured)"

    @property
    def ok(self) -> bool:
        return not any(row.status == "FAIL" for row in self.rows)

    def sdpa_for(self, row: BenchRow) -> SdpaResult | None:
        return self.sdpa.get((row.shape, row.sdpa_dtype or ""))

    def ratio(self, row: BenchRow) -> float | None:
        """Variant time over SDPA time (2.0: twice as slow as torch)."""
        ref = self.sdpa_for(row)
        if row.timing is None or ref is None or not _positive(ref.timing):
            return None
        return row.timing.median_ns / ref.timing.median_ns

    def percent(self, row: BenchRow) -> dict[str, float | None]:
        """% of peak bandwidth (profile, copy) and of the FP32 peak, where known."""
        gbps, tflops = row.gbps, row.tflops
        out: dict[str, float | None] = {
            "pct_peak_bw": None,
            "pct_copy_bw": None,
            "pct_fp32_peak": None,
        }
        if gbps is None or tflops is None:
            return out
        if self.peak_gbps:
            out["pct_peak_bw"] = 100.0 * gbps / self.peak_gbps
        if self.copy:
            out["pct_copy_bw"] = 100.0 * gbps / self.copy.gbps
        if self.profile:
            out["pct_fp32_peak"] = 100.0 * tflops / self.profile.fp32_tflops
        return out

    def l2_resident(self, row: BenchRow) -> bool | None:
        if self.profile is None or row.status != "ok":
            return None
        return row.bytes_moved <= self.profile.l2_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": "doppler-gen bench",
            "backend": self.backend,
            "adapter": self.adapter,
            "cpu_adapter": self.is_cpu,
            "warning": cpu_warning(self.adapter) if self.is_cpu else None,
            "timestamp_period_ns": self.timestamp_period,
            "settings": {
                "repeats": self.settings.repeats,
                "warmup": self.settings.warmup,
                "seed": self.settings.seed,
                "limits": self.limits,
                "storage_overrun": self.settings.storage_overrun,
            },
            "profile": self.profile.as_dict() if self.profile else None,
            "copy_bandwidth": self.copy.as_dict() if self.copy else None,
            "copy_note": self.copy_note,
            "peak_bw_basis": self.peak_basis,
            "sdpa_status": self.sdpa_status,
            "shapes": self.shapes,
            "ok": self.ok,
            "methodology": METHODOLOGY,
            "rows": [self.row_dict(row) for row in self.rows],
        }

    def row_dict(self, row: BenchRow) -> dict[str, Any]:
        ref = self.sdpa_for(row)
        ratio = self.ratio(row)
        return {
            "variant": row.variant,
            "shape": row.shape,
            "status": row.status,
            "reason": row.reason,
            "cpu_adapter": self.is_cpu,
            "timing": row.timing.as_dict() if row.timing else None,
            "bytes": row.bytes_moved,
            "flops": row.flops,
            "gbps": _round(row.gbps),
            "tflops": _round(row.tflops),
            **{key: _round(value, 4) for key, value in self.percent(row).items()},
            "l2_resident": self.l2_resident(row),
            "sdpa": ref.as_dict() if ref else None,
            "ratio_to_sdpa": _round(ratio, 4),
        }


def _round(value: float | None, digits: int = 6) -> float | None:
    """``digits`` significant digits: enough for any comparison, short enough to read."""
    return None if value is None else float(f"{value:.{digits}g}")


def cpu_warning(adapter: str) -> str:
    return f"CPU ADAPTER ({adapter}): these timings say nothing about GPU performance"


# -- device ------------------------------------------------------------------------------------


def refuse_cpu(adapter: AdapterInfo, allow_cpu: bool, command: str) -> None:
    """Refuse a CPU adapter before anything runs, unless the user accepted CPU numbers."""
    if adapter.is_cpu and not allow_cpu:
        raise CpuAdapterRefused(
            f"{command} measures GPUs; {adapter.name} is a CPU adapter — timings would say nothing "
            f"about GPU performance; pass --allow-cpu to run anyway (results labelled CPU)"
        )


def choose_adapter(
    backend: Backend, want: str | None, allow_cpu: bool, command: str
) -> AdapterInfo:
    adapter = select_adapter(backend.adapters(), want)
    refuse_cpu(adapter, allow_cpu, command)
    return adapter


def open_timing_device(
    backend: Backend, adapter: AdapterInfo, kernels: Sequence[RenderedKernel], limits: str
) -> Device:
    """A device with timestamp queries and every feature the kernels need that the adapter has."""
    if "timestamp-query" not in adapter.features:
        raise BackendUnavailable(
            f"{adapter.short()} does not offer timestamp-query; bench needs GPU timestamps"
        )
    wanted = {f for k in kernels for f in k.variant.requires if f in adapter.features}
    features = sorted(wanted | {"timestamp-query"})
    return backend.open_device(adapter, features=features, limits=effective_limits(adapter, limits))


def timestamp_period(device: Device) -> float | None:
    """ns per tick, where the backend can say (already applied by timed_dispatch)."""
    getter = getattr(device, "timestamp_period", None)
    return float(getter()) if callable(getter) else None


COPY_WGSL = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    let n = arrayLength(&dst);
    let stride = groups.x * 256u;
    for (var i = gid.x; i < n; i = i + stride) {
        dst[i] = src[i];
    }
}
"""


def measure_copy(device: Device, mib: int, settings: Settings) -> CopyBandwidth:
    """Time a device-local copy of ``mib`` MiB (capped by the binding limit) like a kernel."""
    limit = min(
        device.limits.get("max-storage-buffer-binding-size", 1 << 27),
        device.limits.get("max-buffer-size", 1 << 28),
    )
    size = min(mib << 20, limit) // 16 * 16
    words = np.zeros(size // 4, np.uint32)
    src = device.storage_buffer(words, label="copy src")
    dst = device.storage_buffer(words, read_write=True, label="copy dst")
    pipeline = device.compile(COPY_WGSL, entry_point="main", label="copy bandwidth")
    groups = min(
        math.ceil(size / 16 / 256), device.limits.get("max-compute-workgroups-per-dimension", 65535)
    )
    times = device.timed_dispatch(
        pipeline, {0: src, 1: dst}, (groups, 1, 1), repeats=settings.repeats, warmup=settings.warmup
    )
    return CopyBandwidth(2 * size, Timing(tuple(times)))


# -- measuring one variant on one shape ---------------------------------------------------------


def measure(
    device: Device,
    kernel: RenderedKernel,
    entry: dict[str, Any],
    shape: Shape,
    settings: Settings,
    constants: dict[str, float] | None = None,
) -> BenchRow:
    """Check once (finite output), then time ``settings.repeats`` dispatches on the same buffers."""
    from doppler_gen.validate import static_skip

    row = BenchRow(kernel.variant.name, shape.label, "n/a", sdpa_dtype=sdpa_dtype(entry))
    skip, note = static_skip(entry, device, storage_overrun=settings.storage_overrun)
    if skip:
        row.reason = skip
        return row
    runner = KernelRunner(device, kernel, entry, constants)
    spec = shape.case_spec(settings.seed)
    try:
        runner.check_spec(spec)  # before building (possibly huge) inputs
        data = runner.build(spec)
        runner.check_shape(data)
    except ShapeError as error:
        row.reason = _without_prefix(error.message, kernel.variant.name)
        return row
    row.bytes_moved = bound_bytes(data.buffers, runner.output_shape(data), entry)
    row.flops = shape.flops()
    try:
        _time(device, runner, data, settings, row)
    except ShaderCompileError as error:
        row.status, row.reason = "FAIL", f"compile error: {error.message.splitlines()[0]}"
    except DopplerGenError as error:
        row.status, row.reason = "FAIL", str(error)
    if note and row.status == "ok":
        row.reason = note
    return row


def _time(
    device: Device, runner: KernelRunner, data: Any, settings: Settings, row: BenchRow
) -> None:
    bound = runner.bind(data)
    device.dispatch(bound.pipeline, bound.bindings, bound.workgroups)
    output = runner.read_output(bound)
    bad = int(output.size - np.isfinite(output).sum())
    if bad:
        row.status = "FAIL"
        row.reason = (
            f"{bad} of {output.size} outputs NaN/Inf after one dispatch on NaN-poisoned "
            f"output; not timed (run `doppler-gen validate {row.variant}`)"
        )
        return
    times = device.timed_dispatch(
        bound.pipeline,
        bound.bindings,
        bound.workgroups,
        repeats=settings.repeats,
        warmup=settings.warmup,
    )
    row.status, row.timing = "ok", Timing(tuple(times))


def bound_bytes(
    buffers: dict[str, np.ndarray], output_shape: tuple[int, ...], entry: dict[str, Any]
) -> int:
    """Compulsory traffic: every input buffer read once plus the output written once."""
    out_type = next(b["element_type"] for b in entry["bindings"] if b["access"] == "read_write")
    out_bytes = int(np.prod(output_shape)) * np.dtype(NUMPY_DTYPES[out_type]).itemsize
    return sum(int(array.nbytes) for array in buffers.values()) + out_bytes


def sdpa_dtype(entry: dict[str, Any]) -> str:
    """SDPA takes one dtype for Q, K and V: use the K/V storage dtype, which dominates traffic."""
    return str(entry["metadata"]["kv_dtype"])


def _without_prefix(message: str, name: str) -> str:
    prefix = f"{name}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


# -- the run -----------------------------------------------------------------------------------

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BenchRequest:
    """What the user asked bench to do (the CLI's options, minus output formatting)."""

    patterns: tuple[str, ...] = ()
    shapes: tuple[Shape, ...] = ()
    backend: str = "wgpu"
    adapter: str | None = None
    limits: str = "adapter"
    allow_cpu: bool = False
    copy_mib: int = 256
    profile: str | None = None  # a profile name, "none", or None to match the adapter name
    sdpa: bool = True
    settings: Settings = field(default_factory=Settings)


def run_bench(
    project: Project, request: BenchRequest, progress: Progress | None = None
) -> BenchRun:
    """Measure the selected variants on the shapes of their family; SDPA afterwards."""
    renderer = Renderer(project)
    kernels = [renderer.render(v, with_origins=True) for v in select(project, request.patterns)]
    backend = get_backend(request.backend)
    adapter = choose_adapter(backend, request.adapter, request.allow_cpu, "bench")
    device = open_timing_device(backend, adapter, kernels, request.limits)
    run = BenchRun(
        request.backend,
        adapter.describe(),
        adapter.is_cpu,
        request.settings,
        request.limits,
        [s.label for s in request.shapes],
        [],
        profile=_profile(request.profile, adapter),
    )
    try:
        run.timestamp_period = timestamp_period(device)
        run.copy, run.copy_note = _copy(device, request, progress)
        for kernel in kernels:
            run.rows.extend(_variant_rows(device, kernel, request, progress))
    finally:
        device.close()
    if request.sdpa:
        attach_sdpa(run, request.shapes, progress)
    else:
        run.sdpa_status = f"{SDPA_UNAVAILABLE} (--no-sdpa)"
    return run


def _profile(name: str | None, adapter: AdapterInfo) -> DeviceProfile | None:
    if name is None:
        return match_profile(adapter.name)
    return None if name.lower() == "none" else profile_named(name)


def _copy(
    device: Device, request: BenchRequest, progress: Progress | None
) -> tuple[CopyBandwidth | None, str]:
    if request.copy_mib <= 0:
        return None, "not measured (--copy-mib 0)"
    if progress:
        progress(f"copy bandwidth ({request.copy_mib} MiB)")
    copy = measure_copy(device, request.copy_mib, request.settings)
    return copy, f"WGSL copy kernel, {copy.bytes_moved // 2 >> 20} MiB read + written"


def _variant_rows(
    device: Device, kernel: RenderedKernel, request: BenchRequest, progress: Progress | None
) -> list[BenchRow]:
    entry = variant_entry(kernel, parse_kernel(kernel))
    family = entry["family"]
    shapes = [s for s in request.shapes if s.family == family]
    if not shapes:
        kinds = ", ".join(k for k, f in FAMILY_OF_KIND.items() if f == family)
        reason = f"no {family} shape given (--shape {kinds}:...)"
        return [BenchRow(kernel.variant.name, "-", "n/a", reason)]
    rows = []
    for shape in shapes:
        if progress:
            progress(f"{kernel.variant.name} on {shape.label}")
        rows.append(measure(device, kernel, entry, shape, request.settings))
    return rows


# -- torch SDPA --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SdpaPlan:
    """How to run one shape through torch SDPA so that it computes what the kernel computes."""

    shape: Shape
    dtype: str

    @property
    def is_causal(self) -> bool:
        """torch's is_causal is top-left aligned: right only when queries and keys coincide."""
        return (
            self.shape.kind == "prefill"
            and self.shape.causal
            and self.shape.query_len == self.shape.kv_len
        )

    @property
    def lower_right_mask(self) -> bool:
        """Chunked causal prefill (q < kv) needs an explicit bottom-right mask."""
        s = self.shape
        return s.kind == "prefill" and s.causal and s.query_len < s.kv_len


def torch_cuda() -> tuple[Any | None, str]:
    """(torch, "torch X on DEVICE") when torch sees CUDA, else (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, f"{SDPA_UNAVAILABLE} (torch is not importable)"
    if not torch.cuda.is_available():
        return None, f"{SDPA_UNAVAILABLE} (torch {torch.__version__} sees no CUDA device)"
    return torch, f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}"


def attach_sdpa(run: BenchRun, shapes: Sequence[Shape], progress: Progress | None = None) -> None:
    """Time SDPA once per (shape, dtype) some timed row needs, and record it on the run."""
    torch, run.sdpa_status = torch_cuda()
    if torch is None:
        return
    by_label = {s.label: s for s in shapes}
    wanted = sorted(
        {(r.shape, r.sdpa_dtype) for r in run.rows if r.status == "ok" and r.sdpa_dtype}
    )
    for label, dtype in wanted:
        if progress:
            progress(f"torch SDPA {dtype} on {label}")
        run.sdpa[(label, dtype)] = time_sdpa(torch, SdpaPlan(by_label[label], dtype), run.settings)


def time_sdpa(torch: Any, plan: SdpaPlan, settings: Settings) -> SdpaResult:
    """Median CUDA-event time of SDPA on random inputs of the plan's shape and dtype."""
    try:
        call, note = _sdpa_call(torch, plan)
        times = _cuda_event_times(torch, call, settings)
    except (RuntimeError, ValueError) as error:  # OOM, unsupported dtype/shape combination
        return SdpaResult(plan.dtype, None, f"SDPA failed: {str(error).splitlines()[0]}")
    return SdpaResult(plan.dtype, Timing(tuple(times)), note)


def _sdpa_call(torch: Any, plan: SdpaPlan) -> tuple[Callable[[], Any], str]:
    """A zero-argument SDPA call, using enable_gqa where torch has it (else repeated K/V)."""
    s, dtype = plan.shape, {"f16": torch.float16, "f32": torch.float32}[plan.dtype]
    generator = torch.Generator(device="cuda").manual_seed(0)

    def tensor(heads: int, length: int) -> Any:
        return torch.randn(
            1, heads, length, s.head_dim, device="cuda", dtype=dtype, generator=generator
        )

    q, k, v = (
        tensor(s.num_heads, s.query_len),
        tensor(s.num_kv_heads, s.kv_len),
        tensor(s.num_kv_heads, s.kv_len),
    )
    mask, notes = None, []
    if plan.lower_right_mask:
        ones = torch.ones(s.query_len, s.kv_len, dtype=torch.bool, device="cuda")
        mask = ones.tril(diagonal=s.kv_len - s.query_len)
        notes.append("explicit bottom-right causal mask")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if s.num_heads == s.num_kv_heads:
        return (lambda: sdpa(q, k, v, attn_mask=mask, is_causal=plan.is_causal)), "; ".join(notes)
    try:
        sdpa(q, k, v, attn_mask=mask, is_causal=plan.is_causal, enable_gqa=True)
        notes.append("enable_gqa")
        return (
            lambda: sdpa(q, k, v, attn_mask=mask, is_causal=plan.is_causal, enable_gqa=True)
        ), "; ".join(notes)
    except TypeError:  # torch < 2.5: no enable_gqa; repeat K/V outside the timed region
        group = s.num_heads // s.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        notes.append("K/V repeated per query head (torch without enable_gqa)")
        return (lambda: sdpa(q, k, v, attn_mask=mask, is_causal=plan.is_causal)), "; ".join(notes)


def _cuda_event_times(torch: Any, call: Callable[[], Any], settings: Settings) -> list[float]:
    """ns per call from CUDA events; a GPU sleep first lets the launches queue up back to back,
    so the numbers are GPU time like the WebGPU timestamps, not Python launch overhead."""
    for _ in range(max(settings.warmup, 1)):
        call()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(settings.repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(settings.repeats)]
    sleep = getattr(torch.cuda, "_sleep", None)
    if callable(sleep):
        sleep(20_000_000)
    for start, end in zip(starts, ends, strict=True):
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e6 for start, end in zip(starts, ends, strict=True)]


# -- report ------------------------------------------------------------------------------------


def format_report(run: BenchRun) -> str:
    """The human-readable report: context lines, one table row per (variant, shape), notes."""
    from doppler_gen.listing import format_table

    sdpa_ok = not run.sdpa_status.startswith(SDPA_UNAVAILABLE)
    headers = ["variant", "shape", "median µs", "p10–p90 µs", "GB/s", "%BW", "TFLOP/s", "%FP32"]
    headers += ["SDPA µs", "×SDPA"] if sdpa_ok else ["SDPA"]
    headers.append("note")
    if run.is_cpu:
        headers.insert(0, "adapter")
    rows = [_table_row(run, row, sdpa_ok) for row in run.rows]
    lines = [
        *_banner(run),
        *_context(run),
        "",
        format_table(headers, rows),
        "",
        _summary(run, sdpa_ok),
    ]
    lines.extend(_banner(run))
    return "\n".join(lines)


def _banner(run: BenchRun) -> list[str]:
    return [f"*** {cpu_warning(run.adapter)} ***"] if run.is_cpu else []


def _context(run: BenchRun) -> list[str]:
    period = f"; timestamp period {run.timestamp_period:g} ns/tick" if run.timestamp_period else ""
    copy = f"{run.copy.gbps:.1f} GB/s ({run.copy_note})" if run.copy else run.copy_note
    copy = copy or "not measured"
    s = run.settings
    return [
        f"adapter: {run.adapter} [{run.backend}, limits {run.limits}]{period}",
        f"timing: median and p10–p90 of {s.repeats} GPU-timestamped dispatches after "
        f"{s.warmup} warm-up",
        f"%BW is of: {run.peak_basis}",
        f"copy bandwidth: {copy}",
        f"SDPA: {run.sdpa_status}",
    ]


def _table_row(run: BenchRun, row: BenchRow, sdpa_ok: bool) -> list[str]:
    pct = run.percent(row)
    cells = [row.variant, row.shape]
    if row.timing is None:
        cells += [row.status] + ["-"] * 5
    else:
        cells += [
            f"{row.timing.median_ns / 1e3:.1f}",
            row.timing.spread_text(),
            number(row.gbps),
            _pct(pct["pct_peak_bw"]),
            number(row.tflops),
            _pct(pct["pct_fp32_peak"]),
        ]
    cells += _sdpa_cells(run, row) if sdpa_ok else [SDPA_UNAVAILABLE if row.timing else "-"]
    cells.append(_note(run, row))
    return (["CPU"] if run.is_cpu else []) + cells


def _sdpa_cells(run: BenchRun, row: BenchRow) -> list[str]:
    ref, ratio = run.sdpa_for(row), run.ratio(row)
    if ref is None or ref.timing is None:
        return ["-", "-"]
    return [f"{ref.timing.median_ns / 1e3:.1f} ({ref.dtype})", f"{ratio:.2f}" if ratio else "-"]


def _note(run: BenchRun, row: BenchRow) -> str:
    parts = [f"({row.reason})" if row.status != "ok" and row.reason else row.reason]
    resident = run.l2_resident(row)
    if resident is not None and run.profile is not None:
        # every shape says which side of L2 it is on: decode at 8k keys is L2-resident, 32k is not
        size = f"{row.bytes_moved / 2**20:.1f} of {run.profile.l2_bytes / 2**20:.0f} MiB"
        parts.append(f"L2-resident ({size})" if resident else f"exceeds L2 ({size})")
    ref = run.sdpa_for(row)
    if ref and ref.note:
        parts.append(f"SDPA: {ref.note}")
    return "; ".join(p for p in parts if p)


def number(value: float | None) -> str:
    """Three significant digits, whole numbers from 100 up: 4521, 45.2, 0.0452."""
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _summary(run: BenchRun, sdpa_ok: bool) -> str:
    counts = {s: sum(r.status == s for r in run.rows) for s in ("ok", "n/a", "FAIL")}
    ratio = "; ×SDPA > 1 is slower than torch" if sdpa_ok else ""
    return (
        f"{counts['ok']} timed, {counts['n/a']} n/a, {counts['FAIL']} failed. "
        "bytes: bound buffers read once + output written once; FLOPs: 4·pairs·h·d over "
        f"unmasked pairs{ratio}."
    )


# -- chart -------------------------------------------------------------------------------------


def require_matplotlib() -> Any:
    """matplotlib.pyplot on the Agg backend, or a one-line error naming the optional extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DopplerGenError(
            "--plot needs matplotlib, an optional extra: pip install 'doppler-gen[plot]'"
        ) from None
    return plt


def plot(run: BenchRun, path: Path) -> None:
    """Bars of median µs (log scale) per shape and variant; SDPA as a dashed line per group."""
    plt = require_matplotlib()
    shapes = list(dict.fromkeys(r.shape for r in run.rows if r.shape != "-"))
    variants = list(dict.fromkeys(r.variant for r in run.rows))
    colors = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    fig, ax = plt.subplots(figsize=(max(6.0, 2.4 * len(shapes) + 2) + 3, 4.8))
    labelled: set[str] = set()
    for index, shape in enumerate(shapes):
        group = [r for r in run.rows if r.shape == shape]
        width = 0.8 / len(group)
        for slot, row in enumerate(group):
            x = index - 0.4 + width * (slot + 0.5)
            _plot_bar(ax, row, x, width, colors[row.variant], row.variant not in labelled)
            labelled.add(row.variant)
    _plot_sdpa(ax, run, shapes)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([s.replace(",", ",\n", 1) for s in shapes], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("GPU time per dispatch (µs, median)")
    warning = "CPU ADAPTER — NOT GPU PERFORMANCE\n" if run.is_cpu else ""
    ax.set_title(f"{warning}doppler-gen bench on {run.adapter.split(' — ')[0]}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_bar(ax: Any, row: BenchRow, x: float, width: float, color: str, label: bool) -> None:
    """One bar, or an "n/a"/"FAIL" mark at the bottom where nothing was timed."""
    if row.timing is None:
        mark = "n/a" if row.status == "n/a" else "FAIL"
        ax.text(
            x,
            0.02,
            f"{row.variant}: {mark}",
            rotation=90,
            ha="center",
            va="bottom",
            fontsize=6,
            color=color,
            transform=ax.get_xaxis_transform(),
        )
        return
    ax.bar(
        [x],
        [row.timing.median_ns / 1e3],
        width=width,
        color=color,
        label=row.variant if label else None,
    )


def _plot_sdpa(ax: Any, run: BenchRun, shapes: list[str]) -> None:
    styles = {"f16": "--", "f32": ":"}
    labelled: set[str] = set()
    for (shape, dtype), ref in sorted(run.sdpa.items()):
        if ref.timing is None or shape not in shapes:
            continue
        x = shapes.index(shape)
        label = f"torch SDPA {dtype}" if dtype not in labelled else None
        labelled.add(dtype)
        ax.hlines(
            ref.timing.median_ns / 1e3,
            x - 0.45,
            x + 0.45,
            colors="black",
            linestyles=styles.get(dtype, "-"),
            label=label,
        )
