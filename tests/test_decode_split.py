"""The split-KV (flash-decoding) decode passes, run as two dispatches on the adapter.

The two templates (templates/attention_decode_split_{partials,reduce}.wgsl.j2) are not yet
variants: variants.toml has no multi-pass templates or scratch buffers on this branch. Until it
does, this module renders both passes, sizes and NaN-poisons the scratch buffers, dispatches the
partials pass and then the reduce pass, and judges the output against the float64 tiled
reference with the validator's tolerances, over the tiled family's case matrix.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from conftest import REPO_ROOT
from gpu_support import adapter_problem

from doppler_gen import reference
from doppler_gen.backends import Device, effective_limits, get_backend, select_adapter
from doppler_gen.cases import NUMPY_DTYPES, CaseSpec, build_tiled, tiled_specs
from doppler_gen.config import TemplateSpec, Variant, load_project
from doppler_gen.harness import pack_uniforms
from doppler_gen.manifest import _uniform_layout
from doppler_gen.render import Renderer
from doppler_gen.tolerance import f16_tolerance, f32_tolerance, judge
from doppler_gen.wgsl import parse_module

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

BASE = {
    "q_dtype": "f32",
    "kv_dtype": "f32",
    "out_dtype": "f32",
    "max_head_dim": 128,
    "masked_row": "zero",
    "reduce": "subgroup",
    "workgroup_size": 256,
    "lanes_per_key": 8,
    "keys_per_iter": 2,
    "kv_split": 16,
    "reduce_workgroup_size": 64,
}
F16 = {"q_dtype": "f16", "kv_dtype": "f16", "out_dtype": "f16"}


def render(params: dict[str, Any], source: str) -> str:
    """The WGSL of one pass for ``params`` (a throwaway variant of a throwaway template)."""
    project = load_project(REPO_ROOT)
    template = TemplateSpec(source, source, "tiled", "", "", params, {}, {}, 0)
    requires = tuple(
        f
        for f, wanted in (
            ("shader-f16", "f16" in (params["q_dtype"], params["kv_dtype"], params["out_dtype"])),
            ("subgroups", params["reduce"] == "subgroup"),
        )
        if wanted
    )
    variant = Variant("split", template, "generated/split.wgsl", "", requires, params, 0)
    return Renderer(project).render(variant).text


class SplitKernel:
    """Both passes compiled on one device; ``run`` dispatches them in order."""

    def __init__(self, device: Device, params: dict[str, Any]) -> None:
        self.device, self.params = device, params
        self.partials_text = render(params, "attention_decode_split_partials.wgsl.j2")
        self.reduce_text = render(params, "attention_decode_split_reduce.wgsl.j2")
        self.partials = device.compile(self.partials_text, label="partials")
        self.reduce = device.compile(self.reduce_text, label="reduce")
        partials_module = parse_module(self.partials_text)
        self.layout = _uniform_layout(partials_module, "Uniforms")
        self.dtypes = {b.name: b.element_type for b in partials_module.bindings if b.element_type}
        self.dtypes["output"] = params["out_dtype"]

    def bind(self, spec: CaseSpec, data: Any = None) -> dict[str, Any]:
        """Buffers (output and scratch NaN-poisoned), bindings and workgroups of both passes."""
        data = data or build_tiled(spec, self.dtypes)
        u = data.uniforms
        splits = math.ceil(int(u["seq_len"]) / int(self.params["kv_split"]))
        slots = int(u["query_len"]) * int(u["num_heads"])
        dev = self.device
        uniforms = dev.uniform_buffer(pack_uniforms(self.layout, u))
        inputs = {
            name: dev.storage_buffer(np.ascontiguousarray(data.buffers[name]).reshape(-1))
            for name in ("Q", "K", "V", "kv_len_buffer", "page_table")
        }
        out_type = NUMPY_DTYPES[self.params["out_dtype"]]
        output = dev.storage_buffer(
            np.full(slots * int(u["head_dim"]), np.nan, out_type), read_write=True
        )
        acc = dev.storage_buffer(
            np.full(splits * slots * int(u["head_dim"]), np.nan, np.float32), read_write=True
        )
        ml = dev.storage_buffer(np.full(splits * slots * 2, np.nan, np.float32), read_write=True)
        first = {0: uniforms, 1: inputs["Q"], 2: inputs["K"], 3: inputs["V"]}
        first.update({5: inputs["kv_len_buffer"], 6: inputs["page_table"], 7: acc, 8: ml})
        return {
            "data": data,
            "output": output,
            "out_type": out_type,
            "shape": (int(u["query_len"]), int(u["num_heads"]), int(u["head_dim"])),
            "passes": [
                (self.partials, first, (splits * int(u["num_kv_heads"]), 1, 1)),
                (self.reduce, {0: uniforms, 4: output, 7: acc, 8: ml}, (slots, 1, 1)),
            ],
        }

    def run(self, spec: CaseSpec) -> tuple[np.ndarray, Any]:
        bound = self.bind(spec)
        for pipeline, bindings, workgroups in bound["passes"]:
            self.device.dispatch(pipeline, bindings, workgroups)
        count = int(np.prod(bound["shape"]))
        raw = np.frombuffer(self.device.read_buffer(bound["output"]), bound["out_type"], count)
        return raw.astype(np.float64).reshape(bound["shape"]), bound["data"]


def verdict(kernel: SplitKernel, spec: CaseSpec):
    output, data = kernel.run(spec)
    r = data.reference_inputs
    stats: dict[str, float] = {}

    def ref(dtype: Any, into: dict[str, float] | None = None) -> np.ndarray:
        return reference.tiled_attention(
            data.uniforms,
            r["q"],
            r["k"],
            r["v"],
            kv_len_buffer=r["kv_len_buffer"],
            page_table=r["page_table"],
            compute_dtype=dtype,
            stats=into,
        )

    exact = ref(np.float64, stats)
    if kernel.params["out_dtype"] == "f16":
        baseline = ref(np.float32).astype(np.float16).astype(np.float64)
        error = float(np.max(np.abs(baseline - exact))) if exact.size else 0.0
        tol = f16_tolerance(error, float(np.max(np.abs(exact))) if exact.size else 0.0)
        return judge(output, exact, tol, "f16")
    tol = f32_tolerance(
        stats.get("value_bound", 0.0),
        int(data.uniforms["head_dim"]),
        stats.get("logit_bound", 0.0),
        int(stats.get("keys", 0)),
    )
    return judge(output, exact, tol, "f32")


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    backend = get_backend("wgpu")
    adapter = select_adapter(backend.adapters(), None)
    features = [f for f in ("shader-f16", "subgroups") if f in adapter.features]
    if len(features) < 2:
        pytest.skip(f"adapter {adapter.name} lacks shader-f16 or subgroups")
    dev = backend.open_device(
        adapter, features=features, limits=effective_limits(adapter, "adapter")
    )
    yield dev
    dev.close()


CONFIGS = {
    "f32 subgroup d128": {},
    "f16 subgroup d64": {**F16, "max_head_dim": 64},
    "f16kv workgroup d256": {"kv_dtype": "f16", "reduce": "workgroup", "max_head_dim": 256},
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_split_passes_match_the_reference_on_the_quick_matrix(device: Device, config: str) -> None:
    params = {**BASE, **CONFIGS[config]}
    kernel = SplitKernel(device, params)
    for spec in tiled_specs(params["max_head_dim"], quick=True, seed=0):
        result = verdict(kernel, spec)
        assert result.passed, f"{config}: {spec.name}: {result}"


def test_many_splits_and_heads_beyond_one_chunk(device: Device) -> None:
    """MQA with 24 heads on one KV head (several head chunks) over 40 splits of 8 keys."""
    params = {**BASE, "kv_split": 8, "workgroup_size": 64}
    kernel = SplitKernel(device, params)
    spec = CaseSpec("mqa", num_heads=24, num_kv_heads=1, head_dim=32, kv_len=317, start_pos=316)
    for case in (spec, replace(spec, sliding_window=50), replace(spec, kv_len_source=1)):
        result = verdict(kernel, case)
        assert result.passed, f"{case}: {result}"
