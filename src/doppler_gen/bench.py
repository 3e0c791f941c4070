"""`doppler-gen bench`: GPU time, bandwidth and throughput of each variant, next to torch.

People pick variants and tile sizes by speed, so the numbers must be the GPU's own: each run of
a variant (every pass, in one command buffer) is timed with begin/end-of-pass timestamp queries
(scaled by the queue's timestamp period), after warm-up runs, on buffers created once per
(variant, shape); the report gives the median and the p10–p90 spread of at least 20 runs, and
each pass's own time for a multi-pass variant. Kernels are driven by
``runtime.runner.KernelRunner`` with the inputs their family builds for the shape, so bench
measures exactly what ``validate`` checks.

Before timing, each (variant, shape) is run once on NaN-poisoned outputs and scratch and the
output is judged at the bench shape: every element must be finite, and the rows the family
samples (``sampling``: first and last of each dimension included) must match the float64
reference within the validation tolerance. A wrong output is FAIL and gets no time: a fast wrong
kernel must never look like a win. The kernels are the committed generated/ files, proven fresh
first (``shipped``), unless ``--from-templates``.

Definitions (also in the JSON under ``methodology``):

* bytes: every input buffer read once at its storage dtype, plus the output written once
  (scratch buffers between passes are not counted). The inputs hold exactly what the kernel
  needs, so this is the compulsory traffic; GB/s here is a lower bound of what it moved.
* FLOPs: the useful operations of the shape, as its family counts them (attention:
  ``4 · pairs · h · d`` over the unmasked (query, key) pairs, causal prefill counting the
  triangle only; rmsnorm: ``4 · rows · size``).
* % of peak bandwidth: of the matched device profile's HBM bandwidth, else of a copy bandwidth
  measured here (a WGSL copy kernel, read + write, timed the same way).

A CPU adapter (lavapipe) is refused unless ``--allow-cpu``; its timings say nothing about GPUs,
so with ``--allow-cpu`` every row is labelled CPU.

``--against DIR`` is an A/B in one run: the same variants, rendered fresh from another project
directory (an older checkout, a copy with one knob changed), are timed in rounds alternating
with this project's, so that neither side always runs first; each output on both sides is
judged as above. The report adds one line per (variant, shape) with both sides' per-round
medians and a verdict that calls a difference only where the rounds do not overlap.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from doppler_gen.backends import Device, get_backend
from doppler_gen.config import Project, load_project
from doppler_gen.errors import ConfigError, DopplerGenError
from doppler_gen.families import get_family
from doppler_gen.families.base import Shape
from doppler_gen.render import RenderedKernel
from doppler_gen.runtime.measure import (
    BenchRow,
    Settings,
    Timing,
    cpu_warning,
    measure_on_fresh_device,
    positive,
    ramp_up,
)
from doppler_gen.runtime.session import (
    Progress,
    choose_adapter,
    open_device,
    timestamp_period,
)
from doppler_gen.shapes import kinds
from doppler_gen.shipped import load_kernels
from doppler_gen.text_table import format_table

BASELINE_UNAVAILABLE = "torch+CUDA not available"
METHODOLOGY = {
    "timing": "GPU timestamps at the begin and end of a compute pass, scaled by the queue's "
    "timestamp period; a multi-pass variant runs its passes as consecutive dispatches of one "
    "compute pass (as validate runs it, and as a host should record it); a second timing with "
    "a compute pass per pass gives each pass's own span (pass_timings) and that encoding's "
    "total (split_pass_total); warm-up runs first; median and p10-p90 of the timed runs",
    "bytes": "every bound buffer read once at its storage dtype + the output written once "
    "(inputs hold exactly the attended keys): compulsory traffic, so GB/s is a lower bound",
    "flops": "the useful FLOPs of the shape, as its family counts them (families: per family)",
    "l2_resident": "working set <= the profile's L2 size: repeats may be served from L2, so GB/s "
    "can exceed HBM; the torch baseline is timed the same way (no cache flush)",
    "correctness": "before timing, one run on NaN-poisoned outputs and scratch: no NaN/Inf "
    "anywhere and the rows the family samples (first and last of each included) within the "
    "validation tolerance of float64; a wrong output is FAIL and not timed",
    "baseline": "the family's torch call computing what the kernel computes (families: per "
    "family), CUDA events after a GPU sleep so launches queue back to back, warm-up, median",
}


def methodology() -> dict[str, Any]:
    """METHODOLOGY plus what each registered family says about its FLOPs and baseline."""
    from doppler_gen.families import all_families

    families = {f.name: dict(f.methodology) for f in all_families() if f.methodology}
    return {**METHODOLOGY, "families": families}


# -- device profiles ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceProfile:
    """Published peaks of a GPU, to say how far a kernel is from the hardware.

    ``fp32_tflops`` is the non-tensor FP32 peak (FMA = 2 FLOPs): WGSL cannot reach tensor cores,
    so that, not the f16 tensor-core peak, is the ceiling of these kernels' arithmetic.
    """

    name: str
    match: tuple[str, ...]  # lower-case words that must all occur in the adapter name
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


# Most specific first: "NVIDIA H100 PCIe" must not match the SXM entry. Matched by whole words,
# so a GH200 (another memory system) gets no profile, and its peak is the measured copy.
PROFILES = (
    DeviceProfile(
        "H200 NVL",
        ("h200", "nvl"),
        4800.0,
        60.0,
        50 << 20,
        "NVIDIA H200 NVL datasheet: 4.8 TB/s HBM3e, 60 TFLOP/s FP32",
    ),
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
    """The profile whose every match word is a word of the adapter's name, if any ("h200" is
    not a word of "NVIDIA GH200 480GB")."""
    words = set(re.findall(r"[a-z0-9]+", adapter_name.lower()))
    return next((p for p in PROFILES if all(m in words for m in p.match)), None)


def profile_named(name: str) -> DeviceProfile:
    for profile in PROFILES:
        if profile.name.lower() == name.lower():
            return profile
    raise DopplerGenError(f"unknown device profile {name!r} (known: {', '.join(PROFILE_NAMES)})")


# -- timings -----------------------------------------------------------------------------------


@dataclass
class CopyBandwidth:
    """A large device-local copy timed like the kernels: the attainable streaming bandwidth."""

    bytes_moved: int  # read + write
    timing: Timing

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.timing.median_ns if positive(self.timing) else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes_moved, "gbps": round(self.gbps, 1), **self.timing.as_dict()}


@dataclass
class BaselineResult:
    """The torch baseline on one (shape, dtype): the reference speed a variant is compared with."""

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
    baseline_status: str = BASELINE_UNAVAILABLE
    baselines: dict[tuple[str, str], BaselineResult] = field(default_factory=dict)
    comparison: Comparison | None = None

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
        """No output was wrong, and something was timed: a run of nothing but n/a rows (no
        variant selected runs any shape asked for) measured nothing, as `validate` with no
        case run checked nothing."""
        statuses = [row.status for row in self.rows]
        if self.comparison is None:
            return "FAIL" not in statuses and "ok" in statuses
        # an A/B: a wrong output on either side fails it, and so does comparing nothing
        other = [row.status for row in self.comparison.rows]
        return "FAIL" not in statuses + other and self.comparison.compared > 0

    def baseline_for(self, row: BenchRow) -> BaselineResult | None:
        return self.baselines.get((row.shape, row.baseline_dtype or ""))

    def ratio(self, row: BenchRow) -> float | None:
        """Variant time over the torch baseline's time (2.0: twice as slow as torch)."""
        ref = self.baseline_for(row)
        if row.timing is None or ref is None or not positive(ref.timing):
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
        if self.copy and self.copy.gbps > 0:  # a coarse timer can give the copy 0 ns
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
                "warmup_ms": self.settings.warmup_ms,
                "seed": self.settings.seed,
                "limits": self.limits,
                "storage_overrun": self.settings.storage_overrun,
            },
            "profile": self.profile.as_dict() if self.profile else None,
            "copy_bandwidth": self.copy.as_dict() if self.copy else None,
            "copy_note": self.copy_note,
            "peak_bw_basis": self.peak_basis,
            "baseline_status": self.baseline_status,
            "shapes": self.shapes,
            "ok": self.ok,
            "methodology": methodology(),
            "rows": [self.row_dict(row) for row in self.rows],
            "comparison": self.comparison.as_dict() if self.comparison else None,
        }

    def row_dict(self, row: BenchRow) -> dict[str, Any]:
        ref = self.baseline_for(row)
        ratio = self.ratio(row)
        return {
            "variant": row.variant,
            "shape": row.shape,
            "status": row.status,
            "reason": row.reason,
            "cpu_adapter": self.is_cpu,
            "timing": row.timing.as_dict() if row.timing else None,
            "pass_timings": {name: t.as_dict() for name, t in row.passes.items()} or None,
            "split_pass_total": row.split_total.as_dict() if row.split_total else None,
            "bytes": row.bytes_moved,
            "flops": row.flops,
            "gbps": _round(row.gbps),
            "tflops": _round(row.tflops),
            **{key: _round(value, 4) for key, value in self.percent(row).items()},
            "l2_resident": self.l2_resident(row),
            "baseline": ref.as_dict() if ref else None,
            "ratio_to_baseline": _round(ratio, 4),
        }


