"""Case inputs and references shared between variants (doppler_gen.families.memo).

Sharing must be invisible: the same arrays and references as building afresh, nothing one
variant's run does can reach another's case, and anything that changes what a build or a
reference reads gets its own entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from conftest import REPO_ROOT

from doppler_gen.families import get_family, memo
from doppler_gen.families.attention import CaseSpec
from doppler_gen.families.base import element_types
from doppler_gen.families.rmsnorm import RmsNormSpec
from doppler_gen.families.tiered import build_tiered
from doppler_gen.families.tiled import build_tiled

MANIFEST = json.loads((REPO_ROOT / "generated/manifest.json").read_text(encoding="utf-8"))
ENTRIES = MANIFEST["variants"]
SPEC = CaseSpec("memo", num_heads=4, num_kv_heads=2, head_dim=16, query_len=5, kv_len=40)
RMS_SPEC = RmsNormSpec("memo rows", rows=4, size=64)
TIERED_SPEC = CaseSpec(
    "memo tiered", num_heads=4, num_kv_heads=2, head_dim=16, cold_len=30, hot_len=8
)


@pytest.fixture(autouse=True)
def empty_memo() -> Iterator[None]:
    memo.clear()
    yield
    memo.clear()


def _arrays(data) -> dict[str, np.ndarray]:
    found = {f"buffers.{k}": v for k, v in data.buffers.items()}
    for name, value in data.reference_inputs.items():
        if isinstance(value, np.ndarray):
            found[f"reference_inputs.{name}"] = value
    return found


@pytest.mark.parametrize(
    "name", ["attention_f16", "attention_prefill_large_d64", "attention_decode_sg_d64_f16kv"]
)
def test_a_shared_case_holds_the_arrays_a_fresh_build_makes(name: str) -> None:
    entry = ENTRIES[name]
    family = get_family(entry["family"])
    first, second = family.build(SPEC, entry), family.build(SPEC, entry)
    fresh = build_tiled(SPEC, element_types(entry))
    assert memo.counts()["case_hits"] == 1
    for key, array in _arrays(fresh).items():
        for shared in (first, second):
            got = _arrays(shared)[key]
            assert got.dtype == array.dtype and np.array_equal(got, array, equal_nan=True), key
    assert first.buffers["K"] is second.buffers["K"]  # shared, not rebuilt


def test_shared_arrays_are_read_only() -> None:
    entry = ENTRIES["attention_f16"]
    data = get_family("tiled").build(SPEC, entry)
    with pytest.raises(ValueError, match="read-only"):
        data.buffers["K"][0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        data.reference_inputs["q"][...] = 0.0


def test_replacing_a_buffer_changes_only_that_copy() -> None:
    entry = ENTRIES["attention_f16"]
    family = get_family("tiled")
    planted = family.build(SPEC, entry)
    planted.buffers["K"] = np.full_like(planted.buffers["K"], np.nan)
    planted.uniforms["seq_len"] = 0
    again = family.build(SPEC, entry)
    assert not np.isnan(again.buffers["K"]).any()
    assert again.uniforms["seq_len"] == SPEC.kv_len


def test_element_types_and_cold_formats_get_their_own_cases() -> None:
    tiled = get_family("tiled")
    f32 = tiled.build(SPEC, ENTRIES["attention"])
    f16 = tiled.build(SPEC, ENTRIES["attention_f16"])
    assert f32.buffers["K"].dtype == np.float32 and f16.buffers["K"].dtype == np.float16
    tiered = get_family("tiered")
    int8 = ENTRIES["attention_decode_tiered_int8_f16kv"]
    int4 = ENTRIES["attention_decode_tiered_int4_f16kv"]
    a, b = tiered.build(TIERED_SPEC, int8), tiered.build(TIERED_SPEC, int4)
    assert memo.counts()["case_hits"] == 0
    fresh = build_tiered(TIERED_SPEC, element_types(int4), "int4")
    assert np.array_equal(b.buffers["K_cold"], fresh.buffers["K_cold"])
    assert not np.array_equal(a.reference_inputs["k_cold"], b.reference_inputs["k_cold"])


def _uncached_reference(family, data, entry, dtype=np.float64):
    """The family's reference on a copy of the case the memo does not know."""
    return family.reference(replace(data, memo_key=None), entry, dtype, stats={})


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_shared_reference_equals_a_fresh_one_with_its_statistics(dtype) -> None:
    entry = ENTRIES["attention_prefill_large_d64"]
    family = get_family("tiled")
    data = family.build(SPEC, entry)
    stats_a: dict[str, float] = {}
    stats_b: dict[str, float] = {}
    a = family.reference(data, entry, dtype, stats=stats_a)
    b = family.reference(family.build(SPEC, entry), entry, dtype, stats=stats_b)
    assert a is b and memo.counts()["reference_hits"] == 1
    assert stats_a == stats_b and stats_a["keys"] > 0
    assert np.array_equal(a, _uncached_reference(family, data, entry, dtype))
    assert not a.flags.writeable


