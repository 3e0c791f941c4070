"""wgpu-py specifics: adapter choice and limits (pure), naga diagnostics, wgpu log capture, doctor.

The behaviour every backend shares (dispatch, errors, timing, device requests) is specified once
in tests/test_backend_contract.py, parametrized over the registered backends.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest

from doppler_gen.backends import (
    WEBGPU_DEFAULT_LIMITS,
    AdapterInfo,
    Backend,
    Device,
    effective_limits,
    get_backend,
    select_adapter,
)
from doppler_gen.errors import BackendUnavailable, DopplerGenError

# --------------------------------------------------------------------------- synthetic adapters

LAVAPIPE_LIMITS = {
    "max-compute-workgroup-storage-size": 32768,
    "max-compute-invocations-per-workgroup": 1024,
    "min-storage-buffer-offset-alignment": 32,
    "min-uniform-buffer-offset-alignment": 32,
    "max-buffer-size": 2147483647,
}


def fake(index: int, name: str, backend: str, kind: str, **limits: int) -> AdapterInfo:
    return AdapterInfo(
        index=index,
        name=name,
        backend=backend,
        adapter_type=kind,
        vendor="v",
        driver="d",
        features=frozenset({"shader-f16"}),
        limits={**LAVAPIPE_LIMITS, **limits},
    )


GL_GPU = fake(0, "NVIDIA H200/PCIe/SSE2", "OpenGL", "DiscreteGPU")
VK_CPU = fake(1, "llvmpipe (LLVM 15.0.6, 256 bits)", "Vulkan", "CPU")
VK_IGPU = fake(2, "Intel(R) Graphics", "Vulkan", "IntegratedGPU")
VK_DGPU = fake(3, "NVIDIA H200", "Vulkan", "DiscreteGPU")
GL_CPU = fake(4, "llvmpipe (LLVM 15.0.6, 256 bits)", "OpenGL", "CPU")
ALL = [GL_GPU, VK_CPU, VK_IGPU, VK_DGPU, GL_CPU]


def test_default_prefers_first_vulkan_gpu_over_cpu_and_opengl() -> None:
    assert select_adapter(ALL, None) is VK_IGPU
    assert select_adapter([GL_GPU, VK_CPU, VK_DGPU], None) is VK_DGPU


def test_default_falls_back_to_vulkan_cpu_never_opengl() -> None:
    assert select_adapter([GL_GPU, GL_CPU, VK_CPU], None) is VK_CPU


def test_default_without_vulkan_is_one_line_error_with_fix() -> None:
    with pytest.raises(BackendUnavailable) as info:
        select_adapter([GL_GPU, GL_CPU], None)
    message = str(info.value)
    assert "\n" not in message
    assert "mesa-vulkan-drivers" in message
    assert "NVIDIA H200/PCIe/SSE2" in message and "OpenGL" in message


def test_default_with_no_adapters_at_all() -> None:
    with pytest.raises(BackendUnavailable, match=r"none.*mesa-vulkan-drivers"):
        select_adapter([], None)


@pytest.mark.parametrize(
    ("want", "expected"),
    [
        ("0", GL_GPU),  # an index is explicit: OpenGL allowed
        ("4", GL_CPU),
        ("cpu", VK_CPU),  # Vulkan lavapipe beats its OpenGL twin
        ("gpu", VK_IGPU),
        ("discrete", VK_DGPU),
        ("integrated", VK_IGPU),
        ("vulkan", VK_IGPU),
        ("OpenGL", GL_GPU),
        ("LLVMPIPE", VK_CPU),
        ("h200", VK_DGPU),
        ("H200/PCIe", GL_GPU),
    ],
)
def test_want_selects_by_index_type_backend_or_name(want: str, expected: AdapterInfo) -> None:
    assert select_adapter(ALL, want) is expected


@pytest.mark.parametrize("want", ["7", "radeon", "metal"])
def test_want_without_match_lists_adapters_in_one_line(want: str) -> None:
    with pytest.raises(BackendUnavailable) as info:
        select_adapter(ALL, want)
    message = str(info.value)
    assert "\n" not in message and repr(want) in message
    assert all(a.name in message for a in ALL)


def test_describe_and_is_cpu() -> None:
    assert VK_CPU.is_cpu and not VK_DGPU.is_cpu
    assert VK_CPU.describe() == "llvmpipe (LLVM 15.0.6, 256 bits) — Vulkan CPU, driver d"


def test_adapter_info_is_frozen_and_hashable() -> None:
    with pytest.raises(TypeError):
        VK_CPU.limits["max-buffer-size"] = 1  # type: ignore[index]
    assert len({VK_CPU, fake(1, "llvmpipe (LLVM 15.0.6, 256 bits)", "Vulkan", "CPU")}) == 1


def test_effective_limits_adapter_profile_takes_maxima_and_minimal_alignment() -> None:
    limits = effective_limits(VK_CPU, "adapter")
    assert limits["max-compute-workgroup-storage-size"] == 32768
    assert limits["max-compute-invocations-per-workgroup"] == 1024
    assert limits["min-storage-buffer-offset-alignment"] == 32
    assert limits["max-buffer-size"] == 2147483647
    # a limit the adapter does not report keeps the WebGPU default
    assert limits["max-bind-groups"] == 4
    assert set(limits) == set(WEBGPU_DEFAULT_LIMITS)


def test_effective_limits_webgpu_default_profile_is_capped_by_adapter() -> None:
    limits = effective_limits(VK_CPU, "webgpu-default")
    assert limits["max-compute-workgroup-storage-size"] == 16384
    assert limits["max-compute-invocations-per-workgroup"] == 256
    assert limits["max-compute-workgroup-size-z"] == 64
    assert limits["min-storage-buffer-offset-alignment"] == 256
    assert limits["max-buffer-size"] == 268435456
    weak = fake(
        0,
        "weak",
        "Vulkan",
        "IntegratedGPU",
        **{
            "max-compute-workgroup-storage-size": 8192,
            "min-uniform-buffer-offset-alignment": 512,
        },
    )
    capped = effective_limits(weak, "webgpu-default")
    assert capped["max-compute-workgroup-storage-size"] == 8192
    assert capped["min-uniform-buffer-offset-alignment"] == 512


def test_effective_limits_unknown_profile() -> None:
    with pytest.raises(BackendUnavailable, match="webgpu-default"):
        effective_limits(VK_CPU, "browser")


# --------------------------------------------------------------------------- naga text parsing

NAGA_PARSE_ERROR = """Validation Error

