"""`doppler-gen validate`: compile every variant and check it against the float64 reference.

The kernels are the committed generated/ files and manifest entries, first proven equal to a
fresh render (``shipped``; a stale tree exits 1 with check's verdict), or with
``--from-templates`` a fresh render; either way with the source map that puts compile errors at
template lines. The GPU work runs in worker processes (``runtime.workers``: one, or N with
``--jobs N``), each opening one device for the variants it is handed; each variant is compiled
once; cases are generated deterministically from the seed: the feature matrix of ``cases`` plus
the size cases of the tier (``tiers``), large outputs compared on sampled rows (``sampling``).

A variant is PASS only when every case ran and passed; FAIL when any case failed, a compile
error occurred or a case left NaN/Inf in the output; SKIP (with the reason) when the device
cannot run it at all: a missing feature, or static needs beyond the requested limits. Skips are
never counted as passes.

`--backend all` validates on every WebGPU implementation (wgpu-py/naga as in Firefox, Dawn/Tint
as in Chrome) and also requires, case by case, that their two outputs agree within the tolerance
each output was judged by: a kernel that computes differently in two browsers is a bug even
when both stay near the reference.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from doppler_gen.backends import Backend, get_backend
from doppler_gen.config import Project
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.outputs import select
from doppler_gen.render import RenderedKernel, Renderer
from doppler_gen.runtime.session import Progress
from doppler_gen.runtime.verify import (
    CaseSpec,
    VariantReport,
    case_specs,
    tier_of,
)
from doppler_gen.runtime.workers import validate_in_workers
from doppler_gen.shipped import load_kernels
from doppler_gen.text_table import format_table


@dataclass
class ValidationRun:
    backend: str
    adapter: str
    limits_profile: str
    seed: int
    tier: str
    variants: list[VariantReport]
    seconds: float
    source: str = "committed generated/"
    jobs: int = 1  # worker processes (validate --jobs), each with its own device

    @property
    def quick(self) -> bool:
        return self.tier == "quick"

    @property
    def ok(self) -> bool:
        ran = [v for v in self.variants if v.status != "SKIP"]
        return bool(ran) and all(v.status == "PASS" for v in ran)

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "adapter": self.adapter,
            "limits": self.limits_profile,
            "seed": self.seed,
            "quick": self.quick,
            "tier": self.tier,
            "kernels": self.source,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "jobs": self.jobs,
            "variants": [v.as_dict() for v in self.variants],
        }


# The implementations `--backend all` runs (then compared case by case), in report order.
ALL_BACKENDS = ("wgpu", "dawn")

Outputs = dict[str, dict[CaseSpec, np.ndarray]]  # variant -> case -> output


def backend_names(choice: str) -> list[str]:
    """The implementations ``--backend choice`` runs on, in report order."""
    return list(ALL_BACKENDS) if choice == "all" else [choice]


def validate(
    project: Project,
    patterns: tuple[str, ...] = (),
    *,
    backend_name: str = "wgpu",
    adapter: str | None = None,
    limits: str = "adapter",
    quick: bool = False,
    tier: str | None = None,
    seed: int = 0,
    storage_overrun: bool = False,
    progress: Progress | None = None,
    large: bool = False,
    fail_fast: bool = False,
    from_templates: bool = False,
    jobs: int = 1,
) -> ValidationRun:
    """Validate the selected variants; never raises for a kernel failure (that is a report).

    Runs the committed generated/ kernels after proving them fresh (``shipped``; a stale tree
    raises StaleTree, exit 1), or a fresh render with ``from_templates``.
    """
    tier = tier_of(quick, tier, large)
    kernels, entries = load_kernels(project, patterns, from_templates=from_templates)
    return _run_backend(
        get_backend(backend_name),
        kernels,
        entries,
        adapter=adapter,
        limits=limits,
        tier=tier,
        seed=seed,
        storage_overrun=storage_overrun,
        progress=progress,
        fail_fast=fail_fast,
        source=_source(from_templates),
        jobs=jobs,
    )


def _source(from_templates: bool) -> str:
    return (
        "fresh render of templates/ (--from-templates)"
        if from_templates
        else "committed generated/"
    )


def _run_backend(
    backend: Backend,
    kernels: Sequence[RenderedKernel],
    entries: Sequence[dict[str, Any]],
    *,
    adapter: str | None,
    limits: str,
    tier: str,
    seed: int,
    storage_overrun: bool,
    progress: Progress | None,
    outputs: Outputs | None = None,
    fail_fast: bool = False,
    source: str = "committed generated/",
    jobs: int = 1,
) -> ValidationRun:
    """Every kernel on a device of ``backend`` in a worker process (``jobs`` of them, each
    with its own device): a kernel that kills the process compiling or running it is then
    that variant's FAIL, not the end of the run (``runtime.workers``); ``outputs`` (if
    given) collects case outputs."""
    started = time.perf_counter()
    options = {
        "tier": tier,
        "seed": seed,
        "storage_overrun": storage_overrun,
        "fail_fast": fail_fast,
    }
    reports, described, workers = validate_in_workers(
        backend.name,
        kernels,
        entries,
        jobs=jobs,
        adapter=adapter,
        limits=limits,
        options=options,
        progress=progress,
        outputs=outputs,
    )
    seconds = time.perf_counter() - started
    return ValidationRun(
        backend.name, described, limits, seed, tier, reports, seconds, source, workers
    )


# --------------------------------------------------------------------------- across backends


@dataclass
class Agreement:
    """Whether two implementations computed the same outputs for one variant.

    AGREE: every case both ran is within its tolerance of the other's output; DIFFER: some
    case is not; "-": nothing to compare (a backend skipped or failed the variant).
    """

    name: str
    status: str  # AGREE | DIFFER | -
    compared: int = 0
    max_abs_diff: float | None = None
    worst_ratio: float | None = None  # |a - b| / tolerance of the worst case
    worst_case: str | None = None
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "variant": self.name,
            "status": self.status,
            "cases_compared": self.compared,
            "max_abs_diff": self.max_abs_diff,
            "diff_over_tolerance": self.worst_ratio,
            "worst_case": self.worst_case,
            "reason": self.reason,
        }


@dataclass
class CrossRun:
    """``--backend all``: one ValidationRun per implementation plus their case-by-case agreement."""

    runs: list[ValidationRun]
    agreements: list[Agreement]
    seconds: float

    @property
    def ok(self) -> bool:
        """Every implementation's run is ok, no variant differs, and at least one was compared."""
        statuses = [a.status for a in self.agreements]
        return all(r.ok for r in self.runs) and "DIFFER" not in statuses and "AGREE" in statuses

    def as_dict(self) -> dict[str, Any]:
        first = self.runs[0]
        return {
            "backend": "all",
            "backends": [r.backend for r in self.runs],
            "limits": first.limits_profile,
            "seed": first.seed,
            "quick": first.quick,
            "tier": first.tier,
            "kernels": first.source,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "runs": {r.backend: r.as_dict() for r in self.runs},
            "agreement": [a.as_dict() for a in self.agreements],
        }


