"""Validation cases: deterministic problem shapes and the input tensors they need.

A case is a *spec* (plain numbers: heads, lengths, masks, layouts) plus tensors drawn from a
seeded generator. The specs cover every feature of the kernels' contracts (DESIGN-NOTES §1): GQA
ratios, causal prefill / chunked prefill / decode, sliding windows and their edges, softcap, KV
length from a buffer, kv_start, ring and paged KV (shuffled page tables), hot-ring wrap-around,
paged and quantized cold tiers, head_dim from 8 to the kernel's maximum, ragged lengths, length
1, large logits and the MAX_KV_LEN boundary. The same seed gives the same cases on every machine.

Tensors are built for the *bindings the manifest lists*, by name, in the binding's element type,
so a case can only be fed to a kernel whose interface it matches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from doppler_gen.formats import QUANT_BITS
from doppler_gen.quant import dequantize_kv, packed_stride_for, quantize_kv

NUMPY_DTYPES = {"f32": np.float32, "f16": np.float16, "u32": np.uint32, "i32": np.int32}


@dataclass(frozen=True)
class CaseSpec:
    """One problem. Fields not used by a family keep their defaults."""

    name: str
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 32
    is_causal: int = 1
    start_pos: int = 0
    sliding_window: int = 0
    softcap: float = 0.0
    logit_gain: float = 1.0  # multiplies Q: large values make large logits
    # tiled family
    query_len: int = 1
    kv_len: int = 1
    kv_start: int = 0
    kv_layout: str = "contiguous"  # contiguous | ring | paged
    page_size: int = 0
    kv_len_source: int = 0
    # tiered family
    cold_len: int = 0
    hot_len: int = 1
    hot_start: int = 0
    hot_window: int = 0
    hot_layout: int = 1
    cold_layout: int = 0  # 0 contiguous, 2 paged (f16 cold only)
    cold_page_size: int = 0
    extra_stride: int = 0  # quantized cold: packed_stride beyond the minimum
    magnitude_span: float = 0.0  # cold K/V row magnitudes span this many decades (int scales too)
    seed: int = 0


@dataclass
class CaseData:
    """Everything one dispatch needs, plus the reference's view of the same data."""

    spec: CaseSpec
    uniforms: dict[str, float]  # by Uniforms field name
    buffers: dict[str, np.ndarray]  # by binding name, in the binding's element dtype
    reference_inputs: dict[str, Any] = field(default_factory=dict)


# -- the case matrix ----------------------------------------------------------------------------


def tiled_specs(max_head_dim: int, *, quick: bool, seed: int) -> list[CaseSpec]:
    """Tiled-family cases: fixed feature cases, then seeded random mixtures."""
    hd = max_head_dim
    fixed = [
        CaseSpec("decode, MHA", query_len=1, kv_len=37, start_pos=36, head_dim=32),
        CaseSpec(
            "prefill causal, GQA 2",
            num_heads=4,
            num_kv_heads=2,
            query_len=70,
            kv_len=70,
            head_dim=16,
        ),
        CaseSpec(
            "prefill causal, GQA 4",
            num_heads=8,
            num_kv_heads=2,
            query_len=33,
            kv_len=33,
            head_dim=hd,
        ),
        CaseSpec(
            "prefill causal, GQA 8",
            num_heads=8,
            num_kv_heads=1,
            query_len=20,
            kv_len=20,
            head_dim=8,
        ),
        CaseSpec("chunked prefill (start_pos)", query_len=24, kv_len=88, start_pos=64, head_dim=24),
        CaseSpec("non-causal", is_causal=0, query_len=19, kv_len=53, head_dim=40),
        CaseSpec("length 1", query_len=1, kv_len=1, head_dim=8),
        CaseSpec("sliding window", query_len=40, kv_len=40, sliding_window=7, head_dim=16),
        CaseSpec(
            "window edge (query == w-1, w, w+1)",
            query_len=3,
            kv_len=11,
            start_pos=8,
            sliding_window=9,
            head_dim=8,
        ),
        CaseSpec("softcap", query_len=17, kv_len=17, softcap=2.0, logit_gain=6.0, head_dim=32),
        CaseSpec(
            "kv length from buffer",
            query_len=5,
            kv_len=29,
            start_pos=24,
            kv_len_source=1,
            head_dim=16,
        ),
        CaseSpec("kv_start", query_len=9, kv_len=21, kv_start=12, start_pos=24, head_dim=16),
        CaseSpec(
            "ring KV (window)",
            query_len=4,
            kv_len=50,
            start_pos=46,
            sliding_window=16,
            kv_layout="ring",
            head_dim=16,
        ),
        CaseSpec(
            "paged KV, shuffled pages",
            query_len=6,
            kv_len=45,
            start_pos=39,
            kv_layout="paged",
            page_size=8,
            head_dim=32,
            num_heads=4,
            num_kv_heads=2,
        ),
        CaseSpec(
            "paged KV with kv_start",
            query_len=3,
            kv_len=30,
            kv_start=5,
            start_pos=32,
            kv_layout="paged",
            page_size=4,
            head_dim=16,
        ),
        CaseSpec(
            "large logits", query_len=12, kv_len=40, start_pos=28, logit_gain=30.0, head_dim=hd
        ),
        CaseSpec(
            "fully masked rows write zero",
            query_len=4,
            kv_len=6,
            kv_start=10,
            start_pos=0,
            head_dim=8,
        ),
        CaseSpec(
            "head_dim = max, ragged blocks",
            query_len=65,
            kv_len=131,
            start_pos=66,
            head_dim=hd,
            num_heads=2,
            num_kv_heads=1,
        ),
    ]
    rng = np.random.default_rng(seed)
    count = 4 if quick else 26
    randoms = [_random_tiled(rng, i, hd) for i in range(count)]
    specs = (fixed[::3] if quick else fixed) + randoms
    return [replace(s, seed=seed * 1000 + i) for i, s in enumerate(specs)]


