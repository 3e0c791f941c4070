"""Validating one variant on an open device: every case of its tier, judged by its family.

Shared by ``validate`` (every selected variant) and ``tune`` (every candidate, quick; the
winner, in full). A variant is PASS only when every case ran and passed; FAIL when a case
failed, was refused, left NaN/Inf or the kernel did not compile; SKIP (with the reason) when
the device cannot run it at all.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, is_dataclass, replace
from typing import Any

import numpy as np

from doppler_gen.backends import Device
from doppler_gen.errors import BackendUnavailable, DopplerGenError, ShaderCompileError
from doppler_gen.families import get_family
from doppler_gen.render import RenderedKernel
from doppler_gen.runtime.runner import CaseResult, KernelRunner
from doppler_gen.runtime.session import Progress, limit_refusal, static_skip, storage_need

CaseSpec = Any  # a family's case spec: hashable, with .name and .seed
TIERS = ("quick", "default", "large")
# Workgroups a row in the grids of the folded-path cases (dispatch_fold): far below any device's
# limit, so that the quick cases fold into several rows, and odd, so that most grids have spare
# workgroups for the kernel to skip
FOLDED_ROW = 5


@dataclass
class VariantReport:
    name: str
    status: str  # PASS | FAIL | SKIP
    reason: str = ""
    cases: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if c.verdict is not None and not c.passed]

    @property
    def worst(self) -> CaseResult | None:
        judged = [c for c in self.cases if c.verdict is not None]
        return max(judged, key=lambda c: c.verdict.ratio) if judged else None  # type: ignore[union-attr]

    def as_dict(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "variant": self.name,
            "status": self.status,
            "reason": self.reason,
            "cases": len(self.cases),
            "passed": sum(c.passed for c in self.cases),
            "failed": len(self.failures),
            "refused": sum(c.refused is not None for c in self.cases),
            "seconds": round(self.seconds, 3),
            "worst": _case_dict(worst) if worst else None,
            "failures": [_case_dict(c) for c in self.failures[:10]],
        }


def _case_dict(case: CaseResult) -> dict[str, Any]:
    v = case.verdict
    assert v is not None
    return {
        "case": case.spec.name,
        "seed": case.spec.seed,
        "max_abs_error": v.max_abs_error,
        "max_rel_error": v.max_rel_error,
        "tolerance": v.tolerance,
        "error_over_tolerance": v.ratio,
        "worst_index": list(v.worst_index),
        "non_finite": v.non_finite,
        "policy": v.policy,
    }


def tier_of(quick: bool, tier: str | None, large: bool = False) -> str:
    """The case tier asked for: ``tier`` itself, else quick, large or default by the flags."""
    if quick and large:
        raise DopplerGenError("--quick and --large are exclusive")
    chosen = tier or ("quick" if quick else "large" if large else "default")
    if chosen not in TIERS:
        raise DopplerGenError(f"unknown case tier {chosen!r} (known: {', '.join(TIERS)})")
    return chosen


def case_specs(
    entry: dict[str, Any], *, quick: bool = False, seed: int, tier: str | None = None
) -> list:
    """The variant's case matrix from its family: ``tier`` (quick/default/large) or ``quick``;
    then, for a variant with a folding pass, its ``folded_cases``."""
    family = get_family(entry["family"])
    specs = _checked(family, family.specs(entry, tier_of(quick, tier), seed))
    return specs + folded_cases(entry, seed)


def _checked(family: Any, specs: Any) -> list:
    """``specs`` as the core needs them: a list of frozen dataclasses (hashed to key outputs and
    folded cases, copied by ``dataclasses.replace``) with a ``name`` and a ``seed``. A family
    that gets this wrong is a bug, named here rather than as a TypeError deep in the core."""
    where = f"family {family.name!r} ({type(family).__module__})"
    if not isinstance(specs, list):
        raise TypeError(f"{where}: specs() returned {type(specs).__name__}, not a list")
    for spec in specs:
        problem = None
        if not is_dataclass(spec) or isinstance(spec, type):
            problem = "is not a dataclass instance"
        elif not isinstance(getattr(spec, "name", None), str):
            problem = "has no str name"
        elif not isinstance(getattr(spec, "seed", None), int):
            problem = "has no int seed"
        else:
            try:
                hash(spec)
            except TypeError:
                problem = "is not hashable (make it @dataclass(frozen=True))"
        if problem:
            raise TypeError(f"{where}: the case spec {spec!r} {problem}")
    return specs


def folded_cases(entry: dict[str, Any], seed: int) -> list:
    """The quick cases again, named as folded, where some pass declares ``dispatch_fold``.

    Hosts fold only above the device's limit (65,535 workgroups a dimension or more), far
    beyond the cases a CPU can run; these cases fold at FOLDED_ROW workgroups a row
    (``KernelRunner.fold_above``), so that the path is validated wherever the kernel is.
    """
    if not any(p.get("dispatch_fold") for p in entry.get("passes", ())):
        return []
    quick = get_family(entry["family"]).specs(entry, "quick", seed)
    return [replace(s, name=f"{s.name} [folded, rows of {FOLDED_ROW}]") for s in quick]


def validate_variant(
    device: Device,
    kernel: RenderedKernel,
    entry: dict[str, Any],
    *,
    quick: bool = False,
    tier: str | None = None,
    seed: int,
    progress: Progress | None = None,
    storage_overrun: bool = False,
    constants: dict[str, float] | None = None,
    outputs: dict[CaseSpec, np.ndarray] | None = None,
    fail_fast: bool = False,
) -> VariantReport:
    """Validate one variant; ``outputs`` (when given) receives each case's output by spec."""
    name = kernel.variant.name
    started = time.perf_counter()
    specs = case_specs(entry, quick=quick, tier=tier, seed=seed)
    skip, note = static_skip(entry, device, storage_overrun=storage_overrun)
    if skip:
        if progress:
            progress(name, len(specs))
        return VariantReport(name, "SKIP", skip)
    runner = KernelRunner(device, kernel, entry, constants)
    report = VariantReport(name, "PASS", note)
    folded = set(folded_cases(entry, seed))
    try:
        runner.compile()
        for index, spec in enumerate(specs):
            runner.fold_above = FOLDED_ROW if spec in folded else None
            result = runner.run_case(spec, keep_output=outputs is not None)
            if outputs is not None and result.output is not None:
                outputs[spec] = result.output
                result.output = None
            report.cases.append(result)
            if progress:
                progress(name, 1)
            if fail_fast and not result.passed:  # --fail-fast: the rest is not run
                if progress:
                    progress(name, len(specs) - index - 1)
                break
    except ShaderCompileError as error:
        refusal = limit_refusal(error) if note else None
        if refusal:
            storage, limit = storage_need(entry, device)
            report.status = "SKIP"
            report.reason = (
                f"needs {storage} B workgroup storage; limit {limit}, enforced by the "
                f"implementation (--storage-overrun cannot apply): {refusal}"
            )
            if progress:
                progress(name, len(specs))
        else:
            report.status, report.reason = "FAIL", f"compile error: {error.message}"
    except BackendUnavailable:  # the installation, not this kernel: the run ends (exit 2)
        raise
    except DopplerGenError as error:
        report.status, report.reason = "FAIL", str(error)
    else:
        _judge_report(report, len(specs))
        if len(report.cases) < len(specs):
            report.reason += f"; stopped there (--fail-fast): {len(specs)} cases in the tier"
    report.seconds = time.perf_counter() - started
    return report