def validate_all(
    project: Project,
    patterns: tuple[str, ...] = (),
    *,
    backends: Sequence[str] = ALL_BACKENDS,
    adapter: str | None = None,
    limits: str = "adapter",
    quick: bool = False,
    tier: str | None = None,
    seed: int = 0,
    storage_overrun: bool = False,
    progress: Progress | None = None,
    large: bool = False,
    fail_fast: bool = False,
    from_templates: bool = False,
    jobs: int = 1,
) -> CrossRun:
    """Validate on every implementation in ``backends``, then compare their outputs pairwise.

    Every backend is instantiated before any work, so a missing one (pydawn not installed)
    fails at once with its one-line install hint instead of after a long first run.
    """
    started = time.perf_counter()
    tier = tier_of(quick, tier, large)
    implementations = [get_backend(name) for name in backends]
    kernels, entries = load_kernels(project, patterns, from_templates=from_templates)
    runs, outputs = [], []
    for backend in implementations:
        kept: Outputs = {}
        runs.append(
            _run_backend(
                backend,
                kernels,
                entries,
                adapter=adapter,
                limits=limits,
                tier=tier,
                seed=seed,
                storage_overrun=storage_overrun,
                progress=progress,
                outputs=kept,
                fail_fast=fail_fast,
                source=_source(from_templates),
                jobs=jobs,
            )
        )
        outputs.append(kept)
    agreements = [
        compare_variant(
            name,
            [r.variants[i] for r in runs],
            [o.get(name, {}) for o in outputs],
            [r.backend for r in runs],
        )
        for i, name in enumerate(k.variant.name for k in kernels)
    ]
    return CrossRun(runs, agreements, time.perf_counter() - started)


