"""`bench`: shape syntax, report and JSON formats, the CPU refusal, and a tiny run on lavapipe.

Timing numbers from lavapipe mean nothing, so the end-to-end test checks structure and sanity
(every row timed or n/a with a reason, finite positive numbers, CPU labels), not speed. The torch
SDPA path runs against a fake torch here (control flow, GQA and mask handling); the real one
needs torch with CUDA and skips otherwise.
"""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO_ROOT, assert_one_line_error, edit, run_cli

from doppler_gen.backends import AdapterInfo
from doppler_gen.bench import (
    BASELINE_UNAVAILABLE,
    BaselineResult,
    BenchRow,
    BenchRun,
    Settings,
    Timing,
    format_report,
    match_profile,
    profile_named,
    time_baseline,
)
from doppler_gen.errors import DopplerGenError
from doppler_gen.runtime.session import CpuAdapterRefused, refuse_cpu
from doppler_gen.shapes import DEFAULT_SHAPES, ShapeSyntaxError, parse_shape, parse_shapes

PREFILL = "prefill:q=2048,kv=2048,h=32,kvh=8,d=64"
DECODE = "decode:kv=8192,h=32,kvh=8,d=64"
TIERED = "tiered:cold=1536,hot=512,h=32,kvh=8,d=64"
RMSNORM = "rmsnorm:rows=2048,size=4096"


def cpu_adapter_problem() -> str | None:
    """None when wgpu sees a CPU (lavapipe) Vulkan adapter, else why the test must skip."""
    try:
        from doppler_gen.backends import get_backend, select_adapter

        adapter = select_adapter(get_backend("wgpu").adapters(), "cpu")
    except (DopplerGenError, ImportError, RuntimeError) as error:
        return f"no CPU WebGPU adapter: {error}"
    return None if adapter.is_cpu else "no CPU WebGPU adapter"


needs_cpu_adapter = pytest.mark.skipif(
    cpu_adapter_problem() is not None, reason=str(cpu_adapter_problem())
)


# -- shapes -------------------------------------------------------------------------------------


def test_default_shapes_are_the_issue_s_shapes() -> None:
    prefill, decode, tiered, rmsnorm = parse_shapes(())
    assert rmsnorm.label == RMSNORM and rmsnorm.family == "rmsnorm"
    assert [s.label for s in (prefill, decode, tiered)] == [PREFILL, DECODE, TIERED]
    assert (prefill.query_len, prefill.kv_len, prefill.causal) == (2048, 2048, True)
    assert (decode.query_len, decode.kv_len) == (1, 8192)
    assert (tiered.cold_len, tiered.hot_len, tiered.kv_len) == (1536, 512, 2048)
    assert {s.family for s in (prefill, decode)} == {"tiled"} and tiered.family == "tiered"
    assert tuple(s.label for s in parse_shapes(DEFAULT_SHAPES)) == (
        PREFILL,
        DECODE,
        TIERED,
        RMSNORM,
    )


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("prefill", PREFILL),
        ("decode", DECODE),
        ("tiered", TIERED),
        ("prefill:kv=4096", "prefill:q=4096,kv=4096,h=32,kvh=8,d=64"),
        ("prefill:q=512", "prefill:q=512,kv=512,h=32,kvh=8,d=64"),
        (" Prefill: q=128 , kv=1_024, causal=0 ", "prefill:q=128,kv=1024,h=32,kvh=8,d=64,causal=0"),
        ("decode:kv=100,h=4,kvh=4,d=128", "decode:kv=100,h=4,kvh=4,d=128"),
        ("tiered:cold=0,hot=7,d=16", "tiered:cold=0,hot=7,h=32,kvh=8,d=16"),
    ],
)
def test_shapes_parse_to_a_canonical_label_that_parses_back(text: str, label: str) -> None:
    shape = parse_shape(text)
    assert shape.label == label
    assert parse_shape(shape.label) == shape


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("prefil:q=1", "unknown kind 'prefil'"),
        ("prefill:q=2048,x=3", "unknown key 'x' (prefill takes q, kv, h, kvh, d, causal)"),
        ("decode:q=1", "unknown key 'q' (decode takes kv, h, kvh, d)"),
        ("prefill:q2048", "'q2048' is not key=value"),
        ("prefill:q=abc", "q='abc' is not an integer"),
        ("prefill:q=0", "q=0 must be a positive integer"),
        ("tiered:cold=-1", "cold=-1 must not be negative"),
        ("prefill:causal=2", "causal=2 must be 0 or 1"),
        ("prefill:q=1,q=2", "key 'q' given twice"),
        ("decode:h=32,kvh=6", "h=32 is not a multiple of kvh=6"),
        ("prefill:q=4096,kv=2048", "q=4096 exceeds kv=2048"),
        ("tiered:cold=0,hot=0", "cold + hot must be at least 1 key"),
        ("decode:kv=100000000,kvh=32", "larger than any WebGPU binding"),
        ("prefill:q=1,,kv=2", "'' is not key=value"),
        ("decode:kv=\u0664", "kv='\u0664' is not an integer"),  # an Arabic-Indic 4: int() took it
        ("decode:kv=" + "1" * 5000, "kv has more than 18 digits"),
        # `_` groups digits, as in Python: not at the end, not twice in a row
        ("decode:kv=5_", "kv='5_' is not an integer"),
        ("decode:kv=1__0", "kv='1__0' is not an integer"),
        ("decode:kv=_10", "kv='_10' is not an integer"),
    ],
)
def test_bad_shapes_name_the_bad_token(text: str, names: str) -> None:
    with pytest.raises(ShapeSyntaxError) as caught:
        parse_shape(text)
    message = str(caught.value)
    assert message.startswith(f"--shape {text!r}: "[:200])
    assert names in message
    assert "\n" not in message and len(message) <= 1_100  # a long value is cut in the middle


