"""Attention math shared by the tiled and tiered families: the numpy reference, case specs,
benchmark shapes, the f32 tolerance, the torch SDPA baseline and the shape refusals.

The validator holds every generated kernel to these functions, so they model the *seed kernels'*
semantics, including their odd corners, not an idealised attention:

* positions: every logical key gets an absolute position and a physical buffer row (contiguous,
  sliding-window ring, paged, hot ring), computed with exact integers and gathered up front;
* masks (causal, sliding window) use the kernels' u32 comparisons on absolute positions;
* scores are ``dot(q, k) * scale``, then ``tanh(s / cap) * cap`` when ``attn_softcap > 0``;
  ``scale`` and ``attn_softcap`` are first rounded to f32, because that is what the uniform holds;
* masked keys are excluded from the softmax. A tiled row with no visible key writes 0. The tiered
  kernels mask with the finite score -3.402823e38 instead of skipping, so a tiered row whose keys
  are *all* masked averages V over every key (``masked_row="mean_v"``, the seed's behaviour);
  ``masked_row="zero"`` is the alternative contract where such a row writes 0.

Tensors arrive already rounded to the kernel's storage dtype; they are upcast to
``compute_dtype``. float64 is the reference; float32 is "a plain same-precision implementation"
(same algorithm, every intermediate in float32, max-subtracted softmax), the error baseline for
tolerances. Kernel-side shape limits (``MAX_HEAD_DIM``, ``MAX_KV_LEN``, workgroup size) are not
modelled: a kernel refuses those shapes without writing, and the validator refuses them earlier.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from doppler_gen.families.base import CaseData, Family
from doppler_gen.shapes import ShapeSyntaxError
from doppler_gen.tolerance import F32_UNIT_ROUNDOFF

MASKED_SCORE = -3.402823e38
"""The finite score the tiered kernels give a masked key (not -inf); see ``masked_row``."""

MASKED_ROW_CONTRACTS = ("mean_v", "zero")

_U32_LIMIT = 2**32

_TILED_U32 = (
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "seq_len",
    "query_len",
    "is_causal",
    "start_pos",
    "sliding_window",
    "kv_len_source",
    "kv_start",
    "page_size",
    "kv_layout",
)
_TIERED_U32 = (
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "cold_len",
    "hot_len",
    "is_causal",
    "start_pos",
    "sliding_window",
    "hot_window",
    "hot_start",
)
_TIERED_LAYOUT_U32 = ("cold_page_size", "cold_layout", "hot_layout")
_F32_FIELDS = ("scale", "attn_softcap")

_LAYOUT_RING = 1
_LAYOUT_PAGED = 2


# --- uniforms and argument checks -------------------------------------------------------------


def _u32_field(u: Mapping[str, float], name: str) -> int:
    """A u32 uniform as an exact Python int; a fractional or out-of-range value is a caller bug."""
    value = u[name]
    as_int = int(value)
    if as_int != value or not 0 <= as_int < _U32_LIMIT:
        raise ValueError(f"uniform field {name!r} must be a u32, got {value!r}")
    return as_int


def _f32_field(u: Mapping[str, float], name: str) -> float:
    """An f32 uniform rounded to f32 first: the kernel never sees more precision than that."""
    return float(np.float32(u[name]))


def _read_uniforms(u: Mapping[str, float], u32_names: Sequence[str]) -> dict[str, Any]:
    """The uniforms the math reads; every missing one is named at once."""
    missing = [name for name in (*u32_names, *_F32_FIELDS) if name not in u]
    if missing:
        raise ValueError(f"uniform fields missing: {', '.join(map(repr, missing))}")
    fields: dict[str, Any] = {name: _u32_field(u, name) for name in u32_names}
    fields.update({name: _f32_field(u, name) for name in _F32_FIELDS})
    return fields


def _check_compute_dtype(dtype: Any) -> np.dtype:
    resolved = np.dtype(dtype)
    if resolved not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"compute_dtype must be float32 or float64, got {resolved}")
    return resolved


def _kv_head_of(num_heads: int, num_kv_heads: int) -> np.ndarray:
    """GQA map, query head -> KV head, as the kernels' ``h / (num_heads / num_kv_heads)``."""
    if num_heads < 1 or num_kv_heads < 1:
        raise ValueError(f"num_heads={num_heads} and num_kv_heads={num_kv_heads} must be >= 1")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
    return np.arange(num_heads) // (num_heads // num_kv_heads)


def _check_shape(array: Any, expected: tuple[int, ...], name: str) -> np.ndarray:
    array = np.asarray(array)
    if array.shape != expected:
        raise ValueError(f"{name} must have shape {expected}, got {array.shape}")
    return array


def _check_kv_buffer(array: Any, num_kv_heads: int, head_dim: int, name: str) -> np.ndarray:
    """A physical K/V buffer: any number of rows, each ``[num_kv_heads, head_dim]``."""
    array = np.asarray(array)
    if array.ndim != 3 or array.shape[1:] != (num_kv_heads, head_dim):
        raise ValueError(
            f"{name} must have shape [rows, num_kv_heads={num_kv_heads}, head_dim={head_dim}], "
            f"got {array.shape}"
        )
    return array


