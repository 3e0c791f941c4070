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
import json
import statistics
import sys
from collections.abc import Callable

import numpy as np

from doppler_gen.backends.base import Step, select_adapter
from doppler_gen.backends.wgpu_backend import WgpuBackend
from doppler_gen.errors import DopplerGenError
from doppler_gen.runtime.measure import Settings, ramp_up

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

# Two values (vec2<f32>) from word W: the modes that feed one multiply-add a value
TWO_VALUES = {
    # two integer operations a value: the yardstick the others are read against
    "bits": "vec2<f32>(bitcast<f32>(W & 0x3fffffffu), bitcast<f32>((W >> 2u) & 0x3fffffffu))",
    # the f16 -> f32 conversion instruction, as the prefill's packed tiles use it
    "unpack": "unpack2x16float(W)",
    # the same conversion by integer operations (times 2^-112): sign to bit 31, the rest << 13
    "trick": "vec2<f32>(bitcast<f32>(((W << 13u) & 0x0fffe000u) | ((W << 16u) & 0x80000000u)), "
    "bitcast<f32>(((W >> 3u) & 0x0fffe000u) | (W & 0x80000000u)))",
    # an integer-to-float conversion a value
    "i2f": "vec2<f32>(f32(W & 0xffffu), f32(W >> 16u))",
    # one subgroup shuffle a word
    "shfl": "vec2<f32>(bitcast<f32>(W & 0x3fffffffu), "
    "subgroupShuffleXor(bitcast<f32>((W >> 2u) & 0x3fffffffu), 1u))",
    # one exp a word
    "exp": "vec2<f32>(bitcast<f32>(W & 0x3fffffffu), "
    "exp(bitcast<f32>((W & 0x007fffffu) | 0x3f800000u)))",
}

# mode -> (values produced per word per iteration, multiply-adds per word per iteration)
MODES: dict[str, tuple[int, int]] = {
    **dict.fromkeys(TWO_VALUES, (2, 2)),
    "f16vec": (2, 2),  # vec4<f32>(vec4<f16>): how the decode kernels convert K and V
    "int8magic": (4, 4),  # the tiered cold tier's int8 decode (templates/lib/cold_tier.wgsl.j2)
    "i2f4": (4, 4),  # four bytes by integer-to-float conversions
    "i2f8s": (4, 4),  # four signed bytes by arithmetic shifts and conversions (int8magic's values)
    "fma4": (2, 8),  # unpack2x16float feeding 4 multiply-adds a value (a GQA group of 4)
    "fma4trick": (2, 8),  # the integer conversion feeding 4 multiply-adds a value
    "fma4bits": (2, 8),  # the yardstick feeding 4 multiply-adds a value
}


def _two_values(mode: str) -> Callable[[int], list[str]]:
    expression = TWO_VALUES[mode]

    def body(j: int) -> list[str]:
        return [
            f"        w{j} = w{j} + 0x00010001u;",
            f"        let v{j} = {expression.replace('W', f'w{j}')};",
            f"        a{j} = fma(v{j}, vec2<f32>(1.0001), a{j});",
        ]

    return body


def _four_fmas(expression: str) -> Callable[[int], list[str]]:
    def body(j: int) -> list[str]:
        lines = [
            f"        w{j} = w{j} + 0x00010001u;",
            f"        let v{j} = {expression.replace('W', f'w{j}')};",
        ]
        lines += [f"        a{j} = fma(v{j}, vec2<f32>({c}), a{j});" for c in FMA_CONSTANTS]
        return lines

    return body


def _int8magic(j: int) -> list[str]:
    bits = (
        f"(vec4<u32>(lo{j}, lo{j}, hi{j}, hi{j}) & vec4<u32>(0xffu, 0xff00u, 0xffu, 0xff00u))"
        " | vec4<u32>(0x4b000000u)"
    )
    return [
        f"        w{j} = w{j} + 0x00010001u;",
        f"        let lo{j} = w{j} ^ 0x80808080u; let hi{j} = lo{j} >> 16u;",
        f"        let v{j} = fma(bitcast<vec4<f32>>({bits}), vec4<f32>(1.0, 0.00390625, 1.0, "
        "0.00390625), vec4<f32>(-8388736.0, -32896.0, -8388736.0, -32896.0));",
        f"        a{j} = fma(v{j}.xy, vec2<f32>(1.0001), a{j});",
        f"        a{j} = fma(v{j}.zw, vec2<f32>(1.0001), a{j});",
    ]


def _i2f4(j: int) -> list[str]:
    return [
        f"        w{j} = w{j} + 0x00010001u;",
        f"        let v{j} = vec4<f32>(vec4<u32>(w{j} & 0xffu, (w{j} >> 8u) & 0xffu, "
        f"(w{j} >> 16u) & 0xffu, w{j} >> 24u));",
        f"        a{j} = fma(v{j}.xy, vec2<f32>(1.0001), a{j});",
        f"        a{j} = fma(v{j}.zw, vec2<f32>(1.0001), a{j});",
    ]


def _i2f8s(j: int) -> list[str]:
    shifted = ", ".join(f"bitcast<i32>(w{j} << {s}u)" for s in (24, 16, 8, 0))
    return [
        f"        w{j} = w{j} + 0x00010001u;",
        f"        let v{j} = vec4<f32>(vec4<i32>({shifted}) >> vec4<u32>(24u));",
        f"        a{j} = fma(v{j}.xy, vec2<f32>(1.0001), a{j});",
        f"        a{j} = fma(v{j}.zw, vec2<f32>(1.0001), a{j});",
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


def _body(mode: str) -> Callable[[int], list[str]]:
    if mode in TWO_VALUES:
        return _two_values(mode)
    special: dict[str, Callable[[int], list[str]]] = {
        "int8magic": _int8magic,
        "i2f4": _i2f4,
        "i2f8s": _i2f8s,
        "f16vec": _f16vec,
        "fma4": _four_fmas(TWO_VALUES["unpack"]),
        "fma4trick": _four_fmas(TWO_VALUES["trick"]),
        "fma4bits": _four_fmas(TWO_VALUES["bits"]),
    }
    if mode not in special:
        raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
    return special[mode]


def kernel(mode: str) -> str:
    """The WGSL of one mode's kernel."""
    body = _body(mode)
    lines = [
        HEADER,
        f"@compute @workgroup_size({WORKGROUP})",
        "fn main(@builtin(global_invocation_id) g: vec3<u32>) {",
    ]
    for j in range(WORDS):
        lines.append(f"    var w{j}: u32 = seed[(g.x * {WORDS}u + {j}u) % {SEED_WORDS}u];")
        lines.append(f"    var a{j}: vec2<f32> = vec2<f32>(0.0);")
    if mode == "f16vec":
        for k in range(WORDS // 2):
            pair = f"unpack2x16float(w{2 * k}), unpack2x16float(w{2 * k + 1})"
            lines.append(f"    var h{k}: vec4<f16> = vec4<f16>(vec4<f32>({pair}));")
    lines.append("    for (var i: u32 = 0u; i < ITERS; i++) {")
    for j in range(WORDS):
        lines += body(j)
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
        for mode, (values, fmas) in MODES.items():
            pipeline = device.compile(kernel(mode), constants={"ITERS": args.iters}, label=mode)
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
            results.setdefault(mode, []).append(ns)
            print(
                f"{mode:10s} round {round_index}: {ns / 1e3:9.1f} us  "
                f"elements/clk/SM {words * values / (ns * clocks_per_sm):7.1f}  "
                f"FMA/clk/SM {words * fmas / (ns * clocks_per_sm):7.1f}",
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
