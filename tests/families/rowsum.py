"""A test-only two-pass family: the sum of squares of each row of a matrix.

Its kernels (tests/fixtures/twopass) write per-chunk partial sums to a scratch buffer in one
pass and add them per row in a second, so generate, check, the manifest, validate and bench
exercise passes and scratch buffers end to end. Registered by the tests, never by the product.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from doppler_gen.families.base import INPUT, OUTPUT, CaseData, Family, rounded, seeded
from doppler_gen.shapes import ShapeSyntaxError
from doppler_gen.tolerance import F32_UNIT_ROUNDOFF


@dataclass(frozen=True)
class RowsumSpec:
    name: str
    rows: int
    size: int
    seed: int = 0


@dataclass(frozen=True)
class RowsumShape:
    kind: str
    rows: int
    size: int
    family: str = "rowsum"

    @property
    def label(self) -> str:
        return f"rowsum:rows={self.rows},size={self.size}"

    def case_spec(self, seed: int = 0) -> RowsumSpec:
        return RowsumSpec(self.label, self.rows, self.size, seed)

    def flops(self) -> int:
        return 2 * self.rows * self.size


_CASES = ((1, 1), (3, 127), (4, 128), (2, 129), (5, 1000), (1, 4097), (17, 300), (8, 64))


class RowsumFamily(Family):
    name = "rowsum"
    roles: ClassVar[Mapping[str, str]] = {"x": INPUT, "y": OUTPUT}
    metadata = ("dtype", "chunk")
    shape_keys: ClassVar[Mapping[str, Any]] = {"rowsum": {"rows": 64, "size": 4096}}
    default_shapes = ("rowsum:rows=64,size=4096",)

    def interface_problems(
        self, variant: Any, meta: Mapping[str, Any], passes: list[tuple[Any, Any]]
    ) -> Iterator[str]:
        for _, module in passes:
            x = module.binding("x")
            if x is not None and x.element_type != meta["dtype"]:
                yield f"dtype = {meta['dtype']!r} but the WGSL binds x as {x.type}"
            chunk = module.constants.get("CHUNK")
            if chunk != meta["chunk"]:
                yield f"chunk = {meta['chunk']} but the WGSL's CHUNK is {chunk}"

    def specs(self, entry: Mapping[str, Any], tier: str, seed: int) -> list[RowsumSpec]:
        cases = _CASES[::2] if tier == "quick" else _CASES
        if tier == "large":
            cases = (*cases, (33, 20000))
        return [
            RowsumSpec(f"{rows} x {size}", rows, size, seed * 1000 + i)
            for i, (rows, size) in enumerate(cases)
        ]

    def refuse(
        self,
        spec: RowsumSpec,
        entry: Mapping[str, Any],
        limits: Mapping[str, int],
        constants: Mapping,
    ) -> str | None:
        if spec.rows < 1 or spec.size < 1:
            return "rows and size must be positive"
        return None

    def build(self, spec: RowsumSpec, entry: Mapping[str, Any]) -> CaseData:
        x = rounded(seeded(spec.seed).standard_normal((spec.rows, spec.size)), "f32")
        uniforms = {"rows": spec.rows, "size": spec.size}
        return CaseData(spec, uniforms, {"x": x}, {"x": x})

    def output_shape(self, data: CaseData) -> tuple[int, ...]:
        return (int(data.uniforms["rows"]),)

    def reference(
        self,
        data: CaseData,
        entry: Mapping[str, Any],
        compute_dtype: Any = np.float64,
        stats: dict[str, float] | None = None,
        sample: Any = None,
    ) -> np.ndarray:
        x = data.reference_inputs["x"].astype(compute_dtype)
        return (x * x).sum(axis=1)

    def f32_tolerance(self, data: CaseData, ref: np.ndarray, stats: Mapping[str, float]) -> float:
        """A sum of n non-negative f32 terms is within n*u of its value (plus the squares' u)."""
        size = int(data.uniforms["size"])
        return float(ref.max(initial=0.0)) * F32_UNIT_ROUNDOFF * (size + 2)

    def make_shape(self, kind: str, text: str, values: dict[str, int]) -> RowsumShape:
        if values["rows"] * values["size"] > 1 << 28:
            raise ShapeSyntaxError(f"--shape {text!r}: too large")
        return RowsumShape(kind, values["rows"], values["size"])


ROWSUM = RowsumFamily()
