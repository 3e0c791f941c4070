"""tools/instruction_rates.py: every mode compiles and times on the machine's adapter, and the
integer f16 conversion it measures is the exact conversion docs/h200-sessions.md says it is."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from gpu_support import adapter_problem

from doppler_gen.backends import get_backend, select_adapter
from doppler_gen.backends.base import Step

TOOL = Path(__file__).resolve().parents[1] / "tools" / "instruction_rates.py"

pytestmark = pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))


def load_tool():
    spec = importlib.util.spec_from_file_location("instruction_rates", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_mode_compiles_runs_and_is_timed(tmp_path: Path, capsys) -> None:
    tool = load_tool()
    out = tmp_path / "rates.json"
    args = ["--workgroups", "2", "--iters", "4", "--repeats", "2", "--rounds", "1"]
    args += ["--warmup-ms", "0"]
    assert tool.main([*args, "--json", str(out)]) == 0
    results = json.loads(out.read_text(encoding="utf-8"))
    assert set(results) == set(tool.MODES)
    assert all(len(times) == 1 and times[0] > 0 for times in results.values())
    printed = capsys.readouterr().out
    assert all(f"{mode:10s} round 0:" in printed for mode in tool.MODES)


def test_an_adapter_it_cannot_use_is_one_line_and_exit_2(capsys) -> None:
    assert load_tool().main(["--adapter", "no-such-adapter-anywhere"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("instruction_rates: ") and err.count("\n") == 1
    assert "no-such-adapter-anywhere" in err


def test_an_unwritable_json_path_fails_before_measuring(tmp_path: Path, capsys) -> None:
    target = tmp_path / "missing-directory" / "rates.json"
    assert load_tool().main(["--json", str(target), "--adapter", "no-such-adapter"]) == 2
    err = capsys.readouterr().err
    assert "rates.json" in err and "no-such-adapter" not in err


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown mode 'nope'"):
        load_tool().kernel("nope")


def test_the_integer_conversion_is_the_f16_value_times_two_to_the_minus_112() -> None:
    """Every finite normal f16, in either half of a word, on the adapter (f16 subnormals become
    f32 subnormals, which a driver may flush: they may read as 0 or as their value)."""
    tool = load_tool()
    trick = tool.TRICK.replace("W", "w")
    wgsl = f"""
@group(0) @binding(0) var<storage, read> words: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<vec2<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {{
    let w = words[g.x];
    out[g.x] = {trick};
}}
"""
    halves = np.arange(1 << 16, dtype=np.uint32)
    words = halves | (halves[::-1] << 16)  # every pattern in the low half and in the high half
    backend = get_backend("wgpu")
    device = backend.open_device(select_adapter(backend.adapters(), None))
    try:
        source = device.storage_buffer(words, label="words")
        out = device.storage_buffer(np.zeros(2 * words.size, np.float32), read_write=True)
        pipeline = device.compile(wgsl, label="trick")
        device.run([Step(pipeline, {0: source, 1: out}, (words.size // 256, 1, 1))])
        got = np.frombuffer(device.read_buffer(out), np.float32).reshape(-1, 2)
    finally:
        device.close()
    for half, column in ((words & 0xFFFF, 0), (words >> 16, 1)):
        value = half.astype(np.uint16).view(np.float16).astype(np.float64)
        scaled = got[:, column].astype(np.float64) * 2.0**112
        normal = np.isfinite(value) & (np.abs(value) >= 2.0**-14)
        assert np.array_equal(scaled[normal], value[normal])
        subnormal = np.isfinite(value) & (np.abs(value) < 2.0**-14)
        assert np.all((scaled[subnormal] == value[subnormal]) | (scaled[subnormal] == 0.0))
