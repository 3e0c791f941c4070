"""Case tiers and sampled comparison: sizes come from metadata, samples span every dimension.

Pure tests (no adapter): the tiers reach the issue's sizes for every committed variant and for
synthetic variants with larger maxima (a new variant gets coverage without a matrix edit), and
the sampled judge catches what a full judge catches in the rows it covers, plus NaN anywhere.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import REPO_ROOT

from doppler_gen.families import attention as reference
from doppler_gen.families.attention import CaseSpec, kv_vector_width
from doppler_gen.families.attention import paged_buffer as _paged_buffer
from doppler_gen.families.tiered import build_tiered
from doppler_gen.families.tiers import (
    SIZES,
    TENSOR_BYTES,
    head_dims,
    largest_tensor,
    tier_name,
    tiered_sizes,
    tiled_sizes,
)
from doppler_gen.sampling import choose_sample, judge_sampled, spread_indices
from doppler_gen.validate import case_specs

# the attention families' variants (the tiers of this file are theirs)
MANIFEST = {
    name: entry
    for name, entry in json.loads((REPO_ROOT / "generated" / "manifest.json").read_text())[
        "variants"
    ].items()
    if entry["family"] in ("tiled", "tiered")
}


def size_specs(entry: dict, tier: str, seed: int) -> list[CaseSpec]:
    """The size cases of ``tier`` for an attention variant (its family's tiers)."""
    sizes = tiled_sizes if entry["family"] == "tiled" else tiered_sizes
    return sizes(entry, tier, seed)


def _synthetic(family: str, max_head_dim: int, max_kv_len: int | None, cold: str = "f16") -> dict:
    meta = {"max_head_dim": max_head_dim, "max_kv_len": max_kv_len}
    return {"family": family, "metadata": meta, "params": {"cold": cold}}


ENTRIES = {
    **MANIFEST,
    "synthetic decode d256": _synthetic("tiled", 256, None),
    "synthetic prefill d512": _synthetic("tiled", 512, None),
    "synthetic tiered 131072": _synthetic("tiered", 256, 131072, "int4"),
    "synthetic tiered f16 1024": _synthetic("tiered", 128, 1024, "f16"),
    "synthetic tiled with MAX_KV_LEN 4096": _synthetic("tiled", 128, 4096),
}


def _reach(specs: list) -> dict[str, int]:
    tiled = [s for s in specs if s.cold_len == 0 and s.hot_len <= 1]
    return {
        "heads": max(s.num_heads for s in specs),
        "head_dim": max(s.head_dim for s in specs),
        "offset": max(max(s.start_pos, s.kv_start, s.hot_start) for s in specs),
        "kv": max(max(s.kv_len, s.cold_len + s.hot_len) for s in specs),
        "queries": max((s.query_len for s in tiled), default=1),
    }


@pytest.mark.parametrize("tier", ["default", "large"])
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_tiers_reach_the_issue_sizes_from_metadata(name: str, tier: str) -> None:
    entry = ENTRIES[name]
    specs = case_specs(entry, seed=0, tier=tier)
    reach = _reach(specs)
    meta = entry["metadata"]
    sizes = SIZES[tier]
    ratios = {(s.num_heads, s.num_kv_heads) for s in specs}
    assert {(64, 8), (32, 8), (64, 64), (64, 1), (1, 1)} <= ratios
    # a kernel reading K/V as vecN runs each swept head_dim at the next multiple of N
    width = kv_vector_width(entry)
    top = meta["max_head_dim"] - meta["max_head_dim"] % width
    swept = {min(-(-d // width) * width, top) for d in head_dims(meta["max_head_dim"])}
    assert {s.head_dim for s in specs} >= swept
    assert all(s.head_dim % width == 0 for s in specs)
    assert reach["head_dim"] == meta["max_head_dim"] and reach["offset"] >= 4096
    if entry["family"] == "tiled":
        longest = meta["max_kv_len"] or 1 << 30
        assert longest >= reach["kv"] >= min(2048 if tier == "default" else 8192, longest - 37)
        assert reach["queries"] >= min(300 if tier == "default" else 1024, longest - 37)
        rings = [s for s in specs if s.kv_layout == "ring"]
        assert max(s.kv_len // s.sliding_window for s in rings) >= 4  # wrapped several times
        paged = [s for s in specs if s.kv_layout == "paged"]
        assert max((s.kv_start + s.kv_len) // s.page_size for s in paged) >= 64
    else:
        cap = meta["max_kv_len"] if sizes.kv_cap is None else min(meta["max_kv_len"], sizes.kv_cap)
        sized = _reach(size_specs(entry, tier, 0))
        assert sized["kv"] == cap  # size cases: cold tier up to the (capped) MAX_KV_LEN
        assert reach["kv"] == meta["max_kv_len"]  # the feature matrix's exact boundary case
        wrapped = [
            s for s in specs if s.hot_window and s.hot_start - s.cold_len >= 3 * s.hot_window
        ]
        assert wrapped and any(s.magnitude_span >= 4 for s in specs)
        if entry["params"]["cold"] == "f16":
            paged = [s for s in specs if s.cold_layout == 2]
            assert max(-(-s.cold_len // s.cold_page_size) for s in paged) >= 64


def test_quick_tier_adds_no_size_cases_and_tiers_are_deterministic() -> None:
    entry = MANIFEST["attention"]
    assert size_specs(entry, "quick", 0) == []
    assert size_specs(entry, "default", 3) == size_specs(entry, "default", 3)
    assert tier_name(quick=True, large=False) == "quick"
    assert tier_name(quick=False, large=True) == "large"
    with pytest.raises(ValueError):
        tier_name(quick=True, large=True)


SPLIT_VARIANTS = sorted(
    name
    for name, entry in MANIFEST.items()
    if entry["family"] == "tiled"
    and any(o["name"] == "KV_SPLITS" for p in entry["passes"] for o in p["overrides"])
)


@pytest.mark.parametrize("tier", ["default", "large"])
@pytest.mark.parametrize("name", SPLIT_VARIANTS)
def test_split_kernels_get_splits_longer_than_two_key_tiles(name: str, tier: str) -> None:
    """Every split of one case holds more than two of the kernel's key tiles (its TILE_KEYS, or
    256 keys), so rescaling across a split's tiles is judged below the bench shapes."""
    entry = MANIFEST[name]
    splits = entry["pipeline_constants"].get("KV_SPLITS")
    tile = 256
    for record in entry["passes"]:
        splits = splits or next(
            (o["default"] for o in record["overrides"] if o["name"] == "KV_SPLITS"), None
        )
        tile = max(tile, record["constants"].get("TILE_KEYS", 0))
    long = [s for s in size_specs(entry, tier, 0) if s.kv_len > 2 * tile * splits]
    assert long and all(s.query_len == 1 and s.num_heads == 4 for s in long)
    assert max(s.head_dim for s in long) == entry["metadata"]["max_head_dim"]


def test_kernels_without_splits_get_no_long_split_case() -> None:
    names = [s.name for s in size_specs(MANIFEST["attention"], "default", 0)]
    assert names and not any(n.startswith("long splits") for n in names)


def test_head_dims_cover_small_and_model_sizes_up_to_the_maximum() -> None:
    assert head_dims(64) == [1, 8, 13, 16, 24, 32, 40, 48, 56, 64]
    assert head_dims(100)[-1] == 100 and 96 in head_dims(100)
    dims = head_dims(512)
    assert {80, 96, 112, 128, 160, 192, 256, 512} <= set(dims) and max(dims) == 512


def test_the_default_tier_caps_a_131072_key_tiered_variant() -> None:
    specs = size_specs(ENTRIES["synthetic tiered 131072"], "default", 0)
    assert max(s.cold_len + s.hot_len for s in specs) == SIZES["default"].kv_cap
    large = size_specs(ENTRIES["synthetic tiered 131072"], "large", 0)
    assert max(s.cold_len + s.hot_len for s in large) == 131072


@pytest.mark.parametrize(("n", "count"), [(1, 8), (2, 8), (9, 8), (64, 8), (2083, 24), (7, 2)])
def test_spread_indices_include_both_ends_and_every_stratum(n: int, count: int) -> None:
    rng = np.random.default_rng(0)
    picked = spread_indices(n, count, rng)
    assert picked[0] == 0 and picked[-1] == n - 1
    assert list(picked) == sorted(set(picked.tolist())) and len(picked) <= max(count, 2)
    if n > count > 2:
        edges = np.linspace(0, n, count - 1)
        for lo, hi in itertools.pairwise(edges):
            assert any(lo <= i < hi for i in picked), (lo, hi, picked)


def test_small_outputs_are_compared_in_full_and_samples_are_deterministic() -> None:
    assert choose_sample(4, 64, seed=1) is None  # 256 rows
    a, b = choose_sample(333, 2, seed=5), choose_sample(333, 2, seed=5)
    assert a is not None and b is not None
    assert np.array_equal(a.queries, b.queries) and np.array_equal(a.heads, [0, 1])
    assert not np.array_equal(a.queries, choose_sample(333, 2, seed=6).queries)  # type: ignore[union-attr]


def _tiled_problem(query_len: int, heads: int, kv_heads: int, rng: np.random.Generator):
    d, keys = 8, query_len + 5
    u = {
        "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": d, "seq_len": keys,
        "query_len": query_len, "scale": 0.35, "is_causal": 1, "start_pos": 5,
        "attn_softcap": 0.0, "sliding_window": 0, "kv_len_source": 0, "kv_start": 0,
        "page_size": 0, "kv_layout": 0,
    }  # fmt: skip
    q = rng.standard_normal((query_len, heads, d))
    k, v = rng.standard_normal((2, keys, kv_heads, d))
    return u, q, k, v


def test_sampled_reference_equals_the_full_reference_on_its_rows() -> None:
    u, q, k, v = _tiled_problem(300, 16, 4, np.random.default_rng(1))
    full = reference.tiled_attention(u, q, k, v)
    sample = choose_sample(300, 16, seed=2)
    assert sample is not None
    rows = reference.tiled_attention(u, q, k, v, query_rows=sample.queries, head_rows=sample.heads)
    assert np.allclose(rows, full[np.ix_(sample.queries, sample.heads)], rtol=0, atol=1e-12)
    verdict = judge_sampled(full, rows, sample, 1e-9, "f32")
    assert verdict.passed and "sampled" in verdict.policy


def test_sampled_judge_fails_a_wrong_last_head_and_a_nan_outside_the_sample() -> None:
    u, q, k, v = _tiled_problem(300, 64, 8, np.random.default_rng(3))
    output = reference.tiled_attention(u, q, k, v)
    sample = choose_sample(300, 64, seed=4)
    assert sample is not None
    rows = reference.tiled_attention(u, q, k, v, query_rows=sample.queries, head_rows=sample.heads)
    wrong = output.copy()
    wrong[:, 63] += 1e-3  # only the last head: always sampled
    verdict = judge_sampled(wrong, rows, sample, 1e-6, "f32")
    assert not verdict.passed and verdict.worst_index[1] == 63
    unsampled = next(i for i in range(300) if i not in set(sample.queries.tolist()))
    poisoned = output.copy()
    poisoned[unsampled, 5, 3] = np.nan
    verdict = judge_sampled(poisoned, rows, sample, 1e-6, "f32")
    assert not verdict.passed and verdict.non_finite == 1
    assert verdict.worst_index == (unsampled, 5, 3)


def test_sampled_tiered_reference_selects_heads() -> None:
    rng = np.random.default_rng(7)
    heads, kv_heads, d = 64, 8, 16
    u = {
        "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": d, "cold_len": 5, "hot_len": 3,
        "scale": 0.25, "is_causal": 1, "start_pos": 7, "attn_softcap": 0.0, "sliding_window": 0,
        "hot_window": 0, "hot_start": 5, "cold_page_size": 0, "cold_layout": 0, "hot_layout": 0,
    }  # fmt: skip
    q = rng.standard_normal((heads, d))
    kh, vh = rng.standard_normal((2, 3, kv_heads, d))
    kc, vc = rng.standard_normal((2, 5, kv_heads, d))
    full = reference.tiered_attention(u, q, kh, vh, kc, vc)
    picked = np.array([0, 17, 63])
    rows = reference.tiered_attention(u, q, kh, vh, kc, vc, head_rows=picked)
    assert np.allclose(rows, full[picked], rtol=0, atol=1e-12)


def test_page_tables_are_never_the_identity() -> None:
    for seed in range(200):
        table, _ = _paged_buffer(np.random.default_rng(seed), 16, 8)  # 2 pages + a spare
        assert list(table) != [0, 1]


def test_int8_scales_span_orders_of_magnitude() -> None:
    spec = CaseSpec("span", num_heads=2, num_kv_heads=2, head_dim=32, cold_len=200, hot_len=4,
                    hot_window=8, hot_start=205, start_pos=208, magnitude_span=4.0, seed=3)  # fmt: skip
    data = build_tiered(spec, {"Q": "f32"}, "int8")
    scales = data.buffers["scales_k"].astype(np.float64)
    assert scales.max() / scales.min() > 1e3
    plain = build_tiered(replace(spec, magnitude_span=0.0), {"Q": "f32"}, "int8")
    plain_scales = plain.buffers["scales_k"].astype(np.float64)
    assert plain_scales.max() / plain_scales.min() < 10


@pytest.mark.parametrize("tier", ["default", "large"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_no_tier_case_needs_a_buffer_webgpu_cannot_bind(tier: str, seed: int) -> None:
    """128 MiB is WebGPU's default maxStorageBufferBindingSize (and lavapipe's maximum)."""
    for name, entry in ENTRIES.items():
        for spec in size_specs(entry, tier, seed):
            limit = TENSOR_BYTES if spec.name.startswith("random size") else 128 << 20
            assert largest_tensor(spec) <= limit, (name, spec)


def test_the_default_tier_exercises_the_sampled_comparison_on_every_tiled_variant() -> None:
    for name, entry in MANIFEST.items():
        if entry["family"] != "tiled":
            continue
        sampled = [
            s
            for s in case_specs(entry, quick=False, seed=0)
            if choose_sample(s.query_len, s.num_heads, s.seed, keys=s.kv_len) is not None
        ]
        assert sampled, f"{name}: no default-tier case is compared on a sample"