# --- positions, masks, physical rows ----------------------------------------------------------


def _positions(start: int, count: int, what: str) -> np.ndarray:
    """Absolute positions ``start + i``; refuse ones the kernel's u32 arithmetic would wrap."""
    if count and start + count - 1 >= _U32_LIMIT:
        raise ValueError(f"{what} positions reach {start + count - 1}, past the u32 range")
    return start + np.arange(count, dtype=np.int64)


def _mask(abs_query: np.ndarray, abs_key: np.ndarray, is_causal: int, window: int) -> np.ndarray:
    """True where a key is hidden from a query, ``[queries, keys]``, as the kernels' is_masked."""
    query = abs_query[:, None]
    key = abs_key[None, :]
    masked = np.zeros((query.shape[0], key.shape[1]), dtype=bool)
    if is_causal != 0:
        masked |= key > query
    if window > 0:
        masked |= (query >= window) & (key < query - window + 1)
    return masked


def _paged_rows(abs_pos: np.ndarray, table: Any, page_size: int, name: str) -> np.ndarray:
    """``table[pos // page_size] * page_size + pos % page_size``, with the table checked."""
    if page_size == 0:
        raise ValueError(f"paged layout needs a nonzero page size for {name}")
    if table is None:
        raise ValueError(f"paged layout needs {name}")
    table = np.asarray(table)
    if table.ndim != 1 or not np.issubdtype(table.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D integer (u32) array, got {table.dtype}")
    pages = abs_pos // page_size
    if pages.size and pages.max() >= table.size:
        raise ValueError(
            f"{name} is too short: position {abs_pos.max()} needs page {pages.max()}, "
            f"the table has {table.size} entries"
        )
    return table[pages].astype(np.int64) * page_size + abs_pos % page_size


def _tiled_rows(fields: Mapping[str, Any], abs_key: np.ndarray, page_table: Any) -> np.ndarray:
    """Physical K/V row of each key, following the seed's ``get_kv_pos`` branch order."""
    window, layout = fields["sliding_window"], fields["kv_layout"]
    if layout == _LAYOUT_RING and window > 0:
        return abs_key % window
    if layout == _LAYOUT_PAGED:
        return _paged_rows(abs_key, page_table, fields["page_size"], "page_table")
    return abs_key


def _tiled_kv_len(fields: Mapping[str, Any], kv_len_buffer: Any) -> int:
    """KV length from the uniform, or from ``kv_len_buffer[0]`` when ``kv_len_source != 0``."""
    if fields["kv_len_source"] == 0:
        return fields["seq_len"]
    if kv_len_buffer is None:
        raise ValueError("kv_len_source != 0 needs kv_len_buffer")
    buffer = np.asarray(kv_len_buffer)
    if buffer.ndim != 1 or buffer.size == 0 or not np.issubdtype(buffer.dtype, np.integer):
        raise ValueError("kv_len_buffer must be a non-empty 1-D integer (u32) array")
    return int(buffer[0])


def _gather(
    buffer: np.ndarray, rows: np.ndarray, kv_head_of: np.ndarray, name: str, dtype: np.dtype
) -> np.ndarray:
    """Logical keys per query head, ``[num_heads, keys, head_dim]``, bounds-checked.

    Every key the kernel loads is checked, masked or not: the kernel reads them all.
    """
    if rows.size and rows.max() >= buffer.shape[0]:
        raise ValueError(
            f"{name}: physical row {int(rows.max())} is outside the buffer of "
            f"{buffer.shape[0]} rows"
        )
    per_key = buffer[rows][:, kv_head_of, :]
    return per_key.transpose(1, 0, 2).astype(dtype)


# --- the arithmetic ---------------------------------------------------------------------------


def _scores(
    q: np.ndarray, keys: np.ndarray, scale: float, softcap: float, dtype: np.dtype
) -> np.ndarray:
    """``[heads, queries, keys]`` = softcap(q · k * scale), all in ``dtype``."""
    scores = np.matmul(q, keys.transpose(0, 2, 1)) * dtype.type(scale)
    if softcap > 0:
        cap = dtype.type(softcap)
        scores = np.tanh(scores / cap) * cap
    return scores


def _softmax_excluding(scores: np.ndarray, masked: np.ndarray) -> np.ndarray:
    """Softmax over the unmasked keys; a row with none left is all zeros.

    Masked entries are replaced by -inf *before* exp, so they contribute exactly 0 and never
    overflow, and the row max is taken over visible keys only (large logits stay finite).
    """
    hidden = np.broadcast_to(masked, scores.shape)
    visible_scores = np.where(hidden, -np.inf, scores)
    row_max = visible_scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0)
    weights = np.exp(visible_scores - row_max)
    total = weights.sum(axis=-1, keepdims=True)
    return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)