def _random_tiled(rng: np.random.Generator, index: int, max_head_dim: int) -> CaseSpec:
    group = int(rng.choice([1, 2, 4, 8]))
    kv_heads = int(rng.choice([1, 2])) if group == 8 else int(rng.choice([1, 2, 3]))
    head_dim = int(
        rng.choice([d for d in (8, 12, 16, 24, 32, 48, 64, 96, 128) if d <= max_head_dim])
    )
    query_len = int(rng.choice([1, 1, 2, 7, 31, 64, 65, 100]))
    history = int(rng.integers(0, 90))
    kv_len = query_len + history
    layout = str(rng.choice(["contiguous", "contiguous", "ring", "paged"]))
    window = (
        int(rng.choice([0, 0, 5, 16, 33])) if layout != "ring" else int(rng.choice([8, 16, 40]))
    )
    return CaseSpec(
        name=f"random #{index} ({layout})",
        num_heads=kv_heads * group,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        query_len=query_len,
        kv_len=kv_len,
        start_pos=history,
        is_causal=int(rng.random() < 0.8),
        sliding_window=window,
        softcap=float(rng.choice([0.0, 0.0, 5.0, 30.0])),
        logit_gain=float(rng.choice([1.0, 1.0, 4.0, 12.0])),
        kv_layout=layout,
        page_size=int(rng.choice([1, 4, 16])) if layout == "paged" else 0,
        kv_len_source=int(rng.random() < 0.25),
    )


