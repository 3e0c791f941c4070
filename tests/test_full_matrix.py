"""A variant of every kernel body, the default tier (feature matrix + size cases), on this
machine's adapter: lavapipe in CI; the committed generated/ kernels, proven fresh first.

It fails if any of them fails any case, and accepts a skip only where the adapter truly lacks
what the variant needs (the reason is shown). Every variant runs the same tier in `.ci/setup`
(`doppler-gen validate --storage-overrun`), which CI runs before this suite; the suite takes one
variant per kernel body (`conftest.representatives`) so the two do not repeat each other's
three minutes.
"""

from __future__ import annotations

import pytest
from conftest import REPO_ROOT, representatives
from gpu_support import adapter_problem

from doppler_gen.config import load_project
from doppler_gen.validate import format_report, validate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]


def test_a_variant_of_every_kernel_body_passes_the_full_matrix() -> None:
    project = load_project(REPO_ROOT)
    names = representatives(project)
    run = validate(project, names, storage_overrun=True)
    print(format_report(run))
    assert run.ok, format_report(run)
    assert [v.name for v in run.variants] == list(names)
    for report in run.variants:
        if report.status == "SKIP":
            # f16 where the adapter has none; subgroups narrower than the variant needs (its
            # code path runs at lavapipe's widths in tests/test_streaming_subgroups.py)
            assert report.reason.startswith("needs shader-f16") or (
                "(min_subgroup_size" in report.reason
            ), report.reason
            continue
        assert report.status == "PASS"
        assert len(report.cases) >= 60  # 44 feature cases + the default tier's size cases
        assert all(c.passed for c in report.cases)