# The A/B calls a difference only where a clean split of the rounds is this unlikely by chance
# (3 rounds a side: 10 %; 2 rounds, 33 %, get no verdict)
MAX_VERDICT_CHANCE = 0.1


@dataclass
class Comparison:
    """``--against``: each (variant, shape) timed in this project and in another, in rounds
    that alternate which side runs first (a measurement's position in a run moved it by up to
    2x on the H200; see ``measure_on_fresh_device``)."""

    against: str  # the other project's directory, resolved
    rounds: int
    this: dict[tuple[str, str], list[BenchRow]] = field(default_factory=dict)
    other: dict[tuple[str, str], list[BenchRow]] = field(default_factory=dict)

    def add(self, side: str, row: BenchRow) -> None:
        rows = self.this if side == "this" else self.other
        rows.setdefault((row.variant, row.shape), []).append(row)

    @property
    def rows(self) -> list[BenchRow]:
        return [row for side in (self.this, self.other) for rows in side.values() for row in rows]

    def pairs(self) -> list[tuple[str, str]]:
        """Every (variant, shape) either side has a row for, this side's first."""
        return list(dict.fromkeys([*self.this, *self.other]))

    def medians(self, key: tuple[str, str]) -> tuple[list[float], list[float]]:
        """Both sides' timed round medians (µs, in round order) for one (variant, shape)."""
        return _medians_us(self.this.get(key, [])), _medians_us(self.other.get(key, []))

    @property
    def compared(self) -> int:
        """How many (variant, shape) pairs were timed on both sides."""
        return sum(all(self.medians(key)) for key in self.pairs())

    def verdict(self, key: tuple[str, str]) -> tuple[float | None, str]:
        """This side's median of round medians over the other's, and what the rounds say: a
        side is faster only if its slowest round beat the other's fastest, and the verdict says
        how likely a split that clean is by chance alone, either way (10 % with 3 rounds a
        side, 2.9 % with 4)."""
        mine, theirs = self.medians(key)
        for side, rows in (("this", self.this.get(key, [])), ("against", self.other.get(key, []))):
            failed = [row for row in rows if row.status == "FAIL"]
            if failed:
                return None, f"FAIL ({side}): {failed[0].reason}"
        if not mine or not theirs:
            return None, "not timed on both sides"
        ratio = float(np.median(mine)) / float(np.median(theirs))
        # with no real difference, one side's rounds all come first with this probability
        chance = 2 / math.comb(len(mine) + len(theirs), len(mine))
        if chance > MAX_VERDICT_CHANCE:
            return ratio, "too few rounds for a verdict (3 a side at least)"
        odds = f"in every round ({100 * chance:.1f} % chance of a clean split either way if equal)"
        if max(mine) < min(theirs):
            return ratio, f"faster {odds}"
        if min(mine) > max(theirs):
            return ratio, f"slower {odds}"
        return ratio, "no clear difference: the rounds overlap"

    def as_dict(self) -> dict[str, Any]:
        entries = []
        for key in self.pairs():
            ratio, verdict = self.verdict(key)
            mine, theirs = self.medians(key)
            entries.append(
                {
                    "variant": key[0],
                    "shape": key[1],
                    "this_round_medians_us": mine,
                    "against_round_medians_us": theirs,
                    "ratio": _round(ratio, 4),
                    "verdict": verdict,
                }
            )
        return {"against": self.against, "rounds": self.rounds, "rows": entries}


