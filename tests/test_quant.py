"""Tests for the cold-tier KV quantizer: numeric contract and the exact bit layout.

The layout constants below were worked out by hand from DESIGN-NOTES §1.2 (lane ``d % per_word``
at bit ``bits * lane``, two's complement), not produced by the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO_ROOT
from gpu_support import adapter_problem

from doppler_gen.backends import get_backend, select_adapter
from doppler_gen.config import load_project
from doppler_gen.families import quant
from doppler_gen.families.quant import (
    QuantizedKV,
    dequantize_kv,
    pack_signed,
    packed_stride_for,
    quantize_kv,
    unpack_signed,
)
from doppler_gen.render import Renderer

BITS = [8, 4]
QMAX = {8: 127, 4: 7}
F16_TINY = 2.0**-24


def _ints_from_packed(q: QuantizedKV) -> np.ndarray:
    rows = q.packed.reshape(-1, q.packed_stride)
    return unpack_signed(rows, q.bits, q.head_dim).reshape(-1, q.num_kv_heads, q.head_dim)


# --- strides ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head_dim", "bits", "expected"),
    [(64, 8, 16), (5, 8, 2), (4, 8, 1), (1, 8, 1), (64, 4, 8), (8, 4, 1), (9, 4, 2), (10, 4, 2)],
)
def test_packed_stride_for(head_dim: int, bits: int, expected: int) -> None:
    assert packed_stride_for(head_dim, bits) == expected


@pytest.mark.parametrize("bits", [0, 3, 16, 32, True, "8"])
def test_unsupported_bits_rejected(bits: object) -> None:
    with pytest.raises(ValueError, match="bits must be one of"):
        packed_stride_for(8, bits)  # type: ignore[arg-type]


def test_packed_stride_for_rejects_empty_head() -> None:
    with pytest.raises(ValueError, match="head_dim"):
        packed_stride_for(0, 8)


# --- bit layout, by hand ----------------------------------------------------------------------


def test_int8_layout_full_range() -> None:
    # lanes 0..3 = 0x01, 0xFF (-1), 0x7F (127), 0x80 (-128)
    words = pack_signed(np.array([1, -1, 127, -128]), 8, 1)
    assert words.dtype == np.uint32
    assert words.tolist() == [0x807FFF01]


def test_int8_layout_ragged_and_padded_stride() -> None:
    # head_dim 6 needs 2 words; stride 3 adds a zero word. -2 = 0xFE, 5 = 0x05.
    words = pack_signed(np.array([1, 2, 3, 4, -2, 5]), 8, 3)
    assert words.tolist() == [0x04030201, 0x000005FE, 0x00000000]


def test_int4_layout_full_range() -> None:
    # nibbles low to high: 1, F (-1), 7, 8 (-8), 0, 2, E (-2), 3
    words = pack_signed(np.array([1, -1, 7, -8, 0, 2, -2, 3]), 4, 1)
    assert words.tolist() == [0x3E2087F1]


def test_int4_layout_ragged_and_padded_stride() -> None:
    # head_dim 10: word 0 holds 8 values, word 1 two (-7 = 9, -3 = D), word 2 is padding.
    words = pack_signed(np.array([1, 2, 3, 4, 5, 6, 7, -8, -7, -3]), 4, 3)
    assert words.tolist() == [0x87654321, 0x000000D9, 0x00000000]


def test_pack_keeps_leading_axes() -> None:
    values = np.array([[[1, -1, 127, -128]], [[0, 0, 0, 1]]])
    words = pack_signed(values, 8, 2)
    assert words.shape == (2, 1, 2)
    assert words.tolist() == [[[0x807FFF01, 0]], [[0x01000000, 0]]]


@pytest.mark.parametrize("bits", BITS)
def test_unpack_inverts_pack_over_full_range(bits: int) -> None:
    rng = np.random.default_rng(bits)
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    values = rng.integers(lo, hi + 1, size=(3, 5, 13))
    values[0, 0, :2] = [lo, hi]
    stride = packed_stride_for(13, bits) + 1
    words = pack_signed(values, bits, stride)
    unpacked = unpack_signed(words, bits, 13)
    assert unpacked.dtype == np.int32
    np.testing.assert_array_equal(unpacked, values)


def test_unpack_sign_extends_by_hand() -> None:
    assert unpack_signed(np.array([0x807FFF01], dtype=np.uint32), 8, 4).tolist() == [
        1,
        -1,
        127,
        -128,
    ]
    assert unpack_signed(np.array([0x3E2087F1], dtype=np.uint32), 4, 8).tolist() == [
        1,
        -1,
        7,
        -8,
        0,
        2,
        -2,
        3,
    ]


def test_quantizer_writes_hand_computed_int8_word() -> None:
    # max|x| = 127 -> scale 1.0; halves round to even: 62.5 -> 62, 63.5 -> 64.
    # bytes 0x7F, 0x81 (-127), 0x3E (62), 0x40 (64)
    q = quantize_kv(np.array([[[127.0, -127.0, 62.5, 63.5]]]), 8)
    assert q.scales.tolist() == [1.0]
    assert q.packed.tolist() == [0x403E817F]


def test_quantizer_writes_hand_computed_int4_word() -> None:
    # max|x| = 7 -> scale 1.0; q = 7, -7 (9), 2, 0 (-0.5 -> -0 -> 0), 4, 0, 0, 1
    q = quantize_kv(np.array([[[7.0, -7.0, 2.5, -0.5, 3.5, 0.0, 0.0, 1.0]]]), 4)
    assert q.scales.tolist() == [1.0]
    assert q.packed.tolist() == [0x10040297]


def test_new_width_is_one_table_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(quant.QUANT_BITS, "int2", 2)
    # lanes 01, 11 (-1), 00, 10 (-2) at bits 0, 2, 4, 6 -> 0b10001101
    assert pack_signed(np.array([1, -1, 0, -2]), 2, 1).tolist() == [0x8D]
    assert packed_stride_for(17, 2) == 2
    x = np.array([[[1.0, -1.0, 0.2, -0.7, 0.0]]])
    np.testing.assert_array_equal(dequantize_kv(quantize_kv(x, 2)), [[[1.0, -1.0, 0.0, -1.0, 0]]])


# --- numeric contract -------------------------------------------------------------------------


@pytest.mark.parametrize("bits", BITS)
def test_round_trip_error_within_half_a_step(bits: int) -> None:
    rng = np.random.default_rng(100 + bits)
    magnitudes = 10.0 ** rng.uniform(-3, 3, size=(7, 3, 1))
    x = (rng.standard_normal((7, 3, 20)) * magnitudes).astype(np.float16)
    q = quantize_kv(x, bits)
    restored = dequantize_kv(q)
    assert restored.dtype == np.float64
    assert restored.shape == x.shape
    scales = q.scales.astype(np.float64).reshape(7, 3, 1)
    error = np.abs(restored - x.astype(np.float64))
    assert np.all(error <= scales / 2 * (1 + 1e-12))


@pytest.mark.parametrize("bits", BITS)
def test_values_on_the_grid_round_trip_exactly(bits: int) -> None:
    rng = np.random.default_rng(200 + bits)
    qmax = QMAX[bits]
    ints = rng.integers(-qmax, qmax + 1, size=(5, 2, 11))
    ints[..., 3] = np.where(rng.random((5, 2)) < 0.5, qmax, -qmax)  # pins max|x| = qmax * s
    scales = rng.uniform(0.01, 4.0, size=(5, 2, 1)).astype(np.float16).astype(np.float64)
    x = ints * scales
    q = quantize_kv(x, bits)
    np.testing.assert_array_equal(q.scales.reshape(5, 2, 1), scales)
    np.testing.assert_array_equal(_ints_from_packed(q), ints)
    np.testing.assert_array_equal(dequantize_kv(q), x)


@pytest.mark.parametrize("bits", BITS)
def test_zero_rows_get_unit_scale_and_decode_to_zero(bits: int) -> None:
    x = np.zeros((3, 2, 6))
    x[1, 0] = [0.5, -1.0, 0, 0, 0, 0.25]
    q = quantize_kv(x, bits)
    scales = q.scales.reshape(3, 2)
    assert scales[0, 0] == 1.0 and scales[2, 1] == 1.0 and scales[1, 1] == 1.0
    assert scales[1, 0] == np.float16(1.0 / QMAX[bits])
    restored = dequantize_kv(q)
    assert np.all(restored[0] == 0) and np.all(restored[1, 1] == 0) and np.all(restored[2] == 0)


def test_scales_are_indexed_token_major() -> None:
    tokens, heads = 4, 3
    x = np.zeros((tokens, heads, 5))
    for t in range(tokens):
        for h in range(heads):
            x[t, h, 2] = (t * heads + h + 1) * 127 / 16  # scale (t*heads + h + 1) / 16
    q = quantize_kv(x, 8)
    np.testing.assert_array_equal(q.scales, np.arange(1, tokens * heads + 1) / 16)
    assert q.scales.dtype == np.float16


@pytest.mark.parametrize("bits", BITS)
def test_clamps_at_qmax_when_f16_scale_rounds_down(bits: int) -> None:
    # max|x| / qmax = 1.4 * 2**-24 rounds to the f16 subnormal 2**-24, so x / scale = 1.4 * qmax
    # and only the clamp keeps q inside [-qmax, qmax].
    qmax = QMAX[bits]
    peak = qmax * 1.4 * F16_TINY
    x = np.array([[[peak, -peak, 0.0, peak / 2]]])
    q = quantize_kv(x, bits)
    assert q.scales.tolist() == [F16_TINY]
    ints = _ints_from_packed(q)
    assert ints[0, 0, :2].tolist() == [qmax, -qmax]
    assert ints.min() >= -qmax and ints.max() <= qmax


@pytest.mark.parametrize("bits", BITS)
def test_quantizer_never_emits_most_negative_value(bits: int) -> None:
    rng = np.random.default_rng(300 + bits)
    x = rng.standard_normal((50, 2, 16))
    ints = _ints_from_packed(quantize_kv(x, bits))
    assert ints.min() >= -QMAX[bits]
    assert ints.max() <= QMAX[bits]


def test_scale_that_underflows_f16_is_kept_positive() -> None:
    q = quantize_kv(np.array([[[1e-12, -1e-13]]]), 8)
    assert q.scales.tolist() == [F16_TINY]
    assert np.all(dequantize_kv(q) == 0)


@pytest.mark.parametrize("bits", BITS)
def test_larger_packed_stride_pads_with_zero_words(bits: int) -> None:
    rng = np.random.default_rng(400 + bits)
    x = rng.standard_normal((3, 2, 9))
    tight = quantize_kv(x, bits)
    padded = quantize_kv(x, bits, packed_stride=tight.packed_stride + 2)
    rows = padded.packed.reshape(6, padded.packed_stride)
    assert padded.packed.size == 3 * 2 * (tight.packed_stride + 2)
    assert np.all(rows[:, tight.packed_stride :] == 0)
    np.testing.assert_array_equal(rows[:, : tight.packed_stride].reshape(-1), tight.packed)
    np.testing.assert_array_equal(dequantize_kv(padded), dequantize_kv(tight))


def test_quantized_kv_fields() -> None:
    q = quantize_kv(np.ones((4, 2, 10)), 4)
    assert (q.bits, q.num_kv_heads, q.head_dim, q.packed_stride, q.tokens) == (4, 2, 10, 2, 4)
    assert q.packed.dtype == np.uint32 and q.packed.shape == (4 * 2 * 2,)
    assert q.scales.dtype == np.float16 and q.scales.shape == (8,)


# --- argument checks --------------------------------------------------------------------------


def test_quantize_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="tokens, num_kv_heads, head_dim"):
        quantize_kv(np.ones((4, 8)), 8)
    with pytest.raises(ValueError, match="non-finite"):
        quantize_kv(np.array([[[1.0, np.nan]]]), 8)
    with pytest.raises(ValueError, match="non-finite"):
        quantize_kv(np.array([[[1.0, np.inf]]]), 4)
    with pytest.raises(ValueError, match="bits must be one of"):
        quantize_kv(np.ones((1, 1, 4)), 3)
    with pytest.raises(ValueError, match="packed_stride=1 is too small"):
        quantize_kv(np.ones((1, 1, 5)), 8, packed_stride=1)
    with pytest.raises(ValueError, match="f16 range"):
        quantize_kv(np.array([[[1e7, 0.0]]]), 8)


def test_pack_and_unpack_reject_bad_input() -> None:
    with pytest.raises(ValueError, match=r"\[-128, 127\]"):
        pack_signed(np.array([128]), 8, 1)
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        pack_signed(np.array([-9]), 4, 1)
    with pytest.raises(ValueError, match="integer array"):
        pack_signed(np.array([1.0]), 8, 1)
    with pytest.raises(ValueError, match="too small"):
        pack_signed(np.zeros(9, dtype=np.int8), 4, 1)
    with pytest.raises(ValueError, match="too small"):
        unpack_signed(np.zeros(1, dtype=np.uint32), 8, 5)
    with pytest.raises(ValueError, match="u32"):
        unpack_signed(np.array([2**32]), 8, 4)


def test_dequantize_rejects_inconsistent_container() -> None:
    good = quantize_kv(np.ones((2, 2, 8)), 8)
    bad = QuantizedKV(
        packed=good.packed[:-1],
        scales=good.scales,
        bits=8,
        num_kv_heads=2,
        head_dim=8,
        packed_stride=good.packed_stride,
    )
    with pytest.raises(ValueError, match="packed must be flat"):
        dequantize_kv(bad)


# --- the kernels' decode, on the adapter ------------------------------------------------------

DECODE_KERNEL = """
{% import "lib/cold_tier.wgsl.j2" as cold_tier %}
@group(0) @binding(0) var<storage, read> words: array<u32>;
@group(0) @binding(1) var<storage, read_write> values: array<f32>;

