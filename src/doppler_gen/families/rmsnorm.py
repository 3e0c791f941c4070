"""The rmsnorm family: ``y = x / sqrt(mean(x²) + eps) * weight`` over rows, as Doppler does it.

Host interface (``templates/rmsnorm.wgsl.j2``): a ``Uniforms`` struct with ``size`` (elements
per row), ``num_rows`` and ``eps``; ``input`` ``[num_rows, size]``, ``weight`` ``[size]`` and
``output`` ``[num_rows, size]``, all in the variant's ``dtype``; one workgroup per row. The
case matrix covers a row of one element, sizes below, at and above the workgroup size and not
multiples of it, several rows, eps from 1e-6 to 1e-2, large and tiny magnitudes (the mean of
squares must neither overflow nor drown eps) and an all-zero row (where eps alone keeps the
output finite).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from doppler_gen.families import memo
from doppler_gen.families.base import INPUT, OUTPUT, CaseData, Family, rounded, seeded
from doppler_gen.shapes import ShapeSyntaxError
from doppler_gen.tolerance import F32_UNIT_ROUNDOFF


@dataclass(frozen=True)
class RmsNormSpec:
    """One problem: ``rows`` rows of ``size`` elements, values ~ N(0, gain²)."""

    name: str
    rows: int = 1
    size: int = 64
    eps: float = 1e-5
    gain: float = 1.0
    zero_row: bool = False  # row 0 all zeros
    seed: int = 0


@dataclass(frozen=True)
class RmsNormShape:
    """A benchmark problem: ``rows`` tokens of hidden size ``size``."""

    kind: str
    rows: int
    size: int
    family: str = "rmsnorm"

    @property
    def label(self) -> str:
        return f"rmsnorm:rows={self.rows},size={self.size}"

    def case_spec(self, seed: int = 0) -> RmsNormSpec:
        return RmsNormSpec(self.label, self.rows, self.size, seed=seed)

    def flops(self) -> int:
        """Square-and-add, then two multiplies per element (the rsqrt per row not counted)."""
        return 4 * self.rows * self.size


_FIXED = (
    RmsNormSpec("one element", rows=1, size=1),
    RmsNormSpec("size below the workgroup", rows=2, size=7),
    RmsNormSpec("size = 64", rows=3, size=64),
    RmsNormSpec("size not a multiple of the workgroup", rows=2, size=255),
    RmsNormSpec("size = 256", rows=4, size=256),
    RmsNormSpec("ragged, many rows", rows=9, size=1000),
    RmsNormSpec("Llama hidden size", rows=2, size=4096),
    RmsNormSpec("eps 1e-6", rows=3, size=333, eps=1e-6),
    RmsNormSpec("eps 1e-2 with small values", rows=2, size=128, eps=1e-2, gain=0.05),
    RmsNormSpec("large magnitudes", rows=2, size=512, gain=1e3),
    RmsNormSpec("tiny magnitudes", rows=2, size=512, gain=1e-3),
    RmsNormSpec("an all-zero row", rows=3, size=96, zero_row=True),
)
_LARGE = (
    RmsNormSpec("long rows", rows=3, size=16384),
    RmsNormSpec("many rows", rows=257, size=2048),
)


class RmsNormFamily(Family):
    """RMSNorm kernels: one workgroup per row, f32 arithmetic whatever the storage dtype."""

    name = "rmsnorm"
    roles: ClassVar[Mapping[str, str]] = {"input": INPUT, "weight": INPUT, "output": OUTPUT}
    metadata = ("dtype",)
    shape_keys: ClassVar[Mapping[str, Any]] = {"rmsnorm": {"rows": 2048, "size": 4096}}
    shape_help: ClassVar[Mapping[str, str]] = {
        "rmsnorm": "rows tokens of hidden size size (input, weight and output in the variant's dtype)"
    }
    default_shapes = ("rmsnorm:rows=2048,size=4096",)
    baseline_name = "rms_norm"
    methodology: ClassVar[Mapping[str, str]] = {
        "flops": "4 * rows * size (square and add, then two multiplies per element)",
        "baseline": "torch.nn.functional.rms_norm (eps 1e-5) in the variant's dtype, else "
        "x * rsqrt(mean(x^2) + eps) * weight",
    }

    def interface_problems(
        self, variant: Any, meta: Mapping[str, Any], passes: list[tuple[Any, Any]]
    ) -> Iterator[str]:
        for _, module in passes:
            for name in self.roles:
                binding = module.binding(name)
                if binding is None:
                    yield f"the WGSL has no binding named {name}"
                elif binding.element_type != meta["dtype"]:
                    yield f"dtype = {meta['dtype']!r} but the WGSL binds {name} as {binding.type}"

    # -- cases ---------------------------------------------------------------------------------

    def specs(self, entry: Mapping[str, Any], tier: str, seed: int) -> list[RmsNormSpec]:
        fixed = list(_FIXED[::2] if tier == "quick" else _FIXED)
        if tier == "large":
            fixed += _LARGE
        rng = seeded(seed + 3)
        count = 4 if tier == "quick" else 48
        randoms = [
            RmsNormSpec(
                f"random #{i}",
                rows=int(rng.integers(1, 6)),
                size=int(rng.choice([3, 17, 100, 257, 640, 1536, 3000])),
                eps=float(rng.choice([1e-6, 1e-5, 1e-3])),
                gain=float(rng.choice([0.1, 1.0, 10.0])),
            )
            for i in range(count)
        ]
        return [
            RmsNormSpec(**{**s.__dict__, "seed": seed * 1000 + i})
            for i, s in enumerate(fixed + randoms)
        ]

    def refuse(
        self,
        spec: RmsNormSpec,
        entry: Mapping[str, Any],
        limits: Mapping[str, int],
        constants: Mapping,
    ) -> str | None:
        if spec.rows < 1 or spec.size < 1:
            return "rows and size must be positive"
        largest = limits.get("max-storage-buffer-binding-size", 1 << 27)
        need = 4 * spec.rows * spec.size
        if need > largest:
            return f"a buffer would need about {need} B; the device binds at most {largest} B"
        return None

    def build(self, spec: RmsNormSpec, entry: Mapping[str, Any]) -> CaseData:
        dtype = str(entry["metadata"]["dtype"])
        return memo.case((self.name, spec, dtype), lambda: _build_rmsnorm(spec, dtype))

    def output_shape(self, data: CaseData) -> tuple[int, ...]:
        return (int(data.uniforms["num_rows"]), int(data.uniforms["size"]))

    def reference(
        self,
        data: CaseData,
        entry: Mapping[str, Any],
        compute_dtype: Any = np.float64,
        stats: dict[str, float] | None = None,
        sample: Any = None,
    ) -> np.ndarray:
        """eps is rounded to f32 first: that is what the uniform holds."""

        def compute(stats: dict[str, float] | None) -> np.ndarray:
            x = data.reference_inputs["x"].astype(compute_dtype)
            weight = data.reference_inputs["weight"].astype(compute_dtype)
            eps = compute_dtype(np.float32(data.uniforms["eps"]))
            mean_sq = (x * x).mean(axis=1, keepdims=True, dtype=compute_dtype)
            return (x / np.sqrt(mean_sq + eps) * weight).astype(compute_dtype)

        return memo.reference(data, (), compute_dtype, sample, stats, compute)

    def f32_tolerance(self, data: CaseData, ref: np.ndarray, stats: Mapping[str, float]) -> float:
        """max|y| * u * (16 + 2 sqrt(size)): the sum of ``size`` squares carries the random-walk
        rounding bound 2 sqrt(n) u (as for the attention dot products, README "Tolerance
        policy"); sqrt, division and the two products a few u more; relative error of the
        row's scale carries over to every element of the row."""
        size = int(data.uniforms["size"])
        largest = float(np.max(np.abs(ref))) if ref.size else 0.0
        return max(largest, 1e-30) * F32_UNIT_ROUNDOFF * (16 + 2 * math.sqrt(size))

    # -- bench ---------------------------------------------------------------------------------

    def make_shape(self, kind: str, text: str, values: dict[str, int]) -> RmsNormShape:
        if values["rows"] * values["size"] > 1 << 30:
            raise ShapeSyntaxError(
                f"--shape {text!r}: a tensor of {values['rows'] * values['size']} elements is "
                "larger than any WebGPU binding"
            )
        return RmsNormShape(kind, values["rows"], values["size"])

    def baseline_dtype(self, entry: Mapping[str, Any]) -> str | None:
        return str(entry["metadata"]["dtype"])

    def baseline(self, torch: Any, shape: Any, dtype: str) -> tuple[Any, str]:
        """torch's fused rms_norm where it exists (torch >= 2.4), else the same formula."""
        torch_dtype = {"f16": torch.float16, "f32": torch.float32}[dtype]
        generator = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(
            shape.rows, shape.size, device="cuda", dtype=torch_dtype, generator=generator
        )
        weight = torch.randn(shape.size, device="cuda", dtype=torch_dtype, generator=generator)
        fused = getattr(torch.nn.functional, "rms_norm", None)
        if fused is not None:
            return (lambda: fused(x, (shape.size,), weight, 1e-5)), "torch.nn.functional.rms_norm"
        return (
            lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight
        ), "x * rsqrt(mean(x^2) + eps) * weight (torch without rms_norm)"

    # -- tune ----------------------------------------------------------------------------------

    def constraints(self, entry: Mapping[str, Any], constants: Mapping[str, int]) -> str | None:
        """The tree reduction halves WORKGROUP_SIZE: it must be a power of two within the
        workgroup array (MAX_WORKGROUP_SIZE)."""
        size = constants.get("WORKGROUP_SIZE")
        if size is None:
            return None
        limit = entry["passes"][0]["constants"].get("MAX_WORKGROUP_SIZE", size)
        if size & (size - 1) or size > limit:
            return f"WORKGROUP_SIZE {size} must be a power of two <= MAX_WORKGROUP_SIZE {limit}"
        return None


def _build_rmsnorm(spec: RmsNormSpec, dtype: str) -> CaseData:
    """Rows of seeded normals (row 0 zero where the spec asks), weights near 1, both rounded
    to ``dtype`` before the reference sees them."""
    rng = seeded(spec.seed)
    x = rng.standard_normal((spec.rows, spec.size)) * spec.gain
    if spec.zero_row:
        x[0] = 0.0
    x = rounded(x, dtype)
    weight = rounded(1.0 + 0.25 * rng.standard_normal(spec.size), dtype)
    uniforms = {"size": spec.size, "num_rows": spec.rows, "eps": spec.eps, "_pad": 0}
    buffers = {"input": x, "weight": weight}
    return CaseData(spec, uniforms, buffers, {"x": x, "weight": weight})


FAMILY = RmsNormFamily()