def _record_bounds(
    stats: dict[str, float],
    query: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    counted: np.ndarray,
    scale: float,
) -> None:
    """Magnitudes that bound a correct f32 kernel's rounding error, over the keys that count.

    ``query`` is ``[heads, queries, d]``, ``keys``/``values`` ``[heads, keys, d]`` (already the
    matching KV head per query head) and ``counted`` ``[queries, keys]``: keys that enter each
    row's softmax. ``logit_bound`` = max of ``|scale| * sum_d |q_d k_d|`` (bounds each logit and
    its dot product's rounding, before any softcap, whose derivative is at most 1);
    ``value_bound`` = max |v| over counted keys; ``keys`` = most keys in one row.
    """
    magnitude = np.matmul(np.abs(query), np.abs(keys).transpose(0, 2, 1)) * abs(scale)
    mask = np.broadcast_to(counted, magnitude.shape)
    any_key = counted.any(axis=0)
    stats["logit_bound"] = float(magnitude[mask].max()) if mask.any() else 0.0
    stats["value_bound"] = float(np.abs(values[:, any_key, :]).max()) if any_key.any() else 0.0
    stats["keys"] = int(counted.sum(axis=-1).max()) if counted.size else 0


# --- tiled ------------------------------------------------------------------------------------


def tiled_attention(
    u: Mapping[str, float],
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    kv_len_buffer: np.ndarray | None = None,
    page_table: np.ndarray | None = None,
    compute_dtype: Any = np.float64,
    stats: dict[str, float] | None = None,
    query_rows: np.ndarray | None = None,
    head_rows: np.ndarray | None = None,
) -> np.ndarray:
    """Reference for ``attention``, ``attention_f16`` and ``attention_f16kv``.

    ``q`` is ``[query_len, num_heads, head_dim]``; ``k``/``v`` are physical buffers
    ``[rows, num_kv_heads, head_dim]``. Returns ``[query_len, num_heads, head_dim]`` in
    ``compute_dtype``. ``stats``, when given, receives the problem's magnitudes over the keys
    that count (see :func:`_record_bounds`), which the f32 tolerance is built from.
    ``query_rows``/``head_rows`` (index arrays) restrict the result to those rows, ``[queries, heads,
    head_dim]``: a sampled comparison (see ``sampling``) then pays only for the rows it compares.
    """
    dtype = _check_compute_dtype(compute_dtype)
    fields = _read_uniforms(u, _TILED_U32)
    heads, kv_heads, head_dim = fields["num_heads"], fields["num_kv_heads"], fields["head_dim"]
    kv_head_of = _kv_head_of(heads, kv_heads)
    q = _check_shape(q, (fields["query_len"], heads, head_dim), "q")
    k = _check_kv_buffer(k, kv_heads, head_dim, "k")
    v = _check_kv_buffer(v, kv_heads, head_dim, "v")
    kv_len = _tiled_kv_len(fields, kv_len_buffer)
    abs_query = _positions(fields["start_pos"], q.shape[0], "query")
    q, abs_query, kv_head_of = _select_rows(q, abs_query, kv_head_of, query_rows, head_rows)
    out = np.zeros(q.shape, dtype=dtype)
    if kv_len == 0 or q.shape[0] == 0:
        return out
    abs_key = _positions(fields["kv_start"], kv_len, "key")
    rows = _tiled_rows(fields, abs_key, page_table)
    keys = _gather(k, rows, kv_head_of, "k", dtype)
    values = _gather(v, rows, kv_head_of, "v", dtype)
    masked = _mask(abs_query, abs_key, fields["is_causal"], fields["sliding_window"])
    query = q.transpose(1, 0, 2).astype(dtype)
    if stats is not None:
        _record_bounds(stats, query, keys, values, ~masked, fields["scale"])
    scores = _scores(query, keys, fields["scale"], fields["attn_softcap"], dtype)
    probs = _softmax_excluding(scores, masked[None])
    return np.matmul(probs, values).transpose(1, 0, 2).astype(dtype)


