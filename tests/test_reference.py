"""Tests for the numpy reference attention against deliberately naive loop implementations.

The naive versions below walk one query, one head, one key at a time and follow the seed kernels
line by line (the tiered one even uses the literal -3.402823e38 masked score), so they share no
code or vectorisation tricks with ``doppler_gen.reference``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from doppler_gen.families.attention import tiered_attention, tiled_attention
from doppler_gen.families.quant import dequantize_kv, quantize_kv

MASKED = -3.402823e38
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


# --- naive implementations --------------------------------------------------------------------


def _is_masked(u: dict[str, Any], abs_query: int, abs_key: int) -> bool:
    if u["is_causal"] and abs_key > abs_query:
        return True
    w = u["sliding_window"]
    return w > 0 and abs_query >= w and abs_key < abs_query - w + 1


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    return sum(float(x) * float(y) for x, y in zip(a, b, strict=True))


def _score(u: dict[str, Any], q: np.ndarray, k: np.ndarray) -> float:
    s = _dot(q, k) * float(np.float32(u["scale"]))
    cap = float(np.float32(u["attn_softcap"]))
    if cap > 0:
        s = math.tanh(s / cap) * cap
    return s


def _naive_tiled_row(u: dict[str, Any], abs_key: int, page_table: Any) -> int:
    if u["kv_layout"] == 1 and u["sliding_window"] > 0:
        return abs_key % u["sliding_window"]
    if u["kv_layout"] == 2:
        ps = u["page_size"]
        return int(page_table[abs_key // ps]) * ps + abs_key % ps
    return abs_key


def naive_tiled(u, q, k, v, kv_len_buffer=None, page_table=None) -> np.ndarray:
    kv_len = u["seq_len"] if u["kv_len_source"] == 0 else int(kv_len_buffer[0])
    group = u["num_heads"] // u["num_kv_heads"]
    head_dim = u["head_dim"]
    out = np.zeros((u["query_len"], u["num_heads"], head_dim))
    for qi in range(u["query_len"]):
        abs_query = qi + u["start_pos"]
        for h in range(u["num_heads"]):
            kvh = h // group
            scores, rows = [], []
            for key in range(kv_len):
                abs_key = u["kv_start"] + key
                if _is_masked(u, abs_query, abs_key):
                    continue
                row = _naive_tiled_row(u, abs_key, page_table)
                scores.append(_score(u, q[qi, h], k[row, kvh]))
                rows.append(row)
            if not scores:
                continue
            m = max(scores)
            weights = [math.exp(s - m) for s in scores]
            total = sum(weights)
            for d in range(head_dim):
                acc = sum(w * float(v[r, kvh, d]) for w, r in zip(weights, rows, strict=True))
                out[qi, h, d] = acc / total
    return out


def _naive_tiered_keys(u, k_hot, v_hot, k_cold, v_cold, cold_page_table, quantized):
    keys = []  # (absolute position, K buffer, V buffer, physical row)
    for i in range(u["cold_len"]):
        row = i
        if not quantized and u["cold_layout"] == 2:
            ps = u["cold_page_size"]
            row = int(cold_page_table[i // ps]) * ps + i % ps
        keys.append((i, k_cold, v_cold, row))
    ring = u["hot_window"] > 0 and (quantized or u["hot_layout"] == 1)
    for i in range(u["hot_len"]):
        row = (u["hot_start"] + i) % u["hot_window"] if ring else i
        keys.append((u["hot_start"] + i, k_hot, v_hot, row))
    return keys


def naive_tiered(
    u, q, k_hot, v_hot, k_cold, v_cold, cold_page_table=None, masked_row="mean_v", quantized=False
) -> np.ndarray:
    heads, head_dim = u["num_heads"], u["head_dim"]
    q2 = np.asarray(q).reshape(heads, head_dim)
    group = heads // u["num_kv_heads"]
    keys = _naive_tiered_keys(u, k_hot, v_hot, k_cold, v_cold, cold_page_table, quantized)
    out = np.zeros((heads, head_dim))
    for h in range(heads):
        kvh = h // group
        scores, all_masked = [], True
        for pos, kb, _vb, row in keys:
            s = _score(u, q2[h], kb[row, kvh])
            if _is_masked(u, u["start_pos"], pos):
                s = MASKED
            else:
                all_masked = False
            scores.append(s)
        if masked_row == "zero" and all_masked:
            continue
        m = max([MASKED, *scores])
        weights = [math.exp(s - m) for s in scores]
        total = sum(weights)
        inv = 1.0 / total if total > 0 else 0.0
        for d in range(head_dim):
            acc = sum(
                w * float(vb[row, kvh, d]) for w, (_, _, vb, row) in zip(weights, keys, strict=True)
            )
            out[h, d] = acc * inv
    return out.reshape(np.shape(q))


# --- problem builders -------------------------------------------------------------------------


def tiled_u(**fields: Any) -> dict[str, Any]:
    u = {
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 8,
        "seq_len": 10,
        "query_len": 3,
        "scale": 1 / math.sqrt(8),
        "is_causal": 0,
        "start_pos": 0,
        "attn_softcap": 0.0,
        "sliding_window": 0,
        "kv_len_source": 0,
        "kv_start": 0,
        "page_size": 0,
        "kv_layout": 0,
    }
    u.update(fields)
    return u


def tiered_u(quantized: bool = False, **fields: Any) -> dict[str, Any]:
    u = {
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 8,
        "cold_len": 6,
        "hot_len": 5,
        "seq_len": 1,
        "scale": 1 / math.sqrt(8),
        "is_causal": 1,
        "start_pos": 10,
        "attn_softcap": 0.0,
        "sliding_window": 0,
        "hot_window": 0,
        "hot_start": 6,
    }
    if quantized:
        u["packed_stride"] = 2
    else:
        u.update({"cold_page_size": 0, "cold_layout": 0, "hot_layout": 0})
    u.update(fields)
    return u


def random_qkv(rng, u, rows: int, q_rows: int | None = None, gain: float = 1.0):
    """Q rounded to f32, K/V rounded to f16: the reference sees storage-dtype values."""
    heads, kv_heads, hd = u["num_heads"], u["num_kv_heads"], u["head_dim"]
    q_shape = (heads, hd) if q_rows is None else (q_rows, heads, hd)
    q = (rng.standard_normal(q_shape) * gain).astype(np.float32)
    k = (rng.standard_normal((rows, kv_heads, hd)) * gain).astype(np.float16)
    v = rng.standard_normal((rows, kv_heads, hd)).astype(np.float16)
    return q, k, v


def random_tiered(rng, u, hot_rows: int, cold_rows: int, gain: float = 1.0):
    q, k_hot, v_hot = random_qkv(rng, u, hot_rows, gain=gain)
    _, k_cold, v_cold = random_qkv(rng, u, cold_rows, gain=gain)
    return q, k_hot, v_hot, k_cold, v_cold


def check_tiled(u, rows: int, seed: int = 0, gain: float = 1.0, **kwargs: Any) -> np.ndarray:
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, u, rows, q_rows=u["query_len"], gain=gain)
    got = tiled_attention(u, q, k, v, **kwargs)
    assert got.shape == q.shape and got.dtype == np.float64
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, naive_tiled(u, q, k, v, **kwargs), **TIGHT)
    return got


# --- tiled: against the naive loop ------------------------------------------------------------


@pytest.mark.parametrize("num_kv_heads", [8, 4, 2, 1])
@pytest.mark.parametrize("is_causal", [0, 1])
def test_tiled_gqa_ratios(num_kv_heads: int, is_causal: int) -> None:
    u = tiled_u(
        num_heads=8,
        num_kv_heads=num_kv_heads,
        seq_len=9,
        query_len=4,
        start_pos=5,
        is_causal=is_causal,
    )
    check_tiled(u, rows=9, seed=num_kv_heads)


@pytest.mark.parametrize(
    ("query_len", "start_pos", "seq_len"),
    [(12, 0, 12), (5, 7, 12), (1, 11, 12)],
    ids=["prefill", "chunked-prefill", "decode"],
)
def test_tiled_causal(query_len: int, start_pos: int, seq_len: int) -> None:
    u = tiled_u(is_causal=1, query_len=query_len, start_pos=start_pos, seq_len=seq_len)
    check_tiled(u, rows=seq_len, seed=query_len)


@pytest.mark.parametrize("is_causal", [0, 1])
def test_tiled_sliding_window_edges(is_causal: int) -> None:
    # abs_query runs over w-1, w, w+1 (and beyond) with w = 4
    u = tiled_u(is_causal=is_causal, sliding_window=4, query_len=5, start_pos=3, seq_len=9)
    check_tiled(u, rows=9, seed=11)


def test_tiled_softcap_and_kv_len_from_buffer() -> None:
    u = tiled_u(attn_softcap=2.0, scale=1.0, is_causal=1, start_pos=6, seq_len=999, kv_len_source=1)
    check_tiled(u, rows=12, seed=3, gain=2.0, kv_len_buffer=np.array([9], dtype=np.uint32))


def test_tiled_kv_start() -> None:
    u = tiled_u(kv_start=4, seq_len=6, query_len=2, start_pos=8, is_causal=1)
    check_tiled(u, rows=10, seed=4)


@pytest.mark.parametrize(
    ("kv_start", "seq_len", "query_len", "start_pos"),
    [(7, 5, 1, 11), (6, 6, 3, 9)],
    ids=["decode", "prefill-chunk-overwriting"],
)
def test_tiled_ring_layout(kv_start: int, seq_len: int, query_len: int, start_pos: int) -> None:
    u = tiled_u(
        kv_layout=1,
        sliding_window=5,
        kv_start=kv_start,
        seq_len=seq_len,
        query_len=query_len,
        start_pos=start_pos,
        is_causal=1,
    )
    check_tiled(u, rows=5, seed=5)


def test_tiled_ring_layout_needs_a_window() -> None:
    # kv_layout 1 without a window falls back to contiguous rows
    u = tiled_u(kv_layout=1, sliding_window=0, kv_start=2, seq_len=6)
    check_tiled(u, rows=8, seed=6)


@pytest.mark.parametrize("kv_start", [0, 2])
def test_tiled_paged_layout(kv_start: int) -> None:
    table = np.random.default_rng(7).permutation(6).astype(np.uint32)
    u = tiled_u(
        kv_layout=2,
        page_size=4,
        kv_start=kv_start,
        seq_len=17,
        query_len=5,
        start_pos=kv_start + 12,
        is_causal=1,
    )
    check_tiled(u, rows=24, seed=8, page_table=table)


def test_tiled_length_one_kv() -> None:
    got = check_tiled(tiled_u(seq_len=1, query_len=1), rows=1, seed=9)
    assert got.shape == (1, 4, 8)


def test_tiled_empty_kv_writes_zero() -> None:
    got = check_tiled(tiled_u(seq_len=0), rows=1, seed=10)
    assert np.all(got == 0)


def test_tiled_fully_masked_rows_write_zero() -> None:
    # queries at 8, 9 see no key (keys start at 10); queries 10, 11 see some
    u = tiled_u(kv_start=10, seq_len=4, query_len=4, start_pos=8, is_causal=1)
    got = check_tiled(u, rows=14, seed=12)
    assert np.all(got[:2] == 0)
    assert np.all(np.abs(got[2:]).sum(axis=-1) > 0)


def test_tiled_large_logits_stay_finite() -> None:
    u = tiled_u(seq_len=16, query_len=4, start_pos=12, is_causal=1)
    rng = np.random.default_rng(13)
    q, k, v = random_qkv(rng, u, 16, q_rows=4, gain=30.0)
    got = tiled_attention(u, q, k, v)
    scores = np.einsum("hd,kd->hk", q[0, :, :].astype(np.float64), k[:, 0, :].astype(np.float64))
    assert np.abs(scores * u["scale"]).max() > 500  # really a large-logit case
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, naive_tiled(u, q, k, v), **TIGHT)
    assert np.all(np.isfinite(tiled_attention(u, q, k, v, compute_dtype=np.float32)))


def test_tiled_float32_mode_close_to_float64() -> None:
    u = tiled_u(seq_len=20, query_len=6, start_pos=14, is_causal=1, sliding_window=9)
    rng = np.random.default_rng(14)
    q, k, v = random_qkv(rng, u, 20, q_rows=6)
    ref = tiled_attention(u, q, k, v)
    f32 = tiled_attention(u, q, k, v, compute_dtype=np.float32)
    assert f32.dtype == np.float32
    assert not np.array_equal(f32, ref)
    np.testing.assert_allclose(f32, ref, rtol=1e-5, atol=1e-6)


# --- tiled: hand-derived expectations ---------------------------------------------------------


def test_tiled_window_edge_by_hand() -> None:
    # q = 0 gives equal weights, and V row j = e_j, so the output row is the indicator of the
    # visible keys divided by their count. w = 4, causal, abs_query = 3 (w-1), 4 (w), 5 (w+1).
    u = tiled_u(
        num_heads=1,
        num_kv_heads=1,
        head_dim=6,
        seq_len=6,
        query_len=3,
        start_pos=3,
        is_causal=1,
        sliding_window=4,
    )
    q = np.zeros((3, 1, 6), dtype=np.float32)
    k = np.ones((6, 1, 6), dtype=np.float16)
    v = np.eye(6, dtype=np.float16)[:, None, :]
    got = tiled_attention(u, q, k, v)[:, 0, :]
    expected = np.array([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]) / 4
    np.testing.assert_array_equal(got, expected)


def test_tiled_paged_rows_by_hand() -> None:
    # page_size 2, table [2, 0, 1]: logical keys 0..5 live in rows 4, 5, 0, 1, 2, 3. With one
    # visible key (causal decode at position 0 sees key 0 only) the output is V[4].
    u = tiled_u(
        num_heads=1,
        num_kv_heads=1,
        head_dim=1,
        seq_len=6,
        query_len=1,
        is_causal=1,
        kv_layout=2,
        page_size=2,
    )
    v = np.arange(6, dtype=np.float16).reshape(6, 1, 1) * 10
    k = np.zeros((6, 1, 1), dtype=np.float16)
    got = tiled_attention(u, np.ones((1, 1, 1)), k, v, page_table=np.array([2, 0, 1], np.uint32))
    assert got.item() == 40.0


# --- tiled: argument checks -------------------------------------------------------------------


def test_tiled_rejects_inconsistent_arguments() -> None:
    u = tiled_u()
    q, k, v = random_qkv(np.random.default_rng(0), u, 10, q_rows=3)
    with pytest.raises(ValueError, match="q must have shape"):
        tiled_attention(tiled_u(head_dim=6), q, k, v)
    with pytest.raises(ValueError, match="k must have shape"):
        tiled_attention(u, q, k[:, :, :4], v)
    with pytest.raises(ValueError, match="not divisible"):
        tiled_attention(tiled_u(num_heads=4, num_kv_heads=3), q, k, v)
    with pytest.raises(ValueError, match="outside the buffer"):
        tiled_attention(tiled_u(kv_start=1), q, k, v)
    with pytest.raises(ValueError, match="too short"):
        tiled_attention(tiled_u(kv_layout=2, page_size=4), q, k, v, page_table=np.arange(2))
    with pytest.raises(ValueError, match="needs page_table"):
        tiled_attention(tiled_u(kv_layout=2, page_size=4), q, k, v)
    with pytest.raises(ValueError, match="needs kv_len_buffer"):
        tiled_attention(tiled_u(kv_len_source=1), q, k, v)
    with pytest.raises(ValueError, match="missing: 'kv_layout'"):
        tiled_attention({key: val for key, val in u.items() if key != "kv_layout"}, q, k, v)
    with pytest.raises(ValueError, match="must be a u32"):
        tiled_attention(tiled_u(start_pos=-1), q, k, v)
    with pytest.raises(ValueError, match="compute_dtype"):
        tiled_attention(u, q, k, v, compute_dtype=np.float16)


# --- tiered: against the naive loop -----------------------------------------------------------


def check_tiered(
    u, hot_rows: int, cold_rows: int, seed: int = 0, gain: float = 1.0, **kwargs: Any
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    args = random_tiered(rng, u, hot_rows, cold_rows, gain=gain)
    got = tiered_attention(u, *args, **kwargs)
    assert got.shape == args[0].shape and got.dtype == np.float64
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, naive_tiered(u, *args, **kwargs), **TIGHT)
    return got


@pytest.mark.parametrize("num_kv_heads", [8, 4, 2, 1])
@pytest.mark.parametrize("quantized", [False, True])
def test_tiered_gqa_ratios(num_kv_heads: int, quantized: bool) -> None:
    u = tiered_u(quantized, num_heads=8, num_kv_heads=num_kv_heads)
    check_tiered(u, hot_rows=5, cold_rows=6, seed=num_kv_heads, quantized=quantized)


@pytest.mark.parametrize("quantized", [False, True])
def test_tiered_hot_ring_wraps(quantized: bool) -> None:
    # hot keys at 13..18 live in rows 5, 6, 7, 0, 1, 2 of an 8-row ring
    u = tiered_u(quantized, cold_len=13, hot_len=6, hot_start=13, hot_window=8, start_pos=18)
    if not quantized:
        u["hot_layout"] = 1
    check_tiered(u, hot_rows=8, cold_rows=13, seed=20, quantized=quantized)


def test_tiered_hot_layout_zero_disables_ring_only_without_quantization() -> None:
    u = tiered_u(False, cold_len=3, hot_len=6, hot_start=13, hot_window=8, start_pos=18)
    rng = np.random.default_rng(21)
    args = random_tiered(rng, u, 8, 3)
    flat = tiered_attention(u, *args)
    np.testing.assert_allclose(flat, naive_tiered(u, *args), **TIGHT)
    quant_u = {key: val for key, val in u.items() if key not in ("hot_layout", "cold_layout")}
    ring = tiered_attention(quant_u, *args, quantized=True)
    np.testing.assert_allclose(ring, naive_tiered(quant_u, *args, quantized=True), **TIGHT)
    assert not np.allclose(flat, ring)


def test_tiered_cold_paged() -> None:
    table = np.random.default_rng(22).permutation(4).astype(np.uint32)
    u = tiered_u(
        cold_len=14, cold_layout=2, cold_page_size=4, hot_start=14, hot_len=3, start_pos=16
    )
    check_tiered(u, hot_rows=3, cold_rows=16, seed=23, cold_page_table=table)


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("start_pos", [4, 5, 6, 12])
def test_tiered_sliding_window(quantized: bool, start_pos: int) -> None:
    # w = 5: start_pos 4 (w-1), 5 (w), 6 (w+1), 12 (cold keys 0..7 hidden)
    u = tiered_u(quantized, sliding_window=5, start_pos=start_pos)
    check_tiered(u, hot_rows=5, cold_rows=6, seed=start_pos, quantized=quantized)


@pytest.mark.parametrize("masked_row", ["mean_v", "zero"])
def test_tiered_softcap_with_large_logits(masked_row: str) -> None:
    u = tiered_u(attn_softcap=30.0, scale=1.0)
    got = check_tiered(u, hot_rows=5, cold_rows=6, seed=24, gain=30.0, masked_row=masked_row)
    assert np.all(np.isfinite(got))


def test_tiered_large_logits_without_softcap() -> None:
    u = tiered_u(cold_len=10, hot_start=10, hot_len=6, start_pos=15)
    rng = np.random.default_rng(25)
    args = random_tiered(rng, u, 6, 10, gain=30.0)
    q, k_cold = args[0].astype(np.float64), args[3].astype(np.float64)
    assert np.abs(q[0] @ k_cold[:, 0, :].T * u["scale"]).max() > 500
    got = tiered_attention(u, *args)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, naive_tiered(u, *args), **TIGHT)
    assert np.all(np.isfinite(tiered_attention(u, *args, compute_dtype=np.float32)))


@pytest.mark.parametrize("masked_row", ["mean_v", "zero"])
@pytest.mark.parametrize("quantized", [False, True])
def test_tiered_fully_masked_row_contracts(masked_row: str, quantized: bool) -> None:
    # w = 2 at position 20 hides everything before 19: cold 0..3 and hot 5..7 are all masked
    u = tiered_u(quantized, cold_len=4, hot_start=5, hot_len=3, start_pos=20, sliding_window=2)
    rng = np.random.default_rng(26)
    q, k_hot, v_hot, k_cold, v_cold = random_tiered(rng, u, 3, 4)
    got = tiered_attention(
        u, q, k_hot, v_hot, k_cold, v_cold, masked_row=masked_row, quantized=quantized
    )
    expected = naive_tiered(
        u, q, k_hot, v_hot, k_cold, v_cold, masked_row=masked_row, quantized=quantized
    )
    np.testing.assert_allclose(got, expected, **TIGHT)
    if masked_row == "zero":
        assert np.all(got == 0)
    else:  # plain mean of V over all 7 keys, per query head's KV head
        all_v = np.concatenate([v_cold, v_hot]).astype(np.float64)
        by_head = all_v.mean(axis=0)[[0, 0, 1, 1]]
        np.testing.assert_allclose(got, by_head, **TIGHT)


def test_tiered_partially_masked_row_is_the_same_in_both_contracts() -> None:
    u = tiered_u(sliding_window=3, start_pos=9)  # sees keys 7..9 only
    rng = np.random.default_rng(27)
    args = random_tiered(rng, u, 5, 6)
    mean_v = tiered_attention(u, *args, masked_row="mean_v")
    zero = tiered_attention(u, *args, masked_row="zero")
    np.testing.assert_array_equal(mean_v, zero)
    np.testing.assert_allclose(mean_v, naive_tiered(u, *args), **TIGHT)


@pytest.mark.parametrize("masked_row", ["mean_v", "zero"])
def test_tiered_empty_kv_writes_zero(masked_row: str) -> None:
    u = tiered_u(cold_len=0, hot_len=0)
    got = check_tiered(u, hot_rows=1, cold_rows=1, seed=28, masked_row=masked_row)
    assert np.all(got == 0)


@pytest.mark.parametrize(("cold_len", "hot_len"), [(1, 0), (0, 1)])
def test_tiered_length_one_kv(cold_len: int, hot_len: int) -> None:
    u = tiered_u(cold_len=cold_len, hot_len=hot_len, hot_start=cold_len, start_pos=cold_len)
    rng = np.random.default_rng(29)
    q, k_hot, v_hot, k_cold, v_cold = random_tiered(rng, u, 1, 1)
    got = tiered_attention(u, q, k_hot, v_hot, k_cold, v_cold)
    only_v = (v_cold if cold_len else v_hot)[0].astype(np.float64)[[0, 0, 1, 1]]
    np.testing.assert_allclose(got, only_v, **TIGHT)


def test_tiered_accepts_rank_three_query() -> None:
    u = tiered_u()
    rng = np.random.default_rng(30)
    q, *kv = random_tiered(rng, u, 5, 6)
    flat = tiered_attention(u, q, *kv)
    batched = tiered_attention(u, q[None], *kv)
    assert flat.shape == (4, 8) and batched.shape == (1, 4, 8)
    np.testing.assert_array_equal(batched[0], flat)


@pytest.mark.parametrize("bits", [8, 4])
def test_tiered_on_dequantized_cold_tier(bits: int) -> None:
    u = tiered_u(True, cold_len=9, hot_start=9, hot_len=4, hot_window=6, start_pos=12)
    rng = np.random.default_rng(31)
    q, k_hot, v_hot, k_cold, v_cold = random_tiered(rng, u, 6, 9)
    k_deq = dequantize_kv(quantize_kv(k_cold, bits))
    v_deq = dequantize_kv(quantize_kv(v_cold, bits))
    got = tiered_attention(u, q, k_hot, v_hot, k_deq, v_deq, quantized=True)
    expected = naive_tiered(u, q, k_hot, v_hot, k_deq, v_deq, quantized=True)
    np.testing.assert_allclose(got, expected, **TIGHT)


def test_tiered_float32_mode_close_to_float64() -> None:
    u = tiered_u(cold_len=20, hot_start=20, hot_len=8, hot_window=8, hot_layout=1, start_pos=27)
    rng = np.random.default_rng(32)
    args = random_tiered(rng, u, 8, 20)
    ref = tiered_attention(u, *args)
    f32 = tiered_attention(u, *args, compute_dtype=np.float32)
    assert f32.dtype == np.float32
    assert not np.array_equal(f32, ref)
    np.testing.assert_allclose(f32, ref, rtol=1e-5, atol=1e-6)


# --- tiered: argument checks ------------------------------------------------------------------


def test_tiered_rejects_inconsistent_arguments() -> None:
    u = tiered_u()
    q, k_hot, v_hot, k_cold, v_cold = random_tiered(np.random.default_rng(0), u, 5, 6)
    kv = (k_hot, v_hot, k_cold, v_cold)
    with pytest.raises(ValueError, match="q must have shape"):
        tiered_attention(u, q[:, :4], *kv)
    with pytest.raises(ValueError, match="k_cold must have shape"):
        tiered_attention(u, q, k_hot, v_hot, k_cold[:, :1], v_cold)
    with pytest.raises(ValueError, match="not divisible"):
        tiered_attention(tiered_u(num_kv_heads=3), q, *kv)
    with pytest.raises(ValueError, match="v_hot: physical row 5"):
        tiered_attention(
            tiered_u(hot_len=6), q, np.concatenate([k_hot, k_hot]), v_hot, k_cold, v_cold
        )
    with pytest.raises(ValueError, match="k_hot: physical row 5"):
        tiered_attention(tiered_u(hot_len=6), q, *kv)
    with pytest.raises(ValueError, match="too short"):
        tiered_attention(
            tiered_u(cold_layout=2, cold_page_size=2),
            q,
            *kv,
            cold_page_table=np.array([0, 1], np.uint32),
        )
    with pytest.raises(ValueError, match="needs cold_page_table"):
        tiered_attention(tiered_u(cold_layout=2, cold_page_size=2), q, *kv)
    with pytest.raises(ValueError, match="no cold page table"):
        tiered_attention(tiered_u(True), q, *kv, quantized=True, cold_page_table=np.arange(3))
    with pytest.raises(ValueError, match="missing: 'cold_page_size', 'cold_layout', 'hot_layout'"):
        tiered_attention(tiered_u(True), q, *kv)
    with pytest.raises(ValueError, match="masked_row"):
        tiered_attention(u, q, *kv, masked_row="nan")