def _medians_us(rows: list[BenchRow]) -> list[float]:
    """The timed rounds' medians, µs, in round order."""
    return [row.timing.median_ns / 1e3 for row in rows if row.status == "ok" and row.timing]


def _representative(rows: list[BenchRow]) -> BenchRow:
    """The row the main table shows for several rounds: a FAIL if any, else the round with
    the median median (the lower middle one for an even count)."""
    failed = [row for row in rows if row.status == "FAIL"]
    if failed:
        return failed[0]
    timed = sorted((row for row in rows if row.timing), key=lambda row: row.timing.median_ns)
    return timed[(len(timed) - 1) // 2] if timed else rows[0]


def _round(value: float | None, digits: int = 6) -> float | None:
    """``digits`` significant digits: enough for any comparison, short enough to read."""
    return None if value is None else float(f"{value:.{digits}g}")


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
    bindings, workgroups = {0: src, 1: dst}, (groups, 1, 1)

    def timed(count: int) -> list[float]:
        return device.timed_dispatch(pipeline, bindings, workgroups, repeats=count, warmup=0)

    ramp_up(timed, settings)
    times = device.timed_dispatch(
        pipeline, bindings, workgroups, repeats=settings.repeats, warmup=settings.warmup
    )
    return CopyBandwidth(2 * size, Timing(tuple(times)))


# -- measuring one variant on one shape ---------------------------------------------------------


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
    baseline: bool = True
    settings: Settings = field(default_factory=Settings)
    from_templates: bool = False  # time a fresh render instead of the committed kernels
    shapes_given: bool = False  # the shapes are the user's (--shape), not every family's defaults
    against: Path | None = None  # --against: another project directory, timed in alternation
    rounds: int = 1  # rounds of the A/B (with against)


def run_bench(
    project: Project, request: BenchRequest, progress: Progress | None = None
) -> BenchRun:
    """Measure the selected variants on the shapes of their family; torch baselines afterwards."""
    kernels, entries = load_kernels(
        project, request.patterns, from_templates=request.from_templates
    )
    if request.shapes_given:
        _refuse_unused_shapes(request.shapes, {entry["family"] for entry in entries})
    # the other project's kernels too are rendered (or refused) before any device opens
    other = _against_kernels(request, kernels) if request.against is not None else None
    named = _named_profile(request.profile)  # an unknown name: one line, before any device
    backend = get_backend(request.backend)
    adapter = choose_adapter(backend, request.adapter, request.allow_cpu, "bench")
    profile = match_profile(adapter.name) if request.profile is None else named
    everything = kernels + (other[0] if other else [])
    requires = {f for k in everything for f in k.variant.requires}
    device = open_device(backend, adapter, requires, request.limits, timing=True)
    run = BenchRun(
        request.backend,
        adapter.describe(),
        adapter.is_cpu,
        request.settings,
        request.limits,
        [s.label for s in request.shapes],
        [],
        profile=profile,
    )
    copies = 2 * request.rounds if other else 1  # an A/B times every pair on both sides, each round
    estimate = (
        CpuEstimate(kernels, request, progress, copies) if adapter.is_cpu and progress else None
    )
    try:
        run.timestamp_period = timestamp_period(device)
        run.copy, run.copy_note = _copy(device, request, progress)

        # each measurement on its own device: see measure_on_fresh_device
        def opener() -> Device:
            return open_device(backend, adapter, requires, request.limits, timing=True)

        if other is None:
            for kernel, entry in zip(kernels, entries, strict=True):
                run.rows.extend(_variant_rows(opener, kernel, entry, request, progress, estimate))
        else:
            run.comparison = _ab_rounds(
                opener, (kernels, entries), other, request, progress, estimate
            )
            run.rows.extend(_representative(rows) for rows in run.comparison.this.values())
    finally:
        device.close()
    if request.baseline:
        attach_baselines(run, request.shapes, progress)
    else:
        run.baseline_status = f"{BASELINE_UNAVAILABLE} (--no-baseline)"
    return run


def _against_kernels(
    request: BenchRequest, kernels: list[RenderedKernel]
) -> tuple[list[RenderedKernel], list[dict[str, Any]]]:
    """The selected variants, by name, rendered fresh from the --against project (whatever its
    generated/ holds: an older checkout's may be stale or absent). Only its variants.toml and
    templates come from there; the families (inputs, references, judging) are this checkout's.
    """
    assert request.against is not None
    where = f"--against {request.against}"
    try:
        project = load_project(request.against)
        known = {variant.name: variant for variant in project.variants}
        missing = [k.variant.name for k in kernels if k.variant.name not in known]
        if missing:
            raise ConfigError(
                f"no variant {', '.join(missing)} in its variants.toml (an A/B times the same "
                "variant names on both sides)"
            )
        for kernel in kernels:
            here, there = kernel.variant.template.family, known[kernel.variant.name].template.family
            if here != there:
                raise ConfigError(
                    f"variant {kernel.variant.name} is a {here} kernel here and a {there} "
                    "kernel there: an A/B compares like with like"
                )
        return load_kernels(project, tuple(k.variant.name for k in kernels), from_templates=True)
    except DopplerGenError as error:  # its own type and location, the option named first
        error.message = f"{where}: {error.message}"
        error.args = (error.message,)
        raise


def _ab_rounds(
    opener: Callable[[], Device],
    this: tuple[list[RenderedKernel], list[dict[str, Any]]],
    other: tuple[list[RenderedKernel], list[dict[str, Any]]],
    request: BenchRequest,
    progress: Progress | None,
    estimate: CpuEstimate | None = None,
) -> Comparison:
    """Every round times both sides, this project first in odd rounds and the other first in
    even ones; each measurement on its own device, each output judged."""
    assert request.against is not None
    comparison = Comparison(str(request.against.resolve()), request.rounds)
    sides = [("this", this), ("other", other)]
    for index in range(request.rounds):
        for side, (kernels, entries) in sides if index % 2 == 0 else sides[::-1]:
            prefix = f"round {index + 1}/{request.rounds}{'' if side == 'this' else ' (--against)'}"
            step = _prefixed(progress, prefix)
            for kernel, entry in zip(kernels, entries, strict=True):
                for row in _variant_rows(opener, kernel, entry, request, step, estimate):
                    comparison.add(side, row)
    return comparison


def _prefixed(progress: Progress | None, prefix: str) -> Progress | None:
    """``progress`` with every message prefixed (which A/B round and side is running)."""
    if progress is None:
        return None
    return lambda text, value: progress(f"{prefix}: {text}", value)


def _refuse_unused_shapes(shapes: Sequence[Shape], families: set[str]) -> None:
    """A --shape no selected variant can run is a mistake (`bench rmsnorm --shape decode:...`):
    refused before a device opens. It used to time the copy kernel, then print only n/a rows."""
    for shape in shapes:
        if shape.family not in families:
            raise DopplerGenError(
                f"--shape {shape.label!r} is for {shape.family} kernels; no selected variant is "
                f"(their families: {', '.join(sorted(families))})"
            )


def _named_profile(name: str | None) -> DeviceProfile | None:
    """The profile --profile names; None for none given (matched to the adapter later) or
    `none`."""
    return None if name is None or name.lower() == "none" else profile_named(name)


def _copy(
    device: Device, request: BenchRequest, progress: Progress | None
) -> tuple[CopyBandwidth | None, str]:
    if request.copy_mib <= 0:
        return None, "not measured (--copy-mib 0)"
    if progress:
        progress(f"copy bandwidth ({request.copy_mib} MiB)", 0)
    copy = measure_copy(device, request.copy_mib, request.settings)
    return copy, f"WGSL copy kernel, {copy.bytes_moved // 2 >> 20} MiB read + written"


def _variant_rows(
    opener: Callable[[], Device],
    kernel: RenderedKernel,
    entry: dict[str, Any],
    request: BenchRequest,
    progress: Progress | None,
    estimate: CpuEstimate | None = None,
) -> list[BenchRow]:
    family = entry["family"]
    shapes = [s for s in request.shapes if s.family == family]
    if not shapes:
        kinds_of = ", ".join(k for k, f in kinds().items() if f.name == family)
        reason = f"no {family} shape given (--shape {kinds_of}:...)"
        return [BenchRow(kernel.variant.name, "-", "n/a", reason)]
    rows = []
    for shape in shapes:
        if progress:
            progress(f"{kernel.variant.name} on {shape.label}", 0)
        on_first = estimate.callback(kernel.variant.name, shape) if estimate else None
        rows.append(
            measure_on_fresh_device(
                opener, kernel, entry, shape, request.settings, on_first=on_first
            )
        )
    return rows


class CpuEstimate:
    """Duration estimates for a bench run on a CPU adapter, where one prefill dispatch can take
    seconds and the default run minutes or hours: the user should know before waiting.

    The first checked run of the bench gives seconds per FLOP; the whole run is estimated
    from the FLOPs of every (variant, shape) it will time. Each measurement then prints its own
    estimate from its own first run.
    """

    def __init__(
        self,
        kernels: Sequence[RenderedKernel],
        request: BenchRequest,
        progress: Progress,
        copies: int = 1,
    ) -> None:
        """``copies``: how many times each (variant, shape) is measured (an A/B: both sides,
        every round)."""
        self.progress = progress
        self.settings = request.settings
        family = {k.variant.name: k.variant.template.family for k in kernels}
        self.total_flops = copies * sum(
            s.flops() for name in family for s in request.shapes if s.family == family[name]
        )
        self.announced = False
        measurements = copies * sum(
            1 for name in family for s in request.shapes if s.family == family[name]
        )
        progress(
            f"CPU adapter: {measurements} measurement(s) of {self.settings.dispatches} dispatches "
            f"each (1 check + {self.settings.warmup} warm-up + {self.settings.repeats} timed); "
            "the duration is estimated after the first dispatch",
            0,
        )

    def callback(self, variant: str, shape: Shape) -> Callable[[float], None]:
        def report(seconds: float) -> None:
            remaining = seconds * (self.settings.dispatches - 1)
            if not self.announced and shape.flops() > 0:
                self.announced = True
                total = seconds / shape.flops() * self.total_flops * self.settings.dispatches
                self.progress(f"estimated duration of this run: about {duration_text(total)}", 0)
            self.progress(
                f"{variant} on {shape.label}: one dispatch took {duration_text(seconds)}; "
                f"{self.settings.dispatches - 1} more take about {duration_text(remaining)}",
                0,
            )

        return report


def duration_text(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``3.5 min``, ``2.1 h``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# -- the torch baseline -----------------------------------------------------------------------


def torch_cuda() -> tuple[Any | None, str]:
    """(torch, "torch X on DEVICE") when torch sees CUDA, else (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, f"{BASELINE_UNAVAILABLE} (torch is not importable)"
    if not torch.cuda.is_available():
        return None, f"{BASELINE_UNAVAILABLE} (torch {torch.__version__} sees no CUDA device)"
    return torch, f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}"


def attach_baselines(
    run: BenchRun, shapes: Sequence[Shape], progress: Progress | None = None
) -> None:
    """Time each family's torch baseline once per (shape, dtype) some timed row needs."""
    torch, run.baseline_status = torch_cuda()
    if torch is None:
        return
    by_label = {s.label: s for s in shapes}
    wanted = sorted(
        {(r.shape, r.baseline_dtype) for r in run.rows if r.status == "ok" and r.baseline_dtype}
    )
    for label, dtype in wanted:
        shape = by_label[label]
        name = get_family(shape.family).baseline_name
        if progress:
            progress(f"torch {name} {dtype} on {label}", 0)
        run.baselines[(label, dtype)] = time_baseline(torch, shape, dtype, run.settings)


def time_baseline(torch: Any, shape: Shape, dtype: str, settings: Settings) -> BaselineResult:
    """Median CUDA-event time of the shape's family baseline on random inputs of that dtype."""
    family = get_family(shape.family)
    try:
        call, note = family.baseline(torch, shape, dtype)
        times = _cuda_event_times(torch, call, settings)
    except NotImplementedError:
        return BaselineResult(dtype, None, f"family {family.name} has no torch baseline")
    except (RuntimeError, ValueError) as error:  # OOM, unsupported dtype/shape combination
        return BaselineResult(
            dtype, None, f"{family.baseline_name} failed: {str(error).splitlines()[0]}"
        )
    return BaselineResult(dtype, Timing(tuple(times)), note)


def _cuda_event_times(torch: Any, call: Callable[[], Any], settings: Settings) -> list[float]:
    """ns per call from CUDA events; a GPU sleep first lets the launches queue up back to back,
    so the numbers are GPU time like the WebGPU timestamps, not Python launch overhead. The
    same time-based warm-up as the kernels' (``ramp_up``) runs first, so both see busy clocks."""
    for _ in range(max(settings.warmup, 1)):
        call()
    torch.cuda.synchronize()
    ramp_up(lambda count: _event_times(torch, call, count), settings)
    return _event_times(torch, call, settings.repeats)


_SLEEP_MIN_CYCLES = 20_000_000  # ~10 ms at the H200's 1.98 GHz
_SLEEP_CYCLES_PER_CALL = 100_000  # ~50 µs


def _event_times(torch: Any, call: Callable[[], Any], count: int) -> list[float]:
    """ns of each of ``count`` calls queued back to back behind a GPU sleep.

    The sleep must outlast the host's launching of every call: once the GPU catches up, a start
    event is recorded on an idle stream and the span includes the host's launch time, which
    the WebGPU kernels (one command buffer) never pay. So it grows with ``count``: about 50 µs
    of GPU clock a call (a Python launch takes 10-20 µs), and never under 10 ms.
    """
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    sleep = getattr(torch.cuda, "_sleep", None)
    if callable(sleep):
        sleep(max(_SLEEP_MIN_CYCLES, count * _SLEEP_CYCLES_PER_CALL))
    for start, end in zip(starts, ends, strict=True):
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e6 for start, end in zip(starts, ends, strict=True)]


# -- report ------------------------------------------------------------------------------------


def format_report(run: BenchRun) -> str:
    """The human-readable report: context lines, one table row per (variant, shape), notes."""
    baseline_ok = not run.baseline_status.startswith(BASELINE_UNAVAILABLE)
    headers = ["variant", "shape", "median µs", "p10–p90 µs", "GB/s", "%BW", "TFLOP/s", "%FP32"]
    headers += ["torch µs", "×torch"] if baseline_ok else ["torch"]
    headers.append("note")
    if run.is_cpu:
        headers.insert(0, "adapter")
    rows = [_table_row(run, row, baseline_ok) for row in run.rows]
    lines = [
        *_banner(run),
        *_context(run),
        "",
        format_table(headers, rows),
        "",
        _summary(run, baseline_ok),
    ]
    if run.comparison is not None:
        lines += ["", *_comparison_lines(run.comparison)]
    lines.extend(_banner(run))
    return "\n".join(lines)


def _comparison_lines(comparison: Comparison) -> list[str]:
    """The A/B table: both sides' round medians, their ratio and the verdict."""
    headers = ["variant", "shape", "this µs (rounds)", "against µs (rounds)", "this ÷ against"]
    headers += ["verdict"]
    rows = []
    for key in comparison.pairs():
        ratio, verdict = comparison.verdict(key)
        mine, theirs = comparison.medians(key)
        rows.append(
            [
                *key,
                ", ".join(f"{v:.1f}" for v in mine) or "-",
                ", ".join(f"{v:.1f}" for v in theirs) or "-",
                f"{ratio:.3f}" if ratio is not None else "-",
                verdict,
            ]
        )
    nothing = [] if comparison.compared else ["", "No pair was timed on both sides (exit 1)."]
    return [
        f"A/B against {comparison.against}: {comparison.rounds} round(s), this project first in "
        "odd rounds and the other first in even ones, each measurement on a fresh device and "
        "each output judged; the table above shows this project's median round",
        "",
        format_table(headers, rows),
        *nothing,
    ]


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
        f"{s.warmup} warm-up and a {s.warmup_ms:g} ms GPU-time ramp",
        f"%BW is of: {run.peak_basis}",
        f"copy bandwidth: {copy}",
        f"torch baseline: {run.baseline_status}",
    ]