Caused by:
  In wgpuDeviceCreateShaderModule, label = 'k'

Shader 'k' parsing error: redefinition of `foo`
  ┌─ wgsl:2:4
  │
2 │ fn foo() {}
  │    ^^^ previous definition of `foo`
3 │ fn foo() {}
  │    ^^^ redefinition of `foo`

"""
NAGA_VALIDATION_ERROR = """Validation Error

Caused by:
  In wgpuDeviceCreateShaderModule

Shader validation error: Entry point main at Compute is invalid
  ┌─ :3:13
  │
3 │ fn main() { out[0] = 1.0; }
  │             ^^^^^^ writing to this location is not permitted
  │
  = The pointer [1] doesn't relate to a valid destination for a store


      The pointer [1] doesn't relate to a valid destination for a store"""


def test_parse_naga_parse_error_with_two_spans() -> None:
    from doppler_gen.backends.wgpu_backend import one_line, parse_diagnostics

    diagnostics = parse_diagnostics(NAGA_PARSE_ERROR)
    assert [d[:2] for d in diagnostics] == [(2, 4), (3, 4)]
    assert "previous definition" in diagnostics[0][2]
    assert one_line(NAGA_PARSE_ERROR) == "parsing error: redefinition of `foo`"


def test_parse_naga_validation_error_named_after_label() -> None:
    from doppler_gen.backends.wgpu_backend import one_line, parse_diagnostics

    assert [d[:2] for d in parse_diagnostics(NAGA_VALIDATION_ERROR)] == [(3, 13)]
    assert one_line(NAGA_VALIDATION_ERROR) == (
        "validation error: Entry point main at Compute is invalid: "
        "The pointer [1] doesn't relate to a valid destination for a store"
    )


