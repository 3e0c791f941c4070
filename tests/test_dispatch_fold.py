"""Folded dispatches (``dispatch_fold`` in variants.toml): a workgroup count past the device's
per-dimension limit runs as a 2-D grid.

The streaming prefill dispatches query_len * num_heads workgroups: 65,536 at q = 2048 and 32
heads, one more than a dimension holds; the tiled prefill ceil(query_len / BLOCK_Q) * num_heads,
past the limit at 32,768 queries with 32-query blocks and 64 heads. Their templates read the
index as id.x + id.y * the grid's width, the runner folds such counts into the fewest rows, and
validation runs the quick cases folded into rows of FOLDED_ROW workgroups, because no CPU case
reaches 65,535. A kernel that ignores the row must fail there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO_ROOT, copy_project, edit, render_variant
from gpu_support import adapter_problem, open_run_device

from doppler_gen.backends import get_backend
from doppler_gen.families.attention import CaseSpec
from doppler_gen.runtime.runner import KernelRunner, Prepared, dispatch_grid
from doppler_gen.runtime.verify import FOLDED_ROW, folded_cases, validate_variant

STREAMING = "attention_streaming_f16"
COMMON = "templates/lib/attention_common.wgsl.j2"
FOLDED_INDEX = "{{ wg_id }}.x + {{ wg_id }}.y * {{ num_wg }}.x"

# -- the grid -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "grid"),
    [
        (1, (1, 1, 1)),
        (65535, (65535, 1, 1)),  # within the limit: the host's 1-D formula, unchanged
        (65536, (32768, 2, 1)),  # q = 2048 x 32 heads: two rows, no spare workgroup
        (131072, (43691, 3, 1)),  # three rows, one spare
        (65535 * 65535, (65535, 65535, 1)),
    ],
)
def test_a_folding_pass_takes_the_fewest_rows(count: int, grid: tuple[int, int, int]) -> None:
    assert dispatch_grid(count, 65535, True) == grid
    x, y, _ = grid
    assert x <= 65535 and y <= 65535
    assert count <= x * y < count + y  # at most y - 1 spares, each skipped by the kernel


def test_a_count_no_grid_holds_is_refused() -> None:
    assert dispatch_grid(65536, 65535, False) is None  # not declared foldable
    assert dispatch_grid(65535 * 65535 + 1, 65535, True) is None  # rows past the limit too


def test_a_row_limit_folds_small_counts() -> None:
    assert dispatch_grid(4, 65535, True, row_limit=5) == (4, 1, 1)
    assert dispatch_grid(24, 65535, True, row_limit=5) == (5, 5, 1)  # one spare
    assert dispatch_grid(24, 65535, False, row_limit=5) == (24, 1, 1)  # only folding passes


# -- what ships -----------------------------------------------------------------------------------


def _folds(name: str) -> bool:
    """The prefill tiers whose count grows with query_len: the streaming and tiled prefill."""
    return name.startswith(("attention_streaming", "attention_prefill_"))


def test_the_prefill_kernels_fold_and_nothing_else_does() -> None:
    manifest = json.loads((REPO_ROOT / "generated" / "manifest.json").read_text())["variants"]
    folding = sorted(
        name for name, e in manifest.items() if any(p.get("dispatch_fold") for p in e["passes"])
    )
    assert folding == sorted(n for n in manifest if _folds(n))
    assert any(n.startswith("attention_prefill_small") for n in folding)  # tiled_small too
    for name in folding:
        text = (REPO_ROOT / manifest[name]["file"]).read_text()
        assert "@builtin(num_workgroups) num_wg" in text
        assert "let w = wg_id.x + wg_id.y * num_wg.x;" in text


def test_the_registry_tells_the_host() -> None:
    registry = json.loads((REPO_ROOT / "generated" / "doppler" / "registry.json").read_text())
    told = 0
    for variant_id, entry in registry["operations"]["attention"]["variants"].items():
        kernel = Path(entry.get("wgsl") or "").stem
        folds = entry.get("variantMetadata", {}).get("dispatchFold", False)
        assert folds == _folds(kernel), variant_id
        told += folds
    assert told == 29  # 20 tiled prefill and 9 streaming kernels


def test_folded_cases_are_the_quick_cases_renamed() -> None:
    _, entry = render_variant(REPO_ROOT, STREAMING)
    folded = folded_cases(entry, seed=0)
    assert folded and all(s.name.endswith(f"[folded, rows of {FOLDED_ROW}]") for s in folded)
    _, decode = render_variant(REPO_ROOT, "attention_decode_sg_d64_f16")
    assert folded_cases(decode, seed=0) == []


# -- on the adapter -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def device():
    kernel, _ = render_variant(REPO_ROOT, STREAMING)
    dev = open_run_device(get_backend("wgpu"), [kernel], None, "adapter")
    yield dev
    dev.close()


@pytest.mark.gpu
@pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
def test_a_folded_case_runs_on_a_two_dimensional_grid(device) -> None:
    kernel, entry = render_variant(REPO_ROOT, STREAMING)
    runner = KernelRunner(device, kernel, entry, fold_above=FOLDED_ROW)
    spec = CaseSpec("folded", num_heads=4, num_kv_heads=2, head_dim=32, query_len=6, kv_len=9)
    prepared = runner.prepare(spec)
    assert isinstance(prepared, Prepared)
    assert prepared.steps[0].workgroups == (5, 5, 1)  # 24 workgroups in rows of 5, one spare
    output = runner.run(prepared)
    assert runner.judge(prepared, output).passed


@pytest.mark.gpu
@pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
def test_validation_runs_the_folded_path(device) -> None:
    kernel, entry = render_variant(REPO_ROOT, STREAMING)
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "PASS", report.reason
    names = [c.spec.name for c in report.cases]
    assert sum("[folded" in n for n in names) == len(folded_cases(entry, seed=0)) > 0


@pytest.mark.gpu
@pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
@pytest.mark.parametrize("name", [STREAMING, "attention_prefill_small_d64"])
def test_a_kernel_that_ignores_the_row_fails_only_folded(device, tmp_path: Path, name: str) -> None:
    root = copy_project(tmp_path / "mutant")
    edit(root / COMMON, FOLDED_INDEX, "{{ wg_id }}.x + 0u * {{ num_wg }}.x")
    kernel, entry = render_variant(root, name)
    report = validate_variant(device, kernel, entry, quick=True, seed=0)
    assert report.status == "FAIL"
    failed = {c.spec.name for c in report.failures}
    assert failed and all("[folded" in n for n in failed)
