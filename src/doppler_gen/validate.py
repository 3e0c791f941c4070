"""`doppler-gen validate`: compile every variant and check it against the float64 reference.

Kernels are rendered fresh from the templates (the same text `generate` writes, plus the source
map that puts compile errors at template lines). One device is opened for the whole run and each
variant is compiled once; cases are generated deterministically from the seed.

A variant is PASS only when every case ran and passed; FAIL when any case failed, a compile
error occurred or a case left NaN/Inf in the output; SKIP (with the reason) when the device
cannot run it at all: a missing feature, or static needs beyond the requested limits. Skips are
never counted as passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from doppler_gen.backends import Backend, Device, effective_limits, get_backend, select_adapter
from doppler_gen.cases import CaseSpec, tiered_specs, tiled_specs
from doppler_gen.config import Project
from doppler_gen.errors import DopplerGenError, ShaderCompileError
from doppler_gen.harness import CaseResult, KernelRunner
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.outputs import select
from doppler_gen.render import RenderedKernel, Renderer


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


@dataclass
class ValidationRun:
    backend: str
    adapter: str
    limits_profile: str
    seed: int
    quick: bool
    variants: list[VariantReport]
    seconds: float

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
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "variants": [v.as_dict() for v in self.variants],
        }


def case_specs(entry: dict[str, Any], *, quick: bool, seed: int) -> list[CaseSpec]:
    meta = entry["metadata"]
    if entry["family"] == "tiled":
        return tiled_specs(meta["max_head_dim"], quick=quick, seed=seed)
    return tiered_specs(meta["max_head_dim"], meta["max_kv_len"], cold=str(entry["params"]["cold"]),
                        quick=quick, seed=seed)


def static_skip(entry: dict[str, Any], device: Device, *, storage_overrun: bool = False) -> tuple[str | None, str]:
    """(why the device cannot run this variant, or None; a note to show when it runs anyway)."""
    missing = [f for f in entry["requires"] if f not in device.features]
    if missing:
        return f"needs {', '.join(missing)}; the device was opened without it", ""
    storage = entry["workgroup_storage_bytes"]
    limit = device.limits.get("max-compute-workgroup-storage-size", 16384)
    if storage > limit:
        if not storage_overrun:
            return f"needs {storage} B workgroup storage; limit {limit}", ""
        note = f"ran beyond the device limit: {storage} B workgroup storage > {limit} B (--storage-overrun)"
        return None, note
    invocations = 1
    for size in entry["workgroup_size_default"]:
        invocations *= size
    limit = device.limits.get("max-compute-invocations-per-workgroup", 256)
    if invocations > limit:
        return f"needs {invocations} invocations per workgroup; limit {limit}", ""
    return None, ""


def open_device(backend: Backend, kernels: Sequence[RenderedKernel], adapter_want: str | None,
                limits_profile: str) -> Device:
    """Open one device able to run as many of the kernels as the adapter allows."""
    adapter = select_adapter(backend.adapters(), adapter_want)
    wanted = {f for k in kernels for f in k.variant.requires}
    features = sorted(f for f in wanted if f in adapter.features)
    return backend.open_device(adapter, features=features, limits=effective_limits(adapter, limits_profile))


Progress = Callable[[str, int], None]


def validate(project: Project, patterns: tuple[str, ...] = (), *, backend_name: str = "wgpu",
             adapter: str | None = None, limits: str = "adapter", quick: bool = False, seed: int = 0,
             storage_overrun: bool = False, progress: Progress | None = None) -> ValidationRun:
    """Validate the selected variants; never raises for a kernel failure (that is a report)."""
    started = time.perf_counter()
    renderer = Renderer(project)
    variants = select(project, patterns)
    kernels = [renderer.render(v, with_origins=True) for v in variants]
    entries = [variant_entry(k, parse_kernel(k)) for k in kernels]
    backend = get_backend(backend_name)
    device = open_device(backend, kernels, adapter, limits)
    reports = []
    try:
        for kernel, entry in zip(kernels, entries, strict=True):
            reports.append(validate_variant(device, kernel, entry, quick=quick, seed=seed, progress=progress,
                                            storage_overrun=storage_overrun))
    finally:
        device.close()
    return ValidationRun(backend_name, device.adapter.describe(), limits, seed, quick, reports,
                         time.perf_counter() - started)


def validate_variant(device: Device, kernel: RenderedKernel, entry: dict[str, Any], *, quick: bool,
                     seed: int, progress: Progress | None = None, storage_overrun: bool = False,
                     constants: dict[str, float] | None = None) -> VariantReport:
    name = kernel.variant.name
    started = time.perf_counter()
    specs = case_specs(entry, quick=quick, seed=seed)
    skip, note = static_skip(entry, device, storage_overrun=storage_overrun)
    if skip:
        if progress:
            progress(name, len(specs))
        return VariantReport(name, "SKIP", skip)
    runner = KernelRunner(device, kernel, entry, constants)
    report = VariantReport(name, "PASS", note)
    try:
        runner.compile()
        for spec in specs:
            report.cases.append(runner.run_case(spec))
            if progress:
                progress(name, 1)
    except ShaderCompileError as error:
        report.status, report.reason = "FAIL", f"compile error: {error.message}"
    except DopplerGenError as error:
        report.status, report.reason = "FAIL", str(error)
    else:
        refused = [c for c in report.cases if c.refused]
        if refused:
            report.status = "FAIL"
            report.reason = f"case {refused[0].spec.name!r} was refused: {refused[0].refused}"
        elif report.failures:
            first = report.failures[0]
            v = first.verdict
            assert v is not None
            report.status = "FAIL"
            nan = f", {v.non_finite} NaN/Inf left" if v.non_finite else ""
            report.reason = (
                f"{len(report.failures)} case(s) failed; first: {first.spec.name!r} (seed {first.spec.seed}): "
                f"max abs error {v.max_abs_error:.3g} > tolerance {v.tolerance:.3g} "
                f"(rel {v.max_rel_error:.3g}) at index {list(v.worst_index)}{nan}"
            )
    report.seconds = time.perf_counter() - started
    return report


def format_report(run: ValidationRun) -> str:
    from doppler_gen.listing import format_table

    rows = []
    for v in run.variants:
        worst = v.worst
        worst_text = "-"
        if worst and worst.verdict:
            worst_text = f"{worst.verdict.max_abs_error:.2e} ({worst.verdict.ratio:.2f} of tol)"
        cases = f"{sum(c.passed for c in v.cases)}/{len(v.cases)}" if v.cases else "-"
        rows.append([v.name, v.status, cases, worst_text, f"{v.seconds:.1f}s", v.reason.split("\n")[0]])
    table = format_table(["variant", "result", "cases", "worst error", "time", "note"], rows)
    details = [f"\n{v.name}: {v.reason}" for v in run.variants if v.status == "FAIL" and "\n" in v.reason]
    counts = {s: sum(v.status == s for v in run.variants) for s in ("PASS", "FAIL", "SKIP")}
    total_cases = sum(len(v.cases) for v in run.variants)
    summary = (
        f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
        f"({total_cases} cases, {run.seconds:.1f}s) on {run.adapter} [{run.backend}, limits {run.limits_profile}]"
    )
    return table + "".join(details) + summary


def case_count(project: Project, patterns: tuple[str, ...], *, quick: bool, seed: int) -> int:
    """How many cases a run will go through (for the progress bar)."""
    renderer = Renderer(project)
    total = 0
    for variant in select(project, patterns):
        kernel = renderer.render(variant)
        total += len(case_specs(variant_entry(kernel, parse_kernel(kernel)), quick=quick, seed=seed))
    return total
