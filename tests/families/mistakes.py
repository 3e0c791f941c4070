"""Test-only variants of the two-pass ``rowsum`` family (tests/families/rowsum.py), each with
one mistake a family module can make. Registered under the name ``rowsum`` by
tests/test_family_mistakes.py, so that the tests/fixtures/twopass project runs them; a
module of its own, so that validate's worker processes can import them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from doppler_gen.families.base import INPUT, OUTPUT, CaseData
from families.rowsum import RowsumFamily, RowsumSpec


class NoQuickCases(RowsumFamily):
    """specs() gives nothing for the quick tier."""

    def specs(self, entry: Mapping[str, Any], tier: str, seed: int) -> list[RowsumSpec]:
        return [] if tier == "quick" else super().specs(entry, tier, seed)


class EmptyOutputs(RowsumFamily):
    """Every case has zero rows (so an empty output), and nothing refuses them."""

    def specs(self, entry: Mapping[str, Any], tier: str, seed: int) -> list[RowsumSpec]:
        return [RowsumSpec(f"0 x {size}", 0, size, seed * 1000 + size) for size in (1, 5, 9)]

    def refuse(self, spec: Any, entry: Any, limits: Any, constants: Any) -> str | None:
        return None


class EmptyAndFullOutputs(EmptyOutputs):
    """One empty case among real ones: a legitimate edge case, judged like any other."""

    def specs(self, entry: Mapping[str, Any], tier: str, seed: int) -> list[RowsumSpec]:
        return super().specs(entry, tier, seed)[:1] + RowsumFamily.specs(self, entry, tier, seed)


class InfiniteTolerance(RowsumFamily):
    """A tolerance that judges nothing (as a bound scaled by an infinite value would)."""

    def f32_tolerance(self, data: CaseData, ref: np.ndarray, stats: Mapping[str, float]) -> float:
        return float("inf")


class BadRole(RowsumFamily):
    roles: ClassVar[Mapping[str, str]] = {"x": INPUT, "y": "outptu"}


class OutputAsInput(RowsumFamily):
    """y, which the kernel writes, named as an input: nothing would read it back."""

    roles: ClassVar[Mapping[str, str]] = {"x": INPUT, "y": INPUT}


class TwoOutputs(RowsumFamily):
    roles: ClassVar[Mapping[str, str]] = {"x": OUTPUT, "y": OUTPUT}


class ReferenceRaises(RowsumFamily):
    def reference(self, data: CaseData, entry: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        return data.reference_inputs["not there"]


@dataclass
class MutableSpec:
    """Not frozen: unhashable."""

    name: str
    rows: int
    size: int
    seed: int = 0


class UnhashableSpecs(RowsumFamily):
    def specs(self, entry: Mapping[str, Any], tier: str, seed: int) -> list[Any]:
        return [
            MutableSpec(s.name, s.rows, s.size, s.seed) for s in super().specs(entry, tier, seed)
        ]
