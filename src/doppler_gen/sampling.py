"""Sampled comparison: judge a large output on a deterministic sample of its (query, head) rows.

At model sizes (thousands of queries, 32-64 heads, 8k keys) a float64 reference of *every* row
costs far more than the kernel on the GPU. The kernel still computes the whole output; only the
comparison is sampled:

* the sample is the cross product of a set of query indices and a set of head indices, each
  drawn deterministically from the case's seed, stratified over the whole range (one random
  index in each of ``count`` equal strata) and always holding the first and the last index, so a
  bug confined to high heads, late queries or the first row cannot hide between samples;
* every element of the output is still checked for NaN/Inf: outputs are NaN-poisoned before the
  dispatch, so an element the kernel never wrote is caught even outside the sample;
* small problems (at most ``FULL_WORK`` (query, head, key) triples, i.e. 256 rows of 2048 keys)
  are compared in full: sampling is only a cost cap.

Pure functions on numpy arrays: no device, no reference, no case types.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from doppler_gen.tolerance import Verdict, judge

FULL_WORK = 256 * 2048
"""Problems with at most this many (query, head, key) triples are compared in full."""

SAMPLE_QUERIES = 24
SAMPLE_HEADS = 8
"""Rows compared in a sampled case: up to SAMPLE_QUERIES queries x SAMPLE_HEADS heads."""


@dataclass(frozen=True)
class RowSample:
    """The (query, head) rows a comparison covers: the cross product of two index sets."""

    queries: np.ndarray  # sorted unique query indices (tiered: always [0])
    heads: np.ndarray  # sorted unique head indices

    def describe(self, query_len: int, num_heads: int) -> str:
        return (
            f"sampled {self.queries.size}/{query_len} queries x {self.heads.size}/{num_heads} heads"
        )


def spread_indices(n: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """Up to ``count`` sorted indices of ``range(n)``: 0, n-1 and one random index per stratum.

    ``count >= n`` returns every index. The strata cover ``[0, n)`` evenly, so the sample spans
    the whole range whatever the seed.
    """
    if n <= 0:
        return np.zeros(0, np.int64)
    if count >= n:
        return np.arange(n, dtype=np.int64)
    inner = max(count - 2, 0)
    edges = np.linspace(0, n, inner + 1).astype(np.int64) if inner else np.zeros(1, np.int64)
    picks = [rng.integers(lo, max(hi, lo + 1)) for lo, hi in itertools.pairwise(edges)]
    chosen = {0, n - 1, *(int(p) for p in picks)}
    return np.array(sorted(i for i in chosen if 0 <= i < n), dtype=np.int64)


def choose_sample(
    query_len: int,
    num_heads: int,
    seed: int,
    *,
    keys: int = 2048,
    full_work: int = FULL_WORK,
    queries: int = SAMPLE_QUERIES,
    heads: int = SAMPLE_HEADS,
) -> RowSample | None:
    """The rows to compare for an output of ``query_len`` x ``num_heads`` rows over ``keys``
    keys; None: all of them (the reference costs rows x keys).

    Deterministic in ``seed`` (the case seed), so a failure reproduces with the same rows.
    """
    if query_len * num_heads * max(keys, 1) <= full_work:
        return None
    rng = np.random.default_rng([seed, query_len, num_heads])
    return RowSample(spread_indices(query_len, queries, rng), spread_indices(num_heads, heads, rng))


def sampled_rows(output: np.ndarray, sample: RowSample | None) -> np.ndarray:
    """The sampled rows of an output laid out ``[query, head, d]`` (tiled) or ``[head, d]``.

    The result has the reference's sampled shape: ``[queries, heads, d]`` or ``[heads, d]``.
    """
    if sample is None:
        return output
    if output.ndim == 2:
        return output[sample.heads]
    return output[np.ix_(sample.queries, sample.heads)]


def _full_index(index: tuple[int, ...], sample: RowSample | None, ndim: int) -> tuple[int, ...]:
    """Map an index into the sampled rows back to the full output."""
    if sample is None or not index:
        return index
    if ndim == 2:
        return (int(sample.heads[index[0]]), index[1])
    return (int(sample.queries[index[0]]), int(sample.heads[index[1]]), index[2])


def judge_sampled(
    output: np.ndarray,
    reference_rows: np.ndarray,
    sample: RowSample | None,
    tolerance: float,
    policy: str,
) -> Verdict:
    """Judge ``output`` against a reference of its sampled rows; NaN/Inf is checked everywhere.

    The verdict's ``worst_index`` is in full-output coordinates; a non-finite element anywhere
    fails the case (its first such index is reported when it lies outside the sample).
    """
    out = np.asarray(output, np.float64)
    if sample is not None:
        policy = f"{policy}; {sample.describe(*_rows_of(out))}"
    verdict = judge(sampled_rows(out, sample), reference_rows, tolerance, policy)
    worst = _full_index(verdict.worst_index, sample, out.ndim)
    non_finite = int(out.size - np.isfinite(out).sum())
    if sample is None or non_finite == verdict.non_finite:
        return _with(verdict, worst, non_finite)
    first_bad = tuple(int(i) for i in np.argwhere(~np.isfinite(out))[0])
    return Verdict(
        False,
        float("inf"),
        float("inf"),
        tolerance,
        first_bad,
        non_finite,
        policy,
    )


def _rows_of(out: np.ndarray) -> tuple[int, int]:
    return (1, out.shape[0]) if out.ndim == 2 else (out.shape[0], out.shape[1])


def _with(verdict: Verdict, worst: tuple[int, ...], non_finite: int) -> Verdict:
    return Verdict(
        verdict.passed and non_finite == 0,
        verdict.max_abs_error,
        verdict.max_rel_error,
        verdict.tolerance,
        worst,
        non_finite,
        verdict.policy,
    )
