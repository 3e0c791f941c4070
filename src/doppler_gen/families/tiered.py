"""The tiered family: decode attention over an f16 hot ring and a cold tier.

It owns the host interface of ``templates/attention_decode_tiered.wgsl.j2`` (Q, K_hot, V_hot,
K_cold, V_cold, and per cold format a page table or packed scales), its case matrix (GQA, hot
ring wrap-around, hot only / cold only, windows, softcap, large logits, the masked-row contract,
paged and quantized cold tiers, packed strides, the MAX_KV_LEN boundary), its inputs (the cold
tier stored as f16, int8 or int4) and its float64 reference (``attention.tiered_attention``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from doppler_gen.families import memo
from doppler_gen.families.attention import (
    AttentionFamily,
    CaseSpec,
    fit_head_dims,
    normal,
    paged_buffer,
    row_gains,
    tiered_attention,
)
from doppler_gen.families.base import AUXILIARY, INPUT, OUTPUT, CaseData, element_types, rounded
from doppler_gen.families.quant import (
    QuantizedKV,
    dequantize_kv,
    pack_signed,
    packed_stride_for,
    quantize_kv,
    unpack_signed,
)
from doppler_gen.families.tiers import tiered_sizes
from doppler_gen.formats import QUANT_BITS
from doppler_gen.sampling import RowSample, choose_sample

# the case with more hot keys than ring rows (tiered_specs), which tests look up by name
SHARED_ROWS_CASE = "hot_len over hot_window, keys share ring rows"


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
    # Every key masked with the cold tier populated: "mean_v" averages V over the cold keys too,
    # so a kernel that skips the cold keys before the window (no visible key there) fails here;
    # the cold tier spans several split-KV splits
    fixed += [
        CaseSpec(
            "fully masked row, cold and hot keys",
            cold_len=300,
            hot_len=5,
            hot_start=340,
            hot_window=8,
            start_pos=320,
            sliding_window=4,
            head_dim=16,
        ),
        CaseSpec(
            "fully masked row, cold only",
            cold_len=23,
            hot_len=0,
            hot_window=8,
            start_pos=60,
            sliding_window=8,
            head_dim=24,
        ),
        # the query before the cold tier's end: the causal mask hides cold keys too (every other
        # causal case has its query past the cold tier)
        CaseSpec(
            "causal masks future cold keys",
            cold_len=20,
            hot_len=4,
            hot_start=20,
            hot_window=4,
            start_pos=12,
            head_dim=16,
        ),
        # more hot keys than ring rows: keys i and i + hot_window share a row, which the kernel
        # reads once for each (as the seed's modulo does). hot_start % 4 = 1 puts the ring
        # offsets 1 .. 11 on the unwrapped rows, the one-subtraction rows and (8 and up) the
        # division that get_hot_pos falls back to; every other case stays below 2 * hot_window
        CaseSpec(
            SHARED_ROWS_CASE,
            cold_len=5,
            hot_len=11,
            hot_start=9,
            hot_window=4,
            start_pos=20,
            head_dim=16,
        ),
    ]
    # Thousands of keys: every kernel walks its tiers in many steps (up to 256 keys a step at
    # 1024 invocations), so a step that reads another step's rows fails here; the quick tier
    # keeps it (its other cases fit in one or two steps)
    many_steps = CaseSpec(
        "many key steps, GQA 4",
        num_heads=8,
        num_kv_heads=2,
        cold_len=min(3000, max_kv_len - 48),
        hot_len=48,
        hot_start=min(3000, max_kv_len - 48) + 64,
        hot_window=64,
        start_pos=min(3000, max_kv_len - 48) + 64 + 47,
        head_dim=min(hd, 64),
    )
    rng = np.random.default_rng(seed + 1)
    count = 3 if quick else 24
    randoms = [_random_tiered(rng, i, hd, max_kv_len, paged) for i in range(count)]
    specs = (fixed[::3] if quick else fixed) + [many_steps] + randoms
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


def build_tiered(spec: CaseSpec, dtypes: dict[str, str], cold: str) -> CaseData:
    """Inputs for the tiered family; the cold tier is stored as ``cold`` (f16, int8, int4)."""
    rng = np.random.default_rng(spec.seed)
    hd, heads, kv_heads = spec.head_dim, spec.num_heads, spec.num_kv_heads
    quantized = cold in QUANT_BITS
    ring = spec.hot_window > 0 and (quantized or spec.hot_layout == 1)
    hot_rows = spec.hot_window if ring else spec.hot_len
    q = rounded(normal(rng, (heads, hd), spec.logit_gain), dtypes["Q"])
    k_hot = rounded(normal(rng, (max(hot_rows, 1), kv_heads, hd)), "f16")
    v_hot = rounded(normal(rng, (max(hot_rows, 1), kv_heads, hd)), "f16")
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
        k_raw = normal(rng, shape) * row_gains(rng, spec.magnitude_span, shape)
        v_raw = normal(rng, shape) * row_gains(rng, spec.magnitude_span, shape)
        kq = _with_most_negative(quantize_kv(k_raw, bits, packed_stride=stride), rng)
        vq = _with_most_negative(quantize_kv(v_raw, bits, packed_stride=stride), rng)
        uniforms["packed_stride"] = stride
        buffers.update(K_cold=kq.packed, V_cold=vq.packed, scales_k=kq.scales, scales_v=vq.scales)
        reference.update(k_cold=dequantize_kv(kq), v_cold=dequantize_kv(vq))
    else:
        table = np.zeros(1, np.uint32)
        if spec.cold_layout == 2:
            table, cold_rows = paged_buffer(rng, spec.cold_len, spec.cold_page_size)
        shape = (cold_rows, kv_heads, hd)
        k_cold = rounded(normal(rng, shape) * row_gains(rng, spec.magnitude_span, shape), "f16")
        v_cold = rounded(normal(rng, shape) * row_gains(rng, spec.magnitude_span, shape), "f16")
        uniforms.update(
            cold_page_size=spec.cold_page_size,
            cold_layout=spec.cold_layout,
            hot_layout=spec.hot_layout,
        )
        buffers.update(K_cold=k_cold, V_cold=v_cold, cold_page_table=table)
        reference.update(k_cold=k_cold, v_cold=v_cold, cold_page_table=table)
    return CaseData(spec, uniforms, buffers, reference)


def _with_most_negative(q: QuantizedKV, rng: np.random.Generator) -> QuantizedKV:
    """``q`` with about one value in 16 set to the most negative code, -2**(bits-1).

    The symmetric quantizer never writes that code, but the kernels decode every two's
    complement value (``unpack_quant`` in templates/lib/cold_tier.wgsl.j2); without it a sign
    extension wrong only there (``if (q > 128) { q -= 256; }``) would pass every case. The
    reference dequantizes these same words.
    """
    rows = q.packed.reshape(-1, q.packed_stride)
    ints = unpack_signed(rows, q.bits, q.head_dim)
    ints[rng.random(ints.shape) < 1 / 16] = -(2 ** (q.bits - 1))
    return replace(q, packed=pack_signed(ints, q.bits, q.packed_stride).reshape(-1))


class TieredFamily(AttentionFamily):
    """Tiered decode attention: one workgroup per query head, hot ring + cold tier."""

    name = "tiered"
    roles: ClassVar[Mapping[str, Any]] = {
        "Q": INPUT,
        "K_hot": INPUT,
        "V_hot": INPUT,
        "K_cold": INPUT,
        "V_cold": INPUT,
        "scales_k": INPUT,
        "scales_v": INPUT,
        "cold_page_table": AUXILIARY,
        "output": OUTPUT,
    }
    dtype_bindings: ClassVar[Mapping[str, Any]] = {
        "q_dtype": "Q",
        "kv_dtype": "K_hot",
        "out_dtype": "output",
    }
    shape_zero_keys = ("cold", "hot")  # an all-hot or all-cold cache
    shape_keys: ClassVar[Mapping[str, Any]] = {
        "tiered": {"cold": 1536, "hot": 512, "h": 32, "kvh": 8, "d": 64}
    }
    shape_help: ClassVar[Mapping[str, str]] = {
        "tiered": "one query after cold contiguous keys and a hot ring of hot keys",
    }
    default_shapes = ("tiered:cold=1536,hot=512,h=32,kvh=8,d=64",)

    def specs(self, entry: Mapping[str, Any], tier: str, seed: int) -> list[CaseSpec]:
        """The feature matrix (its subset for ``quick``), then the tier's size cases."""
        meta = entry["metadata"]
        features = tiered_specs(
            int(meta["max_head_dim"]),
            int(meta["max_kv_len"]),
            cold=str(entry["params"]["cold"]),
            quick=tier == "quick",
            seed=seed,
        )
        return fit_head_dims(features + tiered_sizes(entry, tier, seed), entry)

    def wide_subgroup_width(self, entry: Mapping[str, Any]) -> int:
        """16 for a subgroup kernel with the f16 cold tier whose widest key group passes 8
        lanes, else ``min_subgroup_size`` or 0.

        A key group is head_dim / dims_per_lane lanes (a power of two), so one whose widest
        group (at max_head_dim) passes 8 lanes has 16-lane groups at some head_dim of its
        cases, whose shuffles 8-lane lavapipe replaces by workgroup memory. The quantized cold
        tiers share that key-group code and took 3.5 times as long on 16-lane lavapipe (230 s
        of the 300 that all seven such variants took), so the f16 ones stand for them.
        """
        params = entry["params"]
        if entry.get("min_subgroup_size") or "subgroups" not in entry["requires"]:
            return super().wide_subgroup_width(entry)
        widest = math.ceil(int(params["max_head_dim"]) / int(params["dims_per_lane"]))
        return 16 if widest > 8 and params.get("cold") == "f16" else 0

    def head_dim_limit(self, entry: Mapping[str, Any], constants: Mapping[str, Any]) -> int | str:
        """The largest head_dim the kernel runs at its WORKGROUP_SIZE.

        A kernel declaring DIMS_PER_LANE splits head_dim over a power-of-two lane group of at
        most WORKGROUP_SIZE lanes, DIMS_PER_LANE elements each; the seed's kernel needs one
        invocation per element (head_dim <= WORKGROUP_SIZE).
        """
        limit = int(entry["metadata"]["max_head_dim"])
        size = constants.get("WORKGROUP_SIZE")
        if size is None:
            return limit
        size = int(size)
        if "DIMS_PER_LANE" not in constants:
            return min(limit, size)
        largest = constants.get("MAX_WORKGROUP_SIZE")
        if largest is not None and size > largest:
            return f"WORKGROUP_SIZE {size} exceeds the kernel's MAX_WORKGROUP_SIZE {largest}"
        return min(limit, (1 << (size.bit_length() - 1)) * int(constants["DIMS_PER_LANE"]))

    def kv_total(self, spec: CaseSpec) -> tuple[int, str]:
        return spec.cold_len + spec.hot_len, f" (cold {spec.cold_len} + hot {spec.hot_len})"

    def build(self, spec: CaseSpec, entry: Mapping[str, Any]) -> CaseData:
        types, cold = element_types(entry), str(entry["params"]["cold"])
        key = (self.name, spec, tuple(sorted(types.items())), cold)
        return memo.case(key, lambda: build_tiered(spec, types, cold))

    def output_shape(self, data: CaseData) -> tuple[int, ...]:
        u = data.uniforms
        return (int(u["num_heads"]), int(u["head_dim"]))

    def reference(
        self,
        data: CaseData,
        entry: Mapping[str, Any],
        compute_dtype: Any = np.float64,
        stats: dict[str, float] | None = None,
        sample: RowSample | None = None,
    ) -> np.ndarray:
        r = data.reference_inputs
        masked_row = entry["metadata"]["masked_row"]

        def compute(stats: dict[str, float] | None) -> np.ndarray:
            return tiered_attention(
                data.uniforms,
                r["q"],
                r["k_hot"],
                r["v_hot"],
                r["k_cold"],
                r["v_cold"],
                cold_page_table=r.get("cold_page_table"),
                masked_row=masked_row,
                quantized=r["quantized"],
                compute_dtype=compute_dtype,
                stats=stats,
                head_rows=None if sample is None else sample.heads,
            )

        return memo.reference(data, (masked_row,), compute_dtype, sample, stats, compute)

    def row_sample(self, data: CaseData) -> RowSample | None:
        """Sampled heads of a large output (one query per head; see ``sampling``)."""
        spec = data.spec
        keys = spec.cold_len + spec.hot_len
        return choose_sample(1, spec.num_heads, spec.seed, keys=keys)


FAMILY = TieredFamily()
