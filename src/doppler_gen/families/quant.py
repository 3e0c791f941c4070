"""The host-side KV quantizer that produces a tiered kernel's cold tier, and its exact inverse.

The quantized tiered kernels (``attention_decode_tiered_int{8,4}_f16kv``) read the cold tier as
signed integers packed into u32 words plus one f16 scale per (token, kv_head). This module writes
that data the way the kernels read it (DESIGN-NOTES §1.2), so the validator can feed a kernel
packed words and give the float64 reference the *same* dequantized values: kernel error is then
judged apart from quantization error.

Layout, for ``bits`` in :data:`QUANT_BITS` (``per_word = 32 // bits`` values a word):

* scale of (token, kv_head) at ``token * num_kv_heads + kv_head`` (f16);
* value ``d`` of that row in word ``(token * num_kv_heads + kv_head) * packed_stride
  + d // per_word``, lane ``d % per_word`` at bit offset ``bits * lane``, two's complement;
* lanes past ``head_dim`` in the last word, and words past it up to ``packed_stride``, are 0.

Everything is derived from ``bits`` alone, so a new width (say ``"int2": 2``) is one more entry in
:data:`QUANT_BITS`, provided it divides 32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from doppler_gen.formats import QUANT_BITS

_WORD_BITS = 32
_F16_MAX = float(np.finfo(np.float16).max)
_F16_TINY = float(np.float16(2.0**-24))  # smallest positive (subnormal) f16


@dataclass(frozen=True, eq=False)
class QuantizedKV:
    """One quantized K or V cold tier, exactly as the kernel's buffers hold it.

    ``eq=False`` because field-wise ``==`` on numpy arrays is ambiguous; compare the arrays.
    """

    packed: np.ndarray  # uint32, flat, tokens * num_kv_heads * packed_stride words
    scales: np.ndarray  # float16, flat, index token * num_kv_heads + kv_head
    bits: int
    num_kv_heads: int
    head_dim: int
    packed_stride: int  # u32 words per (token, kv_head) row

    @property
    def tokens(self) -> int:
        """Number of token positions, derived from the scale count (one per token and head)."""
        return self.scales.size // self.num_kv_heads


def _check_bits(bits: int) -> int:
    """Refuse widths the kernels have no variant for; every other function relies on this."""
    supported = sorted(set(QUANT_BITS.values()))
    if isinstance(bits, bool) or not isinstance(bits, int | np.integer) or bits not in supported:
        raise ValueError(f"bits must be one of {supported} (QUANT_BITS), got {bits!r}")
    if _WORD_BITS % bits != 0:
        raise ValueError(f"bits={bits} does not divide a {_WORD_BITS}-bit word")
    return int(bits)


def qmax_for(bits: int) -> int:
    """Largest magnitude the quantizer emits: symmetric, so -2**(bits-1) is never produced."""
    return 2 ** (_check_bits(bits) - 1) - 1


def _values_per_word(bits: int) -> int:
    return _WORD_BITS // bits


def packed_stride_for(head_dim: int, bits: int) -> int:
    """Minimum u32 words per (token, kv_head) row: what the host passes as ``packed_stride``."""
    bits = _check_bits(bits)
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1, got {head_dim}")
    per_word = _values_per_word(bits)
    return (head_dim + per_word - 1) // per_word


def _resolve_stride(head_dim: int, bits: int, packed_stride: int | None) -> int:
    """A larger stride is allowed (padded rows); a smaller one would overlap rows."""
    needed = packed_stride_for(head_dim, bits)
    if packed_stride is None:
        return needed
    if packed_stride < needed:
        raise ValueError(
            f"packed_stride={packed_stride} is too small: head_dim={head_dim} at {bits} bits "
            f"needs at least {needed} u32 words a row"
        )
    return int(packed_stride)


def pack_signed(values: np.ndarray, bits: int, packed_stride: int) -> np.ndarray:
    """Pack signed ints ``[..., head_dim]`` into u32 words ``[..., packed_stride]``.

    Accepts the full two's complement range ``[-2**(bits-1), 2**(bits-1) - 1]`` (the quantizer
    never emits the most negative value, but the kernel's sign extension decodes it, so the
    packer must be able to write it for layout tests).
    """
    bits = _check_bits(bits)
    values = np.asarray(values)
    if values.ndim < 1 or not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"values must be an integer array [..., head_dim], got {values.dtype}")
    head_dim = values.shape[-1]
    stride = _resolve_stride(head_dim, bits, packed_stride)
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if values.size and (int(values.min()) < lo or int(values.max()) > hi):
        raise ValueError(f"values must lie in [{lo}, {hi}] for {bits}-bit packing")
    wide = values.astype(np.int64)
    per_word = _values_per_word(bits)
    lanes = np.zeros((*values.shape[:-1], stride * per_word), dtype=np.uint64)
    lanes[..., :head_dim] = (wide & ((1 << bits) - 1)).astype(np.uint64)
    lanes = lanes.reshape(*values.shape[:-1], stride, per_word)
    shifts = (np.arange(per_word, dtype=np.uint64) * np.uint64(bits)).astype(np.uint64)
    words = np.bitwise_or.reduce(lanes << shifts, axis=-1)
    return words.astype(np.uint32)


def unpack_signed(words: np.ndarray, bits: int, head_dim: int) -> np.ndarray:
    """Inverse of :func:`pack_signed`: u32 ``[..., packed_stride]`` to int32 ``[..., head_dim]``.

    Shift, mask and sign-extend each lane: the integers the kernels' decode (mask in place,
    offset binary, one exact fma; templates/lib/cold_tier.wgsl.j2) must reproduce.
    """
    bits = _check_bits(bits)
    words = np.asarray(words)
    if words.ndim < 1 or not np.issubdtype(words.dtype, np.integer):
        raise ValueError(f"words must be an integer array [..., packed_stride], got {words.dtype}")
    if words.size and (words.min() < 0 or words.max() > 0xFFFFFFFF):
        raise ValueError("words must be u32 values in [0, 2**32)")
    _resolve_stride(head_dim, bits, words.shape[-1])
    per_word = _values_per_word(bits)
    shifts = np.arange(per_word, dtype=np.uint64) * np.uint64(bits)
    lanes = (words.astype(np.uint64)[..., None] >> shifts) & np.uint64((1 << bits) - 1)
    lanes = lanes.reshape(*words.shape[:-1], words.shape[-1] * per_word)[..., :head_dim]
    raw = lanes.astype(np.int64)
    signed = np.where(raw >= 2 ** (bits - 1), raw - 2**bits, raw)
    return signed.astype(np.int32)


def _f16_scales(absmax: np.ndarray, qmax: int) -> np.ndarray:
    """Per-row f16 scale = absmax / qmax rounded to nearest f16; 1 for an all-zero row.

    A tiny nonzero row whose scale would round to 0 gets the smallest positive f16 instead, so
    dividing by it stays finite (its values then clamp at ±qmax or round to small ints). A scale
    above the f16 range cannot be stored at all, so it is refused.
    """
    with np.errstate(over="ignore"):
        scales = (absmax / qmax).astype(np.float16)
    if np.any(np.isinf(scales)):
        raise ValueError(
            f"max|x| = {float(absmax.max()):.6g} needs a scale beyond the f16 range "
            f"(max|x| may be at most about {_F16_MAX * qmax:.6g} for qmax={qmax})"
        )
    scales = np.where(absmax == 0, np.float16(1.0), scales)
    return np.where(scales == 0, np.float16(_F16_TINY), scales).astype(np.float16)


def quantize_kv(x: np.ndarray, bits: int, *, packed_stride: int | None = None) -> QuantizedKV:
    """Quantize ``x`` ``[tokens, num_kv_heads, head_dim]`` to one cold tier (symmetric, per row).

    ``q = round(clamp(x / scale_f16, -qmax, qmax))`` divides by the *f16-rounded* scale, so
    ``q * scale_f16`` (what the kernel computes) is the closest grid value to ``x``. Rounding is
    half-to-even (``np.rint``); upstream's JS ``Math.round`` rounds halves up, which differs only
    on exact ties, and either result is a valid quantization since the reference consumes the
    dequantized values, not ``x``.
    """
    bits = _check_bits(bits)
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"x must be [tokens, num_kv_heads, head_dim], got shape {x.shape}")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"x must be a real numeric array, got {x.dtype}")
    _tokens, num_kv_heads, head_dim = x.shape
    if num_kv_heads < 1 or head_dim < 1:
        raise ValueError(f"num_kv_heads and head_dim must be >= 1, got shape {x.shape}")
    x64 = x.astype(np.float64)
    if not np.all(np.isfinite(x64)):
        raise ValueError("x contains non-finite values (nan or inf); they cannot be quantized")
    stride = _resolve_stride(head_dim, bits, packed_stride)
    qmax = qmax_for(bits)
    absmax = np.max(np.abs(x64), axis=-1, initial=0.0)
    scales = _f16_scales(absmax, qmax)
    q = np.rint(np.clip(x64 / scales.astype(np.float64)[..., None], -qmax, qmax))
    packed = pack_signed(q.astype(np.int32), bits, stride)
    return QuantizedKV(
        packed=packed.reshape(-1),
        scales=scales.reshape(-1),
        bits=bits,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        packed_stride=stride,
    )


def _check_quantized(q: QuantizedKV) -> None:
    """Catch a hand-built QuantizedKV whose buffers disagree with its own shape fields."""
    _check_bits(q.bits)
    _resolve_stride(q.head_dim, q.bits, q.packed_stride)
    if q.num_kv_heads < 1 or q.scales.ndim != 1 or q.scales.size % q.num_kv_heads:
        raise ValueError(
            f"scales must be flat with a multiple of num_kv_heads={q.num_kv_heads} entries"
        )
    expected = q.tokens * q.num_kv_heads * q.packed_stride
    if q.packed.ndim != 1 or q.packed.size != expected:
        raise ValueError(
            f"packed must be flat with tokens*num_kv_heads*packed_stride = {expected} words, "
            f"got shape {q.packed.shape}"
        )


def dequantize_kv(q: QuantizedKV) -> np.ndarray:
    """Float64 ``[tokens, num_kv_heads, head_dim]``: float64(int value) * float64(f16 scale).

    Both factors are exact in float64 and their product is exact too (at most 8 + 11
    significant bits), so this is the value the kernel's f32 ``f32(q) * f32(scale)`` computes.
    """
    _check_quantized(q)
    rows = q.packed.reshape(q.tokens * q.num_kv_heads, q.packed_stride)
    ints = unpack_signed(rows, q.bits, q.head_dim).astype(np.float64)
    values = ints * q.scales.astype(np.float64)[:, None]
    return values.reshape(q.tokens, q.num_kv_heads, q.head_dim)
