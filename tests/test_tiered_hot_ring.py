"""The tiered kernels' hot ring rows without a division per key, on the adapter.

Hot key i lives in row (hot_start + i) % hot_window of the ring. Each invocation divides once
(hot_base = hot_start % hot_window); a key's row is then hot_base + i, less hot_window past the
ring's end, which is exact while hot_len <= hot_window (a ring holds hot_window keys). A larger
hot_len (keys sharing rows, as the seed's modulo defines them) takes a division for the keys
past 2 * hot_window.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO_ROOT, edit, render_variant, subgroup_device
from gpu_support import adapter_problem

from doppler_gen.backends import Device
from doppler_gen.families.attention import CaseSpec
from doppler_gen.families.tiered import SHARED_ROWS_CASE, tiered_specs
from doppler_gen.runtime.runner import KernelRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

TEMPLATE = "templates/attention_decode_tiered.wgsl.j2"
# one dispatch, int4 cold tier (its hot ring is on whenever hot_window > 0), shipped form
NAME = "attention_decode_tiered_int4_f16kv_sg"
CASES = [
    # hot_start far past the ring: hot_base 5, rows 5..15 then 0 (a partial ring, so that
    # reading other rows changes the key set: a full ring is only permuted, which attention
    # cannot see)
    CaseSpec(
        "ring wraps, hot_start 10 rings on",
        num_heads=8,
        num_kv_heads=2,
        cold_len=30,
        hot_len=12,
        hot_start=165,
        hot_window=16,
        start_pos=176,
        head_dim=64,
        seed=3,
    ),
    # a full ring starting at row 0: no key wraps
    CaseSpec(
        "full ring, hot_start a multiple of hot_window",
        num_heads=4,
        num_kv_heads=1,
        cold_len=9,
        hot_len=8,
        hot_start=64,
        hot_window=8,
        start_pos=71,
        head_dim=32,
        seed=4,
    ),
    # more hot keys than rows: keys share rows; keys 8.. are 2 * hot_window past hot_base
    CaseSpec(
        "hot_len 20, hot_window 7 (keys share rows)",
        num_heads=4,
        num_kv_heads=2,
        cold_len=5,
        hot_len=20,
        hot_start=13,
        hot_window=7,
        start_pos=32,
        head_dim=16,
        seed=5,
    ),
]


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    yield from subgroup_device([NAME])


def _failures(device: Device, root: Path) -> list[str]:
    kernel, entry = render_variant(root, NAME)
    runner = KernelRunner(device, kernel, entry)
    return [c.name for c in CASES if not runner.run_case(c).passed]


def test_the_ring_row_divides_once_per_invocation() -> None:
    text = render_variant(REPO_ROOT, "attention_decode_tiered_split_f16")[0].passes[0].text
    assert "hot_base = hot_ring_base();" in text
    body = re.search(r"\nfn get_hot_pos\(.*?\n}\n", text, re.S)
    assert body is not None
    # the only division is the fallback for keys past 2 * hot_window
    assert body.group(0).count("%") == 1
    assert "if (p >= 2u * u.hot_window) {\n            return p % u.hot_window;" in body.group(0)


def test_wrapping_and_shared_rows_pass(device: Device) -> None:
    assert _failures(device, REPO_ROOT) == []


PLANTED = [
    # keys past 2 * hot_window never divided (they read beyond the ring)
    ("if (p >= 2u * u.hot_window) {", "if (false) {", {CASES[2].name}),
    # the wrap one key late
    ("select(p, p - u.hot_window, p >= u.hot_window)", "select(p, p - u.hot_window, p > u.hot_window)",
     {CASES[0].name, CASES[2].name}),
    # hot_start's offset into the ring dropped
    ('return {{ common.ring_row("u.hot_start", "u.hot_window") }};', "return 0u;",
     {CASES[0].name, CASES[2].name}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "must_fail"), PLANTED, ids=["no-fallback", "wrap-late", "no-hot-base"]
)
def test_planted_ring_bugs_fail(
    device: Device, project_copy: Path, old: str, new: str, must_fail: set[str]
) -> None:
    edit(project_copy / TEMPLATE, old, new)
    assert must_fail <= set(_failures(device, project_copy))


def test_the_validation_case_catches_a_missing_fallback_in_the_split_kernel(
    device: Device, project_copy: Path
) -> None:
    """The validate matrix's shared-rows case fails the split kernel without the division (it
    failed every tiered variant when planted by hand); the shipped kernel passes it."""
    spec = next(
        s
        for s in tiered_specs(64, 4096, cold="f16", quick=False, seed=0)
        if s.name == SHARED_ROWS_CASE
    )
    name = "attention_decode_tiered_split_f16"
    shipped = KernelRunner(device, *render_variant(REPO_ROOT, name))
    assert shipped.run_case(spec).passed
    edit(project_copy / TEMPLATE, PLANTED[0][0], PLANTED[0][1])
    planted = KernelRunner(device, *render_variant(project_copy, name))
    assert not planted.run_case(spec).passed
