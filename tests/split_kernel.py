"""Render and run the two split-KV decode passes (shared by tests/test_decode_split.py and
tests/gpu_split_timing.py; no pytest here, so the timing script runs where pytest is absent)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from doppler_gen.backends import Device
from doppler_gen.cases import NUMPY_DTYPES, CaseSpec, build_tiled
from doppler_gen.config import TemplateSpec, Variant, load_project
from doppler_gen.harness import pack_uniforms
from doppler_gen.manifest import _uniform_layout
from doppler_gen.render import Renderer
from doppler_gen.wgsl import parse_module

REPO_ROOT = Path(__file__).resolve().parents[1]

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
    "unroll": False,
    "v_with_k": True,
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
