"""Run one generated variant (all its passes) on a device and judge its output.

Everything host-side comes from the variant's manifest entry and its family: uniform fields are
packed by name at the offsets the WGSL layout gives, buffers are bound by binding name and role
and checked against the binding's element type, scratch buffers are sized by the template's
expressions, and each pass's workgroup count comes from its dispatch rule. There is no
per-variant offset, index or size written in Python.

``prepare(spec)`` returns a ``Prepared`` case (buffers created, outputs and scratch poisoned)
or a ``Refusal`` saying why the kernel cannot run it, decided before any dispatch. ``run``
re-poisons outputs and scratch with NaN, records every pass into one command buffer, submits it
and reads the output; ``timed`` times the same prepared buffers; ``judge`` holds the output to
the family's float64 reference and tolerance.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from doppler_gen.backends import Buffer, Device, PassTimes, Pipeline, Step
from doppler_gen.errors import DopplerGenError, ShaderCompileError
from doppler_gen.expressions import parse as parse_expression
from doppler_gen.families import get_family
from doppler_gen.families.base import (
    NUMPY_DTYPES,
    OUTPUT,
    SCRATCH,
    UNIFORM,
    CaseData,
    Family,
    constant_values,
)
from doppler_gen.render import RenderedKernel, RenderedPass
from doppler_gen.sampling import judge_sampled
from doppler_gen.tolerance import Verdict

_PACK = {"u32": "<I", "i32": "<i", "f32": "<f"}


@dataclass
class CaseResult:
    spec: Any
    verdict: Verdict | None  # None when the case was refused
    refused: str | None = None
    output: np.ndarray | None = field(default=None, repr=False)
    elements: int = 0  # output elements the kernel produced and the judge compared

    @property
    def passed(self) -> bool:
        return self.verdict is not None and self.verdict.passed


@dataclass(frozen=True)
class Refusal:
    """Why a kernel cannot run a case, decided before any buffer or dispatch."""

    reason: str


@dataclass
class Prepared:
    """One case's passes and GPU buffers, ready to run (outputs and scratch NaN-poisoned)."""

    data: CaseData
    steps: list[Step]
    output: Buffer
    output_shape: tuple[int, ...]
    out_dtype: Any
    poison: list[tuple[Buffer, bytes]]  # outputs and scratch with their NaN bytes
    bytes_moved: int  # inputs read once + output written once (scratch is not compulsory)
    scratch_bytes: dict[str, int]


def pack_uniforms(layout: Mapping[str, Any], values: Mapping[str, float]) -> bytes:
    """The uniform buffer bytes: every struct field by name, at its manifest offset.

    A field the case does not provide is an error (never a silent 0), and so is a value the
    struct has no field for: the host and the kernel must agree on the whole struct.
    """
    data = bytearray(layout["buffer_size"])
    names = {f["name"] for f in layout["fields"]}
    extra = sorted(set(values) - names)
    if extra:
        raise DopplerGenError(
            f"uniform values {', '.join(extra)} have no field in struct {layout['struct']}"
        )
    for f in layout["fields"]:
        if f["name"] not in values:
            raise DopplerGenError(f"no value for uniform field {layout['struct']}.{f['name']}")
        fmt = _PACK.get(f["type"])
        if fmt is None:
            raise DopplerGenError(f"cannot pack uniform field {f['name']} of type {f['type']}")
        value = values[f["name"]]
        struct.pack_into(fmt, data, f["offset"], float(value) if f["type"] == "f32" else int(value))
    return bytes(data)


def evaluate_dispatch(rule: str, names: Mapping[str, float], what: str = "dispatch rule") -> int:
    """Evaluate a dispatch or size rule like ``ceil(query_len / BLOCK_SIZE) * num_heads``.

    The same whitelisted grammar and evaluator that checked the rule when variants.toml was
    loaded (doppler_gen.expressions): no Python ``eval``, exact division, bounded values.
    """
    value = parse_expression(rule, what=what).evaluate(names)
    if value < 0:
        unit = "workgroups" if what == "dispatch rule" else "elements"
        raise DopplerGenError(f"{what} {rule!r} gives {value} {unit} for these values")
    return value