def tiered_specs(
    max_head_dim: int, max_kv_len: int, *, cold: str, quick: bool, seed: int
) -> list[CaseSpec]:
    """Tiered-family cases (one decode query per head)."""
    hd = max_head_dim
    paged = cold == "f16"
    fixed = [
        CaseSpec(
            "decode, cold + hot",
            cold_len=40,
            hot_len=9,
            hot_start=40,
            hot_window=16,
            start_pos=48,
            head_dim=32,
        ),
        CaseSpec(
            "GQA 2",
            num_heads=4,
            num_kv_heads=2,
            cold_len=20,
            hot_len=5,
            hot_start=20,
            hot_window=8,
            start_pos=24,
            head_dim=16,
        ),
        CaseSpec(
            "GQA 4",
            num_heads=8,
            num_kv_heads=2,
            cold_len=10,
            hot_len=6,
            hot_start=10,
            hot_window=6,
            start_pos=15,
            head_dim=64,
        ),
        CaseSpec(
            "GQA 8",
            num_heads=8,
            num_kv_heads=1,
            cold_len=7,
            hot_len=3,
            hot_start=7,
            hot_window=4,
            start_pos=9,
            head_dim=8,
        ),
        CaseSpec(
            "hot ring wrap-around",
            cold_len=12,
            hot_len=10,
            hot_start=29,
            hot_window=12,
            start_pos=38,
            head_dim=16,
        ),
        CaseSpec(
            "hot only (cold_len 0)",
            cold_len=0,
            hot_len=11,
            hot_start=0,
            hot_window=16,
            start_pos=10,
            head_dim=24,
        ),
        CaseSpec(
            "cold only (hot_len 0)", cold_len=23, hot_len=0, hot_window=8, start_pos=22, head_dim=24
        ),
        CaseSpec("length 1", cold_len=0, hot_len=1, hot_window=1, start_pos=0, head_dim=8),
        CaseSpec(
            "sliding window",
            cold_len=30,
            hot_len=8,
            hot_start=30,
            hot_window=8,
            start_pos=37,
            sliding_window=12,
            head_dim=16,
        ),
        CaseSpec(
            "window edge",
            cold_len=9,
            hot_len=2,
            hot_start=9,
            hot_window=2,
            start_pos=10,
            sliding_window=10,
            head_dim=8,
        ),
        CaseSpec(
            "softcap",
            cold_len=16,
            hot_len=4,
            hot_start=16,
            hot_window=4,
            start_pos=19,
            softcap=3.0,
            logit_gain=8.0,
            head_dim=32,
        ),
        CaseSpec(
            "large logits",
            cold_len=25,
            hot_len=6,
            hot_start=25,
            hot_window=8,
            start_pos=30,
            logit_gain=30.0,
            head_dim=64,
        ),
        CaseSpec(
            "non-causal",
            is_causal=0,
            cold_len=14,
            hot_len=5,
            hot_start=14,
            hot_window=8,
            start_pos=3,
            head_dim=16,
        ),
        CaseSpec(
            "causal masks future hot keys",
            cold_len=10,
            hot_len=6,
            hot_start=10,
            hot_window=8,
            start_pos=12,
            head_dim=16,
        ),
        CaseSpec(
            "fully masked row",
            cold_len=0,
            hot_len=5,
            hot_start=20,
            hot_window=8,
            start_pos=3,
            head_dim=16,
        ),
        CaseSpec(
            "head_dim = max",
            cold_len=9,
            hot_len=4,
            hot_start=9,
            hot_window=4,
            start_pos=12,
            head_dim=hd,
            num_heads=2,
            num_kv_heads=1,
        ),
        CaseSpec(
            "linear hot (no ring)",
            cold_len=6,
            hot_len=7,
            hot_start=6,
            hot_window=0,
            hot_layout=0,
            start_pos=12,
            head_dim=16,
        ),
        CaseSpec(
            "MAX_KV_LEN boundary",
            cold_len=max_kv_len - 64,
            hot_len=64,
            hot_start=max_kv_len - 64,
            hot_window=64,
            start_pos=max_kv_len - 1,
            head_dim=32,
            num_heads=2,
            num_kv_heads=1,
        ),
    ]
    if paged:
        fixed.append(
            CaseSpec(
                "cold paged, shuffled pages",
                cold_len=37,
                hot_len=5,
                hot_start=37,
                hot_window=8,
                start_pos=41,
                cold_layout=2,
                cold_page_size=8,
                head_dim=32,
            )
        )
        fixed.append(
            CaseSpec(
                "hot_layout 0 ignores hot_window",
                cold_len=5,
                hot_len=6,
                hot_start=5,
                hot_window=4,
                hot_layout=0,
                start_pos=10,
                head_dim=8,
            )
        )
    else:
        fixed.append(
            CaseSpec(
                "packed_stride larger than needed",
                cold_len=19,
                hot_len=3,
                hot_start=19,
                hot_window=4,
                start_pos=21,
                extra_stride=2,
                head_dim=20,
            )
        )
        fixed.append(
            CaseSpec(
                "head_dim not a multiple of the pack factor",
                cold_len=13,
                hot_len=2,
                hot_start=13,
                hot_window=2,
                start_pos=14,
                head_dim=13,
            )
        )
    rng = np.random.default_rng(seed + 1)
    count = 3 if quick else 24
    randoms = [_random_tiered(rng, i, hd, max_kv_len, paged) for i in range(count)]
    specs = (fixed[::3] if quick else fixed) + randoms
    return [replace(s, seed=seed * 1000 + 500 + i) for i, s in enumerate(specs)]


