"""Every variant, the default tier (feature matrix + size cases), on this machine's adapter.

lavapipe in CI; the committed generated/ kernels, proven fresh first.

This is the CPU validation the CI relies on: it fails if any variant fails any case, and it does
not accept a skip unless the adapter truly lacks what the variant needs (the reason is shown).
"""

from __future__ import annotations

import pytest
from conftest import REPO_ROOT
from gpu_support import adapter_problem

from doppler_gen.config import load_project
from doppler_gen.validate import format_report, validate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]


def test_every_variant_passes_the_full_matrix() -> None:
    project = load_project(REPO_ROOT)
    run = validate(project, storage_overrun=True)
    print(format_report(run))
    assert run.ok, format_report(run)
    assert [v.name for v in run.variants] == [v.name for v in project.variants]
    for report in run.variants:
        if report.status == "SKIP":
            assert report.reason.startswith("needs shader-f16"), report.reason
            continue
        assert report.status == "PASS"
        assert len(report.cases) >= 60  # 44 feature cases + the default tier's size cases
        assert all(c.passed for c in report.cases)