def compare_variant(
    name: str,
    reports: Sequence[VariantReport],
    outputs: Sequence[dict[CaseSpec, np.ndarray]],
    backends: Sequence[str],
) -> Agreement:
    """Compare the first backend's outputs of one variant with every other backend's.

    Each case is judged by the tolerance its outputs were judged by against the reference.
    """
    not_run = [f"{b} {r.status}" for b, r in zip(backends, reports, strict=True) if not r.cases]
    if not_run:
        return Agreement(name, "-", reason=f"not compared: {', '.join(not_run)}")
    pairs = _case_differences(reports, outputs)
    if not pairs:
        return Agreement(name, "-", reason="not compared: no case ran on every backend")
    ratio, _, case, other = max(pairs)
    max_diff = max(p[1] for p in pairs)
    if ratio <= 1.0:
        return Agreement(name, "AGREE", len(pairs), max_diff, ratio, case)
    diff = max(p[1] for p in pairs if p[2] == case and p[3] == other)
    reason = (
        f"case {case!r}: max |{backends[0]} - {backends[other]}| = {diff:.3g} exceeds the "
        f"tolerance ({ratio:.2f} of it)"
    )
    return Agreement(name, "DIFFER", len(pairs), max_diff, ratio, case, reason)


def _case_differences(
    reports: Sequence[VariantReport], outputs: Sequence[dict[CaseSpec, np.ndarray]]
) -> list[tuple[float, float, str, int]]:
    """(|first - other| / tolerance, |first - other|, case, other) for every case both ran."""
    tolerances = [{c.spec: c.verdict.tolerance for c in r.cases if c.verdict} for r in reports]
    found = []
    for other in range(1, len(reports)):
        for spec in outputs[0].keys() & outputs[other].keys():
            tolerance = min(tolerances[0].get(spec, np.inf), tolerances[other].get(spec, np.inf))
            diff = output_difference(outputs[0][spec], outputs[other][spec])
            ratio = diff / tolerance if tolerance > 0 else (np.inf if diff else 0.0)
            found.append((float(ratio), diff, spec.name, other))
    return found


def output_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b|; a NaN/Inf in one output where the other has a different value is infinite."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a64.shape != b64.shape:
        return float("inf")
    if a64.size == 0:
        return 0.0
    finite = np.isfinite(a64) & np.isfinite(b64)
    same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
    diff = np.where(finite, np.abs(a64 - b64), np.where(same, 0.0, np.inf))
    return float(diff.max())


def _cells(v: VariantReport) -> list[str]:
    """result, cases, worst error, time and note of one variant's report."""
    worst = v.worst
    worst_text = "-"
    if worst and worst.verdict:
        worst_text = f"{worst.verdict.max_abs_error:.2e} ({worst.verdict.ratio:.2f} of tol)"
    cases = f"{sum(c.passed for c in v.cases)}/{len(v.cases)}" if v.cases else "-"
    return [v.status, cases, worst_text, f"{v.seconds:.1f}s", v.reason.split("\n")[0]]


def _details(run: ValidationRun, prefix: str = "") -> list[str]:
    """Multi-line failure reasons (compile errors with their source lines), after the table."""
    return [
        f"\n{prefix}{v.name}: {v.reason}"
        for v in run.variants
        if v.status == "FAIL" and "\n" in v.reason
    ]


