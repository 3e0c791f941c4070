"""Per-SM throughput of the instructions a decode key loop spends its issue slots on, from WGSL.

Why: the decode kernels' key loops are bound by their arithmetic, not by memory
(docs/h200-sessions.md, *Twenty-fourth session*), so a change to them pays only if it removes
issue slots. This measures what the candidates cost on the device itself: an f16 -> f32
conversion (``unpack2x16float`` and ``vec4<f32>(vec4<f16>)``), the same conversion by integer
operations, an integer-to-float conversion, the int8 decode of the tiered kernels' cold tier,
a subgroup shuffle and an ``exp``, each beside the multiply-adds it feeds.

Every kernel is one loop with no memory traffic: each invocation keeps 8 u32 words in
registers, steps each word by an integer add per iteration (so nothing can be hoisted), turns
it into f32 values by the mode's operations and multiply-adds them into accumulators that are
stored once at the end. Reported: the median GPU time of each kernel, and the values produced
(``elements``) and multiply-adds per clock per SM, given the SM count and clock. The loops are
issue-bound, so a mode's rate against ``bits`` (two cheap integer operations a value) says
what its operations cost in issue slots.

Usage (from the repository root, with the project installed)::

    python tools/instruction_rates.py [--adapter gpu] [--sms 132] [--ghz 1.98]

The H200 readings and what they decided are in docs/h200-sessions.md (*Twenty-ninth
session*).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from doppler_gen.backends.base import Step, select_adapter
from doppler_gen.backends.wgpu_backend import WgpuBackend
from doppler_gen.config import load_project
from doppler_gen.errors import DopplerGenError
from doppler_gen.render import Renderer
from doppler_gen.runtime.measure import Settings, ramp_up

REPO_ROOT = Path(__file__).resolve().parents[1]

# every kernel enables f16, `shfl` needs subgroups, and timing needs timestamps
NEEDED_FEATURES = ("shader-f16", "subgroups", "timestamp-query")
WORDS = 8  # u32 words (independent chains) per invocation
WORKGROUP = 256
SEED_WORDS = 4096
FMA_CONSTANTS = ("1.0001", "0.9999", "1.0002", "0.9998")

HEADER = """
enable f16;
@group(0) @binding(0) var<storage, read> seed: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
override ITERS: u32 = 256u;
"""

# Conversions written W for the word they read: two values (vec2<f32>) a word
BITS = "vec2<f32>(bitcast<f32>(W & 0x3fffffffu), bitcast<f32>((W >> 2u) & 0x3fffffffu))"
UNPACK = "unpack2x16float(W)"
# the f16 conversion by integer operations (times 2^-112): sign to bit 31, the rest << 13
TRICK = (
    "vec2<f32>(bitcast<f32>(((W << 13u) & 0x0fffe000u) | ((W << 16u) & 0x80000000u)), "
    "bitcast<f32>(((W >> 3u) & 0x0fffe000u) | (W & 0x80000000u)))"
)


class Mode(NamedTuple):
    """One kernel: the f32 values a word becomes (an expression in W: vec2 or vec4) and the
    multiply-adds each value feeds (vec2 only; a vec4's values feed one each)."""

    expression: str
    values: int  # per word and iteration: 2 (vec2) or 4 (vec4)
    fmas: int = 1  # per value

    @property
    def fmas_per_word(self) -> int:
        return self.values * self.fmas


MODES: dict[str, Mode] = {
    # two integer operations a value: the yardstick the others are read against
    "bits": Mode(BITS, 2),
    # the f16 -> f32 conversion instruction, as the prefill's packed tiles use it
    "unpack": Mode(UNPACK, 2),
    "trick": Mode(TRICK, 2),
    # an integer-to-float conversion a value
    "i2f": Mode("vec2<f32>(f32(W & 0xffffu), f32(W >> 16u))", 2),
    # one subgroup shuffle a word
    "shfl": Mode(
        "vec2<f32>(bitcast<f32>(W & 0x3fffffffu), "
        "subgroupShuffleXor(bitcast<f32>((W >> 2u) & 0x3fffffffu), 1u))",
        2,
    ),
    # one exp a word
    "exp": Mode(
        "vec2<f32>(bitcast<f32>(W & 0x3fffffffu), "
        "exp(bitcast<f32>((W & 0x007fffffu) | 0x3f800000u)))",
        2,
    ),
    # vec4<f32>(vec4<f16>): how the decode kernels convert K and V (its own loop body, _f16vec)
    "f16vec": Mode("", 2),
    # the tiered cold tier's int8 decode: unpack_quant_0 of templates/lib/cold_tier.wgsl.j2
    "int8magic": Mode("unpack_quant_0(W)", 4),
    # four bytes by integer-to-float conversions
    "i2f4": Mode(
        "vec4<f32>(vec4<u32>(W & 0xffu, (W >> 8u) & 0xffu, (W >> 16u) & 0xffu, W >> 24u))", 4
    ),
    # four signed bytes by arithmetic shifts and conversions (int8magic's values)
    "i2f8s": Mode(
        "vec4<f32>(vec4<i32>("
        + ", ".join(f"bitcast<i32>(W << {s}u)" for s in (24, 16, 8, 0))
        + ") >> vec4<u32>(24u))",
        4,
    ),
    # four multiply-adds a value (a GQA group of 4) beside each conversion
    "fma4": Mode(UNPACK, 2, 4),
    "fma4trick": Mode(TRICK, 2, 4),
    "fma4bits": Mode(BITS, 2, 4),
}


def _loop_body(mode: Mode, j: int) -> list[str]:
    """Word j's lines in the loop: step it, convert it, multiply-add the values."""
    lines = [
        f"        w{j} = w{j} + 0x00010001u;",
        f"        let v{j} = {mode.expression.replace('W', f'w{j}')};",
    ]
    if mode.values == 4:
        return lines + [
            f"        a{j} = fma(v{j}.{xy}, vec2<f32>(1.0001), a{j});" for xy in ("xy", "zw")
        ]
    return lines + [
        f"        a{j} = fma(v{j}, vec2<f32>({c}), a{j});" for c in FMA_CONSTANTS[: mode.fmas]
    ]


def _f16vec(j: int) -> list[str]:
    """Two words' worth of f16 held as vec4<f16>, stepped by an f16 add, converted at once."""
    if j % 2:
        return []
    k = j // 2
    return [
        f"        h{k} = h{k} + vec4<f16>(0.001h);",
        f"        let c{k} = vec4<f32>(h{k});",
        f"        a{j} = fma(c{k}.xy, vec2<f32>(1.0001), a{j});",
        f"        a{j + 1} = fma(c{k}.zw, vec2<f32>(1.0001), a{j + 1});",
    ]


@functools.cache
def _cold_tier_decode() -> str:
    """The int8 decode functions as the kernels' template renders them."""
    renderer = Renderer(load_project(REPO_ROOT))
    source = '{% import "lib/cold_tier.wgsl.j2" as cold_tier %}{{ cold_tier.unpack_quant("int8") }}'
    return renderer.env.from_string(source).render().strip("\n")


def kernel(name: str) -> str:
    """The WGSL of one mode's kernel."""
    if name not in MODES:
        raise ValueError(f"unknown mode {name!r} (known: {', '.join(MODES)})")
    mode = MODES[name]
    lines = [HEADER]
    if name == "int8magic":
        lines.append(_cold_tier_decode())
    lines += [
        f"@compute @workgroup_size({WORKGROUP})",
        "fn main(@builtin(global_invocation_id) g: vec3<u32>) {",
    ]
    for j in range(WORDS):
        lines.append(f"    var w{j}: u32 = seed[(g.x * {WORDS}u + {j}u) % {SEED_WORDS}u];")
        lines.append(f"    var a{j}: vec2<f32> = vec2<f32>(0.0);")
    if name == "f16vec":
        for k in range(WORDS // 2):
            pair = f"unpack2x16float(w{2 * k}), unpack2x16float(w{2 * k + 1})"
            lines.append(f"    var h{k}: vec4<f16> = vec4<f16>(vec4<f32>({pair}));")
    lines.append("    for (var i: u32 = 0u; i < ITERS; i++) {")
    for j in range(WORDS):
        lines += _f16vec(j) if name == "f16vec" else _loop_body(mode, j)
    lines.append("    }")
    total = " + ".join(f"a{j}.x + a{j}.y" for j in range(WORDS))
    lines.append(f"    out[g.x] = {total};")
    lines.append("}")
    return "\n".join(lines)


def seed_words() -> np.ndarray:
    """Distinct words whose f16 halves are finite and below 1 (no Inf/NaN in any mode)."""
    words = (np.arange(SEED_WORDS, dtype=np.uint64) * 2654435761) % (1 << 32)
    return words.astype(np.uint32) & np.uint32(0x3BFF3BFF)


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """Time every mode ``args.rounds`` times; print one line per reading; return the medians."""
    backend = WgpuBackend()
    adapter = select_adapter(backend.adapters(), args.adapter)
    missing = [f for f in NEEDED_FEATURES if f not in adapter.features]
    if missing:
        raise DopplerGenError(f"{adapter.short()} does not offer {', '.join(missing)}")
    device = backend.open_device(adapter, features=NEEDED_FEATURES)
    groups = args.workgroups or args.sms * 16
    seed = device.storage_buffer(seed_words(), label="seed")
    out = device.storage_buffer(np.zeros(groups * WORKGROUP, np.float32), read_write=True)
    print(f"# {adapter.describe()}; {groups} workgroups x {WORKGROUP}, {args.iters} iterations")
    words = groups * WORKGROUP * WORDS * args.iters
    clocks_per_sm = args.ghz * 1e9 * args.sms * 1e-9  # SM-clocks per ns
    results: dict[str, list[float]] = {}
    for round_index in range(args.rounds):
        for name, mode in MODES.items():
            pipeline = device.compile(kernel(name), constants={"ITERS": args.iters}, label=name)
            step = Step(pipeline, {0: seed, 1: out}, (groups, 1, 1))
            # as bench does: run until the clock has risen (an idle GPU sits at a low clock)
            ramp_up(
                lambda count, step=step: [
                    r.total_ns for r in device.timed_run([step], repeats=count, warmup=0)
                ],
                Settings(warmup_ms=args.warmup_ms),
            )
            runs = device.timed_run([step], repeats=args.repeats, warmup=10)
            ns = statistics.median(r.total_ns for r in runs)
            results.setdefault(name, []).append(ns)
            print(
                f"{name:10s} round {round_index}: {ns / 1e3:9.1f} us  "
                f"elements/clk/SM {words * mode.values / (ns * clocks_per_sm):7.1f}  "
                f"FMA/clk/SM {words * mode.fmas_per_word / (ns * clocks_per_sm):7.1f}",
                flush=True,
            )
    return results


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", default=None, help="as doppler-gen's --adapter")
    parser.add_argument("--sms", type=int, default=132, help="SMs (compute units) of the GPU")
    parser.add_argument("--ghz", type=float, default=1.98, help="SM clock while busy, GHz")
    parser.add_argument("--workgroups", type=int, default=0, help="default: 16 per SM")
    parser.add_argument("--iters", type=int, default=2048, help="loop iterations a kernel")
    parser.add_argument("--repeats", type=int, default=15, help="timed runs a reading")
    parser.add_argument("--rounds", type=int, default=2, help="readings of every mode")
    parser.add_argument(
        "--warmup-ms", type=float, default=200.0, help="GPU ms of runs before each reading"
    )
    parser.add_argument("--json", default=None, help="also write {mode: [ns, ...]} here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Exit 0, or 2 with one line on stderr when the adapter or the --json path will not do."""
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        if args.json:  # a path that cannot be written fails before anything is measured
            open(args.json, "w", encoding="utf-8").close()
        results = measure(args)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(results, handle, indent=1)
    except (DopplerGenError, OSError) as error:
        print(f"instruction_rates: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
