"""Run one generated kernel on a WebGPU device and judge its output against the reference.

Everything host-side comes from the variant's manifest entry: uniform fields are packed by name
at the offsets the WGSL layout gives, buffers are bound by binding name and checked against the
binding's element type, and the workgroup count comes from the variant's dispatch rule. There is
no per-variant offset, index or size written in Python.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from doppler_gen import reference
from doppler_gen.backends import Buffer, Device, Pipeline
from doppler_gen.cases import NUMPY_DTYPES, CaseData, CaseSpec, build_tiered, build_tiled
from doppler_gen.errors import DopplerGenError, ShaderCompileError, ShapeError
from doppler_gen.render import RenderedKernel
from doppler_gen.tolerance import Verdict, f16_tolerance, f32_tolerance, judge

_PACK = {"u32": "<I", "i32": "<i", "f32": "<f"}


@dataclass
class CaseResult:
    spec: CaseSpec
    verdict: Verdict | None  # None when the case was refused
    refused: str | None = None

    @property
    def passed(self) -> bool:
        return self.verdict is not None and self.verdict.passed


def pack_uniforms(layout: dict[str, Any], values: dict[str, float]) -> bytes:
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


def evaluate_dispatch(rule: str, names: dict[str, float]) -> int:
    """Evaluate a dispatch rule like ``ceil(query_len / BLOCK_SIZE) * num_heads``."""
    unknown = set(re.findall(r"[A-Za-z_]\w*", rule)) - set(names) - {"ceil"}
    if unknown:
        raise DopplerGenError(
            f"dispatch rule {rule!r} uses unknown names {', '.join(sorted(unknown))}"
        )
    value = eval(rule, {"__builtins__": {}}, {"ceil": math.ceil, **names})
    return int(value)


@dataclass
class BoundCase:
    """One case's pipeline and GPU buffers, ready to dispatch (the output NaN-poisoned)."""

    pipeline: Pipeline
    bindings: dict[int, Buffer]
    output: Buffer
    workgroups: tuple[int, int, int]
    output_shape: tuple[int, ...]
    out_dtype: Any