def dispatch_grid(
    count: int, limit: int, fold: bool, *, row_limit: int | None = None
) -> tuple[int, int, int] | None:
    """The (x, y, z) workgroup grid of a pass of ``count`` workgroups on a device taking at
    most ``limit`` per dimension; None when it cannot be dispatched.

    A count within the limit is dispatched as (count, 1, 1), the host's 1-D formula. A pass that
    folds (``dispatch_fold``) and exceeds it gets the fewest rows that hold it, y =
    ceil(count / limit), each as short as they can be, x = ceil(count / y): at most y - 1 spare
    workgroups, which the kernel skips by its linear index id.x + id.y * x. ``row_limit`` folds
    at a smaller width than the device's, so that validation runs the folded path at small sizes.
    """
    if not fold:
        return (count, 1, 1) if count <= limit else None
    width = min(limit, row_limit) if row_limit else limit
    if count <= width:
        return (count, 1, 1)
    rows = -(-count // width)
    if rows > limit:
        return None
    return (-(-count // rows), rows, 1)


def filled_bytes(dtype: Any, count: int, value: float) -> bytes:
    """``count`` elements of ``value`` in a float ``dtype``; all ones for an integer one."""
    if np.issubdtype(dtype, np.floating):
        return np.full(count, value, dtype=dtype).tobytes()
    return np.full(count, np.iinfo(dtype).max, dtype=dtype).tobytes()


def poison_bytes(element_type: str, count: int) -> bytes:
    """NaN for float elements, all ones for integers: a value no kernel writes by accident."""
    return filled_bytes(NUMPY_DTYPES[element_type], count, np.nan)


# What run_as_timed leaves in an output before the run: finite, far outside any attention
# or RMSNorm output the cases produce, exact in f16 and f32
STALE_OUTPUT = -4096.0


def stale_elements(first: np.ndarray, again: np.ndarray) -> int:
    """Elements a run as timed (``run_as_timed``) left at ``STALE_OUTPUT`` where the first,
    NaN-poisoned run wrote something else: over the whole output, exactly, since the judge
    compares only the sampled rows of a large one."""
    return int(np.count_nonzero((again == STALE_OUTPUT) & (first != STALE_OUTPUT)))


class KernelRunner:
    """One compiled variant (every pass) on one device: prepares, runs, times and judges cases."""

    def __init__(
        self,
        device: Device,
        kernel: RenderedKernel,
        entry: Mapping[str, Any],
        constants: Mapping[str, float] | None = None,
        *,
        fold_above: int | None = None,
    ) -> None:
        self.device = device
        # workgroups in a row above which a folding pass is dispatched as a 2-D grid: the
        # device's limit (None), or a lower one where validation runs the folded path
        self.fold_above = fold_above
        self.kernel = kernel
        self.entry = entry
        self.family: Family = get_family(entry["family"])
        self.name = kernel.variant.name
        # the variant's recorded pipeline constants, then any the caller sweeps (tune, bench)
        self.constants = {**entry.get("pipeline_constants", {}), **(constants or {})}
        self.pipelines: list[Pipeline] | None = None

    # -- compile ------------------------------------------------------------------------------

    def compile(self) -> list[Pipeline]:
        """One pipeline per pass (each with the pipeline constants its module declares)."""
        if self.pipelines is None:
            pipelines = []
            for rendered, record in zip(self.kernel.passes, self.entry["passes"], strict=True):
                declared = {o["name"] for o in record["overrides"]}
                constants = {k: v for k, v in self.constants.items() if k in declared}
                label = (
                    self.name
                    if len(self.kernel.passes) == 1
                    else f"{self.name}.{rendered.spec.name}"
                )
                try:
                    pipelines.append(
                        self.device.compile(
                            rendered.text,
                            entry_point=record["entry_point"],
                            constants=constants or None,
                            label=label,
                        )
                    )
                except ShaderCompileError as error:
                    raise ShaderCompileError(
                        describe_compile_error(self.kernel, rendered, error),
                        error.diagnostics,
                        error.backend,
                    ) from None
            self.pipelines = pipelines
        return self.pipelines

    def constant_values(self) -> dict[str, float]:
        """Override defaults of every pass, then the pipeline constants set on them."""
        return constant_values(self.entry, self.constants)

    # -- prepare ------------------------------------------------------------------------------

    def refuse(self, spec: Any) -> str | None:
        """The family's refusal of ``spec`` from its dimensions alone (cheap, before inputs)."""
        return self.family.refuse(spec, self.entry, self.device.limits, self.constant_values())

    def prepare(self, spec: Any) -> Prepared | Refusal:
        """Refuse, or build inputs and create every buffer of every pass (outputs poisoned)."""
        plan = self._plan(spec)
        if isinstance(plan, Refusal):
            return plan
        data, names, grids = plan
        pipelines = self.compile()
        return self._bind(data, pipelines, grids, names)

    def unrunnable(self, spec: Any) -> str | None:
        """Why ``spec`` cannot run on this device (what ``prepare`` would refuse), found
        without compiling or creating a buffer; None when it can run."""
        plan = self._plan(spec)
        return plan.reason if isinstance(plan, Refusal) else None

    def _plan(
        self, spec: Any
    ) -> tuple[CaseData, dict[str, float], list[tuple[int, int, int] | None]] | Refusal:
        """The case's inputs, the names its dispatch rules read and each pass's grid; or the
        refusal (the family's, or a dispatch or buffer past the device's limits)."""
        reason = self.refuse(spec)
        if reason:
            return Refusal(reason)
        data = self.family.build(spec, self.entry)
        names = {**self.constant_values(), **data.uniforms}
        workgroups = [evaluate_dispatch(p["dispatch"], names) for p in self.entry["passes"]]
        grids = self._grids(workgroups)
        reason = self._limits_refusal(data, workgroups, grids, names)
        if reason:
            return Refusal(reason)
        return data, names, grids

    def _workgroup_limit(self) -> int:
        """Workgroups a dispatch dimension holds on this device."""
        return int(self.device.limits.get("max-compute-workgroups-per-dimension", 65535))

    def _grids(self, workgroups: list[int]) -> list[tuple[int, int, int] | None]:
        """Each pass's dispatch grid (``dispatch_grid``) on this device; None: not dispatchable."""
        limit = self._workgroup_limit()
        return [
            dispatch_grid(
                count, limit, bool(record.get("dispatch_fold")), row_limit=self.fold_above
            )
            for count, record in zip(workgroups, self.entry["passes"], strict=True)
        ]

    def _limits_refusal(
        self,
        data: CaseData,
        workgroups: list[int],
        grids: list[tuple[int, int, int] | None],
        names: Mapping[str, float],
    ) -> str | None:
        limit = self._workgroup_limit()
        for count, grid, record in zip(workgroups, grids, self.entry["passes"], strict=True):
            if grid is None:
                of = f" (pass {record['name']})" if len(workgroups) > 1 else ""
                how = " even folded into two dimensions" if record.get("dispatch_fold") else ""
                return f"{count} workgroups{of} exceed the device limit {limit} per dimension{how}"
        largest = self.device.limits.get("max-storage-buffer-binding-size", 1 << 27)
        sizes = {name: array.nbytes for name, array in data.buffers.items()}
        sizes.update(self.scratch_sizes(names))
        for binding, size in sizes.items():
            if size > largest:
                return f"buffer {binding} needs {size} B; the device binds at most {largest} B"
        return None

    def scratch_sizes(self, names: Mapping[str, float]) -> dict[str, int]:
        """Bytes of each scratch buffer for one case (its size expression times the element)."""
        sizes = {}
        for scratch in self.entry["scratch"]:
            count = evaluate_dispatch(scratch["size"], names, f"scratch size {scratch['name']}")
            itemsize = np.dtype(NUMPY_DTYPES[scratch["element_type"]]).itemsize
            sizes[scratch["name"]] = max(count, 1) * itemsize
        return sizes

    def _bind(
        self,
        data: CaseData,
        pipelines: list[Pipeline],
        grids: list[tuple[int, int, int] | None],
        names: Mapping[str, float],
    ) -> Prepared:
        output_shape = self.family.output_shape(data)
        out_binding = self.output_binding()
        out_type = out_binding["element_type"]
        buffers: dict[str, Buffer] = {}
        poison: list[tuple[Buffer, bytes]] = []
        scratch_bytes = self.scratch_sizes(names)
        self._check_uniform_values(data)
        steps = []
        for record, pipeline, grid in zip(self.entry["passes"], pipelines, grids, strict=True):
            assert grid is not None  # _limits_refusal refused the case otherwise
            slots: dict[int, Buffer] = {}
            for b in record["bindings"]:
                key = b["name"] if b["role"] != UNIFORM else f"{b['name']}@{record['name']}"
                if key not in buffers:
                    buffers[key] = self._buffer(
                        b, record, data, output_shape, scratch_bytes, poison
                    )
                slots[b["binding"]] = buffers[key]
            steps.append(Step(pipeline, slots, grid))
        out_bytes = int(np.prod(output_shape)) * np.dtype(NUMPY_DTYPES[out_type]).itemsize
        moved = sum(int(a.nbytes) for a in data.buffers.values()) + out_bytes
        return Prepared(
            data,
            steps,
            buffers[out_binding["name"]],
            output_shape,
            NUMPY_DTYPES[out_type],
            poison,
            moved,
            scratch_bytes,
        )

    def _buffer(
        self,
        binding: Mapping[str, Any],
        record: Mapping[str, Any],
        data: CaseData,
        output_shape: tuple[int, ...],
        scratch_bytes: Mapping[str, int],
        poison: list[tuple[Buffer, bytes]],
    ) -> Buffer:
        name, role = binding["name"], binding["role"]
        if role == UNIFORM:
            fields = {f["name"] for f in record["uniforms"]["fields"]}
            values = {k: v for k, v in data.uniforms.items() if k in fields}
            return self.device.uniform_buffer(pack_uniforms(record["uniforms"], values), label=name)
        if role in (OUTPUT, SCRATCH):
            itemsize = np.dtype(NUMPY_DTYPES[binding["element_type"]]).itemsize
            count = (
                int(np.prod(output_shape)) if role == OUTPUT else scratch_bytes[name] // itemsize
            )
            nan = poison_bytes(binding["element_type"], count)
            buffer = self.device.storage_buffer(nan, read_write=True, label=name)
            poison.append((buffer, nan))
            return buffer
        return self.device.storage_buffer(self.input_array(binding, data), label=name)

    def _check_uniform_values(self, data: CaseData) -> None:
        """Every uniform value must land in some pass's struct (see ``pack_uniforms``)."""
        fields = {
            f["name"]
            for record in self.entry["passes"]
            if record["uniforms"]
            for f in record["uniforms"]["fields"]
        }
        extra = sorted(set(data.uniforms) - fields)
        if extra:
            raise DopplerGenError(
                f"uniform values {', '.join(extra)} have no field in any pass's uniform struct"
            )
        for record in self.entry["passes"]:
            if record["uniforms"]:
                struct_fields = {f["name"] for f in record["uniforms"]["fields"]}
                values = {k: v for k, v in data.uniforms.items() if k in struct_fields}
                pack_uniforms(record["uniforms"], values)

    def output_binding(self) -> dict[str, Any]:
        found = {
            b["name"]: b for p in self.entry["passes"] for b in p["bindings"] if b["role"] == OUTPUT
        }
        if len(found) != 1:
            raise DopplerGenError(f"{self.name}: expected exactly one output binding")
        return next(iter(found.values()))

    def input_array(self, binding: Mapping[str, Any], data: CaseData) -> np.ndarray:
        name = binding["name"]
        if name not in data.buffers:
            raise DopplerGenError(f"{self.name}: the case provides no data for binding {name}")
        array = np.ascontiguousarray(data.buffers[name]).reshape(-1)
        expected = NUMPY_DTYPES[binding["element_type"]]
        if array.dtype != expected:
            raise DopplerGenError(
                f"binding {name} is array<{binding['element_type']}> but the case built {array.dtype}"
            )
        return array

    # -- run ----------------------------------------------------------------------------------

    def run(self, prepared: Prepared) -> np.ndarray:
        """Poison outputs and scratch, run every pass in one command buffer; the output as f64."""
        for buffer, nan in prepared.poison:
            self.device.write_buffer(buffer, nan)
        self.device.run(prepared.steps)
        return self.read_output(prepared)

    def run_as_timed(self, prepared: Prepared) -> np.ndarray:
        """One more run as the timed runs ran, on the state they left (nothing poisoned), but
        with the output first filled with a finite value no correct kernel leaves there: a
        kernel that skips work when its output already holds something (or that depends on
        what an earlier run left in its scratch) is then judged wrong."""
        count = int(np.prod(prepared.output_shape))
        self.device.write_buffer(
            prepared.output, filled_bytes(prepared.out_dtype, count, STALE_OUTPUT)
        )
        self.device.run(prepared.steps)
        return self.read_output(prepared)

    def read_output(self, prepared: Prepared) -> np.ndarray:
        """The output buffer as float64 in the output's logical shape."""
        raw = self.device.read_buffer(prepared.output)
        count = int(np.prod(prepared.output_shape))
        values = np.frombuffer(raw, dtype=prepared.out_dtype, count=count)
        return values.astype(np.float64).reshape(prepared.output_shape)

    def timed(
        self, prepared: Prepared, *, repeats: int, warmup: int, split_passes: bool = False
    ) -> list[PassTimes]:
        """Timestamps around each run of the pass sequence on the prepared buffers: one compute
        pass per run, or with ``split_passes`` a compute pass per pass (each pass's own span)."""
        return self.device.timed_run(
            prepared.steps, repeats=repeats, warmup=warmup, split_passes=split_passes
        )

    # -- judge --------------------------------------------------------------------------------

    def judge(self, prepared: Prepared, output: np.ndarray) -> Verdict:
        """The output against the family's float64 reference, within its tolerance.

        Large outputs are compared on the rows the family samples (``sampling``); NaN/Inf
        anywhere in the output fails whatever the sample.
        """
        data = prepared.data
        sample = self.family.row_sample(data)
        stats: dict[str, float] = {}
        ref = self.family.reference(data, self.entry, stats=stats, sample=sample)
        out_type = self.output_binding()["element_type"]
        tol, policy = self.family.tolerance(data, self.entry, out_type, ref, stats, sample)
        return judge_sampled(output, ref, sample, tol, policy)

    def run_case(self, spec: Any, *, keep_output: bool = False) -> CaseResult:
        """Prepare (or refuse), run and judge one case; ``keep_output`` keeps the output array."""
        prepared = self.prepare(spec)
        if isinstance(prepared, Refusal):
            return CaseResult(spec, None, refused=f"{self.name}: {prepared.reason}")
        output = self.run(prepared)
        verdict = self.judge(prepared, output)
        return CaseResult(
            spec, verdict, output=output if keep_output else None, elements=int(output.size)
        )


def describe_compile_error(
    kernel: RenderedKernel, rendered: RenderedPass, error: ShaderCompileError, context: int = 2
) -> str:
    """The compiler's complaint at the template line, with the rendered lines around it."""
    name = kernel.variant.name
    if not error.diagnostics:
        return f"{rendered.spec.source_path} (variant {name}): {error.message}"
    lines = rendered.text.split("\n")
    parts = []
    for line, column, message in error.diagnostics[:3]:
        origin = rendered.origin(line)
        where = f"{origin[0]}:{origin[1]}" if origin else rendered.spec.source_path
        parts.append(f"{where} ({rendered.output}:{line}:{column}): {message}")
        for number in range(max(1, line - context), min(len(lines), line + context) + 1):
            mark = ">" if number == line else " "
            parts.append(f"  {mark}{number:5} | {lines[number - 1]}")
    return "\n".join(parts)
