"""Attention case tiers: how far validation pushes each dimension, from a variant's metadata.

``--quick`` is the CI smoke test (the feature matrix's subset), the default tier is what CI runs,
``--large`` is for a GPU at real model sizes. The default and large tiers add *size cases* to the
feature matrix of ``cases``: bugs that appear only past a size (a head index that aliases above
some head count, keys beyond some count ignored, queries beyond some count never written, an
offset beyond some value dropped) pass every small case.

| dimension | default | large |
|---|---|---|
| query heads | 1-96: 32/8 and 64/8 GQA, 40/8, 28/4 and 96/8 (groups of 5, 7, 12), 64 MHA, 64 MQA | same |
| head_dim | ``head_dims(max_head_dim)`` | same |
| kv_len | 2083 (>= 2048) | 8219 (>= 8192) |
| query_len | 333 (>= 300) | 1061 (>= 1024) |
| start_pos / kv_start | 4099 (>= 4096) | 65543 |
| rings | wrapped 16x (tiled), 2-4x (tiered hot) | 64x, 2-4x |
| page tables | >= 64 shuffled pages (non-identity) | same |
| tiered cold_len | MAX_KV_LEN - hot, capped at 16384 | MAX_KV_LEN - hot |
| cold K/V magnitudes | rows spanning 4 decades (int8/int4 scales too) | same |
| model shapes | 64/8 tiled and 32/8 tiered decodes of 1031 keys | 8219 keys; 32/8 prefill |
| split-KV splits | > 2 key tiles (TILE_KEYS or 256 keys) in each of KV_SPLITS | same |
| random mixtures | 4 seeded (heads, lengths, offsets, layouts, windows, softcap) | 8 |

Everything comes from the manifest entry's metadata (``max_head_dim``, ``max_kv_len``, the cold
format), so a new variant gets coverage without anyone editing a matrix. Lengths are ragged on
purpose (not multiples of any tile). The default tier's per-case cost is kept low for lavapipe:
the long shapes use few heads (the heads cases use short lengths), and large outputs are compared
on a sampled set of rows (``sampling``); the random mixtures cap their work (``TILED_WORK``,
``TIERED_WORK``). The tiered cap of 16384 keys keeps a variant with a
MAX_KV_LEN of 131072 affordable on a CPU adapter; ``--large`` goes to the variant's maximum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from doppler_gen.families.attention import CaseSpec
from doppler_gen.families.base import constant_values

# Head dims every kernel is swept over (those up to its max_head_dim, plus the max itself):
# each multiple of 8 to 128, then each multiple of 32 (the head sizes of real models: 64, 80,
# 96, 112, 128, 160, 192, 256, ...), plus 1 and an odd size that is no multiple of any pack
# factor or vector width.
HEAD_DIM_STEPS = ((8, 128), (32, 4096))
ODD_HEAD_DIMS = (1, 13)


@dataclass(frozen=True)
class TierSizes:
    """The sizes one tier reaches."""

    kv_len: int  # long-context keys
    query_len: int  # long prefill
    offset: int  # start_pos / kv_start
    ring_window: int  # tiled ring size (kv_len / ring_window wraps)
    kv_cap: int | None  # most tiered keys (cold + hot) a case may use; None: MAX_KV_LEN
    model_prefill: bool  # add a model-shaped prefill (32/8 heads, full lengths; GPU only)
    random_cases: int  # seeded random mixtures of the sizes, layouts and features
    model_kv_len: int  # keys of the model-shaped decodes (64/8 tiled, 32/8 tiered heads)


SIZES = {
    "default": TierSizes(
        kv_len=2083,
        query_len=333,
        offset=4099,
        ring_window=128,
        kv_cap=16384,
        model_prefill=False,
        random_cases=4,
        model_kv_len=1031,
    ),
    "large": TierSizes(
        kv_len=8219,
        query_len=1061,
        offset=65543,
        ring_window=128,
        kv_cap=None,
        model_prefill=True,
        random_cases=8,
        model_kv_len=8219,
    ),
}


def tier_name(*, quick: bool, large: bool) -> str:
    """The tier the --quick / --large flags select (the CLI refuses both at once)."""
    if quick and large:
        raise ValueError("--quick and --large are exclusive")
    return "quick" if quick else "large" if large else "default"


def head_dims(max_head_dim: int) -> list[int]:
    """Every head_dim the tiers sweep for a kernel whose maximum is ``max_head_dim``."""
    dims = set(ODD_HEAD_DIMS)
    low = 0
    for step, top in HEAD_DIM_STEPS:
        dims.update(range(low + step - low % step, top + 1, step))
        low = top
    dims.add(max_head_dim)
    return sorted(d for d in dims if 1 <= d <= max_head_dim)


def tiled_sizes(entry: Mapping[str, Any], tier: str, seed: int) -> list[CaseSpec]:
    """The size cases of ``tier`` for a tiled variant (its manifest entry)."""
    if tier == "quick":
        return []
    meta = entry["metadata"]
    hd = int(meta["max_head_dim"])
    rng = np.random.default_rng([seed, 10])
    sizes = _within_max_kv_len(SIZES[tier], meta.get("max_kv_len"))
    specs = tiled_size_specs(hd, sizes) + _long_splits(entry)
    specs += [_random_tiled(rng, i, hd, sizes) for i in range(sizes.random_cases)]
    return _seeded(specs, seed)


def tiered_sizes(entry: Mapping[str, Any], tier: str, seed: int) -> list[CaseSpec]:
    """The size cases of ``tier`` for a tiered variant (its manifest entry)."""
    if tier == "quick":
        return []
    sizes = SIZES[tier]
    meta = entry["metadata"]
    hd = int(meta["max_head_dim"])
    rng = np.random.default_rng([seed, 10])
    cold = str(entry["params"].get("cold", "f16"))
    kv = int(meta["max_kv_len"])
    specs = tiered_size_specs(hd, kv, cold, sizes)
    specs += [_random_tiered(rng, i, hd, kv, cold, sizes) for i in range(sizes.random_cases)]
    return _seeded(specs, seed)


def _seeded(specs: list[CaseSpec], seed: int) -> list[CaseSpec]:
    return [replace(s, seed=seed * 1000 + 700 + i) for i, s in enumerate(specs)]


# -- tiled ----------------------------------------------------------------------------------------


def _within_max_kv_len(sizes: TierSizes, max_kv_len: int | None) -> TierSizes:
    """A tiled variant that declares a MAX_KV_LEN gets its lengths clamped to it."""
    if not max_kv_len:
        return sizes
    return replace(
        sizes,
        kv_len=min(sizes.kv_len, max_kv_len - 37),
        query_len=min(sizes.query_len, max_kv_len - 37),
        model_kv_len=min(sizes.model_kv_len, max_kv_len),
    )


def tiled_size_specs(max_head_dim: int, s: TierSizes) -> list[CaseSpec]:
    """Tiled-family size cases: heads, head_dim sweep, long KV, long prefill, offsets, layouts."""
    hd = max_head_dim
    small = min(hd, 32)
    specs = _tiled_heads(hd) + [
        CaseSpec(
            f"head_dim {d}",
            num_heads=2,
            num_kv_heads=1,
            head_dim=d,
            query_len=5,
            kv_len=23,
            start_pos=18,
        )
        for d in head_dims(hd)
    ]
    specs += [
        CaseSpec(
            f"long KV {s.kv_len}, decode, 1 head",
            num_heads=1,
            num_kv_heads=1,
            head_dim=hd,
            query_len=1,
            kv_len=s.kv_len,
            start_pos=s.kv_len - 1,
        ),
        CaseSpec(
            f"long KV {s.kv_len}, window, from buffer",
            num_heads=4,
            num_kv_heads=2,
            head_dim=small,
            query_len=9,
            kv_len=s.kv_len,
            start_pos=s.kv_len - 9,
            sliding_window=s.kv_len - 301,
            kv_len_source=1,
        ),
        CaseSpec(
            f"long prefill {s.query_len} queries",
            num_heads=2,
            num_kv_heads=1,
            head_dim=small,
            query_len=s.query_len,
            kv_len=s.query_len + 37,
            start_pos=37,
        ),
        CaseSpec(
            f"kv_start and start_pos past {s.offset}",
            num_heads=2,
            num_kv_heads=1,
            head_dim=small,
            query_len=11,
            kv_len=150,
            kv_start=s.offset,
            start_pos=s.offset + 139,
        ),
        CaseSpec(
            f"ring wrapped {s.kv_len // s.ring_window}x, kv_start {s.offset}",
            num_heads=2,
            num_kv_heads=1,
            head_dim=small,
            query_len=6,
            kv_len=s.kv_len,
            kv_start=s.offset,
            start_pos=s.offset + s.kv_len - 6,
            sliding_window=s.ring_window,
            kv_layout="ring",
        ),
        CaseSpec(
            f"paged, {-(-(s.kv_len + 37) // 16)} shuffled pages",
            num_heads=4,
            num_kv_heads=2,
            head_dim=small,
            query_len=5,
            kv_len=s.kv_len,
            kv_start=37,
            start_pos=37 + s.kv_len - 5,
            kv_layout="paged",
            page_size=16,
        ),
        CaseSpec(
            f"paged, kv_start {s.offset}",
            num_heads=2,
            num_kv_heads=2,
            head_dim=small,
            query_len=4,
            kv_len=300,
            kv_start=s.offset,
            start_pos=s.offset + 296,
            kv_layout="paged",
            page_size=64,
        ),
    ]
    return specs + _tiled_model(hd, s)


def _long_splits(entry: Mapping[str, Any]) -> list[CaseSpec]:
    """A split-KV kernel (one whose passes read a KV_SPLITS override) decoding a cache long
    enough that every split holds more than two of its key tiles (TILE_KEYS, at least 256).

    The tiers' other lengths put ~64 keys in each of 33 splits, so a split's key loop would
    run once and its online-softmax rescaling across tiles or iterations would never be
    checked below the bench shapes.
    """
    if not any(o["name"] == "KV_SPLITS" for p in entry.get("passes", []) for o in p["overrides"]):
        return []
    values = constant_values(entry, entry.get("pipeline_constants"))
    splits, tile = int(values["KV_SPLITS"]), int(values.get("TILE_KEYS", 0))
    per_split = 2 * max(tile, 256) + 37
    kv_len = splits * per_split
    return [
        CaseSpec(
            f"long splits: {kv_len} keys, {per_split} in each of {splits} splits",
            num_heads=4,
            num_kv_heads=1,
            head_dim=int(entry["metadata"]["max_head_dim"]),
            query_len=1,
            kv_len=kv_len,
            start_pos=kv_len - 1,
        )
    ]


# (label, heads, KV heads, largest head_dim, query_len, kv_len): the last query sits on the last
# key. GQA groups that are not powers of two (40/8 and 28/4 are real models') and more than 64
# heads catch a head mapping that shifts instead of dividing, or wraps.
TILED_HEADS = (
    ("heads 64/8 (GQA 8)", 64, 8, 32, 3, 45),
    ("heads 32/8 (GQA 4)", 32, 8, 64, 20, 90),
    ("heads 64/64 (MHA)", 64, 64, 16, 2, 33),
    ("heads 64/1 (MQA)", 64, 1, 24, 5, 60),
    ("heads 1", 1, 1, 32, 7, 50),
    ("heads 40/8 (GQA 5)", 40, 8, 64, 4, 70),
    ("heads 28/4 (GQA 7)", 28, 4, 32, 3, 51),
    ("heads 96/8 (GQA 12)", 96, 8, 16, 2, 40),
)


def _tiled_heads(hd: int) -> list[CaseSpec]:
    """1 to 96 query heads: 64/8 and 32/8 GQA, groups of 5, 7 and 12, 64 MHA, 64 MQA (short
    lengths: heads are the dimension under test)."""
    return [
        CaseSpec(
            label,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=min(hd, largest),
            query_len=query_len,
            kv_len=kv_len,
            start_pos=kv_len - query_len,
        )
        for label, heads, kv_heads, largest, query_len, kv_len in TILED_HEADS
    ]


def _tiled_model(hd: int, s: TierSizes) -> list[CaseSpec]:
    """Model-shaped problems (64/8 and 32/8 heads, head_dim up to 128) at the tier's lengths.

    The prefill (32 heads x query_len x kv_len) costs seconds on lavapipe: large tier only.
    """
    d = min(hd, 128)
    decode = CaseSpec(
        f"model decode {s.model_kv_len}, 64/8 heads",
        num_heads=64,
        num_kv_heads=8,
        head_dim=d,
        query_len=1,
        kv_len=s.model_kv_len,
        start_pos=s.model_kv_len - 1,
    )
    if not s.model_prefill:
        return [decode]
    return [
        decode,
        CaseSpec(
            f"model prefill {s.query_len}x{s.kv_len}, 32/8 heads",
            num_heads=32,
            num_kv_heads=8,
            head_dim=d,
            query_len=s.query_len,
            kv_len=s.kv_len,
            start_pos=s.kv_len - s.query_len,
        ),
    ]


# -- tiered ---------------------------------------------------------------------------------------


def tiered_size_specs(
    max_head_dim: int, max_kv_len: int, cold: str, s: TierSizes
) -> list[CaseSpec]:
    """Tiered-family size cases: heads, head_dim sweep, cold tier at MAX_KV_LEN, offsets."""
    hd = max_head_dim
    small = min(hd, 64)
    longest = max_kv_len if s.kv_cap is None else min(max_kv_len, s.kv_cap)
    window = 64
    hot = min(40, longest // 2)
    cold_len = longest - hot
    specs = [
        _tiered_heads(heads, kv_heads, min(hd, d), label)
        for heads, kv_heads, d, label in (
            (64, 8, 64, "heads 64/8 (GQA 8)"),
            (32, 8, 128, "heads 32/8 (GQA 4)"),
            (64, 64, 16, "heads 64/64 (MHA)"),
            (64, 1, 32, "heads 64/1 (MQA)"),
            (1, 1, 32, "heads 1"),
            (40, 8, 64, "heads 40/8 (GQA 5)"),
            (28, 4, 32, "heads 28/4 (GQA 7)"),
            (96, 8, 16, "heads 96/8 (GQA 12)"),
        )
    ]
    specs += [
        CaseSpec(
            f"head_dim {d}",
            num_heads=2,
            num_kv_heads=1,
            head_dim=d,
            cold_len=17,
            hot_len=5,
            hot_window=8,
            hot_start=27,
            start_pos=31,
        )
        for d in head_dims(hd)
    ]
    wrapped = cold_len + 3 * window + 5
    specs.append(
        CaseSpec(
            f"cold {cold_len} + hot {hot} (MAX_KV_LEN {max_kv_len}), ring wrapped 3x, "
            "magnitudes over 4 decades",
            num_heads=4,
            num_kv_heads=2,
            head_dim=small,
            cold_len=cold_len,
            hot_len=hot,
            hot_window=window,
            hot_start=wrapped,
            start_pos=wrapped + hot - 1,
            magnitude_span=4.0,
        )
    )
    hot_start = s.offset + 3
    query = hot_start + 19
    specs.append(
        CaseSpec(
            f"start_pos and hot_start past {s.offset}, window",
            num_heads=2,
            num_kv_heads=1,
            head_dim=small,
            cold_len=300,
            hot_len=20,
            hot_window=32,
            hot_start=hot_start,
            start_pos=query,
            sliding_window=query - 150 + 1,
        )
    )
    if cold == "f16":
        paged = min(longest - 10, 1500)
        page = max(1, min(16, paged // 64))  # at least 64 pages
        specs.append(
            CaseSpec(
                f"cold paged, {-(-paged // page)} shuffled pages",
                num_heads=4,
                num_kv_heads=2,
                head_dim=small,
                cold_len=paged,
                hot_len=10,
                hot_window=16,
                hot_start=paged + 4 * 16 + 1,
                start_pos=paged + 4 * 16 + 10,
                cold_layout=2,
                cold_page_size=page,
            )
        )
    model_cold = min(cold_len, s.model_kv_len - hot)  # 32 heads: the tier's model length
    model_start = model_cold + 3 * window + 5
    specs.append(
        CaseSpec(
            f"model decode cold {model_cold} + hot {hot}, 32/8 heads",
            num_heads=32,
            num_kv_heads=8,
            head_dim=min(hd, 128),
            cold_len=model_cold,
            hot_len=hot,
            hot_window=window,
            hot_start=model_start,
            start_pos=model_start + hot - 1,
            magnitude_span=4.0,
        )
    )
    return specs


def _tiered_heads(heads: int, kv_heads: int, head_dim: int, label: str) -> CaseSpec:
    """A short decode with ``heads``/``kv_heads`` heads and a hot ring wrapped twice."""
    return CaseSpec(
        label,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        cold_len=40,
        hot_len=9,
        hot_window=16,
        hot_start=40 + 2 * 16 + 3,
        start_pos=40 + 2 * 16 + 11,
    )


# -- seeded random mixtures -----------------------------------------------------------------------

HEAD_PAIRS = ((64, 8), (32, 8), (16, 16), (8, 1), (4, 2), (1, 1))
TILED_WORK = 1 << 22  # most (query head, query, key) triples one random tiled case computes
TIERED_WORK = 1 << 16  # most (query head, key) pairs one random tiered case computes
TENSOR_BYTES = 1 << 25  # largest tensor a random case builds (32 MiB; WebGPU binds 128 MiB)


def largest_tensor(spec: CaseSpec) -> int:
    """Bytes of the largest tensor ``spec`` needs, as f32 (the harness refuses beyond its limit).

    Contiguous and paged K/V hold every position up to ``kv_start + kv_len``, so a large offset
    costs memory: the random mixtures trade it against heads and head_dim.
    """
    rows = max(spec.kv_start + spec.kv_len, spec.cold_len, spec.hot_len, spec.hot_window)
    return 4 * spec.head_dim * max(spec.query_len * spec.num_heads, rows * spec.num_kv_heads)


def _fit(spec: CaseSpec, dims: list[int]) -> CaseSpec:
    """Shrink a random case into ``TENSOR_BYTES``: drop its offset, then lower its head_dim."""
    if largest_tensor(spec) > TENSOR_BYTES and spec.kv_start:
        spec = replace(spec, kv_start=0, start_pos=spec.start_pos - spec.kv_start)
    smaller = [d for d in dims if d < spec.head_dim]
    while largest_tensor(spec) > TENSOR_BYTES and smaller:
        spec = replace(spec, head_dim=smaller.pop())
    return spec


def _random_tiled(rng: np.random.Generator, index: int, hd: int, s: TierSizes) -> CaseSpec:
    """Sizes, offsets, layouts, windows and softcap mixed; the work is capped (``TILED_WORK``)."""
    heads, kv_heads = HEAD_PAIRS[int(rng.integers(len(HEAD_PAIRS)))]
    kv_len = int(rng.integers(s.kv_len // 4, s.kv_len + 1))
    query_len = int(rng.integers(1, max(2, min(s.query_len, TILED_WORK // (heads * kv_len)) + 1)))
    query_len = min(query_len, kv_len)
    layout = str(rng.choice(["contiguous", "ring", "paged"]))
    kv_start = int(rng.choice([0, s.offset + int(rng.integers(0, 1000))]))
    window = int(rng.choice([0, 0, 64, 700])) if layout != "ring" else int(rng.choice([64, 200]))
    dims = [d for d in head_dims(hd) if d >= 8]
    spec = CaseSpec(
        name=f"random size #{index} ({layout}, {heads}/{kv_heads} heads)",
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(rng.choice(dims)),
        query_len=query_len,
        kv_len=kv_len,
        kv_start=kv_start,
        start_pos=kv_start + kv_len - query_len,
        is_causal=int(rng.random() < 0.85),
        sliding_window=window,
        softcap=float(rng.choice([0.0, 0.0, 30.0])),
        logit_gain=float(rng.choice([1.0, 1.0, 4.0])),
        kv_layout=layout,
        page_size=int(rng.choice([16, 64])) if layout == "paged" else 0,
        kv_len_source=int(rng.random() < 0.25),
    )
    return _fit(spec, dims)


def _random_tiered(
    rng: np.random.Generator, index: int, hd: int, max_kv_len: int, cold: str, s: TierSizes
) -> CaseSpec:
    """Long cold tiers, wrapped hot rings, offsets and windows mixed; work capped (TIERED_WORK)."""
    heads, kv_heads = HEAD_PAIRS[int(rng.integers(len(HEAD_PAIRS)))]
    longest = max_kv_len if s.kv_cap is None else min(max_kv_len, s.kv_cap)
    longest = min(longest, max(TIERED_WORK // heads, 2))
    window = int(rng.choice([16, 64, 256]))
    hot_len = int(rng.integers(0, min(window, longest // 2) + 1))
    cold_len = int(rng.integers(max(0, longest // 4 - hot_len), longest - hot_len + 1))
    if cold_len + hot_len == 0:
        hot_len = 1
    hot_start = cold_len + int(rng.integers(0, 6)) * window + int(rng.integers(0, window))
    hot_start += int(rng.choice([0, s.offset]))
    start_pos = hot_start + max(hot_len - 1, 0) + int(rng.integers(0, 3))
    paged = cold == "f16" and cold_len > 0 and rng.random() < 0.5
    dims = [d for d in head_dims(hd) if d >= 8]
    spec = CaseSpec(
        name=f"random size #{index} ({heads}/{kv_heads} heads, cold {cold_len})",
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(rng.choice(dims)),
        cold_len=cold_len,
        hot_len=hot_len,
        hot_window=window,
        hot_start=hot_start,
        start_pos=start_pos,
        is_causal=int(rng.random() < 0.85),
        sliding_window=int(rng.choice([0, 0, start_pos // 2 + 1])),
        softcap=float(rng.choice([0.0, 0.0, 30.0])),
        logit_gain=float(rng.choice([1.0, 1.0, 4.0])),
        cold_layout=2 if paged else 0,
        cold_page_size=int(rng.choice([16, 32])) if paged else 0,
        magnitude_span=float(rng.choice([0.0, 4.0])),
        extra_stride=int(rng.choice([0, 1])),
    )
    return _fit(spec, dims)