def test_a_bad_shape_on_the_command_line_is_one_line_and_exit_2() -> None:
    result = run_cli(REPO_ROOT, "bench", "--shape", "decode:kv=8192,heads=32")
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert "unknown key 'heads'" in line


def test_attended_pairs_match_a_brute_force_mask() -> None:
    for text in (
        "prefill:q=5,kv=9",
        "prefill:q=7,kv=7",
        "prefill:q=3,kv=8,causal=0",
        "decode:kv=11",
    ):
        shape = parse_shape(text)
        queries = np.arange(shape.query_len)[:, None] + (shape.kv_len - shape.query_len)
        keys = np.arange(shape.kv_len)[None, :]
        visible = (
            keys <= queries if shape.kind == "prefill" and shape.causal else keys >= 0 * queries
        )
        assert shape.attended_pairs() == int(visible.sum()), text
    shape = parse_shape(PREFILL)
    assert shape.flops() == 4 * (2048 * 2049 // 2) * 32 * 64


def test_case_specs_put_the_queries_at_the_end_of_the_keys() -> None:
    prefill = parse_shape("prefill:q=16,kv=48,h=4,kvh=2,d=8").case_spec()
    assert (prefill.query_len, prefill.kv_len, prefill.start_pos, prefill.is_causal) == (
        16,
        48,
        32,
        1,
    )
    assert (prefill.kv_layout, prefill.sliding_window, prefill.kv_start) == ("contiguous", 0, 0)
    decode = parse_shape("decode:kv=30,h=4,kvh=2,d=8").case_spec()
    assert (decode.query_len, decode.kv_len, decode.start_pos) == (1, 30, 29)
    tiered = parse_shape("tiered:cold=20,hot=6,h=4,kvh=2,d=8").case_spec()
    assert (tiered.cold_len, tiered.hot_len, tiered.hot_start, tiered.hot_window) == (20, 6, 20, 6)
    assert tiered.start_pos == 25 and tiered.hot_layout == 1


# -- profiles, timings, refusal ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "profile"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),  # 60 TFLOP/s FP32, not the SXM's 67
        ("NVIDIA GH200 480GB", None),  # matched H200 by substring: 4.8 TB/s for a 4.0 TB/s part
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("llvmpipe (LLVM 15.0.6, 256 bits)", None),
    ],
)
def test_device_profiles_match_by_name(adapter: str, profile: str | None) -> None:
    found = match_profile(adapter)
    assert (found.name if found else None) == profile


def test_torch_calls_queue_behind_a_sleep_longer_than_their_launches() -> None:
    """A fixed 10 ms sleep covered about 500 Python launches: past that, torch's start events
    were recorded on an idle stream and its times included the host's launch time."""
    from doppler_gen import bench

    slept: list[int] = []
    torch = _fake_torch(gqa=True)
    torch.cuda._sleep = slept.append
    bench._event_times(torch, lambda: None, 30)
    bench._event_times(torch, lambda: None, 10_000)
    assert slept[0] == 20_000_000  # about 10 ms: far beyond 30 launches
    assert slept[1] >= 10_000 * 40_000  # at least 20 µs of GPU clock for each launch


def test_h200_profile_is_4_8_tb_per_s() -> None:
    assert profile_named("h200").hbm_gbps == 4800.0
    assert profile_named("H100").hbm_gbps == 3350.0
    with pytest.raises(DopplerGenError, match="unknown device profile"):
        profile_named("A100")


def test_timing_summary_is_median_and_p10_p90() -> None:
    timing = Timing(tuple(float(v) for v in range(1000, 21000, 1000)))  # 1..20 µs
    summary = timing.as_dict()
    assert summary["runs"] == 20
    assert summary["median_us"] == 10.5
    assert summary["p10_us"] == pytest.approx(2.9)
    assert summary["p90_us"] == pytest.approx(18.1)
    assert (summary["min_us"], summary["max_us"]) == (1.0, 20.0)


def test_fewer_than_20_repeats_are_refused() -> None:
    with pytest.raises(DopplerGenError, match="at least 20"):
        Settings(repeats=19)


def _adapter(kind: str) -> AdapterInfo:
    return AdapterInfo(0, "llvmpipe (LLVM 15.0.6, 256 bits)", "Vulkan", kind, "Mesa", "25")


def test_a_cpu_adapter_is_refused_unless_allowed() -> None:
    with pytest.raises(CpuAdapterRefused) as caught:
        refuse_cpu(_adapter("CPU"), False, "bench")
    assert str(caught.value) == (
        "bench measures GPUs; llvmpipe (LLVM 15.0.6, 256 bits) is a CPU adapter — timings would "
        "say nothing about GPU performance; pass --allow-cpu to run anyway (results labelled CPU)"
    )
    assert caught.value.exit_code == 2
    refuse_cpu(_adapter("CPU"), True, "bench")
    refuse_cpu(_adapter("DiscreteGPU"), False, "bench")


# -- report and JSON (synthetic results) ---------------------------------------------------------