def _table_row(run: BenchRun, row: BenchRow, baseline_ok: bool) -> list[str]:
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
    cells += (
        _baseline_cells(run, row) if baseline_ok else [BASELINE_UNAVAILABLE if row.timing else "-"]
    )
    cells.append(_note(run, row))
    return (["CPU"] if run.is_cpu else []) + cells


def _baseline_cells(run: BenchRun, row: BenchRow) -> list[str]:
    ref, ratio = run.baseline_for(row), run.ratio(row)
    if ref is None or ref.timing is None:
        return ["-", "-"]
    return [f"{ref.timing.median_ns / 1e3:.1f} ({ref.dtype})", f"{ratio:.2f}" if ratio else "-"]


def _note(run: BenchRun, row: BenchRow) -> str:
    parts = [f"({row.reason})" if row.status != "ok" and row.reason else row.reason]
    if row.passes:
        spans = ", ".join(f"{n} {t.median_ns / 1e3:.1f}" for n, t in row.passes.items())
        whole = f" = {row.split_total.median_ns / 1e3:.1f}" if row.split_total else ""
        parts.append(f"as a compute pass each: {spans}{whole}")
    resident = run.l2_resident(row)
    if resident is not None and run.profile is not None:
        # every shape says which side of L2 it is on: decode at 8k keys is L2-resident, 32k is not
        size = f"{row.bytes_moved / 2**20:.1f} of {run.profile.l2_bytes / 2**20:.0f} MiB"
        parts.append(f"L2-resident ({size})" if resident else f"exceeds L2 ({size})")
    ref = run.baseline_for(row)
    if ref and ref.note:
        parts.append(f"torch: {ref.note}")
    return "; ".join(p for p in parts if p)


