"""Measuring one variant on one shape: the timing statistics and the measured row.

Shared by ``bench`` (every variant on every shape of its family) and ``tune`` (every candidate
on one shape), so both report the same numbers the same way. A variant runs through the runner
exactly as ``validate`` drives it: once on NaN-poisoned outputs and scratch (every output
element must be finite), then ``repeats`` timed runs of all its passes on the same buffers.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from doppler_gen.backends import Device, PassTimes
from doppler_gen.errors import (
    BackendUnavailable,
    DopplerGenError,
    GpuTimeout,
    ShaderCompileError,
)
from doppler_gen.families import get_family
from doppler_gen.families.base import Shape
from doppler_gen.render import RenderedKernel
from doppler_gen.runtime.runner import KernelRunner, Refusal, stale_elements
from doppler_gen.runtime.session import static_skip
from doppler_gen.tolerance import Verdict

MIN_REPEATS = 20
# Caps on --repeats / --warmup: every timed pass needs two timestamp slots and every pass is
# queued GPU work, so unbounded values grow memory and run for days (the CLI's limits mirror
# these; tests/test_errors.py checks that they agree).
MAX_REPEATS = 10_000
MAX_WARMUP = 1_000
# GPU time of warm-up runs before the timed ones. An idle H200 sits at 345 MHz and its governor
# raises the clock only after a few hundred milliseconds of sustained work (nvidia-smi sampled
# every 100 ms during bench: 345-645 MHz through 50 ms ramps, 1980 MHz only after ~0.3 s of
# back-to-back runs). Timed at idle clocks a kernel measured 2-5x slow, and torch likewise; so
# every measurement, ours and torch's, first runs this long, and then on while still speeding up.
DEFAULT_WARMUP_MS = 500.0
MAX_WARMUP_MS = 5_000.0
# Bounds on the ramp: its rounds double from the --warmup count, at most this many runs a
# round, and it stops after this many wall seconds (a CPU adapter's first run can be slow).
_RAMP_ROUND_CAP = 1024
_RAMP_WALL_S = 10.0
# After the target, the ramp goes on while a round (or its second half) runs faster than this
# fraction of the previous round (or its first half): the clock is still rising.
_RAMP_SETTLED = 0.97


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
    warmup_ms: float = DEFAULT_WARMUP_MS

    def __post_init__(self) -> None:
        if self.repeats < MIN_REPEATS:
            raise DopplerGenError(
                f"--repeats {self.repeats}: at least {MIN_REPEATS} runs are needed for a median "
                "and spread"
            )
        if self.repeats > MAX_REPEATS:
            raise DopplerGenError(f"--repeats {self.repeats}: at most {MAX_REPEATS}")
        if self.warmup < 0:
            raise DopplerGenError(f"--warmup {self.warmup} must not be negative")
        if self.warmup > MAX_WARMUP:
            raise DopplerGenError(f"--warmup {self.warmup}: at most {MAX_WARMUP}")
        if not 0 <= self.warmup_ms <= MAX_WARMUP_MS:
            raise DopplerGenError(f"--warmup-ms {self.warmup_ms:g}: 0 to {MAX_WARMUP_MS:g}")

    @property
    def dispatches(self) -> int:
        """Dispatches per measurement: the finite-output check, the warm-ups, the timed runs."""
        return 1 + self.warmup + self.repeats


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
    baseline_dtype: str | None = None  # the dtype the family's torch baseline runs in
    passes: dict[str, Timing] = field(default_factory=dict)  # per pass, multi-pass variants
    split_total: Timing | None = None  # multi-pass: the whole, a compute pass per pass

    @property
    def gbps(self) -> float | None:
        """Effective bandwidth: bytes per ns is GB/s."""
        return self.bytes_moved / self.timing.median_ns if positive(self.timing) else None

    @property
    def tflops(self) -> float | None:
        return self.flops / self.timing.median_ns / 1e3 if positive(self.timing) else None


def positive(timing: Timing | None) -> bool:
    """A median a rate can be divided by (a coarse timer can report 0 ns for a tiny dispatch)."""
    return timing is not None and timing.median_ns > 0


def cpu_warning(adapter: str) -> str:
    return f"CPU ADAPTER ({adapter}): these timings say nothing about GPU performance"


def measure_on_fresh_device(
    open_device: Callable[[], Device],
    kernel: RenderedKernel,
    entry: dict[str, Any],
    shape: Shape,
    settings: Settings,
    constants: dict[str, float] | None = None,
    on_first: Callable[[float], None] | None = None,
) -> BenchRow:
    """``measure`` on a device opened for this one measurement, then closed.

    Why: on the H200 (wgpu 0.32, NVIDIA Vulkan) a two-pass kernel on an L2-resident shape
    measured 1.2-2x slower in every measurement after the first on the same device (one
    device: 42.1, 57.1, 63.9, 68.3, 55.4 ... us for the same kernel with fresh buffers each
    time; a device per measurement: 39.2-40.0 us every time). Single-dispatch kernels and
    HBM-bound shapes did not move. A comparison (bench rows, tune candidates: the current
    configuration is measured first) must not depend on the order of its measurements.
    """
    try:
        device = open_device()
    except GpuTimeout as error:  # an earlier kernel never finished: this row is not run
        return BenchRow(kernel.variant.name, shape.label, "FAIL", reason=str(error))
    try:
        return measure(device, kernel, entry, shape, settings, constants, on_first)
    finally:
        device.close()


def measure(
    device: Device,
    kernel: RenderedKernel,
    entry: dict[str, Any],
    shape: Shape,
    settings: Settings,
    constants: dict[str, float] | None = None,
    on_first: Callable[[float], None] | None = None,
) -> BenchRow:
    """Judge one run at the shape, then time ``settings.repeats`` runs on the same buffers.

    The judged run is on NaN-poisoned outputs and scratch: every output element must be finite
    and the family's sampled rows within the validation tolerance of float64, else FAIL and no
    time (a fast wrong kernel must never look like a win). The timed runs poison nothing, so
    one more run as they ran (its output prefilled with a finite stale value) is judged after
    them: a kernel whose work depends on what earlier runs left is FAIL too.

    ``on_first`` receives the wall seconds of the first (checked) run, before timing.
    """
    family = get_family(entry["family"])
    row = BenchRow(
        kernel.variant.name, shape.label, "n/a", baseline_dtype=family.baseline_dtype(entry)
    )
    skip, note = static_skip(entry, device, storage_overrun=settings.storage_overrun)
    if skip:
        row.reason = skip
        return row
    runner = KernelRunner(device, kernel, entry, constants)
    try:
        prepared = runner.prepare(shape.case_spec(settings.seed))
        if isinstance(prepared, Refusal):
            row.reason = prepared.reason
            return row
        row.bytes_moved = prepared.bytes_moved
        row.flops = shape.flops()
        _time(runner, prepared, settings, row, on_first)
    except ShaderCompileError as error:
        row.status, row.reason = "FAIL", f"compile error: {error.message.splitlines()[0]}"
    except BackendUnavailable:  # the installation, not this kernel: the run ends (exit 2)
        raise
    except DopplerGenError as error:
        row.status, row.reason = "FAIL", str(error)
    if note and row.status == "ok":
        row.reason = note
    return row


def _time(
    runner: KernelRunner,
    prepared: Any,
    settings: Settings,
    row: BenchRow,
    on_first: Callable[[float], None] | None = None,
) -> None:
    started = time.perf_counter()
    output = runner.run(prepared)
    if on_first is not None:
        on_first(time.perf_counter() - started)
    verdict = runner.judge(prepared, output)
    if not verdict.passed:  # a fast wrong kernel must never look like a win
        row.status, row.reason = "FAIL", wrong_output_reason(verdict, row.variant)
        return
    ramp_up(
        lambda count: [r.total_ns for r in runner.timed(prepared, repeats=count, warmup=0)],
        settings,
    )
    runs = runner.timed(prepared, repeats=settings.repeats, warmup=settings.warmup)
    # the timed runs poisoned nothing: one more like them must still be right, in the rows
    # judged and, for the prefilled value, everywhere the first run wrote
    again = runner.run_as_timed(prepared)
    verdict, stale = runner.judge(prepared, again), stale_elements(output, again)
    if stale or not verdict.passed:
        reason = (
            f"{stale} output element(s) kept the prefilled value the first run overwrote"
            if stale
            else wrong_output_reason(verdict, row.variant)
        )
        row.status, row.reason = "FAIL", f"a run as timed (output prefilled, state kept): {reason}"
        return
    row.status, row.timing = "ok", Timing(tuple(r.total_ns for r in runs))
    names = [p["name"] for p in runner.entry["passes"]]
    if len(names) > 1:
        # each pass's own span needs a compute pass per pass: a second, separate timing
        split = runner.timed(
            prepared, repeats=settings.repeats, warmup=settings.warmup, split_passes=True
        )
        row.passes = per_pass(names, split)
        row.split_total = Timing(tuple(r.total_ns for r in split))


def ramp_up(timed: Callable[[int], Sequence[float]], settings: Settings) -> float:
    """Run timed rounds until ``settings.warmup_ms`` of GPU time has passed and the runs stopped
    getting faster; return the ns spent.

    ``timed(count)`` runs the work ``count`` times back to back and returns each run's GPU ns.
    Rounds double (from the --warmup count, at least 8 runs) so a short kernel gets thousands of
    runs and a long one few. Past the target, a round still more than 3 % faster than the
    previous round, or in its second half than in its first (``_settled``), means the clock is
    still rising, so another round runs. The ramp gives up after _RAMP_WALL_S wall seconds.
    Used before every timed measurement, so that kernels and torch are all timed at the clocks a
    busy GPU runs at.
    """
    target_ns = settings.warmup_ms * 1e6
    if target_ns <= 0:
        return 0.0
    spent, previous = 0.0, math.inf
    count = max(8, settings.warmup)
    started = time.perf_counter()
    while time.perf_counter() - started < _RAMP_WALL_S:
        runs = list(timed(count))
        spent += float(sum(runs))
        median = float(statistics.median(runs))
        if spent >= target_ns and _settled(runs, previous):
            break
        previous = median
        count = min(2 * count, _RAMP_ROUND_CAP)
    return spent


def _settled(runs: Sequence[float], previous_median: float) -> bool:
    """No longer speeding up: the round's second half is not >3 % faster than its first half,
    nor the round than the one before."""
    half = len(runs) // 2
    if half and statistics.median(runs[half:]) < _RAMP_SETTLED * statistics.median(runs[:half]):
        return False
    return previous_median == math.inf or statistics.median(runs) >= _RAMP_SETTLED * previous_median


def wrong_output_reason(verdict: Verdict, variant: str) -> str:
    """Why a measured output is FAIL: NaN/Inf left, or the worst sampled error over tolerance."""
    if verdict.non_finite:
        what = f"{verdict.non_finite} outputs NaN/Inf after one run on NaN-poisoned outputs"
    else:
        what = (
            f"wrong output: max abs error {verdict.max_abs_error:.3g} > tolerance "
            f"{verdict.tolerance:.3g} at index {list(verdict.worst_index)} ({verdict.policy})"
        )
    return f"{what}; not timed (run `doppler-gen validate {variant}`)"


def per_pass(names: Sequence[str], runs: Sequence[PassTimes]) -> dict[str, Timing]:
    """Each pass's own timing over runs timed with a compute pass per pass (their total spans
    them all, gaps included)."""
    return {
        name: Timing(tuple(r.passes_ns[index] for r in runs)) for index, name in enumerate(names)
    }


# -- the run -----------------------------------------------------------------------------------