def _synthetic_run(*, cpu: bool = False, sdpa: bool = True) -> BenchRun:
    def timing(us: float) -> Timing:
        return Timing(tuple(us * 1e3 * f for f in np.linspace(0.9, 1.1, 21)))

    rows = [
        BenchRow(
            "attention_f16",
            PREFILL,
            "ok",
            timing=timing(590.0),
            bytes_moved=20_000_000,
            flops=parse_shape(PREFILL).flops(),
            baseline_dtype="f16",
        ),
        BenchRow(
            "attention_f16",
            DECODE,
            "ok",
            timing=timing(290.0),
            bytes_moved=2_900_000_000,
            flops=parse_shape(DECODE).flops(),
            baseline_dtype="f16",
        ),
        BenchRow(
            "attention_f16",
            "decode:kv=64,h=32,kvh=8,d=128",
            "n/a",
            reason="head_dim 128 exceeds the kernel's maximum 64",
            baseline_dtype="f16",
        ),
        BenchRow("attention_decode_tiered_f16", "-", "n/a", reason="no tiered shape given"),
    ]
    run = BenchRun(
        "wgpu",
        "NVIDIA H200 — Vulkan DiscreteGPU",
        cpu,
        Settings(repeats=21),
        "adapter",
        [PREFILL, DECODE],
        rows,
        timestamp_period=1.0,
        profile=profile_named("H200"),
    )
    if sdpa:
        run.baseline_status = "torch 2.5.1 on NVIDIA H200"
        run.baselines = {
            (PREFILL, "f16"): BaselineResult("f16", timing(59.0), "enable_gqa"),
            (DECODE, "f16"): BaselineResult("f16", timing(29.0), "enable_gqa"),
        }
    else:
        run.baseline_status = f"{BASELINE_UNAVAILABLE} (torch is not importable)"
    return run


def test_json_has_timings_derived_metrics_and_sdpa_ratios() -> None:
    document = json.loads(json.dumps(_synthetic_run().as_dict()))
    assert document["tool"] == "doppler-gen bench" and document["ok"] is True
    assert document["profile"]["name"] == "H200" and document["cpu_adapter"] is False
    assert set(document["methodology"]) >= {"timing", "bytes", "flops", "baseline", "families"}
    families = document["methodology"]["families"]
    assert "scaled_dot_product_attention" in families["tiled"]["baseline"]
    assert (
        "head_dim" in families["tiered"]["flops"] and "rms_norm" in families["rmsnorm"]["baseline"]
    )
    prefill, decode, not_runnable, no_shape = document["rows"]
    assert prefill["timing"]["median_us"] == pytest.approx(590.0)
    assert prefill["gbps"] == pytest.approx(20_000_000 / 590_000, rel=1e-5)
    assert prefill["tflops"] == pytest.approx(parse_shape(PREFILL).flops() / 590e3 / 1e3, rel=1e-5)
    assert prefill["ratio_to_baseline"] == pytest.approx(10.0)
    assert prefill["baseline"]["timing"]["median_us"] == pytest.approx(59.0)
    assert prefill["l2_resident"] is True and decode["l2_resident"] is False
    assert decode["pct_peak_bw"] == pytest.approx(100 * (2.9e9 / 290e3) / 4800, rel=1e-3)
    assert not_runnable["status"] == "n/a" and "exceeds" in not_runnable["reason"]
    assert not_runnable["timing"] is None and not_runnable["ratio_to_baseline"] is None
    assert no_shape["shape"] == "-"


def test_report_table_shows_ratios_and_n_a_reasons() -> None:
    text = format_report(_synthetic_run())
    assert "CPU" not in text
    line = next(
        line for line in text.splitlines() if line.startswith("attention_f16") and PREFILL in line
    )
    assert "590.0" in line and "59.0 (f16)" in line and "10.00" in line
    assert "(head_dim 128 exceeds the kernel's maximum 64)" in text
    assert "%BW is of: H200 profile HBM 4800 GB/s" in text
    assert "2 timed, 2 n/a, 0 failed" in text
    assert "torch µs" in text and "×torch" in text


def test_report_says_for_every_timed_shape_which_side_of_l2_it_is_on() -> None:
    lines = format_report(_synthetic_run()).splitlines()
    prefill = next(line for line in lines if line.startswith("attention_f16") and PREFILL in line)
    decode = next(line for line in lines if line.startswith("attention_f16") and DECODE in line)
    assert "L2-resident (19.1 of 50 MiB)" in prefill
    assert "exceeds L2 (2765.7 of 50 MiB)" in decode


def test_report_without_torch_says_so_in_the_sdpa_column() -> None:
    text = format_report(_synthetic_run(sdpa=False))
    timed = [
        line for line in text.splitlines() if line.startswith("attention_f16") and "590.0" in line
    ]
    assert timed and BASELINE_UNAVAILABLE in timed[0]
    assert "×torch" not in text and "torch µs" not in text