def number(value: float | None) -> str:
    """Three significant digits, whole numbers from 100 up: 4521, 45.2, 0.0452."""
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _summary(run: BenchRun, baseline_ok: bool) -> str:
    counts = {s: sum(r.status == s for r in run.rows) for s in ("ok", "n/a", "FAIL")}
    ratio = "; ×torch > 1 is slower than torch" if baseline_ok else ""
    nothing = "" if counts["ok"] else " Nothing was timed (exit 1)."
    return (
        f"{counts['ok']} timed, {counts['n/a']} n/a, {counts['FAIL']} failed.{nothing} "
        "bytes: bound buffers read once + output written once; FLOPs: the useful operations "
        f"of each shape, as its family counts them (JSON methodology){ratio}."
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
    """Bars of median µs (log scale) per shape and variant; torch as a dashed line per group."""
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
    _plot_baseline(ax, run, shapes)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([s.replace(",", ",\n", 1) for s in shapes], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("GPU time per dispatch (µs, median)")
    warning = "CPU ADAPTER — NOT GPU PERFORMANCE\n" if run.is_cpu else ""
    ax.set_title(f"{warning}doppler-gen bench on {run.adapter.split(' — ')[0]}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except (OSError, ValueError) as error:  # ValueError: a suffix matplotlib has no format for
        reason = getattr(error, "strerror", None) or error
        raise DopplerGenError(f"--plot {path}: cannot write: {reason}") from None
    finally:
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


def _plot_baseline(ax: Any, run: BenchRun, shapes: list[str]) -> None:
    styles = {"f16": "--", "f32": ":"}
    labelled: set[str] = set()
    for (shape, dtype), ref in sorted(run.baselines.items()):
        if ref.timing is None or shape not in shapes:
            continue
        x = shapes.index(shape)
        label = f"torch {dtype}" if dtype not in labelled else None
        labelled.add(dtype)
        ax.hlines(
            ref.timing.median_ns / 1e3,
            x - 0.45,
            x + 0.45,
            colors="black",
            linestyles=styles.get(dtype, "-"),
            label=label,
        )
