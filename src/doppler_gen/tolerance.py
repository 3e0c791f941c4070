"""Tolerance policy: how far a kernel's output may be from the float64 reference.

The policy depends on the (input, arithmetic, output) dtypes of the variant; the f32 bound is
each family's own (``Family.f32_tolerance``), the f16 policy is shared. Every kernel here
does f32 arithmetic; inputs are rounded to their storage dtype *before* the reference sees them,
and quantized cold tiers reach the reference already dequantized from the very bits the kernel
reads, so input rounding and quantization never count as kernel error.

* f32 output: a rounding-error bound in units of f32 roundoff ``u = 2^-24``. The attention
  families' (``families/attention.py``)::

      tol = max|V| * u * (16 + 2 * sqrt(head_dim) * S + 2 * sqrt(L))

  where ``S`` is the largest ``scale * sum_d |q_d k_d|`` over the (query head, matching KV
  head, key) triples that enter a softmax (bounds every logit and the rounding of its dot
  product, which grows with large logits), ``max|V|`` is taken over those keys, ``L`` is the
  most keys in one row, and
  the factor 2 the softmax's sensitivity to score errors. The sqrt terms are the probabilistic
  form of the classical n*u bounds for n-term sums (rounding errors of independent operations
  add like a random walk; Higham & Mary 2019): the worst-case n*u form is ~10x looser than any
  error a correct kernel shows, and too loose to be called tight. Per-case: 1e-6 to 1e-5 for
  unit-scale problems, more only where the logits are large.
* f16 output: FlashAttention-style. A plain numpy implementation computing in float32 from the
  same rounded inputs and rounding its result to f16 the same way sets the baseline error ``e``;
  the kernel may be at most ``2 * e`` plus a rounding floor of half an f16 ulp of the largest
  output (``2^-11 * max|ref|``).

NaN or Inf anywhere in the output fails regardless (outputs are NaN-poisoned before dispatch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

F32_UNIT_ROUNDOFF = 2.0**-24
F16_UNIT_ROUNDOFF = 2.0**-11


@dataclass(frozen=True)
class Verdict:
    """The comparison of one output with its reference."""

    passed: bool
    max_abs_error: float
    max_rel_error: float
    tolerance: float
    worst_index: tuple[int, ...]
    non_finite: int
    policy: str

    @property
    def ratio(self) -> float:
        """Error as a fraction of the tolerance (> 1 fails; inf where the tolerance is no
        finite positive number, which judges nothing)."""
        if not 0 < self.tolerance < float("inf"):
            return float("inf")
        return self.max_abs_error / self.tolerance


def f16_tolerance(baseline_error: float, ref_max: float) -> float:
    return 2.0 * baseline_error + F16_UNIT_ROUNDOFF * max(ref_max, 1e-30)


def judge(output: np.ndarray, reference: np.ndarray, tolerance: float, policy: str) -> Verdict:
    """Compare ``output`` with ``reference`` (float64) against an absolute tolerance.

    A tolerance that is not a finite number fails the case whatever the output: an infinite
    one (a family's bound scaled by an infinite reference, say) would pass any finite output.
    """
    out = np.asarray(output, np.float64)
    ref = np.asarray(reference, np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"output shape {out.shape} != reference shape {ref.shape}")
    finite = np.isfinite(out)
    non_finite = int(out.size - finite.sum())
    error = np.where(finite, np.abs(out - ref), np.inf)
    if error.size == 0:
        return Verdict(True, 0.0, 0.0, tolerance, (), 0, policy)
    flat = int(np.argmax(error))
    worst = tuple(int(i) for i in np.unravel_index(flat, error.shape))
    max_abs = float(error.reshape(-1)[flat])
    scale = np.maximum(np.abs(ref), 1e-6 * max(float(np.abs(ref).max()), 1e-30))
    rel = float(np.max(error / scale))
    passed = non_finite == 0 and max_abs <= tolerance and math.isfinite(tolerance)
    return Verdict(passed, max_abs, rel, tolerance, worst, non_finite, policy)