def _random_tiered(
    rng: np.random.Generator, index: int, max_head_dim: int, max_kv_len: int, paged: bool
) -> CaseSpec:
    group = int(rng.choice([1, 2, 4, 8]))
    kv_heads = int(rng.choice([1, 2]))
    head_dim = int(rng.choice([d for d in (8, 16, 20, 32, 64, 80, 128, 256) if d <= max_head_dim]))
    hot_window = int(rng.choice([4, 16, 64]))
    hot_len = int(rng.integers(0, hot_window + 1))
    cold_len = int(rng.integers(0, min(300, max_kv_len - hot_len) + 1))
    if cold_len + hot_len == 0:
        hot_len = 1
    wrap = int(rng.integers(0, 3)) * hot_window
    cold_layout = 2 if paged and rng.random() < 0.4 else 0
    return CaseSpec(
        name=f"random #{index}" + (" (cold paged)" if cold_layout else ""),
        num_heads=kv_heads * group,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        cold_len=cold_len,
        hot_len=hot_len,
        hot_start=cold_len + wrap,
        hot_window=hot_window,
        start_pos=cold_len + wrap + max(hot_len - 1, 0) + int(rng.integers(0, 3)),
        is_causal=int(rng.random() < 0.85),
        sliding_window=int(rng.choice([0, 0, 0, 8, 50])),
        softcap=float(rng.choice([0.0, 0.0, 5.0])),
        logit_gain=float(rng.choice([1.0, 1.0, 4.0, 12.0])),
        cold_layout=cold_layout,
        cold_page_size=int(rng.choice([1, 8, 32])) if cold_layout else 0,
        extra_stride=int(rng.choice([0, 0, 1])),
    )


# -- tensors ------------------------------------------------------------------------------------


def _round(values: np.ndarray, dtype: str) -> np.ndarray:
    return values.astype(NUMPY_DTYPES[dtype])


def _normal(rng: np.random.Generator, shape: tuple[int, ...], gain: float = 1.0) -> np.ndarray:
    return rng.standard_normal(shape) * gain


def _paged_buffer(rng: np.random.Generator, logical: int, page_size: int) -> tuple[np.ndarray, int]:
    """A shuffled page table covering ``logical`` rows, with one spare physical page."""
    pages = max(1, math.ceil(logical / page_size))
    physical = pages + 1
    table = rng.permutation(physical)[:pages].astype(np.uint32)
    if pages > 1 and np.array_equal(table, np.arange(pages)):
        table = np.roll(table, 1)  # never the identity: a page table that is ignored must fail
    return table, physical * page_size


def _row_gains(rng: np.random.Generator, span: float, shape: tuple[int, ...]) -> np.ndarray | float:
    """Per-(row, kv_head) factors log-uniform over ``span`` decades around 1 (1.0 when 0).

    Draws nothing when ``span`` is 0, so cases without it keep their exact tensors.
    """
    if span <= 0:
        return 1.0
    return 10.0 ** rng.uniform(-span / 2, span / 2, (*shape[:2], 1))


def build_tiled(spec: CaseSpec, dtypes: dict[str, str]) -> CaseData:
    """Inputs for the tiled family; ``dtypes`` maps binding name -> WGSL element type."""
    rng = np.random.default_rng(spec.seed)
    hd, heads, kv_heads = spec.head_dim, spec.num_heads, spec.num_kv_heads
    last_abs = spec.kv_start + spec.kv_len
    page_table = np.zeros(1, np.uint32)
    if spec.kv_layout == "ring":
        rows, layout = spec.sliding_window, 1
    elif spec.kv_layout == "paged":
        page_table, rows = _paged_buffer(rng, last_abs, spec.page_size)
        layout = 2
    else:
        rows, layout = last_abs, 0
    scale = 1.0 / math.sqrt(hd)
    q = _round(_normal(rng, (spec.query_len, heads, hd), spec.logit_gain), dtypes["Q"])
    k = _round(_normal(rng, (max(rows, 1), kv_heads, hd)), dtypes["K"])
    v = _round(_normal(rng, (max(rows, 1), kv_heads, hd)), dtypes["V"])
    kv_len_buffer = np.array([spec.kv_len], np.uint32)
    uniforms = {
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": hd,
        "seq_len": spec.kv_len if spec.kv_len_source == 0 else spec.kv_len + 1000,
        "query_len": spec.query_len,
        "scale": scale,
        "is_causal": spec.is_causal,
        "start_pos": spec.start_pos,
        "attn_softcap": spec.softcap,
        "sliding_window": spec.sliding_window,
        "kv_len_source": spec.kv_len_source,
        "kv_start": spec.kv_start,
        "page_size": spec.page_size,
        "kv_layout": layout,
        "_pad": 0,
    }
    buffers = {"Q": q, "K": k, "V": v, "kv_len_buffer": kv_len_buffer, "page_table": page_table}
    reference = {"q": q, "k": k, "v": v, "kv_len_buffer": kv_len_buffer, "page_table": page_table}
    return CaseData(spec, uniforms, buffers, reference)