def _select_rows(
    q: np.ndarray,
    abs_query: np.ndarray,
    kv_head_of: np.ndarray,
    queries: np.ndarray | None,
    heads: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Only the requested query rows and query heads (each head keeps its own KV head)."""
    if queries is not None:
        index = np.asarray(queries, np.int64)
        q, abs_query = q[index], abs_query[index]
    if heads is not None:
        index = np.asarray(heads, np.int64)
        q, kv_head_of = q[:, index], kv_head_of[index]
    return q, abs_query, kv_head_of


# --- tiered -----------------------------------------------------------------------------------


def _as_single_query(q: Any, heads: int, head_dim: int) -> np.ndarray:
    """Accept ``[num_heads, head_dim]`` or ``[1, num_heads, head_dim]``; return the 2-D view."""
    q = np.asarray(q)
    if q.shape == (heads, head_dim):
        return q
    if q.shape == (1, heads, head_dim):
        return q[0]
    raise ValueError(
        f"q must have shape ({heads}, {head_dim}) or (1, {heads}, {head_dim}), got {q.shape}"
    )


def _cold_rows(
    fields: Mapping[str, Any], count: int, quantized: bool, cold_page_table: Any
) -> np.ndarray:
    """Cold key i sits at row i, or goes through the page table when ``cold_layout == 2``."""
    positions = np.arange(count, dtype=np.int64)
    if quantized:
        if cold_page_table is not None:
            raise ValueError("the quantized tiered kernels have no cold page table")
        return positions
    if fields["cold_layout"] == _LAYOUT_PAGED:
        return _paged_rows(positions, cold_page_table, fields["cold_page_size"], "cold_page_table")
    return positions


def _hot_rows(fields: Mapping[str, Any], abs_hot: np.ndarray, quantized: bool) -> np.ndarray:
    """Hot key i at row ``(hot_start + i) % hot_window`` when the ring applies, else row i.

    The quantized kernels have no ``hot_layout`` field and ring whenever ``hot_window > 0``.
    """
    window = fields["hot_window"]
    ring = window > 0 and (quantized or fields["hot_layout"] == _LAYOUT_RING)
    if ring:
        return abs_hot % window
    return np.arange(abs_hot.size, dtype=np.int64)


def _concat_tiers(
    cold: np.ndarray,
    hot: np.ndarray,
    cold_rows: np.ndarray,
    hot_rows: np.ndarray,
    kv_head_of: np.ndarray,
    name: str,
    dtype: np.dtype,
) -> np.ndarray:
    """Cold keys then hot keys, ``[num_heads, cold_len + hot_len, head_dim]``."""
    cold_part = _gather(cold, cold_rows, kv_head_of, f"{name}_cold", dtype)
    hot_part = _gather(hot, hot_rows, kv_head_of, f"{name}_hot", dtype)
    return np.concatenate([cold_part, hot_part], axis=1)


def tiered_attention(
    u: Mapping[str, float],
    q: np.ndarray,
    k_hot: np.ndarray,
    v_hot: np.ndarray,
    k_cold: np.ndarray,
    v_cold: np.ndarray,
    *,
    cold_page_table: np.ndarray | None = None,
    masked_row: str = "mean_v",
    quantized: bool = False,
    compute_dtype: Any = np.float64,
    stats: dict[str, float] | None = None,
    head_rows: np.ndarray | None = None,
) -> np.ndarray:
    """Reference for ``attention_decode_tiered_{f16,f16kv,int8_f16kv,int4_f16kv}``.

    One query at absolute position ``start_pos``; cold keys first (absolute positions
    ``0..cold_len-1``), then hot keys (``hot_start + i``). For ``quantized=True`` pass the cold
    tier already dequantized (:func:`doppler_gen.families.quant.dequantize_kv`), ``[cold rows,
    num_kv_heads, head_dim]``. ``q`` is ``[num_heads, head_dim]`` or ``[1, num_heads,
    head_dim]``; the result has ``q``'s rank and is in ``compute_dtype``. ``seq_len`` and
    ``packed_stride`` are not read: neither changes the math. ``head_rows`` (an index
    array) restricts the result to those query heads (a sampled comparison).
    """
    dtype = _check_compute_dtype(compute_dtype)
    if masked_row not in MASKED_ROW_CONTRACTS:
        raise ValueError(f"masked_row must be one of {MASKED_ROW_CONTRACTS}, got {masked_row!r}")
    fields = _read_uniforms(u, _TIERED_U32 if quantized else _TIERED_U32 + _TIERED_LAYOUT_U32)
    heads, kv_heads, head_dim = fields["num_heads"], fields["num_kv_heads"], fields["head_dim"]
    kv_head_of = _kv_head_of(heads, kv_heads)
    query = _as_single_query(q, heads, head_dim)
    if head_rows is not None:
        query, kv_head_of = query[head_rows], kv_head_of[head_rows]
    k_hot = _check_kv_buffer(k_hot, kv_heads, head_dim, "k_hot")
    v_hot = _check_kv_buffer(v_hot, kv_heads, head_dim, "v_hot")
    k_cold = _check_kv_buffer(k_cold, kv_heads, head_dim, "k_cold")
    v_cold = _check_kv_buffer(v_cold, kv_heads, head_dim, "v_cold")
    cold_len, hot_len = fields["cold_len"], fields["hot_len"]
    out = np.zeros(query.shape, dtype=dtype)  # total length 0: the kernel's inv_sum select
    if cold_len + hot_len:
        abs_hot = _positions(fields["hot_start"], hot_len, "hot key")
        cold_rows = _cold_rows(fields, cold_len, quantized, cold_page_table)
        hot_rows = _hot_rows(fields, abs_hot, quantized)
        keys = _concat_tiers(k_cold, k_hot, cold_rows, hot_rows, kv_head_of, "k", dtype)
        values = _concat_tiers(v_cold, v_hot, cold_rows, hot_rows, kv_head_of, "v", dtype)
        abs_key = np.concatenate([np.arange(cold_len, dtype=np.int64), abs_hot])
        masked = _mask(
            np.array([fields["start_pos"]]), abs_key, fields["is_causal"], fields["sliding_window"]
        )
        if stats is not None:
            # a fully masked "mean_v" row averages every key: then every key counts
            counted = np.ones_like(masked) if masked.all() and masked_row == "mean_v" else ~masked
            _record_bounds(stats, query[:, None, :], keys, values, counted, fields["scale"])
        out = _tiered_softmax(fields, query, keys, values, masked, masked_row, dtype)
    return out if np.ndim(q) == 2 else out[None]


def _tiered_softmax(
    fields: Mapping[str, Any],
    query: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    masked: np.ndarray,
    masked_row: str,
    dtype: np.dtype,
) -> np.ndarray:
    """``[num_heads, head_dim]`` for one query, with the fully-masked contract applied.

    The seed gives a masked key the finite score -3.4e38: next to any visible key its weight
    underflows to exactly 0 (so it is simply excluded), but when *every* key is masked all
    scores tie, every weight is exp(0) = 1, and the row is the plain mean of V.
    """
    if masked.all():
        if masked_row == "zero":
            return np.zeros(query.shape, dtype=dtype)
        return values.mean(axis=1, dtype=dtype)
    scores = _scores(
        query[:, None, :].astype(dtype), keys, fields["scale"], fields["attn_softcap"], dtype
    )
    probs = _softmax_excluding(scores, masked[None])
    return np.matmul(probs, values)[:, 0, :].astype(dtype)


# --- cases ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseSpec:
    """One attention problem. Fields not used by a family keep their defaults."""

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


def normal(rng: np.random.Generator, shape: tuple[int, ...], gain: float = 1.0) -> np.ndarray:
    return rng.standard_normal(shape) * gain


def paged_buffer(rng: np.random.Generator, logical: int, page_size: int) -> tuple[np.ndarray, int]:
    """A shuffled page table covering ``logical`` rows, with one spare physical page."""
    pages = max(1, math.ceil(logical / page_size))
    physical = pages + 1
    table = rng.permutation(physical)[:pages].astype(np.uint32)
    if pages > 1 and np.array_equal(table, np.arange(pages)):
        table = np.roll(table, 1)  # never the identity: a page table that is ignored must fail
    return table, physical * page_size


def row_gains(rng: np.random.Generator, span: float, shape: tuple[int, ...]) -> np.ndarray | float:
    """Per-(row, kv_head) factors log-uniform over ``span`` decades around 1 (1.0 when 0).

    Draws nothing when ``span`` is 0, so cases without it keep their exact tensors.
    """
    if span <= 0:
        return 1.0
    return 10.0 ** rng.uniform(-span / 2, span / 2, (*shape[:2], 1))


# --- benchmark shapes -------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionShape:
    """One benchmark problem, in the terms both the WebGPU kernels and torch SDPA understand."""

    kind: str  # prefill | decode | tiered
    query_len: int
    kv_len: int  # keys attended in all (tiered: cold + hot)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool = True
    cold_len: int = 0
    hot_len: int = 0
    family: str = "tiled"

    @property
    def label(self) -> str:
        """Canonical text: parses back to the same shape, so reports can be re-run verbatim."""
        heads = f"h={self.num_heads},kvh={self.num_kv_heads},d={self.head_dim}"
        if self.kind == "prefill":
            causal = "" if self.causal else ",causal=0"
            return f"prefill:q={self.query_len},kv={self.kv_len},{heads}{causal}"
        if self.kind == "decode":
            return f"decode:kv={self.kv_len},{heads}"
        return f"tiered:cold={self.cold_len},hot={self.hot_len},{heads}"

    def attended_pairs(self) -> int:
        """(query, key) pairs that contribute to the output, per head.

        Causal prefill counts only the unmasked triangle (bottom-right aligned), the convention
        of FlashAttention's benchmarks: a kernel that computes masked scores anyway shows it as
        lower TFLOP/s, which is the truth about that kernel.
        """
        if self.kind != "prefill" or not self.causal:
            return self.query_len * self.kv_len
        history = self.kv_len - self.query_len
        return self.query_len * history + self.query_len * (self.query_len + 1) // 2

    def flops(self) -> int:
        """Useful FLOPs: QKᵀ and PV at two per multiply-add, 4·pairs·h·d (softmax not counted)."""
        return 4 * self.attended_pairs() * self.num_heads * self.head_dim

    def case_spec(self, seed: int = 0) -> CaseSpec:
        """The validation case with this shape, so bench feeds kernels exactly as validate does."""
        common = {
            "name": self.label,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "seed": seed,
        }
        if self.kind == "tiered":
            return CaseSpec(
                **common,
                cold_len=self.cold_len,
                hot_len=self.hot_len,
                hot_start=self.cold_len,
                hot_window=self.hot_len,
                hot_layout=1 if self.hot_len else 0,
                start_pos=self.kv_len - 1,
                is_causal=1,
            )
        return CaseSpec(
            **common,
            query_len=self.query_len,
            kv_len=self.kv_len,
            start_pos=self.kv_len - self.query_len,
            is_causal=int(self.causal),
        )


DEFAULT_PREFILL_LEN = 2048
# No WebGPU device binds a buffer this large; refusing early avoids building it in numpy first.
MAX_TENSOR_ELEMENTS = 1 << 30


def make_attention_shape(
    family: str, kind: str, text: str, given: dict[str, int]
) -> AttentionShape:
    """Resolve defaults and cross-key rules of an attention shape; errors name the token."""
    values = dict(given)
    heads, kv_heads, head_dim = values["h"], values["kvh"], values["d"]
    if heads % kv_heads:
        raise _shape_error(text, f"h={heads} is not a multiple of kvh={kv_heads}")
    if kind == "prefill":
        query = values.get("q", values.get("kv", DEFAULT_PREFILL_LEN))
        keys = values.get("kv", query)
        if query > keys:
            raise _shape_error(
                text, f"q={query} exceeds kv={keys} (the queries are the last q of kv positions)"
            )
        shape = AttentionShape(
            kind, query, keys, heads, kv_heads, head_dim, bool(values["causal"]), family=family
        )
    elif kind == "decode":
        shape = AttentionShape(kind, 1, values["kv"], heads, kv_heads, head_dim, family=family)
    else:
        cold, hot = values["cold"], values["hot"]
        if cold + hot < 1:
            raise _shape_error(text, "cold + hot must be at least 1 key")
        shape = AttentionShape(
            kind,
            1,
            cold + hot,
            heads,
            kv_heads,
            head_dim,
            cold_len=cold,
            hot_len=hot,
            family=family,
        )
    largest = max(shape.query_len * heads, shape.kv_len * kv_heads) * head_dim
    if largest > MAX_TENSOR_ELEMENTS:
        raise _shape_error(
            text, f"a tensor of {largest} elements is larger than any WebGPU binding"
        )
    return shape


def _shape_error(text: str, message: str) -> ShapeSyntaxError:
    return ShapeSyntaxError(f"--shape {text!r}: {message}")


def f32_tolerance(v_max: float, head_dim: int, logits: float, keys: int) -> float:
    """The f32 attention bound of the README's tolerance policy (see ``tolerance.py``)."""
    return (
        max(v_max, 1e-30)
        * F32_UNIT_ROUNDOFF
        * (16 + 2 * math.sqrt(head_dim) * logits + 2 * math.sqrt(keys))
    )


# --- the shared family behaviour ----------------------------------------------------------------


class AttentionFamily(Family):
    """What the tiled and tiered families share: roles of Q/K/V/output, dtype metadata checks,
    head and length refusals, the f32 tolerance and the torch SDPA baseline."""

    metadata = ("q_dtype", "kv_dtype", "out_dtype", "max_head_dim", "masked_row")
    optional_metadata = ("max_kv_len",)
    # the binding that carries each dtype metadata key
    dtype_bindings: ClassVar[Mapping[str, Any]] = {}
    baseline_name = "SDPA"
    methodology: ClassVar[Mapping[str, str]] = {
        "flops": "4 * attended (query, key) pairs * heads * head_dim; causal prefill counts the "
        "unmasked triangle only; softmax not counted",
        "baseline": "torch.nn.functional.scaled_dot_product_attention in the variant's K/V "
        "storage dtype (one dtype for Q, K, V; int8/int4 cold tiers compare with f16, torch has "
        "no quantized SDPA), causal only for prefill (bottom-right mask when q < kv), GQA via "
        "enable_gqa",
    }

    def interface_problems(
        self, variant: Any, meta: Mapping[str, Any], passes: list[tuple[Any, Any]]
    ) -> Iterator[str]:
        modules = [module for _, module in passes]
        for key, name in self.dtype_bindings.items():
            binding = next((m.binding(name) for m in modules if m.binding(name)), None)
            if binding is None:
                yield f"the WGSL has no binding named {name}"
            elif binding.element_type != meta[key]:
                yield f"{key} = {meta[key]!r} but the WGSL binds {binding.name} as {binding.type}"
        last = modules[-1]
        max_head_dim = next(
            (m.constants["MAX_HEAD_DIM"] for m in modules if "MAX_HEAD_DIM" in m.constants), None
        )
        if max_head_dim is None and "WORKGROUP_SIZE" in last.overrides:
            max_head_dim = last.overrides["WORKGROUP_SIZE"].default
        if max_head_dim != meta["max_head_dim"]:
            yield (
                f"max_head_dim = {meta['max_head_dim']} but the WGSL allows head_dim up to "
                f"{max_head_dim}"
            )
        if meta.get("max_kv_len") is not None:
            found = next(
                (m.constants["MAX_KV_LEN"] for m in modules if "MAX_KV_LEN" in m.constants), None
            )
            if found != meta["max_kv_len"]:
                yield f"max_kv_len = {meta['max_kv_len']} but the WGSL's MAX_KV_LEN is {found}"

    def head_dim_limit(self, entry: Mapping[str, Any], constants: Mapping[str, Any]) -> int | str:
        """The largest head_dim the kernel runs (or why it runs none at these constants)."""
        return int(entry["metadata"]["max_head_dim"])

    def kv_total(self, spec: CaseSpec) -> tuple[int, str]:
        """(keys the case holds, how to describe them)."""
        return spec.kv_len, ""

    def constraints(self, entry: Mapping[str, Any], constants: Mapping[str, int]) -> str | None:
        """Override values the kernels' workgroup arrays are sized for: an override X whose pass
        declares a module constant MAX_X may not exceed it (WORKGROUP_SIZE, BLOCK_Q, ...); a
        pass with key groups needs WORKGROUP_SIZE to be a multiple of LANES_PER_KEY; the
        split reduce halves REDUCE_WORKGROUP_SIZE, a power of two. Past these, WGSL's clamped
        workgroup indices give a wrong answer, not an error (the comments on each override in
        the WGSL say the same to a host)."""
        for p in entry["passes"]:
            mine = {o["name"] for o in p["overrides"]}
            values = {name: int(constants[name]) for name in mine if name in constants}
            consts = p.get("constants") or {}
            for name, value in values.items():
                limit = consts.get(f"MAX_{name}")
                if isinstance(limit, int) and value > limit:
                    return f"{name} {value} must be <= MAX_{name} {limit} ({p['name']} pass)"
            size, lanes = values.get("WORKGROUP_SIZE"), consts.get("LANES_PER_KEY")
            if size is not None and isinstance(lanes, int) and lanes and size % lanes:
                return (
                    f"WORKGROUP_SIZE {size} must be a multiple of LANES_PER_KEY {lanes} "
                    f"({p['name']} pass)"
                )
            reduce = values.get("REDUCE_WORKGROUP_SIZE")
            if reduce is not None and reduce & (reduce - 1):
                return f"REDUCE_WORKGROUP_SIZE {reduce} must be a power of two ({p['name']} pass)"
        return None

    # Doppler's attention host counts a one-kernel variant's workgroups by its tier
    host_dispatch = True

    def host_dtypes(self, entry: Mapping[str, Any]) -> dict[str, str]:
        """Q, K/V and output apart, as the host's attention entries name them."""
        meta = entry.get("metadata") or {}
        keys = (("outputDtype", "out_dtype"), ("inputDtype", "q_dtype"), ("kvDtype", "kv_dtype"))
        return {key: meta[name] for key, name in keys if meta.get(name) is not None}

    def host_metadata(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """K/V bound as vecN: the host must not select the variant for other head_dims."""
        width = kv_vector_width(entry)
        return {"headDimMultiple": width} if width > 1 else {}

    def refuse(
        self,
        spec: CaseSpec,
        entry: Mapping[str, Any],
        limits: Mapping[str, int],
        constants: Mapping,
    ) -> str | None:
        limit = self.head_dim_limit(entry, constants)
        if isinstance(limit, str):
            return limit
        if spec.head_dim > limit:
            return f"head_dim {spec.head_dim} exceeds the kernel's maximum {limit}"
        width = kv_vector_width(entry)
        if spec.head_dim % width:
            return (
                f"head_dim {spec.head_dim} is not a multiple of {width} "
                f"(the kernel reads K/V as vec{width})"
            )
        if spec.head_dim < 1 or spec.num_heads < 1 or spec.num_kv_heads < 1:
            return "head_dim, num_heads and num_kv_heads must be positive"
        if spec.num_heads % spec.num_kv_heads:
            return (
                f"num_heads {spec.num_heads} is not a multiple of num_kv_heads {spec.num_kv_heads}"
            )
        max_kv = entry["metadata"].get("max_kv_len")
        total, detail = self.kv_total(spec)
        if max_kv is not None and total > max_kv:
            return f"KV length {total}{detail} exceeds MAX_KV_LEN {max_kv}"
        largest = limits.get("max-storage-buffer-binding-size", 1 << 27)
        rows = max(spec.kv_start + spec.kv_len, spec.cold_len, spec.hot_len, spec.hot_window)
        biggest = 4 * spec.head_dim * max(spec.query_len * spec.num_heads, rows * spec.num_kv_heads)
        if biggest > largest:
            return f"a buffer would need about {biggest} B; the device binds at most {largest} B"
        return None

    def f32_tolerance(self, data: CaseData, ref: np.ndarray, stats: Mapping[str, float]) -> float:
        return f32_tolerance(
            stats.get("value_bound", 0.0),
            int(data.uniforms["head_dim"]),
            stats.get("logit_bound", 0.0),
            int(stats.get("keys", 0)),
        )

    def make_shape(self, kind: str, text: str, values: dict[str, int]) -> AttentionShape:
        return make_attention_shape(self.name, kind, text, values)

    def baseline_dtype(self, entry: Mapping[str, Any]) -> str | None:
        """SDPA takes one dtype for Q, K and V: the K/V storage dtype, which dominates traffic."""
        return str(entry["metadata"]["kv_dtype"])

    def baseline(self, torch: Any, shape: Any, dtype: str) -> tuple[Any, str]:
        return sdpa_call(torch, shape, dtype)


def kv_vector_width(entry: Mapping[str, Any]) -> int:
    """Elements per load of the K binding in any pass (4 for ``array<vec4<f16>>``).

    A kernel that reads K/V as vecN needs head_dim to be a multiple of N; the manifest's
    ``element_type`` stays the scalar (the host fills the buffer the same way).
    """
    for record in entry.get("passes") or [entry]:
        for binding in record.get("bindings", []):
            if binding["name"] in ("K", "K_hot"):
                match = re.match(r"array<vec([234])<", binding["type"])
                if match:
                    return int(match.group(1))
    return 1


def fit_head_dims(specs: list[CaseSpec], entry: Mapping[str, Any]) -> list[CaseSpec]:
    """Cases whose head_dim a vecN kernel cannot take (a refusal fails the case) get the next
    multiple of N, named so the report says so."""
    width = kv_vector_width(entry)
    if width == 1:
        return specs
    top = int(entry["metadata"]["max_head_dim"])
    fitted = []
    for spec in specs:
        if spec.head_dim % width:
            dim = min(-(-spec.head_dim // width) * width, top - top % width)
            spec = replace(spec, name=f"{spec.name} (head_dim {dim}: vec{width} K/V)", head_dim=dim)
        fitted.append(spec)
    return fitted


def _bottom_right(torch: Any, s: AttentionShape) -> tuple[Any, str]:
    """The causal mask of a chunked prefill (q < kv, aligned bottom-right), and a note.

    torch's ``causal_lower_right`` bias lets SDPA run its FlashAttention or memory-efficient
    kernels with causal tile skipping; a dense boolean mask rules FlashAttention out and
    skips nothing, which made torch about 1.4x slower per useful FLOP on the chunked shape
    and the kernels' ratio look that much better. The dense mask is only the fallback for a
    torch without the bias (before 2.2), and the note says so.
    """
    attention = getattr(torch.nn, "attention", None)
    bias = getattr(attention, "bias", None)
    if bias is None and getattr(torch, "__name__", "") == "torch":
        try:
            bias = importlib.import_module("torch.nn.attention.bias")
        except ImportError:
            bias = None
    lower_right = getattr(bias, "causal_lower_right", None)
    if lower_right is not None:
        return lower_right(s.query_len, s.kv_len), "bottom-right causal bias (causal_lower_right)"
    ones = torch.ones(s.query_len, s.kv_len, dtype=torch.bool, device="cuda")
    dense = ones.tril(diagonal=s.kv_len - s.query_len)
    return (
        dense,
        "dense bottom-right causal mask (torch without causal_lower_right: no FlashAttention)",
    )


def sdpa_call(torch: Any, s: AttentionShape, dtype_name: str) -> tuple[Any, str]:
    """A zero-argument SDPA call, using enable_gqa where torch has it (else repeated K/V).

    torch's is_causal is top-left aligned: right only when queries and keys coincide; chunked
    causal prefill (q < kv) gets the bottom-right causal bias (``_bottom_right``).
    """
    dtype = {"f16": torch.float16, "f32": torch.float32}[dtype_name]
    generator = torch.Generator(device="cuda").manual_seed(0)
    is_causal = s.kind == "prefill" and s.causal and s.query_len == s.kv_len
    lower_right = s.kind == "prefill" and s.causal and s.query_len < s.kv_len

    def tensor(heads: int, length: int) -> Any:
        return torch.randn(
            1, heads, length, s.head_dim, device="cuda", dtype=dtype, generator=generator
        )

    q, k, v = (
        tensor(s.num_heads, s.query_len),
        tensor(s.num_kv_heads, s.kv_len),
        tensor(s.num_kv_heads, s.kv_len),
    )
    mask, notes = None, []
    if lower_right:
        mask, note = _bottom_right(torch, s)
        notes.append(note)
    if dtype_name == "f32":
        notes.append("f32: no FlashAttention in torch (f16/bf16 only)")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if s.num_heads == s.num_kv_heads:
        return (lambda: sdpa(q, k, v, attn_mask=mask, is_causal=is_causal)), "; ".join(notes)
    try:
        sdpa(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
        notes.append("enable_gqa")
        return (
            lambda: sdpa(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
        ), "; ".join(notes)
    except TypeError:  # torch < 2.5: no enable_gqa; repeat K/V outside the timed region
        group = s.num_heads // s.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        notes.append("K/V repeated per query head (torch without enable_gqa)")
        return (lambda: sdpa(q, k, v, attn_mask=mask, is_causal=is_causal)), "; ".join(notes)