class KernelRunner:
    """One compiled variant on one device: runs cases and judges them."""

    def __init__(
        self,
        device: Device,
        kernel: RenderedKernel,
        entry: dict[str, Any],
        constants: dict[str, float] | None = None,
    ) -> None:
        self.device = device
        self.kernel = kernel
        self.entry = entry
        # the variant's recorded pipeline constants, then any the caller sweeps (tune, bench)
        self.constants = {**entry.get("pipeline_constants", {}), **(constants or {})}
        self.family = entry["family"]
        self.meta = entry["metadata"]
        self.dtypes = {b["name"]: b["element_type"] for b in entry["bindings"] if b["element_type"]}
        self.pipeline: Pipeline | None = None

    # -- compile ------------------------------------------------------------------------------

    def compile(self) -> Pipeline:
        if self.pipeline is None:
            try:
                self.pipeline = self.device.compile(
                    self.kernel.text,
                    entry_point=self.entry["entry_point"],
                    constants=self.constants or None,
                    label=self.kernel.variant.name,
                )
            except ShaderCompileError as error:
                raise ShaderCompileError(
                    describe_compile_error(self.kernel, error), error.diagnostics, error.backend
                ) from None
        return self.pipeline

    # -- cases --------------------------------------------------------------------------------

    def build(self, spec: CaseSpec) -> CaseData:
        if self.family == "tiled":
            return build_tiled(spec, self.dtypes)
        return build_tiered(spec, self.dtypes, str(self.entry["params"]["cold"]))

    def check_spec(self, spec: CaseSpec) -> None:
        """Refuse a problem the kernel does not support, from its dimensions alone.

        Cheap: runs before any tensor is built, so an oversized bench shape is refused instead
        of allocating gigabytes of inputs first.
        """
        name = self.kernel.variant.name
        head_dim_limit = int(self.meta["max_head_dim"])
        if self.family == "tiered" and self.has_override("WORKGROUP_SIZE"):
            head_dim_limit = min(head_dim_limit, self.override("WORKGROUP_SIZE"))
        if spec.head_dim > head_dim_limit:
            raise ShapeError(
                f"{name}: head_dim {spec.head_dim} exceeds the kernel's maximum {head_dim_limit}"
            )
        width = self.kv_vector_width()
        if spec.head_dim % width:
            raise ShapeError(
                f"{name}: head_dim {spec.head_dim} is not a multiple of {width} "
                f"(the kernel reads K/V as vec{width})"
            )
        if spec.head_dim < 1 or spec.num_heads < 1 or spec.num_kv_heads < 1:
            raise ShapeError(f"{name}: head_dim, num_heads and num_kv_heads must be positive")
        if spec.num_heads % spec.num_kv_heads:
            raise ShapeError(
                f"{name}: num_heads {spec.num_heads} is not a multiple of num_kv_heads "
                f"{spec.num_kv_heads}"
            )
        max_kv = self.meta.get("max_kv_len")
        total = spec.cold_len + spec.hot_len if self.family == "tiered" else spec.kv_len
        if max_kv is not None and total > max_kv:
            detail = (
                f" (cold {spec.cold_len} + hot {spec.hot_len})" if self.family == "tiered" else ""
            )
            raise ShapeError(f"{name}: KV length {total}{detail} exceeds MAX_KV_LEN {max_kv}")
        largest = self.device.limits.get("max-storage-buffer-binding-size", 1 << 27)
        rows = max(spec.kv_start + spec.kv_len, spec.cold_len, spec.hot_len, spec.hot_window)
        biggest = 4 * spec.head_dim * max(spec.query_len * spec.num_heads, rows * spec.num_kv_heads)
        if biggest > largest:
            raise ShapeError(
                f"{name}: a buffer would need about {biggest} B; the device binds at most {largest} B"
            )

    def check_shape(self, data: CaseData) -> None:
        """Refuse, before any dispatch, a problem the kernel does not support."""
        self.check_spec(data.spec)
        name = self.kernel.variant.name
        workgroups = self.workgroups(data)
        limit = self.device.limits.get("max-compute-workgroups-per-dimension", 65535)
        if workgroups > limit:
            raise ShapeError(
                f"{name}: {workgroups} workgroups exceed the device limit {limit} per dimension"
            )
        largest = self.device.limits.get("max-storage-buffer-binding-size", 1 << 27)
        for binding, array in data.buffers.items():
            if array.nbytes > largest:
                raise ShapeError(
                    f"{name}: buffer {binding} needs {array.nbytes} B; the device binds at most {largest} B"
                )

    def kv_vector_width(self) -> int:
        """Elements per load of the K binding (4 for ``array<vec4<f16>>``): head_dim must divide."""
        key = next((b for b in self.entry["bindings"] if b["name"] in ("K", "K_hot")), None)
        match = re.match(r"array<vec([234])<", key["type"]) if key else None
        return int(match.group(1)) if match else 1

    def has_override(self, name: str) -> bool:
        return name in self.constants or any(o["name"] == name for o in self.entry["overrides"])

    def override(self, name: str) -> int:
        if name in self.constants:
            return int(self.constants[name])
        for o in self.entry["overrides"]:
            if o["name"] == name:
                return int(o["default"])
        raise KeyError(name)

    def workgroups(self, data: CaseData) -> int:
        names = {
            **{o["name"]: o["default"] for o in self.entry["overrides"]},
            **self.constants,
            **data.uniforms,
        }
        return evaluate_dispatch(self.meta["dispatch"], names)

    def output_shape(self, data: CaseData) -> tuple[int, ...]:
        u = data.uniforms
        if self.family == "tiled":
            return (int(u["query_len"]), int(u["num_heads"]), int(u["head_dim"]))
        return (int(u["num_heads"]), int(u["head_dim"]))

    def bind(self, data: CaseData) -> BoundCase:
        """Compile, refuse an unsupported shape, and create every buffer of one dispatch.

        Split from ``run`` so that ``bench`` can dispatch the very same bindings many times: its
        timings then measure the kernel exactly as validation drives it, not a re-implementation.
        """
        pipeline = self.compile()
        self.check_shape(data)
        out_binding = self.output_binding()
        out_dtype = NUMPY_DTYPES[out_binding["element_type"]]
        shape = self.output_shape(data)
        poison = np.full(int(np.prod(shape)), np.nan, dtype=out_dtype)
        bindings = {}
        for b in self.entry["bindings"]:
            name = b["name"]
            if b["address_space"] == "uniform":
                bindings[b["binding"]] = self.device.uniform_buffer(
                    pack_uniforms(self.entry["uniforms"], data.uniforms), label=name
                )
            elif name == out_binding["name"]:
                output = self.device.storage_buffer(poison, read_write=True, label=name)
                bindings[b["binding"]] = output
            else:
                array = self.input_array(b, data)
                bindings[b["binding"]] = self.device.storage_buffer(array, label=name)
        workgroups = (self.workgroups(data), 1, 1)
        return BoundCase(pipeline, bindings, output, workgroups, shape, out_dtype)

    def read_output(self, bound: BoundCase) -> np.ndarray:
        """The output buffer as float64 in the output's logical shape."""
        raw = self.device.read_buffer(bound.output)
        count = int(np.prod(bound.output_shape))
        values = np.frombuffer(raw, dtype=bound.out_dtype, count=count)
        return values.astype(np.float64).reshape(bound.output_shape)

    def run(self, data: CaseData) -> np.ndarray:
        """Dispatch once on NaN-poisoned output; returns the output as float64."""
        bound = self.bind(data)
        self.device.dispatch(bound.pipeline, bound.bindings, bound.workgroups)
        return self.read_output(bound)

    def output_binding(self) -> dict[str, Any]:
        writable = [b for b in self.entry["bindings"] if b["access"] == "read_write"]
        if len(writable) != 1:
            raise DopplerGenError(
                f"{self.kernel.variant.name}: expected exactly one read_write binding"
            )
        return writable[0]

    def input_array(self, binding: dict[str, Any], data: CaseData) -> np.ndarray:
        name = binding["name"]
        if name not in data.buffers:
            raise DopplerGenError(
                f"{self.kernel.variant.name}: the case provides no data for binding {name}"
            )
        array = np.ascontiguousarray(data.buffers[name]).reshape(-1)
        expected = NUMPY_DTYPES[binding["element_type"]]
        if array.dtype != expected:
            raise DopplerGenError(
                f"binding {name} is array<{binding['element_type']}> but the case built {array.dtype}"
            )
        return array

    # -- judging ------------------------------------------------------------------------------

    def reference(
        self, data: CaseData, compute_dtype: Any = np.float64, stats: dict[str, float] | None = None
    ) -> np.ndarray:
        r = data.reference_inputs
        if self.family == "tiled":
            return reference.tiled_attention(
                data.uniforms,
                r["q"],
                r["k"],
                r["v"],
                kv_len_buffer=r["kv_len_buffer"],
                page_table=r["page_table"],
                compute_dtype=compute_dtype,
                stats=stats,
            )
        return reference.tiered_attention(
            data.uniforms,
            r["q"],
            r["k_hot"],
            r["v_hot"],
            r["k_cold"],
            r["v_cold"],
            cold_page_table=r.get("cold_page_table"),
            masked_row=self.meta["masked_row"],
            quantized=r["quantized"],
            compute_dtype=compute_dtype,
            stats=stats,
        )

    def tolerance(
        self, data: CaseData, ref: np.ndarray, stats: dict[str, float]
    ) -> tuple[float, str]:
        """The case's tolerance (see tolerance.py); ``stats`` come from the float64 reference."""
        out_dtype = self.output_binding()["element_type"]
        if out_dtype == "f16":
            baseline = self.reference(data, np.float32).astype(np.float16).astype(np.float64)
            error = float(np.max(np.abs(baseline - ref))) if ref.size else 0.0
            ref_max = float(np.max(np.abs(ref))) if ref.size else 0.0
            return f16_tolerance(error, ref_max), "f16: 2x numpy-f32 baseline + floor"
        bound = f32_tolerance(
            stats.get("value_bound", 0.0),
            int(data.uniforms["head_dim"]),
            stats.get("logit_bound", 0.0),
            int(stats.get("keys", 0)),
        )
        return bound, "f32: rounding bound vs fp64"

    def run_case(self, spec: CaseSpec) -> CaseResult:
        try:
            self.check_spec(spec)
            data = self.build(spec)
            self.check_shape(data)
        except ShapeError as error:
            return CaseResult(spec, None, refused=error.message)
        output = self.run(data)
        stats: dict[str, float] = {}
        ref = self.reference(data, stats=stats)
        tol, policy = self.tolerance(data, ref, stats)
        return CaseResult(spec, judge(output, ref, tol, policy))


def describe_compile_error(
    kernel: RenderedKernel, error: ShaderCompileError, context: int = 2
) -> str:
    """The compiler's complaint at the template line, with the rendered lines around it."""
    if not error.diagnostics:
        return f"{kernel.variant.template.source_path} (variant {kernel.variant.name}): {error.message}"
    lines = kernel.text.split("\n")
    parts = []
    for line, column, message in error.diagnostics[:3]:
        origin = kernel.origin(line)
        where = f"{origin[0]}:{origin[1]}" if origin else kernel.variant.template.source_path
        parts.append(f"{where} ({kernel.variant.output}:{line}:{column}): {message}")
        for number in range(max(1, line - context), min(len(lines), line + context) + 1):
            mark = ">" if number == line else " "
            parts.append(f"  {mark}{number:5} | {lines[number - 1]}")
    return "\n".join(parts)