def build_tiered(spec: CaseSpec, dtypes: dict[str, str], cold: str) -> CaseData:
    """Inputs for the tiered family; the cold tier is stored as ``cold`` (f16, int8, int4)."""
    rng = np.random.default_rng(spec.seed)
    hd, heads, kv_heads = spec.head_dim, spec.num_heads, spec.num_kv_heads
    quantized = cold in QUANT_BITS
    ring = spec.hot_window > 0 and (quantized or spec.hot_layout == 1)
    hot_rows = spec.hot_window if ring else spec.hot_len
    q = _round(_normal(rng, (heads, hd), spec.logit_gain), dtypes["Q"])
    k_hot = _round(_normal(rng, (max(hot_rows, 1), kv_heads, hd)), "f16")
    v_hot = _round(_normal(rng, (max(hot_rows, 1), kv_heads, hd)), "f16")
    uniforms: dict[str, float] = {
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": hd,
        "cold_len": spec.cold_len,
        "hot_len": spec.hot_len,
        "seq_len": spec.cold_len + spec.hot_len,
        "scale": 1.0 / math.sqrt(hd),
        "is_causal": spec.is_causal,
        "start_pos": spec.start_pos,
        "attn_softcap": spec.softcap,
        "sliding_window": spec.sliding_window,
        "hot_window": spec.hot_window,
        "hot_start": spec.hot_start,
        "_pad": 0,
    }
    buffers: dict[str, np.ndarray] = {"Q": q, "K_hot": k_hot, "V_hot": v_hot}
    reference: dict[str, Any] = {"q": q, "k_hot": k_hot, "v_hot": v_hot, "quantized": quantized}
    cold_rows = max(spec.cold_len, 1)
    if quantized:
        bits = QUANT_BITS[cold]
        stride = packed_stride_for(hd, bits) + spec.extra_stride
        shape = (cold_rows, kv_heads, hd)
        k_raw = _normal(rng, shape) * _row_gains(rng, spec.magnitude_span, shape)
        v_raw = _normal(rng, shape) * _row_gains(rng, spec.magnitude_span, shape)
        kq = quantize_kv(k_raw, bits, packed_stride=stride)
        vq = quantize_kv(v_raw, bits, packed_stride=stride)
        uniforms["packed_stride"] = stride
        buffers.update(K_cold=kq.packed, V_cold=vq.packed, scales_k=kq.scales, scales_v=vq.scales)
        reference.update(k_cold=dequantize_kv(kq), v_cold=dequantize_kv(vq))
    else:
        table = np.zeros(1, np.uint32)
        if spec.cold_layout == 2:
            table, cold_rows = _paged_buffer(rng, spec.cold_len, spec.cold_page_size)
        shape = (cold_rows, kv_heads, hd)
        k_cold = _round(_normal(rng, shape) * _row_gains(rng, spec.magnitude_span, shape), "f16")
        v_cold = _round(_normal(rng, shape) * _row_gains(rng, spec.magnitude_span, shape), "f16")
        uniforms.update(
            cold_page_size=spec.cold_page_size,
            cold_layout=spec.cold_layout,
            hot_layout=spec.hot_layout,
        )
        buffers.update(K_cold=k_cold, V_cold=v_cold, cold_page_table=table)
        reference.update(k_cold=k_cold, v_cold=v_cold, cold_page_table=table)
    return CaseData(spec, uniforms, buffers, reference)
