"""The split-KV (flash-decoding) decode passes, run as two dispatches on the adapter.

The two templates (templates/attention_decode_split_{partials,reduce}.wgsl.j2) are not yet
variants: variants.toml has no multi-pass templates or scratch buffers on this branch. Until it
does, this module renders both passes, sizes and NaN-poisons the scratch buffers, dispatches the
partials pass and then the reduce pass, and judges the output against the float64 tiled
reference with the validator's tolerances, over the tiled family's case matrix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from gpu_support import adapter_problem
from split_kernel import BASE, F16, SplitKernel

from doppler_gen import reference
from doppler_gen.backends import Device, effective_limits, get_backend, select_adapter
from doppler_gen.cases import CaseSpec, tiled_specs
from doppler_gen.tolerance import f16_tolerance, f32_tolerance, judge

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]


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
