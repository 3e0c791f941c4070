"""The Family protocol: everything a kernel family knows that the generic core must not.

A family is the host-side contract shared by some templates: which binding plays which role,
which template parameters are host metadata (and how to check them against the WGSL), which
problems (cases) validate a kernel, how to build their inputs, the float64 reference and its
tolerance, the benchmark shapes with their torch baseline, and the knob constraints ``tune``
respects. The core (config, render, manifest, outputs, runtime, validate, bench, tune, list,
cli) asks the family through this interface and never branches on a family's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

# binding roles: what the runtime does with a binding (re-exported for family modules)
from doppler_gen.families.roles import AUXILIARY, INPUT, OUTPUT, ROLES, SCRATCH, UNIFORM
from doppler_gen.tolerance import f16_tolerance

NUMPY_DTYPES = {"f32": np.float32, "f16": np.float16, "u32": np.uint32, "i32": np.int32}
__all__ = [
    "AUXILIARY",
    "INPUT",
    "NUMPY_DTYPES",
    "OUTPUT",
    "ROLES",
    "SCRATCH",
    "TIERS",
    "UNIFORM",
    "Baseline",
    "CaseData",
    "Family",
    "Shape",
    "Spec",
    "element_types",
    "rounded",
    "seeded",
]

TIERS = ("quick", "default", "large")


class Spec(Protocol):
    """A case's plain-number description; the core only reads its name and seed (and hashes it)."""

    name: str
    seed: int


@dataclass
class CaseData:
    """Everything one run needs, plus the reference's view of the same data."""

    spec: Any
    uniforms: dict[str, float]  # by uniform struct field name
    buffers: dict[str, np.ndarray]  # by binding name, in the binding's element dtype
    reference_inputs: dict[str, Any] = field(default_factory=dict)
    memo_key: Hashable | None = None  # set by ``memo.case``: the case its arrays are shared with


class Shape(Protocol):
    """A benchmark problem of some family; ``label`` parses back to an equal shape."""

    kind: str
    family: str

    @property
    def label(self) -> str: ...

    def case_spec(self, seed: int = 0) -> Any: ...

    def flops(self) -> int: ...


Baseline = tuple[Callable[[], Any], str]  # a zero-argument torch call and a note