def _summary(run: ValidationRun) -> str:
    counts = {s: sum(v.status == s for v in run.variants) for s in ("PASS", "FAIL", "SKIP")}
    total_cases = sum(len(v.cases) for v in run.variants)
    return (
        f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
        f"({total_cases} cases, {run.tier} tier, {run.seconds:.1f}s"
        f"{f' in {run.jobs} processes' if run.jobs > 1 else ''}) on {run.adapter} "
        f"[{run.backend}, limits {run.limits_profile}; {run.source}]"
    )


def format_report(run: ValidationRun | CrossRun) -> str:
    """The human-readable report: a table, multi-line failure details, then the summary."""
    if isinstance(run, CrossRun):
        return format_cross_report(run)
    rows = [[v.name, *_cells(v)] for v in run.variants]
    table = format_table(["variant", "result", "cases", "worst error", "time", "note"], rows)
    return table + "".join(_details(run)) + "\n" + _summary(run)


def format_cross_report(cross: CrossRun) -> str:
    """One row per variant and backend, then an "agree" row comparing the backends' outputs.

    The agree row's error column is max |first - other| over the compared cases and its
    fraction of the worst case's tolerance. A variant counts as passed only when it passed on
    every backend and the outputs agreed: a skip on one backend is not a pass.
    """
    rows = []
    for i, agreement in enumerate(cross.agreements):
        for run in cross.runs:
            rows.append(
                [
                    "" if run is not cross.runs[0] else agreement.name,
                    run.backend,
                    *_cells(run.variants[i]),
                ]
            )
        rows.append(["", "agree", *_agreement_cells(agreement)])
    headers = ["variant", "backend", "result", "cases", "worst error / difference", "time", "note"]
    table = format_table(headers, rows)
    details = [d for run in cross.runs for d in _details(run, f"[{run.backend}] ")]
    lines = [f"{run.backend}: {_summary(run)}" for run in cross.runs]
    lines.append(_agreement_summary(cross))
    return table + "".join(details) + "\n\n" + "\n".join(lines)


def _agreement_cells(a: Agreement) -> list[str]:
    difference = "-"
    if a.max_abs_diff is not None and a.worst_ratio is not None:
        difference = f"{a.max_abs_diff:.2e} ({a.worst_ratio:.2f} of tol)"
    return [a.status, str(a.compared) if a.compared else "-", difference, "", a.reason]


def _agreement_summary(cross: CrossRun) -> str:
    names = " vs ".join(run.backend for run in cross.runs)
    counts = {s: sum(a.status == s for a in cross.agreements) for s in ("AGREE", "DIFFER", "-")}
    everywhere = sum(
        a.status == "AGREE" and all(run.variants[i].status == "PASS" for run in cross.runs)
        for i, a in enumerate(cross.agreements)
    )
    compared = [a for a in cross.agreements if a.max_abs_diff is not None]
    largest = max((a.max_abs_diff for a in compared), default=None)  # type: ignore[type-var]
    biggest = f"; max difference {largest:.2e}" if largest is not None else ""
    return (
        f"agreement ({names}): {counts['AGREE']} agree, {counts['DIFFER']} differ, "
        f"{counts['-']} not compared{biggest}; {everywhere} of {len(cross.agreements)} variants "
        f"passed on every backend and agreed ({cross.seconds:.1f}s)"
    )


def case_count(
    project: Project,
    patterns: tuple[str, ...],
    *,
    quick: bool = False,
    seed: int,
    tier: str | None = None,
    large: bool = False,
) -> int:
    """How many cases a run will go through (for the progress bar)."""
    renderer = Renderer(project)
    total = 0
    for variant in select(project, patterns):
        kernel = renderer.render(variant)
        entry = variant_entry(kernel, parse_kernel(kernel))
        total += len(case_specs(entry, quick=quick, tier=tier_of(quick, tier, large), seed=seed))
    return total