def test_compute_dtype_and_statistics_requests_are_separate_entries() -> None:
    entry = ENTRIES["attention_prefill_large_d64"]
    family = get_family("tiled")
    data = family.build(SPEC, entry)
    f64 = family.reference(data, entry, np.float64, stats={})
    f32 = family.reference(data, entry, np.float32)
    stats: dict[str, float] = {}
    again = family.reference(data, entry, np.float32, stats=stats)
    assert f64.dtype == np.float64 and f32.dtype == np.float32
    assert stats and "logit_bound" in stats  # a stats-less entry did not answer a stats request
    assert np.array_equal(f32, again)


def test_the_masked_row_contract_is_part_of_a_tiered_reference_key() -> None:
    family = get_family("tiered")
    mean_v = dict(ENTRIES["attention_decode_tiered_f16kv"])
    zero = {**mean_v, "metadata": {**mean_v["metadata"], "masked_row": "zero"}}
    # a window that hides every key: the contracts disagree on this row
    spec = CaseSpec(
        "all masked", num_heads=2, num_kv_heads=1, head_dim=8, cold_len=12, hot_len=4,
        sliding_window=1, start_pos=40, is_causal=1,
    )  # fmt: skip
    data = family.build(spec, mean_v)
    a = family.reference(data, mean_v, stats={})
    b = family.reference(family.build(spec, zero), zero, stats={})
    assert np.array_equal(a, _uncached_reference(family, data, mean_v))
    assert np.array_equal(b, _uncached_reference(family, data, zero))
    assert not np.array_equal(a, b)  # the row is masked: "zero" and "mean_v" differ


def test_replaced_reference_inputs_are_computed_afresh() -> None:
    entry = ENTRIES["attention_prefill_large_d64"]
    family = get_family("tiled")
    family.reference(family.build(SPEC, entry), entry, stats={})
    changed = family.build(SPEC, entry)
    changed.reference_inputs["v"] = changed.reference_inputs["v"] * 2.0
    doubled = family.reference(changed, entry, stats={})
    plain = family.reference(family.build(SPEC, entry), entry, stats={})
    assert np.allclose(doubled, 2.0 * plain)


@pytest.mark.parametrize(("name", "field", "value"), [
    ("attention_prefill_large_d64", "sliding_window", 3),
    ("attention_decode_tiered_f16kv", "start_pos", 20),
    ("rmsnorm", "eps", 10.0),
])  # fmt: skip
def test_changed_uniforms_are_computed_afresh_and_never_stored_for_others(
    name: str, field: str, value: float
) -> None:
    """A caller that changes a uniform of its copy (what the reference reads besides the
    arrays) gets its own reference, and later callers still get the plain one."""
    entry = ENTRIES[name]
    family = get_family(entry["family"])
    spec = RMS_SPEC if name == "rmsnorm" else (TIERED_SPEC if "tiered" in name else SPEC)
    tweaked = family.build(spec, entry)
    tweaked.uniforms[field] = value
    own = family.reference(tweaked, entry, stats={})
    plain = family.reference(family.build(spec, entry), entry, stats={})
    assert np.array_equal(own, _uncached_reference(family, tweaked, entry))
    assert np.array_equal(plain, _uncached_reference(family, family.build(spec, entry), entry))
    assert not np.array_equal(own, plain)  # the uniform matters, so sharing would have shown


def test_the_memo_stays_within_its_byte_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = ENTRIES["attention_f16"]
    family = get_family("tiled")
    size = sum(a.nbytes for a in _arrays(build_tiled(SPEC, element_types(entry))).values())
    monkeypatch.setattr(memo, "MAX_BYTES", 2 * size)
    for n in range(4):
        family.build(replace(SPEC, name=f"case {n}"), entry)
    assert len(memo._CASES.entries) == 2 and memo._CASES.bytes <= 2 * size
    monkeypatch.setattr(memo, "LARGEST", size - 1)
    family.build(replace(SPEC, name="too large"), entry)
    again = family.build(replace(SPEC, name="too large"), entry)
    assert memo.counts()["case_hits"] == 0  # never stored, so built twice
    assert again.buffers["K"].flags.writeable  # and nothing shares it