def _judge_report(report: VariantReport, tier_cases: int) -> None:
    """FAIL with the first refused or failed case as the reason, or when no case compared a
    single output element (a family that gives no cases, or only empty outputs, would pass
    any kernel); PASS otherwise."""
    refused = [c for c in report.cases if c.refused]
    if not any(c.elements for c in report.cases) and not refused and not report.failures:
        report.status = "FAIL"
        report.reason = (
            f"no case compared any output element ({tier_cases} case(s) in the tier, "
            "every output empty): the family's case matrix checks nothing"
            if tier_cases
            else "the family gives no case for this tier: nothing would check the kernel"
        )
    elif refused:
        report.status = "FAIL"
        report.reason = f"case {refused[0].spec.name!r} was refused: {refused[0].refused}"
    elif report.failures:
        first = report.failures[0]
        v = first.verdict
        assert v is not None
        report.status = "FAIL"
        nan = f", {v.non_finite} NaN/Inf left" if v.non_finite else ""
        if math.isfinite(v.tolerance):
            why = f"max abs error {v.max_abs_error:.3g} > tolerance {v.tolerance:.3g} "
        else:  # judges nothing: a bug in the family's tolerance (or its reference)
            why = (
                f"the family's tolerance is {v.tolerance}, not a finite number; "
                f"max abs error {v.max_abs_error:.3g} "
            )
        report.reason = (
            f"{len(report.failures)} case(s) failed; first: {first.spec.name!r} "
            f"(seed {first.spec.seed}): {why}"
            f"(rel {v.max_rel_error:.3g}) at index {list(v.worst_index)}{nan}"
        )
