"""The tiled family: online-softmax attention over Q tiles, for prefill and decode.

It owns the host interface of ``templates/attention.wgsl.j2`` (bindings Q, K, V, output,
kv_len_buffer, page_table; Uniforms as in the seed kernels), its case matrix (every feature of
the contract: GQA ratios, causal prefill / chunked prefill / decode, sliding windows and their
edges, softcap, KV length from a buffer, kv_start, ring and paged KV with shuffled page tables,
head_dim from 8 to the kernel's maximum, ragged lengths, length 1, large logits), its inputs and
its float64 reference (``attention.tiled_attention``). The same seed gives the same cases on
every machine; tensors are built for the bindings the manifest lists, in their element types.
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
    tiled_attention,
)
from doppler_gen.families.base import AUXILIARY, INPUT, OUTPUT, CaseData, element_types, rounded
from doppler_gen.families.tiers import tiled_sizes
from doppler_gen.sampling import RowSample, choose_sample


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
    # split-KV decode kernels: enough keys for several KV splits holding real keys (not in the
    # quick subset, which stays free of long lengths)
    long_decode = CaseSpec(
        "long decode (several KV splits)",
        num_heads=8,
        num_kv_heads=2,
        query_len=1,
        kv_len=1500,
        start_pos=1499,
        head_dim=hd,
    )
    rng = np.random.default_rng(seed)
    count = 4 if quick else 26
    randoms = [_random_tiled(rng, i, hd) for i in range(count)]
    specs = (fixed[::3] if quick else [*fixed, long_decode]) + randoms
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


def build_tiled(spec: CaseSpec, dtypes: dict[str, str]) -> CaseData:
    """Inputs for the tiled family; ``dtypes`` maps binding name -> WGSL element type."""
    rng = np.random.default_rng(spec.seed)
    hd, heads, kv_heads = spec.head_dim, spec.num_heads, spec.num_kv_heads
    last_abs = spec.kv_start + spec.kv_len
    page_table = np.zeros(1, np.uint32)
    if spec.kv_layout == "ring":
        rows, layout = spec.sliding_window, 1
    elif spec.kv_layout == "paged":
        page_table, rows = paged_buffer(rng, last_abs, spec.page_size)
        layout = 2
    else:
        rows, layout = last_abs, 0
    scale = 1.0 / math.sqrt(hd)
    q = rounded(normal(rng, (spec.query_len, heads, hd), spec.logit_gain), dtypes["Q"])
    k = rounded(normal(rng, (max(rows, 1), kv_heads, hd)), dtypes["K"])
    v = rounded(normal(rng, (max(rows, 1), kv_heads, hd)), dtypes["V"])
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


class TiledFamily(AttentionFamily):
    """Tiled attention: Q tiles of one head per workgroup, K/V contiguous, ring or paged."""

    name = "tiled"
    roles: ClassVar[Mapping[str, Any]] = {
        "Q": INPUT,
        "K": INPUT,
        "V": INPUT,
        "output": OUTPUT,
        "kv_len_buffer": AUXILIARY,
        "page_table": AUXILIARY,
    }
    dtype_bindings: ClassVar[Mapping[str, Any]] = {
        "q_dtype": "Q",
        "kv_dtype": "K",
        "out_dtype": "output",
    }
    shape_flag_keys = ("causal",)
    shape_keys: ClassVar[Mapping[str, Any]] = {
        "prefill": {"q": None, "kv": None, "h": 32, "kvh": 8, "d": 64, "causal": 1},
        "decode": {"kv": 8192, "h": 32, "kvh": 8, "d": 64},
    }
    shape_help: ClassVar[Mapping[str, str]] = {
        "prefill": "q queries at the end of kv keys (q <= kv; causal masking bottom-right "
        "aligned); q and kv default to each other (2048); h: query heads, kvh: K/V heads "
        "(divides h), d: head_dim",
        "decode": "one query after kv keys",
    }
    default_shapes = ("prefill:q=2048,kv=2048,h=32,kvh=8,d=64", "decode:kv=8192,h=32,kvh=8,d=64")

    def wide_subgroup_width(self, entry: Mapping[str, Any]) -> int:
        """``min_subgroup_size``, or with subgroups the key groups' ``lanes_per_key`` (the
        decode kernels fall back to workgroup memory on narrower subgroups)."""
        lanes = entry["params"].get("lanes_per_key") if "subgroups" in entry["requires"] else 0
        return int(entry.get("min_subgroup_size") or lanes or 0)

    def specs(self, entry: Mapping[str, Any], tier: str, seed: int) -> list[CaseSpec]:
        """The feature matrix (its subset for ``quick``), then the tier's size cases."""
        hd = int(entry["metadata"]["max_head_dim"])
        features = tiled_specs(hd, quick=tier == "quick", seed=seed)
        return fit_head_dims(features + tiled_sizes(entry, tier, seed), entry)

    def build(self, spec: CaseSpec, entry: Mapping[str, Any]) -> CaseData:
        types = element_types(entry)
        key = (self.name, spec, tuple(sorted(types.items())))
        return memo.case(key, lambda: build_tiled(spec, types))

    def output_shape(self, data: CaseData) -> tuple[int, ...]:
        u = data.uniforms
        return (int(u["query_len"]), int(u["num_heads"]), int(u["head_dim"]))

    def reference(
        self,
        data: CaseData,
        entry: Mapping[str, Any],
        compute_dtype: Any = np.float64,
        stats: dict[str, float] | None = None,
        sample: RowSample | None = None,
    ) -> np.ndarray:
        r = data.reference_inputs

        def compute(stats: dict[str, float] | None) -> np.ndarray:
            return tiled_attention(
                data.uniforms,
                r["q"],
                r["k"],
                r["v"],
                kv_len_buffer=r["kv_len_buffer"],
                page_table=r["page_table"],
                compute_dtype=compute_dtype,
                stats=stats,
                query_rows=None if sample is None else sample.queries,
                head_rows=None if sample is None else sample.heads,
            )

        return memo.reference(data, (), compute_dtype, sample, stats, compute)

    def row_sample(self, data: CaseData) -> RowSample | None:
        """Sampled (query, head) rows of a large output (see ``sampling``); None: all."""
        spec = data.spec
        return choose_sample(spec.query_len, spec.num_heads, spec.seed, keys=spec.kv_len)


FAMILY = TiledFamily()
