"""GPU timing of the split-KV decode passes until they are variants (run by hand on the H200).

Usage (repo root): PYTHONPATH=src python3 tests/gpu_split_timing.py [--json FILE]
Times the partials and the reduce pass separately with timestamp queries (median of 30 after
5 warm-up) for each (params, shape) below and prints their sum and the effective GB/s of
K and V read once. Not a test: pytest does not collect it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from split_kernel import BASE, F16, SplitKernel

from doppler_gen.backends import effective_limits, get_backend, select_adapter
from doppler_gen.cases import build_tiled
from doppler_gen.shapes import parse_shape

SHAPES = [
    "decode:kv=8192,h=32,kvh=8,d=64",
    "decode:kv=8192,h=32,kvh=8,d=128",
    "decode:kv=2048,h=32,kvh=8,d=128",
    "decode:kv=32768,h=32,kvh=8,d=128",
    "decode:kv=131072,h=32,kvh=8,d=128",
]
SPLITS = (256, 512, 1024)
CONFIGS = [
    {**F16, "max_head_dim": 64, "lanes_per_key": 8, "workgroup_size": 256},
    {**F16, "max_head_dim": 128, "lanes_per_key": 8, "workgroup_size": 256},
    {**F16, "max_head_dim": 128, "lanes_per_key": 8, "workgroup_size": 512},
]


def main() -> None:
    backend = get_backend("wgpu")
    adapter = select_adapter(backend.adapters(), None)
    features = [f for f in ("shader-f16", "subgroups", "timestamp-query") if f in adapter.features]
    device = backend.open_device(
        adapter, features=features, limits=effective_limits(adapter, "adapter")
    )
    rows = []
    inputs = {}  # built once per shape: the kv=131072 tensors take seconds to draw
    for config in CONFIGS:
        for split in SPLITS:
            params = {**BASE, **config, "kv_split": split}
            kernel = SplitKernel(device, params)
            for text in SHAPES:
                shape = parse_shape(text)
                if shape.head_dim > params["max_head_dim"]:
                    continue
                if params["max_head_dim"] == 128 and shape.head_dim < 128:
                    continue
                if text not in inputs:
                    inputs[text] = build_tiled(shape.case_spec(0), kernel.dtypes)
                bound = kernel.bind(shape.case_spec(0), inputs[text])
                medians = []
                for pipeline, bindings, workgroups in bound["passes"]:
                    device.dispatch(pipeline, bindings, workgroups)
                    times = device.timed_dispatch(
                        pipeline, bindings, workgroups, repeats=30, warmup=5
                    )
                    medians.append(float(np.median(times)))
                count = int(np.prod(bound["shape"]))
                out = np.frombuffer(device.read_buffer(bound["output"]), bound["out_type"], count)
                kv_bytes = 2 * shape.kv_len * shape.num_kv_heads * shape.head_dim * 2
                total = sum(medians)
                row = {
                    "shape": text,
                    "params": {k: params[k] for k in [*sorted(config), "kv_split"]},
                    "partials_us": medians[0] / 1e3,
                    "reduce_us": medians[1] / 1e3,
                    "total_us": total / 1e3,
                    "kv_gbps": kv_bytes / total,
                    "finite": bool(np.isfinite(out).all()),
                }
                rows.append(row)
                print(
                    f"{text:36} split={split:5} wg={params['workgroup_size']:4} "
                    f"kpi={params['keys_per_iter']} d<={params['max_head_dim']:3}  "
                    f"partials {row['partials_us']:8.1f} us  reduce {row['reduce_us']:6.1f} us  "
                    f"total {row['total_us']:8.1f} us  {row['kv_gbps']:7.0f} GB/s  "
                    f"finite={row['finite']}",
                    flush=True,
                )
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        Path(sys.argv[2]).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
