"""The backend contract: what every WebGPU implementation in ``backends.BACKENDS`` must do.

One suite, parametrized over the registered backends (wgpu-py/naga, Dawn/Tint), so a behaviour
is specified once and a new backend is held to all of it. Where implementations word a message
differently (naga's and Tint's diagnostics), the expectation per backend is in ``EXPECT``; each
is as exact as the implementation allows. A backend with no adapter here skips with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from doppler_gen.backends import (
    BACKENDS,
    AdapterInfo,
    Backend,
    Device,
    Step,
    get_backend,
    select_adapter,
)
from doppler_gen.errors import BackendUnavailable, DopplerGenError, ShaderCompileError

pytestmark = pytest.mark.gpu

SCALE_WGSL = """override SCALE: f32 = 1.0;
override OFFSET: f32 = 0.0;

struct Params { count: u32, }

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < params.count) {
        dst[gid.x] = src[gid.x] * SCALE + OFFSET;
    }
}
"""

# Line 12, column 9: a u32 literal bound to an f32 `let`.
BROKEN_WGSL = SCALE_WGSL.replace("    if (gid.x", "    let x: f32 = 1u;\n    if (gid.x")

# What each implementation says, as exactly as it says it.
EXPECT: dict[str, dict[str, Any]] = {
    "wgpu": {
        "diagnostic": (12, 9),
        "diagnostic_text": "expected to be `f32`, but got `u32`",
        "where": "'broken' at line 12:9",
        "missing_constant": "'NOPE' not found",
        "too_wide": "max_compute_invocations_per_workgroup",
        "dispatch_error": "bind group",
    },
    "dawn": {
        "diagnostic": (12, 9),
        "diagnostic_text": "cannot initialize 'let' of type 'f32' with value of type 'u32'",
        "where": "'broken' (shader module) at line 12:",
        "missing_constant": "NOPE",
        "too_wide": r"workgroup_size\(512, 1, 1\) that exceeds",
        "dispatch_error": "Dawn error while dispatching",
    },
}


def _problem(name: str) -> str | None:
    try:
        select_adapter(get_backend(name).adapters(), None)
    except DopplerGenError as error:
        return f"no {name} adapter: {error}"
    return None


def test_every_registered_backend_has_expectations() -> None:
    assert set(EXPECT) == set(BACKENDS)


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Backend:
    problem = _problem(request.param)
    if problem:
        pytest.skip(problem)
    return get_backend(request.param)


@pytest.fixture(scope="module")
def adapter(backend: Backend) -> AdapterInfo:
    return select_adapter(backend.adapters(), None)


@pytest.fixture(scope="module")
def device(backend: Backend, adapter: AdapterInfo) -> Iterator[Device]:
    features = [f for f in ("timestamp-query",) if f in adapter.features]
    dev = backend.open_device(adapter, features=features, limits={})
    yield dev
    dev.close()


def _scale_buffers(device: Device, n: int) -> tuple[Any, Any, Any]:
    src = device.storage_buffer(np.arange(n, dtype=np.float32), label="src")
    dst = device.storage_buffer(np.zeros(n, np.float32), read_write=True, label="dst")
    params = device.uniform_buffer(np.array([n], np.uint32).tobytes(), label="params")
    return params, src, dst


def test_adapters_speak_webgpu_names(adapter: AdapterInfo) -> None:
    assert adapter.backend == "Vulkan"
    assert "max-compute-workgroup-storage-size" in adapter.limits
    assert not any(name.startswith("WGPU") or "_" in name for name in adapter.features)


def test_dispatch_with_override_constants_write_and_read(device: Device) -> None:
    n = 100
    pipeline = device.compile(
        SCALE_WGSL, constants={"SCALE": 3.0, "OFFSET": np.float32(0.5)}, label="scale"
    )
    params, src, dst = _scale_buffers(device, n)
    device.dispatch(pipeline, {0: params, 1: src, 2: dst}, (-(-n // 64), 1, 1))
    expected = np.arange(n, dtype=np.float32) * 3 + 0.5
    np.testing.assert_array_equal(np.frombuffer(device.read_buffer(dst), np.float32), expected)
    device.write_buffer(src, np.full(n, 5.0, np.float32))
    device.dispatch(pipeline, {0: params, 1: src, 2: dst}, (2, 1, 1))
    assert set(np.frombuffer(device.read_buffer(dst), np.float32).tolist()) == {15.5}
    assert len(device.read_buffer(params)) == 4  # the caller's size, not the padded one


def test_passes_run_in_order_in_one_submission(device: Device) -> None:
    """run(steps): the second pass reads what the first wrote (x*2, then +1 via OFFSET)."""
    n = 64
    double = device.compile(SCALE_WGSL, constants={"SCALE": 2}, label="double")
    add_one = device.compile(SCALE_WGSL, constants={"OFFSET": 1}, label="add_one")
    params, src, middle = _scale_buffers(device, n)
    out = device.storage_buffer(np.zeros(n, np.float32), read_write=True, label="out")
    device.run(
        [
            Step(double, {0: params, 1: src, 2: middle}, (1, 1, 1)),
            Step(add_one, {0: params, 1: middle, 2: out}, (1, 1, 1)),
        ]
    )
    expected = np.arange(n, dtype=np.float32) * 2 + 1
    np.testing.assert_array_equal(np.frombuffer(device.read_buffer(out), np.float32), expected)


def test_webgpu_default_limits_unless_asked(device: Device) -> None:
    assert device.limits["max-compute-workgroup-storage-size"] == 16384
    assert device.limits["max-compute-invocations-per-workgroup"] == 256


def test_compile_error_carries_line_and_column(backend: Backend, device: Device) -> None:
    expect = EXPECT[backend.name]
    with pytest.raises(ShaderCompileError) as info:
        device.compile(BROKEN_WGSL, label="broken")
    error = info.value
    assert error.backend == backend.name
    assert error.diagnostics[0][:2] == expect["diagnostic"]
    assert expect["diagnostic_text"] in error.diagnostics[0][2]
    assert "\n" not in str(error) and expect["where"] in str(error)


def test_pipeline_creation_errors_are_compile_errors(backend: Backend, device: Device) -> None:
    expect = EXPECT[backend.name]
    with pytest.raises(ShaderCompileError, match=expect["missing_constant"]) as info:
        device.compile(SCALE_WGSL, constants={"NOPE": 1.0})
    assert info.value.diagnostics == []
    # over the device's 256 invocations: caught when the pipeline is created
    too_wide = SCALE_WGSL.replace("@workgroup_size(64)", "@workgroup_size(512)")
    with pytest.raises(ShaderCompileError, match=expect["too_wide"]):
        device.compile(too_wide)


def test_dispatch_errors_are_one_line(backend: Backend, device: Device) -> None:
    pipeline = device.compile(SCALE_WGSL)
    src = device.storage_buffer(np.zeros(4, np.float32))
    with pytest.raises(DopplerGenError) as info:
        device.dispatch(pipeline, {1: src}, (1, 1, 1))
    assert "\n" not in str(info.value)
    assert EXPECT[backend.name]["dispatch_error"] in str(info.value)


def test_timed_dispatch_returns_positive_nanoseconds(device: Device) -> None:
    if "timestamp-query" not in device.features:
        pytest.skip(f"{device.adapter.short()} lacks timestamp-query under {device.backend_name}")
    pipeline = device.compile(SCALE_WGSL)
    params, src, dst = _scale_buffers(device, 64)
    times = device.timed_dispatch(
        pipeline, {0: params, 1: src, 2: dst}, (1, 1, 1), repeats=3, warmup=1
    )
    assert len(times) == 3 and all(t > 0 for t in times)


def test_timed_run_times_the_whole_sequence_and_each_pass(device: Device) -> None:
    if "timestamp-query" not in device.features:
        pytest.skip(f"{device.adapter.short()} lacks timestamp-query under {device.backend_name}")
    pipeline = device.compile(SCALE_WGSL)
    params, src, dst = _scale_buffers(device, 64)
    step = Step(pipeline, {0: params, 1: src, 2: dst}, (1, 1, 1))
    runs = device.timed_run([step, step, step], repeats=4, warmup=2, split_passes=True)
    assert len(runs) == 4
    for run in runs:
        assert len(run.passes_ns) == 3 and all(t > 0 for t in run.passes_ns)
        # one pair around all passes: at least the sum of the passes' own spans
        assert run.total_ns >= sum(run.passes_ns) > 0
    # the default: every run one compute pass holding the three dispatches, one span
    whole = device.timed_run([step, step, step], repeats=4, warmup=2)
    assert len(whole) == 4
    assert all(len(r.passes_ns) == 1 and r.total_ns == r.passes_ns[0] > 0 for r in whole)
    with pytest.raises(ValueError, match="no passes"):
        device.timed_run([], repeats=1, warmup=0)


def test_dispatches_of_one_compute_pass_see_what_the_previous_wrote(device: Device) -> None:
    """``run`` records a multi-pass kernel as one compute pass: the second dispatch must read
    the first one's output (WebGPU makes each dispatch a usage scope of its own)."""
    pipeline = device.compile(SCALE_WGSL, constants={"SCALE": 2.0, "OFFSET": 1.0})
    params, src, _ = _scale_buffers(device, 64)
    middle = device.storage_buffer(np.full(64, np.nan, np.float32), read_write=True, label="mid")
    out = device.storage_buffer(np.full(64, np.nan, np.float32), read_write=True, label="out")
    device.run(
        [
            Step(pipeline, {0: params, 1: src, 2: middle}, (1, 1, 1)),
            Step(pipeline, {0: params, 1: middle, 2: out}, (1, 1, 1)),
        ]
    )
    expected = (np.arange(64, dtype=np.float32) * 2 + 1) * 2 + 1
    np.testing.assert_array_equal(np.frombuffer(device.read_buffer(out), np.float32), expected)


def test_timing_without_the_feature_says_so(backend: Backend, adapter: AdapterInfo) -> None:
    with backend.open_device(adapter, features=[], limits={}) as plain:
        pipeline = plain.compile(SCALE_WGSL)
        with pytest.raises(BackendUnavailable, match="timestamp-query"):
            plain.timed_dispatch(pipeline, {}, (1, 1, 1), repeats=1, warmup=0)


def test_open_device_refuses_what_the_adapter_lacks(backend: Backend, adapter: AdapterInfo) -> None:
    missing = next(
        f
        for f in ("texture-compression-astc", "texture-compression-etc2", "made-up-feature")
        if f not in adapter.features
    )
    with pytest.raises(BackendUnavailable, match=missing):
        backend.open_device(adapter, features=[missing], limits={})
    too_much = adapter.limits["max-compute-workgroup-storage-size"] * 2
    with pytest.raises(BackendUnavailable, match="max-compute-workgroup-storage-size"):
        backend.open_device(
            adapter, features=[], limits={"max-compute-workgroup-storage-size": too_much}
        )