def test_cpu_results_are_labelled_on_every_row_and_in_the_json() -> None:
    run = _synthetic_run(cpu=True)
    text = format_report(run)
    lines = text.splitlines()
    assert lines[0].startswith("*** CPU ADAPTER") and lines[-1].startswith("*** CPU ADAPTER")
    table = [line for line in lines if "attention" in line and not line.startswith("adapter:")]
    assert len(table) == 4 and all(line.startswith("CPU ") for line in table)
    document = run.as_dict()
    assert document["cpu_adapter"] is True and "say nothing about GPU" in document["warning"]
    assert all(row["cpu_adapter"] for row in document["rows"])


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip(
        "matplotlib", reason="matplotlib (the optional 'plot' extra) is not installed"
    )
    from doppler_gen.bench import plot

    path = tmp_path / "bench.png"
    plot(_synthetic_run(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_plot_without_matplotlib_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = run_cli(REPO_ROOT, "bench", "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 2
    assert "pip install 'doppler-gen[plot]'" in assert_one_line_error(result.stderr)


# -- torch SDPA (fake torch: control flow; real torch: skipped without CUDA) ---------------------


class _FakeTensor:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.diagonal: int | None = None

    def tril(self, diagonal: int = 0) -> _FakeTensor:
        self.diagonal = diagonal
        return self

    def repeat_interleave(self, repeats: int, dim: int) -> _FakeTensor:
        shape = list(self.shape)
        shape[dim] *= repeats
        return _FakeTensor(tuple(shape))


def _fake_torch(*, gqa: bool, lower_right: bool = False) -> types.SimpleNamespace:
    """Just enough of torch for bench's SDPA code; each SDPA call takes 50 µs of fake GPU time."""
    clock, calls = [0.0], []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.at = 0.0

        def record(self) -> None:
            self.at = clock[0]

        def elapsed_time(self, end: Event) -> float:
            return end.at - self.at  # ms

    def sdpa(
        q: _FakeTensor,
        k: _FakeTensor,
        v: _FakeTensor,
        attn_mask: _FakeTensor | None = None,
        is_causal: bool = False,
        **kwargs: bool,
    ) -> None:
        if "enable_gqa" in kwargs and not gqa:
            raise TypeError("scaled_dot_product_attention() got an unexpected keyword 'enable_gqa'")
        assert not (attn_mask is not None and is_causal)
        calls.append({"q": q.shape, "k": k.shape, "mask": attn_mask, "causal": is_causal, **kwargs})
        clock[0] += 0.05

    def generator(device: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(manual_seed=lambda seed: object())

    return types.SimpleNamespace(
        float16="f16",
        float32="f32",
        bool="bool",
        calls=calls,
        Generator=generator,
        randn=lambda *shape, **kw: _FakeTensor(shape),
        ones=lambda *shape, **kw: _FakeTensor(shape),
        nn=types.SimpleNamespace(
            functional=types.SimpleNamespace(scaled_dot_product_attention=sdpa),
            **(
                {
                    "attention": types.SimpleNamespace(
                        bias=types.SimpleNamespace(causal_lower_right=_bias)
                    )
                }
                if lower_right
                else {}
            ),
        ),
        cuda=types.SimpleNamespace(
            synchronize=lambda: None, Event=Event, _sleep=lambda cycles: None
        ),
    )


def _bias(query_len: int, kv_len: int) -> tuple[str, int, int]:
    return ("causal_lower_right", query_len, kv_len)


def test_sdpa_prefill_uses_is_causal_and_enable_gqa() -> None:
    torch = _fake_torch(gqa=True)
    result = time_baseline(
        torch,
        parse_shape("prefill:q=64,kv=64,h=8,kvh=2,d=16"),
        "f16",
        Settings(repeats=20, warmup=2),
    )
    assert result.timing is not None and result.timing.runs == 20
    assert result.timing.median_ns == pytest.approx(50_000)
    assert result.note == "enable_gqa"
    last = torch.calls[-1]
    assert last["causal"] is True and last["mask"] is None and last["enable_gqa"] is True
    assert last["q"] == (1, 8, 64, 16) and last["k"] == (1, 2, 64, 16)


def test_sdpa_chunked_prefill_gets_a_bottom_right_mask_and_old_torch_repeats_kv() -> None:
    torch = _fake_torch(gqa=False)
    result = time_baseline(
        torch,
        parse_shape("prefill:q=16,kv=48,h=8,kvh=2,d=16"),
        "f32",
        Settings(repeats=20, warmup=1),
    )
    assert result.timing is not None
    assert "dense bottom-right causal mask (torch without causal_lower_right" in result.note
    assert "K/V repeated" in result.note and "f32: no FlashAttention" in result.note
    last = torch.calls[-1]
    assert (
        last["causal"] is False and last["mask"].diagonal == 32 and last["mask"].shape == (16, 48)
    )
    assert last["k"] == (1, 8, 48, 16) and "enable_gqa" not in last


def test_sdpa_chunked_prefill_takes_the_lower_right_bias_where_torch_has_it() -> None:
    """A dense mask rules FlashAttention out and skips no masked tile: torch ran about 1.4x
    slower per useful FLOP on the chunked shape than on the square one, and the kernels'
    ratio looked that much better."""
    torch = _fake_torch(gqa=True, lower_right=True)
    result = time_baseline(
        torch,
        parse_shape("prefill:q=16,kv=48,h=8,kvh=2,d=16"),
        "f16",
        Settings(repeats=20, warmup=1),
    )
    assert result.note == "bottom-right causal bias (causal_lower_right); enable_gqa"
    last = torch.calls[-1]
    assert last["mask"] == ("causal_lower_right", 16, 48) and last["causal"] is False


def test_sdpa_decode_is_not_causal() -> None:
    for text in (DECODE, TIERED):
        torch = _fake_torch(gqa=True)
        result = time_baseline(torch, parse_shape(text), "f16", Settings(repeats=20, warmup=0))
        assert result.timing is not None
        last = torch.calls[-1]
        assert last["causal"] is False and last["mask"] is None, text


def _torch_cuda_problem() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed (the SDPA comparison needs torch with CUDA)"
    return None if torch.cuda.is_available() else "torch sees no CUDA device"


@pytest.mark.skipif(_torch_cuda_problem() is not None, reason=str(_torch_cuda_problem()))
def test_real_sdpa_times_a_small_decode() -> None:  # pragma: no cover - needs CUDA
    import torch

    result = time_baseline(
        torch,
        parse_shape("decode:kv=1024,h=8,kvh=2,d=64"),
        "f16",
        Settings(repeats=20, warmup=3),
    )
    assert result.timing is not None and 0 < result.timing.median_ns < 1e7


# -- on lavapipe ---------------------------------------------------------------------------------


@needs_cpu_adapter
def test_bench_refuses_a_cpu_adapter_in_one_line() -> None:
    result = run_cli(REPO_ROOT, "bench", "--adapter", "cpu", "--shape", "decode:kv=8,h=2,kvh=1,d=8")
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert "bench measures GPUs;" in line and "is a CPU adapter" in line and "--allow-cpu" in line
    assert result.stdout == ""


def _bench_on_lavapipe(root: Path, *args: str):
    """`bench ARGS` on the CPU adapter, with the fewest timed runs and one warm-up."""
    cpu = ("--adapter", "cpu", "--allow-cpu", "--repeats", "20", "--warmup", "1")
    return run_cli(root, "bench", *args, *cpu)


@needs_cpu_adapter
def test_tiny_bench_on_lavapipe_end_to_end(tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    result = _bench_on_lavapipe(
        REPO_ROOT,
        "attention_small_f16kv",
        "attention_decode_tiered_f16",
        "--copy-mib",
        "1",
        "--shape",
        "prefill:q=20,kv=36,h=4,kvh=2,d=16",
        "--shape",
        "decode:kv=40,h=4,kvh=2,d=16",
        "--shape",
        "decode:kv=8,h=2,kvh=1,d=128",
        "--shape",
        "tiered:cold=24,hot=8,h=4,kvh=2,d=16",
        "--json",
        "--output",
        str(output),
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert json.loads(output.read_text()) == document
    assert document["cpu_adapter"] is True and "say nothing about GPU" in document["warning"]
    assert document["copy_bandwidth"]["gbps"] > 0 and document["peak_bw_basis"].startswith(
        "measured copy"
    )
    assert document["baseline_status"].startswith(BASELINE_UNAVAILABLE) or document[
        "baseline_status"
    ].startswith("torch")
    rows = {(r["variant"], r["shape"]): r for r in document["rows"]}
    assert len(rows) == 4  # three tiled shapes for the tiled variant, one tiered shape
    refused = rows[("attention_small_f16kv", "decode:kv=8,h=2,kvh=1,d=128")]
    assert refused["status"] == "n/a" and "head_dim 128 exceeds" in refused["reason"]
    timed = [r for r in rows.values() if r["status"] == "ok"]
    assert len(timed) == 3
    for row in timed:
        assert row["cpu_adapter"] is True and row["timing"]["runs"] == 20
        assert 0 < row["timing"]["p10_us"] <= row["timing"]["median_us"] <= row["timing"]["p90_us"]
        assert row["gbps"] > 0 and row["tflops"] > 0 and row["bytes"] > 0
    prefill = rows[("attention_small_f16kv", "prefill:q=20,kv=36,h=4,kvh=2,d=16")]
    # Q f32 + K/V f16 + output f32 + kv_len_buffer and page_table (one u32 each)
    assert prefill["bytes"] == 20 * 4 * 16 * 4 + 2 * 36 * 2 * 16 * 2 + 20 * 4 * 16 * 4 + 8
    assert prefill["flops"] == 4 * (20 * 16 + 20 * 21 // 2) * 4 * 16


@needs_cpu_adapter
@pytest.mark.parametrize("planted", [False, True], ids=["correct", "skips-a-written-output"])
def test_a_run_as_timed_is_judged_after_the_timed_runs(fresh_project: Path, planted: bool) -> None:
    """The timed runs poison nothing. A kernel that returns at once when its output already
    holds a number is right on the judged (NaN-poisoned) run and fast on every timed one: the
    run judged after them, its output prefilled with a finite stale value, makes it FAIL."""
    if planted:
        edit(
            fresh_project / "templates/rmsnorm.wgsl.j2",
            "    if (row >= u.num_rows) {",
            "    if (row >= u.num_rows || bitcast<u32>(output[row * u.size]) != 0x7fc00000u) {",
        )
        assert run_cli(fresh_project, "generate").exit_code == 0
    result = _bench_on_lavapipe(
        fresh_project,
        "rmsnorm",
        "--warmup-ms",
        "0",
        "--copy-mib",
        "0",
        "--shape",
        "rmsnorm:rows=8,size=256",
        "--json",
    )
    row = json.loads(result.stdout)["rows"][0]
    if not planted:
        assert result.exit_code == 0 and row["status"] == "ok", result.output
        return
    assert result.exit_code == 1, result.output
    assert row["status"] == "FAIL" and row["timing"] is None
    # every element it skipped still holds the prefilled value: 8 rows x 256
    assert row["reason"] == (
        "a run as timed (output prefilled, state kept): 2048 output element(s) kept the "
        "prefilled value the first run overwrote"
    )


def test_a_run_as_timed_is_checked_for_the_prefilled_value_beyond_the_sampled_rows() -> None:
    """The run as timed was judged on the sampled rows only: at the prefill bench shape 192 of
    65,536 rows. A kernel that skipped every other row in its timed runs passed with 99.7 % of
    its output still holding the prefilled value."""
    from doppler_gen.runtime import measure
    from doppler_gen.runtime.runner import STALE_OUTPUT
    from doppler_gen.tolerance import Verdict

    first = np.linspace(-1.0, 1.0, 4096).reshape(64, 64)
    again = first.copy()
    again[1:] = STALE_OUTPUT  # only row 0, the one "sampled", was computed again

    class SampledOnly:
        def __init__(self) -> None:
            self.entry = {"passes": [{"name": "main"}]}

        def run(self, prepared: Any) -> np.ndarray:
            return first

        def run_as_timed(self, prepared: Any) -> np.ndarray:
            return again

        def judge(self, prepared: Any, output: np.ndarray) -> Verdict:
            ok = bool(np.array_equal(output[0], first[0]))
            return Verdict(ok, 0.0, 0.0, 1e-3, (), 0, "row 0 sampled")

        def timed(self, prepared: Any, repeats: int, warmup: int, **kwargs: Any) -> list[Any]:
            return [types.SimpleNamespace(total_ns=1000.0)] * max(repeats, 1)

    row = BenchRow("v", "s", "n/a")
    measure._time(SampledOnly(), None, Settings(repeats=20, warmup=0, warmup_ms=0.0), row)
    assert row.status == "FAIL" and row.timing is None
    assert "4032 output element(s) kept the prefilled value the first run overwrote" in row.reason
    again[1:] = first[1:]  # a kernel that computes every row again is timed
    again[5, 5] = first[5, 5] = STALE_OUTPUT  # a true output equal to the prefill is no fault
    row = BenchRow("v", "s", "n/a")
    measure._time(SampledOnly(), None, Settings(repeats=20, warmup=0, warmup_ms=0.0), row)
    assert row.status == "ok" and row.timing is not None


# -- warm-up by GPU time ---------------------------------------------------------------------------


def _counting_timer(ns_per_run: float) -> tuple[list[int], object]:
    rounds: list[int] = []

    def timed(count: int) -> list[float]:
        rounds.append(count)
        return [ns_per_run] * count

    return rounds, timed


def test_ramp_runs_until_the_gpu_time_target_doubling_its_rounds() -> None:
    from doppler_gen.runtime.measure import ramp_up

    rounds, timed = _counting_timer(50_000.0)  # a 50 us kernel, a 10 ms ramp: 200 runs
    spent = ramp_up(timed, Settings(repeats=20, warmup=3, warmup_ms=10.0))
    assert rounds == [8, 16, 32, 64, 128]  # 248 runs: the first round past 10 ms (no speed-up)
    assert spent == pytest.approx(248 * 50_000.0)


def test_ramp_rounds_start_at_warmup_and_are_capped() -> None:
    from doppler_gen.runtime.measure import ramp_up

    rounds, timed = _counting_timer(1_000.0)  # 1 us runs: 50 ms needs 50 000 of them
    ramp_up(timed, Settings(repeats=20, warmup=300, warmup_ms=50.0))
    assert rounds[:3] == [300, 600, 1024] and max(rounds) == 1024
    assert sum(rounds) >= 50_000 > sum(rounds[:-1])


def test_ramp_off_and_slow_kernels_cost_one_round() -> None:
    from doppler_gen.runtime.measure import ramp_up

    rounds, timed = _counting_timer(1_000.0)
    assert ramp_up(timed, Settings(repeats=20, warmup_ms=0.0)) == 0.0 and rounds == []
    rounds, timed = _counting_timer(70e6)  # a 70 ms run: one round of 8 passes the 500 ms target
    ramp_up(timed, Settings(repeats=20))
    assert rounds == [8]


def test_ramp_goes_on_while_the_clock_still_rises() -> None:
    from doppler_gen.runtime.measure import ramp_up

    speeds = iter([4.0, 2.0, 1.0, 1.0, 1.0, 1.0])  # a kernel 4x, then 2x slow, then settled
    rounds: list[int] = []

    def timed(count: int) -> list[float]:
        rounds.append(count)
        return [next(speeds) * 1e6] * count  # 1 ms a run once settled

    ramp_up(timed, Settings(repeats=20, warmup_ms=40.0))
    # 32 ms + 32 ms pass the 40 ms target, but round 2 ran 2x faster than round 1; round 3 too
    assert rounds == [8, 16, 32, 64]
    ramping = iter(range(100, 0, -1))  # within one long round: each run faster than the last
    rounds.clear()

    def rising(count: int) -> list[float]:
        rounds.append(count)
        return [max(10, next(ramping, 10)) * 1e6 for _ in range(count)]

    ramp_up(rising, Settings(repeats=20, warmup_ms=1.0))
    # round 4 still falls within itself, round 5 is 14 % below round 4; round 6 agrees with 5
    assert rounds == [8, 16, 32, 64, 128, 256]


def test_torch_baseline_is_ramped_before_timing() -> None:
    calls = {}
    for ms in (0.0, 1.0):
        torch = _fake_torch(gqa=True)
        settings = Settings(repeats=20, warmup=0, warmup_ms=ms)
        assert time_baseline(torch, parse_shape(DECODE), "f16", settings).timing.runs == 20
        calls[ms] = len(torch.calls)
    # the fake's events say 50 us a call: 1 ms of ramp is rounds of 8 and 16 calls
    assert calls[1.0] - calls[0.0] == 8 + 16


@needs_cpu_adapter
def test_every_measurement_runs_on_a_device_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H200 a two-pass kernel measured 1.2-2x slower after the first measurement on a
    device, so bench opens a device for each (variant, shape) and closes it afterwards: two
    variants on two shapes are four measurement devices besides the run's own."""
    import doppler_gen.bench as bench_module

    real_open = bench_module.open_device
    opened: list[Any] = []

    def open_device(*args: Any, **kwargs: Any) -> Any:
        device = real_open(*args, **kwargs)
        opened.append(device)
        return device

    monkeypatch.setattr(bench_module, "open_device", open_device)
    result = run_cli(
        REPO_ROOT,
        "bench",
        "rmsnorm",
        "rmsnorm_f16",
        "--adapter",
        "cpu",
        "--allow-cpu",
        "--repeats",
        "20",
        "--warmup",
        "0",
        "--warmup-ms",
        "0",
        "--copy-mib",
        "0",
        "--no-baseline",
        "--shape",
        "rmsnorm:rows=4,size=64",
        "--shape",
        "rmsnorm:rows=2,size=128",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert len(opened) == 1 + 4
    assert len({id(d) for d in opened}) == 5


@needs_cpu_adapter
def test_a_bench_that_timed_nothing_exits_1() -> None:
    """The seed kernel at head_dim 128 needs more workgroup storage than lavapipe has: every
    row n/a, nothing measured (once exit 0)."""
    result = run_cli(
        REPO_ROOT,
        "bench",
        "attention",
        "--adapter",
        "cpu",
        "--allow-cpu",
        "--copy-mib",
        "0",
        "--no-baseline",
        "--shape",
        "decode:kv=64,d=128",
        "--json",
    )
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["ok"] is False
    assert [row["status"] for row in document["rows"]] == ["n/a"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # the rmsnorm kernel asked for a decode shape only: it timed the copy kernel, then
        # printed one n/a row and exited 1
        (
            ("rmsnorm", "--shape", "decode:kv=64"),
            "error: --shape 'decode:kv=64,h=32,kvh=8,d=64' is for tiled kernels; no selected "
            "variant is (their families: rmsnorm)",
        ),
        # a shape for none of the variants named, beside one that is
        (
            ("rmsnorm", "--shape", "rmsnorm", "--shape", "prefill:q=4,kv=4"),
            "error: --shape 'prefill:q=4,kv=4,h=32,kvh=8,d=64' is for tiled kernels; no "
            "selected variant is (their families: rmsnorm)",
        ),
        # an unknown profile: checked after the device had opened, which was never closed
        (("rmsnorm", "--profile", "bogus"), "error: unknown device profile 'bogus'"),
    ],
    ids=["shape-for-no-variant", "one-of-two-shapes-for-no-variant", "unknown-profile"],
)
def test_bench_refuses_what_cannot_run_before_any_device_opens(
    monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], expected: str
) -> None:
    def no_device(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("bench reached for a GPU backend")

    monkeypatch.setattr("doppler_gen.bench.get_backend", no_device)
    result = run_cli(REPO_ROOT, "bench", *args)
    assert result.exit_code == 2, (result.output, result.stderr)
    assert assert_one_line_error(result.stderr).startswith(expected), result.stderr


def test_a_copy_timed_at_0_ns_gives_no_copy_percentage_and_no_traceback() -> None:
    """A copy whose median was 0 ns (a coarse timer) has no bandwidth: % of it divided by zero
    and the report ended in a ZeroDivisionError traceback after every row was measured."""
    from doppler_gen.bench import CopyBandwidth

    run = _synthetic_run()
    run.profile = None
    run.copy = CopyBandwidth(1 << 21, Timing((0.0,) * 20))
    text = format_report(run)
    assert "%BW is of: measured copy 0.0 GB/s" in text
    row = run.as_dict()["rows"][0]
    assert row["pct_copy_bw"] is None and row["pct_peak_bw"] is None and row["gbps"] > 0


# -- --against: an A/B of two projects in one run -----------------------------------------------

AB_ARGS = ("rmsnorm", "--warmup-ms", "0", "--copy-mib", "0", "--shape", "rmsnorm:rows=8,size=256")
# every element's square is also fed through 4000 dependent FMAs whose result never counts
SLOW_RMSNORM = (
    "        sum_sq = sum_sq + v * v;",
    "        var waste = v;\n"
    "        for (var r = 0u; r < 4000u; r = r + 1u) { waste = fma(waste, 1.0000001, 1e-7); }\n"
    "        sum_sq = sum_sq + v * v + select(0.0, waste, waste < -1e30);",
)


def _project_copy(source: Path, destination: Path) -> Path:
    return Path(shutil.copytree(source, destination))


@needs_cpu_adapter
def test_against_times_both_projects_in_rounds_and_calls_a_clear_difference(
    fresh_project: Path, tmp_path: Path
) -> None:
    """The other project's rmsnorm burns thousands of FMAs per element: over 4 rounds this
    project's kernel is faster in every one, and the verdict says so with the chance of that
    under no difference (2 / C(8, 4), 2.9 %). The main table keeps this project's row."""
    other = _project_copy(fresh_project, tmp_path / "slow")
    edit(other / "templates/rmsnorm.wgsl.j2", *SLOW_RMSNORM)
    result = _bench_on_lavapipe(fresh_project, *AB_ARGS, "--against", str(other), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [(r["variant"], r["status"]) for r in document["rows"]] == [("rmsnorm", "ok")]
    comparison = document["comparison"]
    assert comparison["rounds"] == 4 and comparison["against"] == str(other)
    (row,) = comparison["rows"]
    assert len(row["this_round_medians_us"]) == len(row["against_round_medians_us"]) == 4
    assert max(row["this_round_medians_us"]) < min(row["against_round_medians_us"])
    assert row["ratio"] < 0.5
    assert row["verdict"] == (
        "faster in every round (2.9 % chance of a clean split either way if equal)"
    )
    # the text report: the A/B table after the main one
    text = _bench_on_lavapipe(fresh_project, *AB_ARGS, "--against", str(other), "--rounds", "3")
    assert text.exit_code == 0, text.output
    assert "A/B against" in text.stdout and "3 round(s)" in text.stdout
    assert "faster in every round (10.0 % chance of a clean split" in text.stdout


@needs_cpu_adapter
@pytest.mark.parametrize("rounds", ["1", "2"])
def test_against_itself_gives_no_verdict_from_too_few_rounds(
    fresh_project: Path, rounds: str
) -> None:
    """One round a side cannot tell anything apart, and two split cleanly one way or the
    other a third of the time by chance alone: no verdict below three."""
    result = _bench_on_lavapipe(
        fresh_project, *AB_ARGS, "--against", str(fresh_project), "--rounds", rounds, "--json"
    )
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["comparison"]["rows"]
    assert row["verdict"] == "too few rounds for a verdict (3 a side at least)"


@needs_cpu_adapter
def test_a_wrong_kernel_on_the_against_side_fails_the_run(
    fresh_project: Path, tmp_path: Path
) -> None:
    """The other side's outputs are judged as this side's: a kernel that skips outputs
    already written is FAIL there, the verdict names the side, and the exit status is 1."""
    other = _project_copy(fresh_project, tmp_path / "wrong")
    edit(
        other / "templates/rmsnorm.wgsl.j2",
        "    if (row >= u.num_rows) {",
        "    if (row >= u.num_rows || bitcast<u32>(output[row * u.size]) != 0x7fc00000u) {",
    )
    result = _bench_on_lavapipe(
        fresh_project, *AB_ARGS, "--against", str(other), "--rounds", "2", "--json"
    )
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["rows"][0]["status"] == "ok"
    (row,) = document["comparison"]["rows"]
    assert row["verdict"].startswith("FAIL (against): a run as timed")
    assert row["against_round_medians_us"] == [] and row["ratio"] is None


def test_rounds_without_against_is_a_usage_error() -> None:
    result = run_cli(REPO_ROOT, "bench", "--rounds", "3")
    assert result.exit_code == 2
    assert "--rounds is the number of --against A/B rounds" in result.stderr
    assert "Traceback" not in result.stderr


def test_against_a_directory_without_a_project_is_one_line_exit_2(tmp_path: Path) -> None:
    result = run_cli(REPO_ROOT, "bench", "rmsnorm", "--against", str(tmp_path))
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert f"--against {tmp_path}" in line and "variants.toml" in line


def test_against_a_project_without_the_variant_names_it(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    blocks = (REPO_ROOT / "variants.toml").read_text(encoding="utf-8").split("\n[[variant]]\n")
    kept = [b for b in blocks if 'name = "attention_decode_split_d64_f16"\n' not in b]
    assert len(kept) == len(blocks) - 1
    (other / "variants.toml").write_text("\n[[variant]]\n".join(kept), encoding="utf-8")
    shutil.copytree(REPO_ROOT / "templates", other / "templates")
    result = run_cli(REPO_ROOT, "bench", "attention_decode_split_d64_f16", "--against", str(other))
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert "no variant attention_decode_split_d64_f16 in its variants.toml" in line


def test_ab_rounds_alternate_which_side_runs_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 1 this project first, round 2 the other first, and so on, so that a position
    effect (the first measurement of a run is often slow) cannot favour one side."""
    import doppler_gen.bench as bench_module

    order: list[str] = []

    def fake_rows(opener, kernel, entry, request, progress, estimate=None):
        order.append(kernel)
        timing = Timing((1000.0 + len(order),) * 20)
        return [BenchRow("v", "rmsnorm:rows=8,size=256", "ok", timing=timing)]

    monkeypatch.setattr(bench_module, "_variant_rows", fake_rows)
    request = bench_module.BenchRequest(against=Path("elsewhere"), rounds=3)
    comparison = bench_module._ab_rounds(
        lambda: None, (["this"], [{}]), (["other"], [{}]), request, None
    )
    assert order == ["this", "other", "other", "this", "this", "other"]
    key = ("v", "rmsnorm:rows=8,size=256")
    assert comparison.pairs() == [key]
    assert len(comparison.this[key]) == len(comparison.other[key]) == 3


@needs_cpu_adapter
def test_an_ab_that_timed_nothing_on_the_other_side_exits_1(
    fresh_project: Path, tmp_path: Path
) -> None:
    """The other project's rmsnorm asks for 1024 invocations, beyond WebGPU's default limits:
    n/a there. This side is timed, but nothing was compared, so the run is not a success."""
    other = _project_copy(fresh_project, tmp_path / "wide")
    edit(
        other / "variants.toml",
        'description = "input, weight and output f32"\n',
        'description = "input, weight and output f32"\nparams = { workgroup_size = 1024 }\n',
    )
    result = _bench_on_lavapipe(
        fresh_project,
        *AB_ARGS,
        "--against",
        str(other),
        "--rounds",
        "3",
        "--limits",
        "webgpu-default",
    )
    assert result.exit_code == 1, result.output
    assert "not timed on both sides" in result.stdout
    assert "No pair was timed on both sides (exit 1)." in result.stdout


def test_against_a_variant_of_another_family_is_refused(tmp_path: Path) -> None:
    """Names are matched across the projects; a name that is another family's kernel there
    would be timed on other shapes and compare nothing."""
    other = _project_copy(REPO_ROOT / "templates", tmp_path / "other" / "templates").parent
    text = (REPO_ROOT / "variants.toml").read_text(encoding="utf-8")
    text = text.replace('name = "rmsnorm"\n', 'name = "rmsnorm_renamed"\n')
    text = text.replace('name = "attention_small_f16kv"\n', 'name = "rmsnorm"\n')
    text = text.replace('"generated/rmsnorm.wgsl"', '"generated/rmsnorm_renamed.wgsl"')
    text = text.replace('"generated/attention_small_f16kv.wgsl"', '"generated/rmsnorm.wgsl"')
    (other / "variants.toml").write_text(text, encoding="utf-8")
    result = run_cli(REPO_ROOT, "bench", "rmsnorm", "--against", str(other))
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert f"--against {other}: variant rmsnorm is a rmsnorm kernel here and a" in line
