"""A variant of every kernel body, the quick tier, on this machine's adapter (lavapipe in CI):
the committed generated/ kernels, proven fresh first, through the library's ``validate``.

The default tier (each family's whole feature matrix plus its size cases) runs for *every*
variant in `.ci/setup` (`doppler-gen validate --storage-overrun`), which CI runs before this suite
and which fails CI on any failing case. Until the twenty-sixth session this test ran that tier
again for one variant per body (`conftest.representatives`): 517 s of a 1,346 s pytest slice on
two cores, all of it a repeat of the setup's work (the three streaming bodies alone about half,
most of it their seeded random-size cases). The quick tier keeps the suite's own proof that every
body compiles, binds and computes on the adapter, in about 30 s.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO_ROOT, kernel_body, representatives
from gpu_support import adapter_problem

from doppler_gen.config import load_project
from doppler_gen.runtime.verify import case_specs
from doppler_gen.validate import format_report, validate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]


def test_a_variant_of_every_kernel_body_passes_the_quick_tier() -> None:
    project = load_project(REPO_ROOT)
    names = representatives(project)
    run = validate(project, names, quick=True, storage_overrun=True)
    print(format_report(run))
    assert run.ok, format_report(run)
    assert run.tier == "quick"
    assert [v.name for v in run.variants] == list(names)
    manifest = json.loads((REPO_ROOT / "generated" / "manifest.json").read_text())["variants"]
    for report in run.variants:
        if report.status == "SKIP":
            # f16 where the adapter has none; subgroups narrower than the variant needs (its
            # code path runs at lavapipe's widths in tests/test_streaming_subgroups.py)
            assert report.reason.startswith("needs shader-f16") or (
                "(min_subgroup_size" in report.reason
            ), report.reason
            continue
        assert report.status == "PASS"
        # every case of the variant's quick tier ran and passed
        quick = case_specs(manifest[report.name], quick=True, seed=0)
        assert len(report.cases) == len(quick) >= 10
        assert all(c.passed for c in report.cases)


def test_the_representatives_are_one_variant_per_kernel_body() -> None:
    """Each kernel body of the project is represented exactly once, by its first variant, so no
    body is left to the setup's validation alone; every template is among them, and the
    head-dim and tuning siblings are not (fewer than half the variants)."""
    project = load_project(REPO_ROOT)
    names = representatives(project)
    assert len(names) == len(set(names))
    bodies = [kernel_body(project.variant(n)) for n in names]
    assert len(bodies) == len(set(bodies))
    assert set(bodies) == {kernel_body(v) for v in project.variants}
    for variant in project.variants:
        first = next(v for v in project.variants if kernel_body(v) == kernel_body(variant))
        assert first.name in names
    assert {project.variant(n).template.name for n in names} == {
        v.template.name for v in project.variants
    }
    assert len(names) < len(project.variants) / 2