class Family(ABC):
    """One kernel family. Subclasses set the class attributes and implement the methods."""

    name: str
    # binding name -> role (uniform and scratch bindings need none: the WGSL and the template
    # say what they are)
    roles: ClassVar[Mapping[str, str]] = {}
    metadata: tuple[str, ...] = ()  # template parameters every template of the family defines
    optional_metadata: tuple[str, ...] = ()  # recorded (None when absent)
    shape_keys: ClassVar[Mapping[str, Any]] = {}  # kind -> key -> default (None: derived)
    shape_help: ClassVar[Mapping[str, str]] = {}  # kind -> one line for --help
    shape_zero_keys: tuple[str, ...] = ()  # shape keys that may be 0 (others are positive)
    shape_flag_keys: tuple[str, ...] = ()  # shape keys that are 0 or 1
    default_shapes: tuple[str, ...] = ()
    baseline_name = "torch"
    # what bench's JSON says about this family's FLOP count and torch baseline
    methodology: ClassVar[Mapping[str, str]] = {}

    def _missing(self, method: str, needed_by: str) -> str:
        """What a NotImplementedError of a method the family left out says."""
        where = f"family {self.name!r} ({type(self).__module__})"
        return f"{where} defines no {method}, which {needed_by} needs"

    # -- generate ------------------------------------------------------------------------------

    def interface_problems(
        self, variant: Any, meta: Mapping[str, Any], passes: list[tuple[Any, Any]]
    ) -> Iterator[str]:
        """What the WGSL of ``passes`` ([(PassSpec, wgsl.Module)]) contradicts in ``meta``.

        The generic checks (entry points, features, overrides, dispatch names, roles) are the
        manifest's; a family adds the dtype and size claims of its host metadata.
        """
        return iter(())

    # -- cases ---------------------------------------------------------------------------------

    @abstractmethod
    def specs(self, entry: Mapping[str, Any], tier: str, seed: int) -> list[Any]:
        """The case matrix of a variant (sizes follow its metadata); deterministic in ``seed``."""

    def refuse(
        self, spec: Any, entry: Mapping[str, Any], limits: Mapping[str, int], constants: Mapping
    ) -> str | None:
        """Why the kernel cannot run ``spec``, from its dimensions alone (before any tensor)."""
        return None

    @abstractmethod
    def build(self, spec: Any, entry: Mapping[str, Any]) -> CaseData:
        """Inputs in the bindings' element types, uniforms, and the reference's view of them."""

    @abstractmethod
    def output_shape(self, data: CaseData) -> tuple[int, ...]:
        """The logical shape of the output binding for this case."""

    @abstractmethod
    def reference(
        self,
        data: CaseData,
        entry: Mapping[str, Any],
        compute_dtype: Any = np.float64,
        stats: dict[str, float] | None = None,
        sample: Any = None,
    ) -> np.ndarray:
        """The expected output; float64 is the reference, float32 the f16 error baseline.

        With a ``sample`` (from ``row_sample``), only the sampled rows, in the layout
        ``sampling.sampled_rows`` cuts from the kernel's output.
        """

    def row_sample(self, data: CaseData) -> Any:
        """The output rows a comparison covers (``sampling.RowSample``); None: every row.

        A float64 reference of every row of a model-sized output costs far more than the
        kernel; the kernel's whole output is still checked for NaN/Inf.
        """
        return None

    def f32_tolerance(self, data: CaseData, ref: np.ndarray, stats: Mapping[str, float]) -> float:
        """The absolute tolerance of an f32 output (a rounding-error bound vs float64)."""
        raise NotImplementedError(self._missing("f32_tolerance", "a variant with an f32 output"))

    def tolerance(
        self,
        data: CaseData,
        entry: Mapping[str, Any],
        out_dtype: str,
        ref: np.ndarray,
        stats: Mapping[str, float],
        sample: Any = None,
    ) -> tuple[float, str]:
        """(tolerance, policy); f16 outputs: twice a numpy-f32 implementation's error + floor."""
        if out_dtype == "f16":
            baseline = self.reference(data, entry, np.float32, sample=sample).astype(np.float16)
            error = float(np.max(np.abs(baseline.astype(np.float64) - ref))) if ref.size else 0.0
            ref_max = float(np.max(np.abs(ref))) if ref.size else 0.0
            return f16_tolerance(error, ref_max), "f16: 2x numpy-f32 baseline + floor"
        return self.f32_tolerance(data, ref, stats), "f32: rounding bound vs fp64"

    # -- bench ---------------------------------------------------------------------------------

    def make_shape(self, kind: str, text: str, values: dict[str, int]) -> Shape:
        """The shape of ``kind`` from its parsed key=value pairs (raise ShapeSyntaxError)."""
        raise NotImplementedError(self._missing("make_shape", f"--shape {text!r}"))

    def baseline_dtype(self, entry: Mapping[str, Any]) -> str | None:
        """The dtype the torch baseline runs in for this variant (None: no baseline)."""
        return None

    def baseline(self, torch: Any, shape: Shape, dtype: str) -> Baseline:
        """A zero-argument torch call computing what the kernel computes on ``shape``."""
        raise NotImplementedError(self._missing("baseline", "a baseline_dtype"))

    # -- export --------------------------------------------------------------------------------

    # True where Doppler's host computes a one-kernel variant's workgroup count from formulas
    # of its own (the attention tiers): the registry then leaves the rule out. Otherwise the
    # host has nothing to count workgroups with but the rule, so the export writes it.
    host_dispatch: ClassVar[bool] = False

    def host_dtypes(self, entry: Mapping[str, Any]) -> dict[str, str]:
        """The export's dtype fields: ``inputDtype``, the element type of the first input
        binding (passes in order, each by binding index), and ``outputDtype``, the output's.
        A family whose host tells its inputs apart (attention: Q against K/V) says so itself."""
        bindings = [
            b
            for p in entry["passes"]
            for b in sorted(p["bindings"], key=lambda b: b["binding"])
            if b["element_type"]
        ]
        dtypes: dict[str, str] = {}
        for key, role in (("inputDtype", INPUT), ("outputDtype", OUTPUT)):
            found = next((b for b in bindings if b.get("role") == role), None)
            if found is not None:
                dtypes[key] = found["element_type"]
        return dtypes

    def host_metadata(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Fields of the Doppler export's ``variantMetadata`` that only this family can read
        from a manifest entry (a requirement the host must check before selecting it)."""
        return {}

    # -- validation on narrow subgroups ----------------------------------------------------------

    def wide_subgroup_width(self, entry: Mapping[str, Any]) -> int:
        """The subgroup width (lanes) at which this variant's widest shuffle path runs, where a
        narrower subgroup takes a workgroup-memory fallback or stores NaN; 0 when every width
        runs every path. ``.ci/setup`` validates the variants with 8 < width <= 16 a second
        time on 16-lane lavapipe, beyond its default 8 lanes. By default the manifest's
        ``min_subgroup_size``."""
        return int(entry.get("min_subgroup_size") or 0)

    # -- tune ----------------------------------------------------------------------------------

    def constraints(self, entry: Mapping[str, Any], constants: Mapping[str, int]) -> str | None:
        """Why a tune candidate (rendered entry + override constants) cannot work, if known."""
        return None


def seeded(seed: int) -> np.random.Generator:
    """The generator every family draws its case tensors from (same seed, same tensors)."""
    return np.random.default_rng(seed)


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` in a WGSL element type's numpy dtype: the reference sees the rounded values."""
    return values.astype(NUMPY_DTYPES[dtype])


def element_types(entry: Mapping[str, Any]) -> dict[str, str]:
    """Binding name -> WGSL element type, over every pass of a manifest entry."""
    return {
        b["name"]: b["element_type"]
        for p in entry["passes"]
        for b in p["bindings"]
        if b["element_type"]
    }


def constant_values(
    entry: Mapping[str, Any], pipeline_constants: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Every pass's constants and override defaults, then ``pipeline_constants`` set on them:
    the values a variant's kernel runs with (the manifest entry's, or a run's own)."""
    values: dict[str, float] = {}
    for record in entry["passes"]:
        values.update(record["constants"])
        values.update({o["name"]: o["default"] for o in record["overrides"]})
    values.update(pipeline_constants or {})
    return values