{{ cold_tier.unpack_quant(cold) }}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i >= arrayLength(&words)) {
        return;
    }
{% for first in range(0, 32 // QUANT_BITS[cold], 4) %}
    let v{{ first }} = unpack_quant_{{ first }}(words[i]);
{% for c in range(4) %}
    values[i * {{ 32 // QUANT_BITS[cold] }}u + {{ first + c }}u] = v{{ first }}[{{ c }}];
{% endfor %}
{% endfor %}
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("cold", ["int8", "int4"])
def test_kernel_decode_of_every_value_at_every_lane(cold: str) -> None:
    """The templates' unpack_quant_<first> (mask in place, OR into 2^23, one exact fma) decodes
    every two's-complement value, the most negative included (the quantizer never writes it, a
    host may), at every lane of a word, bit for bit as the numpy unpacker does."""
    problem = adapter_problem()
    if problem is not None:
        pytest.skip(problem)
    bits = quant.QUANT_BITS[cold]
    per_word = 32 // bits
    low = -(2 ** (bits - 1))
    span = np.arange(low, -low)
    # every value at every lane: lane k of word j holds value (j + 5 k) mod 2^bits, and
    # random words besides
    lanes = np.arange(per_word)
    ints = span[(np.arange(span.size)[:, None] + 5 * lanes[None, :]) % span.size]
    rng = np.random.default_rng(7)
    ints = np.concatenate([ints, rng.integers(low, -low, size=(4096, per_word))])
    words = pack_signed(ints, bits, 1).reshape(-1).astype(np.uint32)
    wgsl = Renderer(load_project(REPO_ROOT)).env.from_string(DECODE_KERNEL).render(cold=cold)
    backend = get_backend("wgpu")
    with backend.open_device(select_adapter(backend.adapters(), None), limits={}) as dev:
        pipeline = dev.compile(wgsl, label=f"decode {cold}")
        src = dev.storage_buffer(words.tobytes(), label="words")
        poisoned = np.full(ints.size, np.nan, np.float32)  # a value never written stays NaN
        out = dev.storage_buffer(poisoned, read_write=True, label="values")
        dev.dispatch(pipeline, {0: src, 1: out}, ((words.size + 63) // 64, 1, 1))
        got = np.frombuffer(dev.read_buffer(out), np.float32)[: ints.size].reshape(ints.shape)
    np.testing.assert_array_equal(got, ints.astype(np.float32))
    np.testing.assert_array_equal(unpack_signed(words.reshape(-1, 1), bits, per_word), ints)
