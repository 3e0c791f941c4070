"""Case inputs and references shared by the variants of one process.

Every variant of a family draws a case's tensors from the same seeded generator, so the variants
with the same element types build identical inputs for a spec and get identical float64
references: `validate` of every shipped variant runs 6,219 default-tier cases, of which 1,661
are distinct. Building them and computing the references is about half of a validation's time
once the kernels are compiled, so a family's ``build`` and ``reference`` go through this memo,
keyed by everything they read (the family says what that is).

Sharing must never let one variant's run change another's case:
- arrays are stored read-only, so a write into a shared input or reference raises instead of
  corrupting a later case;
- every hit returns fresh containers (``CaseData`` and its dicts), so a caller that replaces a
  buffer (a test planting NaN rows) changes only its own copy;
- a reference is reused only while the case still has its spec and uniforms and holds the very
  reference-input arrays it was computed from, with the same compute dtype, row sample and
  statistics request.

Read-only is numpy's flag, which code could set back; nothing here does, and a write into a
shared array is a bug the flag turns into an error.

Cases and references are two stores, each bounded by ``MAX_BYTES`` (least recently used first
out); a case or reference larger than ``LARGEST`` (a model-sized bench shape) is never stored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from doppler_gen.families.base import CaseData

MAX_BYTES = 512 << 20
LARGEST = 64 << 20


class _Memo:
    """A byte-bounded LRU of (value, bytes)."""

    def __init__(self) -> None:
        self.entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Any:
        found = self.entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self.entries.move_to_end(key)
        return found[0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        """Store ``value`` (its arrays already read-only) under ``key``."""
        if key in self.entries:
            self.bytes -= self.entries.pop(key)[1]
        self.entries[key] = (value, size)
        self.bytes += size
        while self.bytes > MAX_BYTES and self.entries:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.bytes -= dropped


_CASES = _Memo()
_REFERENCES = _Memo()


def clear() -> None:
    """Forget every stored case and reference (tests; a long-lived process that wants memory)."""
    global _CASES, _REFERENCES
    _CASES = _Memo()
    _REFERENCES = _Memo()


def counts() -> dict[str, int]:
    """Hits and misses so far, for cases and references."""
    return {
        "case_hits": _CASES.hits,
        "case_misses": _CASES.misses,
        "reference_hits": _REFERENCES.hits,
        "reference_misses": _REFERENCES.misses,
    }


def _arrays(value: Any) -> Iterator[np.ndarray]:
    """Every array in ``value`` (nested dicts, lists, tuples)."""
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _arrays(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _arrays(v)


def _store(memo: _Memo, key: Hashable, value: Any, *parts: Any) -> None:
    """Store ``value`` with its arrays (those in ``parts``) made read-only, unless too large."""
    arrays = [a for part in parts for a in _arrays(part)]
    size = sum(int(a.nbytes) for a in arrays)
    if size > LARGEST:
        return
    for array in arrays:
        array.flags.writeable = False
    memo.put(key, value, size)


def _containers(value: Any) -> Any:
    """A copy of the containers around the (shared) arrays and scalars."""
    if isinstance(value, Mapping):
        return {k: _containers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_containers(v) for v in value]
    return value


def _copy(data: CaseData, key: Hashable) -> CaseData:
    return replace(
        data,
        uniforms=dict(data.uniforms),
        buffers=dict(data.buffers),
        reference_inputs=_containers(data.reference_inputs),
        memo_key=key,
    )


def case(key: Hashable, build: Callable[[], CaseData]) -> CaseData:
    """The case ``build`` makes, shared with every earlier call under the same ``key``.

    ``key`` must name everything ``build`` reads (the spec, the element types, ...); an
    unhashable key (a spec holding a list) builds afresh.
    """
    try:
        hash(key)
    except TypeError:
        return build()
    stored = _CASES.get(key)
    if stored is None:
        stored = build()
        _store(_CASES, key, stored, stored.buffers, stored.reference_inputs)
    return _copy(stored, key)


def _sample_key(sample: Any) -> Hashable:
    if sample is None:
        return None
    return tuple(
        (name, np.asarray(value).dtype.str, np.shape(value), np.asarray(value).tobytes())
        for name, value in sorted(vars(sample).items())
    )


def reference(
    data: CaseData,
    key: Hashable,
    compute_dtype: Any,
    sample: Any,
    stats: dict[str, float] | None,
    compute: Callable[[dict[str, float] | None], np.ndarray],
) -> np.ndarray:
    """``compute(stats)`` for ``data``, shared with earlier calls on the same memoised case.

    ``key`` names what the family's reference reads beyond the case (e.g. the masked-row
    contract). A case not built through ``case`` (no ``memo_key``), or whose reference inputs
    were replaced since, is computed afresh and not stored.
    """
    stored_case = _CASES.entries.get(data.memo_key) if data.memo_key is not None else None
    if stored_case is None or not _same_inputs(data, stored_case[0]):
        return compute(stats)
    full_key = (data.memo_key, key, np.dtype(compute_dtype).str, _sample_key(sample), stats is None)
    found = _REFERENCES.get(full_key)
    if found is None:
        fresh: dict[str, float] | None = None if stats is None else {}
        result = compute(fresh)
        found = (result, dict(fresh or {}))
        _store(_REFERENCES, full_key, found, result)
    result, recorded = found
    if stats is not None:
        stats.update(recorded)
    return result


def _same_inputs(data: CaseData, stored: CaseData) -> bool:
    """The case is still its stored twin as the reference reads it: the same spec and uniforms,
    and the very arrays it was built with (none replaced)."""
    mine, theirs = data.reference_inputs, stored.reference_inputs
    return (
        data.spec == stored.spec
        and data.uniforms == stored.uniforms
        and mine.keys() == theirs.keys()
        and all(_same(mine[name], theirs[name]) for name in mine)
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a is b