def test_parse_header_location_when_markers_are_multiline_art() -> None:
    from doppler_gen.backends.wgpu_backend import parse_diagnostics

    text = (
        "Shader 'k' parsing error: oops\n  ┌─ k:7:3\n  │\n7 │ ╭   fn f() {\n"
        "8 │ │   }\n  │ ╰───^ here\n"
    )
    assert parse_diagnostics(text) == [(7, 3, "parsing error: oops")]


# --------------------------------------------------------------------------- real adapter


@pytest.fixture(scope="module")
def backend() -> Backend:
    try:
        return get_backend("wgpu")
    except BackendUnavailable as exc:
        pytest.skip(f"no Vulkan adapter: {exc}")


@pytest.fixture(scope="module")
def adapter(backend: Backend) -> AdapterInfo:
    try:
        return select_adapter(backend.adapters(), None)
    except BackendUnavailable as exc:
        pytest.skip(f"no Vulkan adapter: {exc}")


@pytest.fixture(scope="module")
def device(backend: Backend, adapter: AdapterInfo) -> Iterator[Device]:
    features = [f for f in ("timestamp-query",) if f in adapter.features]
    dev = backend.open_device(adapter, features=features, limits={})
    yield dev
    dev.close()


@pytest.mark.gpu
def test_errors_wgpu_only_logs_are_raised_not_printed(
    device: Device, caplog: pytest.LogCaptureFixture
) -> None:
    # wgpu-py logs (rather than raises) errors that arrive outside an API call, e.g. device
    # loss reported by its poller thread; those must still fail the operation.
    wgpu_log = logging.getLogger("wgpu")
    guard = device._gpu_errors("testing")  # type: ignore[attr-defined]
    with pytest.raises(DopplerGenError, match="simulated device loss"), guard:
        wgpu_log.warning("a warning passes through")
        wgpu_log.error("simulated device loss")
    assert [r.getMessage() for r in caplog.records] == ["a warning passes through"]


@pytest.mark.gpu
def test_doctor_report_and_f16_probe(backend: Backend, adapter: AdapterInfo) -> None:
    import json

    from doppler_gen.doctor import doctor_report, format_doctor

    report = doctor_report(backend)
    json.dumps(report)
    assert report["default_adapter"] == adapter.index
    assert len(report["adapters"]) == len(backend.adapters())
    text = format_doctor(report)
    if "shader-f16" not in adapter.features:
        assert "f16 kernel compiles and runs: no (adapter does not offer shader-f16)" in text
        return
    assert report["f16_probe"]["ok"], report["f16_probe"]["detail"]
    assert "f16 kernel compiles and runs: yes" in text


# --------------------------------------------------------------------------- subgroups

# What the generated subgroup kernels carry for Tint (Chrome): naga 0.32 rejects the directive.
SUBGROUP_WGSL = """enable subgroups;

@group(0) @binding(0) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) lane: u32) {
    dst[2u * lid] = lane;
    dst[2u * lid + 1u] = subgroupShuffleXor(lane, 1u);
}
"""


def test_naga_source_drops_only_the_subgroups_enable_and_keeps_line_numbers() -> None:
    from doppler_gen.backends.wgpu_backend import naga_source

    adapted = naga_source(SUBGROUP_WGSL)
    assert adapted.splitlines()[0] == "// enable subgroups; (removed for naga)"
    assert adapted.splitlines()[1:] == SUBGROUP_WGSL.splitlines()[1:]
    assert naga_source("enable f16, subgroups;\nfn f() {}\n") == "enable f16;\nfn f() {}\n"
    assert naga_source("enable f16;\n") == "enable f16;\n"
    # a name that merely starts like it, or the word in a comment, is left alone
    assert naga_source("// enable subgroups; is needed\n") == "// enable subgroups; is needed\n"


def test_native_features_name_subgroups_as_wgpu_native_does() -> None:
    from doppler_gen.backends.wgpu_backend import native_features

    assert native_features(["subgroups", "shader-f16"]) == ["shader-f16", "subgroup"]
    assert native_features(["timestamp-query"]) == ["timestamp-query"]


@pytest.mark.gpu
def test_kernel_with_enable_subgroups_compiles_and_runs(
    backend: Backend, adapter: AdapterInfo
) -> None:
    if "subgroups" not in adapter.features:
        pytest.skip(f"adapter {adapter.name} offers no subgroups")
    dev = backend.open_device(adapter, features=["subgroups"], limits={})
    try:
        assert "subgroups" in dev.features
        pipeline = dev.compile(SUBGROUP_WGSL, label="subgroups")
        dst = dev.storage_buffer(np.zeros(128, np.uint32), read_write=True)
        dev.dispatch(pipeline, {0: dst}, (1, 1, 1))
        got = np.frombuffer(dev.read_buffer(dst), np.uint32).reshape(64, 2)
        # each invocation got the lane of its xor-1 partner: the shuffle really ran
        np.testing.assert_array_equal(got[:, 1], got[:, 0] ^ 1)
    finally:
        dev.close()


# A device that runs a kernel which never finishes, then waits for it: Ctrl-C after 2 s
# ("sigint"), or a 1 s limit ("limit"). Run in a process of its own: the kernel keeps a CPU
# adapter's threads busy until the process ends.
_ENDLESS = """
import os, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # .ci/test's shards ignore SIGINT
from doppler_gen.backends import get_backend, select_adapter
from doppler_gen.backends.base import Step, leave_if_spent
backend = get_backend("wgpu")
device = backend.open_device(select_adapter(backend.adapters(), None))
wgsl = '''@group(0) @binding(0) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(1) fn main() {
    var i = 0u;
    loop { i = i + o[1]; if (i == 7u && o[2] == 5u) { break; } }
    o[0] = i;
}'''
buffer = device.storage_buffer(bytes(16), read_write=True, label="o")
device.run([Step(device.compile(wgsl, label="endless"), {0: buffer}, (1, 1, 1))])
if sys.argv[1] == "sigint":  # then the process ends, as the CLI does on Ctrl-C
    threading.Timer(2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        device.read_buffer(buffer)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    leave_if_spent(0)  # as cli.main does: the interpreter's exit would wait on the kernel
    sys.exit(3)
os.environ["DOPPLER_GEN_GPU_TIMEOUT"] = "1"
for attempt in range(2):
    try:
        device.read_buffer(buffer)
    except BaseException as error:
        print(type(error).__name__, error, flush=True)
device.close()
leave_if_spent(0)
sys.exit(3)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["sigint", "limit"])
def test_waiting_for_a_kernel_that_never_finishes_can_end(how: str) -> None:
    """wgpu-native blocked the main thread inside queue.submit / read_buffer for ever, deaf
    to Ctrl-C. Now Ctrl-C raises KeyboardInterrupt, and the time limit raises GpuTimeout,
    after which the device refuses at once and closes without waiting."""
    import subprocess
    import sys

    from gpu_support import adapter_problem

    if adapter_problem() is not None:
        pytest.skip(str(adapter_problem()))
    try:
        done = subprocess.run(
            [sys.executable, "-c", _ENDLESS, how], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the wait for the endless kernel never ended")
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    if how == "sigint":
        assert lines == ["KeyboardInterrupt"], lines
    else:
        assert lines[0].startswith(
            "GpuTimeout the GPU did not finish reading buffer 'o' within 1 s"
        )
        assert lines[1].startswith("GpuTimeout the device cannot be used again"), lines
