"""The tiered decode family: seed interface, host layouts, determinism, bad parameters."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    REPO_ROOT,
    SEEDS,
    SEEDS_MISSING,
    assert_one_line_error,
    edit,
    run_cli,
    run_process,
    snapshot,
)
from gpu_support import adapter_problem, open_run_device

from doppler_gen.backends import get_backend
from doppler_gen.config import load_project
from doppler_gen.families import get_family
from doppler_gen.families.attention import CaseSpec
from doppler_gen.families.quant import unpack_signed
from doppler_gen.families.tiered import SHARED_ROWS_CASE, build_tiered, tiered_specs
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.outputs import plan, write
from doppler_gen.render import Renderer
from doppler_gen.runtime.runner import KernelRunner
from doppler_gen.validate import validate
from doppler_gen.wgsl import parse_module

TIERED = (
    "attention_decode_tiered_f16",
    "attention_decode_tiered_f16kv",
    "attention_decode_tiered_int8_f16kv",
    "attention_decode_tiered_int4_f16kv",
)
JS_HOST = SEEDS / "attention.js"


def _module(name: str):
    project = load_project(REPO_ROOT)
    return parse_module(Renderer(project).render(project.variant(name)).text)


def _js_writer_fields(function: str) -> tuple[int, list[int]]:
    """(buffer size, offsets written) of one uniform writer in the seed JS host."""
    text = JS_HOST.read_text()
    body = text[text.index(f"function {function}(") :]
    body = body[: body.index("\n}\n")]
    size = int(re.search(r"\n\s+(\d+),", body).group(1))
    offsets = [int(m) for m in re.findall(r"view\.set(?:Uint32|Float32)\((\d+),", body)]
    return size, offsets


@pytest.mark.skipif(not SEEDS.is_dir(), reason=SEEDS_MISSING)
def test_int8_interface_equals_the_seed() -> None:
    seed = parse_module((SEEDS / "attention_decode_tiered_int8_f16kv.wgsl").read_text())
    assert _module("attention_decode_tiered_int8_f16kv").interface() == seed.interface()


@pytest.mark.skipif(not SEEDS.is_dir(), reason=SEEDS_MISSING)
def test_int4_interface_is_the_int8_interface() -> None:
    seed = parse_module((SEEDS / "attention_decode_tiered_int8_f16kv.wgsl").read_text())
    int4 = _module("attention_decode_tiered_int4_f16kv")
    assert int4.interface() == seed.interface()
    assert int4.constants["PACK_FACTOR"] == 8 and seed.constants["PACK_FACTOR"] == 4


@pytest.mark.parametrize(
    ("name", "q", "out"),
    [
        ("attention_decode_tiered_f16", "f16", "f16"),
        ("attention_decode_tiered_f16kv", "f32", "f32"),
    ],
)
def test_non_quantized_interface_matches_the_js_host(name: str, q: str, out: str) -> None:
    module = _module(name)
    bindings = [(b.binding, b.name, b.access, str(b.type)) for b in module.bindings]
    assert bindings == [
        (0, "u", "read", "Uniforms"),
        (1, "Q", "read", f"array<{q}>"),
        (2, "K_hot", "read", "array<f16>"),
        (3, "V_hot", "read", "array<f16>"),
        (4, "K_cold", "read", "array<f16>"),
        (5, "V_cold", "read", "array<f16>"),
        (6, "output", "read_write", f"array<{out}>"),
        (7, "cold_page_table", "read", "array<u32>"),
    ]
    fields = [f.name for f in module.structs["Uniforms"].fields]
    assert fields == [
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "cold_len",
        "hot_len",
        "seq_len",
        "scale",
        "is_causal",
        "start_pos",
        "attn_softcap",
        "sliding_window",
        "hot_window",
        "hot_start",
        "cold_page_size",
        "cold_layout",
        "hot_layout",
        "_pad",
    ]
    if JS_HOST.is_file():
        size, offsets = _js_writer_fields("createTieredAttentionUniformBuffer")
        assert [f.offset for f in module.structs["Uniforms"].fields] == offsets
        assert size == -(-module.structs["Uniforms"].size // 16) * 16 == 80


@pytest.mark.skipif(not JS_HOST.is_file(), reason=SEEDS_MISSING)
def test_quantized_uniforms_match_the_js_host() -> None:
    size, offsets = _js_writer_fields("createTieredQuantAttentionUniformBuffer")
    struct = _module("attention_decode_tiered_int8_f16kv").structs["Uniforms"]
    assert [f.offset for f in struct.fields] == offsets
    assert size == 64 and struct.size == 60


def test_the_four_render_deterministically() -> None:
    project = load_project(REPO_ROOT)
    first = {n: Renderer(project).render(project.variant(n)).text for n in TIERED}
    second = {n: Renderer(load_project(REPO_ROOT)).render(project.variant(n)).text for n in TIERED}
    assert first == second
    for name, text in first.items():
        assert text == (REPO_ROOT / f"generated/{name}.wgsl").read_text(), f"{name} is stale"


@pytest.mark.parametrize(("cold", "bits"), [("int8", 8), ("int4", 4)])
def test_validation_feeds_the_most_negative_code(cold: str, bits: int) -> None:
    """The quantizer never writes -2**(bits-1); the cases must, or a sign extension wrong only
    there (`q > 128`) passes. The reference still sees exactly the words the kernel reads."""
    spec = CaseSpec("c", cold_len=40, hot_len=3, hot_start=40, hot_window=4, start_pos=42, seed=5)
    data = build_tiered(spec, {"Q": "f32"}, cold)
    stride = int(data.uniforms["packed_stride"])
    for name, ref in (("K_cold", "k_cold"), ("V_cold", "v_cold")):
        words = data.buffers[name].reshape(-1, stride)
        ints = unpack_signed(words, bits, spec.head_dim)
        assert ints.min() == -(2 ** (bits - 1)), name
        scales = data.buffers["scales_" + name[0].lower()]
        expected = ints.astype(np.float64) * scales.astype(np.float64)[:, None]
        np.testing.assert_array_equal(data.reference_inputs[ref].reshape(expected.shape), expected)


@pytest.mark.parametrize("cold", ["f16", "int8", "int4"])
def test_a_fully_masked_row_with_cold_keys_is_a_case(cold: str) -> None:
    """The "mean_v" contract averages V over every key, cold ones included: a kernel that skips
    the cold keys before the window (none visible there) differs only on a fully masked row."""

    def fully_masked_with_cold(s: CaseSpec) -> bool:
        keys = np.concatenate([np.arange(s.cold_len), s.hot_start + np.arange(s.hot_len)])
        hidden = (keys > s.start_pos) if s.is_causal else np.zeros(keys.size, bool)
        if s.sliding_window and s.start_pos >= s.sliding_window:
            hidden |= keys < s.start_pos - s.sliding_window + 1
        return s.cold_len > 0 and bool(hidden.all())

    specs = tiered_specs(256, 4096, cold=cold, quick=False, seed=0)
    assert sum(fully_masked_with_cold(s) for s in specs) >= 2


@pytest.mark.parametrize("cold", ["f16", "int8", "int4"])
def test_the_causal_mask_over_cold_keys_is_a_case(cold: str) -> None:
    """The seed masks cold key i when i > start_pos: some case must hide a cold key that way,
    with other keys visible, or a kernel that never masks the cold tier causally passes."""
    specs = tiered_specs(256, 4096, cold=cold, quick=False, seed=0)
    assert any(
        s.is_causal and s.sliding_window == 0 and 0 <= s.start_pos < s.cold_len - 1 for s in specs
    )


def _reaches_the_fallback(spec: CaseSpec) -> bool:
    """Whether some hot key's ring offset, hot_start % hot_window + i, is 2 * hot_window or more."""
    if spec.hot_window == 0 or spec.hot_len == 0:
        return False
    return spec.hot_start % spec.hot_window + spec.hot_len - 1 >= 2 * spec.hot_window


@pytest.mark.parametrize("cold", ["f16", "int8", "int4"])
def test_every_tiered_validation_matrix_reaches_the_shared_rows(cold: str) -> None:
    """validate itself, not only tests/test_tiered_hot_ring.py, runs hot keys past
    2 * hot_window for every cold format (default and large tiers; the quick tier's subset
    leaves it out)."""
    specs = tiered_specs(64, 4096, cold=cold, quick=False, seed=0)
    assert [s.name for s in specs if _reaches_the_fallback(s)] == [SHARED_ROWS_CASE]


def test_the_variants_16_lane_lavapipe_validates_are_the_ones_whose_shuffles_need_it() -> None:
    """.ci/setup's second validation (16-lane lavapipe) takes each variant whose family says its
    widest shuffle path needs 9 to 16 lanes: the 16-lane key groups of the tiered f16-cold
    subgroup kernels (not the quantized ones, which share that code, nor the kernels without
    subgroups), besides the tiled family's min_subgroup_size and lanes_per_key."""
    manifest = json.loads((REPO_ROOT / "generated" / "manifest.json").read_text("utf-8"))
    width = {
        name: get_family(entry["family"]).wide_subgroup_width(entry)
        for name, entry in manifest["variants"].items()
    }
    assert sorted(n for n, w in width.items() if 8 < w <= 16) == [
        "attention_decode_sg_d128_f16",
        "attention_decode_sg_d256",
        "attention_decode_sg_d256_f16",
        "attention_decode_sg_d256_f16kv",
        "attention_decode_split_d128_f16",
        "attention_decode_split_long_d128_f16",
        "attention_decode_tiered_f16_sg",
        "attention_decode_tiered_split_f16",
        "attention_decode_tiered_split_short_f16",
        "attention_prefill_large_sg_d64_f16",
    ]
    assert width["attention_decode_tiered_split_int8_f16kv"] == 0  # quantized: f16 stands for it
    assert width["attention_decode_tiered_f16"] == 0  # no subgroups
    assert width["attention_streaming_sg_d64_f16"] == 32  # GPU only
    assert ".wide_subgroup_width(e)" in (REPO_ROOT / ".ci" / "setup").read_text("utf-8")


def test_metadata_records_what_a_host_needs() -> None:
    import json

    manifest = json.loads((REPO_ROOT / "generated/manifest.json").read_text())["variants"]
    for name in TIERED:
        meta = manifest[name]["metadata"]
        assert meta["max_kv_len"] == 131072
        assert meta["workgroup_size"] == [256, 1, 1]
        assert meta["requires"] == ["shader-f16"]
        assert meta["masked_row"] == "mean_v"
        assert meta["dispatch"] == "num_heads"
    assert manifest["attention_decode_tiered_f16"]["metadata"]["out_dtype"] == "f16"
    assert manifest["attention_decode_tiered_int4_f16kv"]["metadata"]["out_dtype"] == "f32"
    assert manifest["attention"]["metadata"]["masked_row"] == "zero"


BAD_TIERED = [
    (
        'params = { q_dtype = "f32", out_dtype = "f32", cold = "int8" }',
        'params = { q_dtype = "f32", out_dtype = "f32", cold = "int3" }',
        "variants.toml:",
        "parameter cold='int3' is not one of 'f16', 'int8', 'int4'",
    ),
    (
        'params = { q_dtype = "f32", out_dtype = "f32", cold = "int8" }',
        'params = { q_dtype = "f16", out_dtype = "f32", cold = "int8" }',
        "templates/attention_decode_tiered.wgsl.j2:",
        "a quantized cold tier (int8) takes f32 Q and output",
    ),
    (
        'params = { q_dtype = "f32", out_dtype = "f32", cold = "int8" }',
        'params = { q_dtype = "f32", out_dtype = "f32", cold = "int8", max_kv_len = "2048" }',
        "variants.toml:",
        "parameter max_kv_len must be int",
    ),
    (
        'params = { q_dtype = "f32", out_dtype = "f32", cold = "int8" }',
        'params = { q_dtype = "f32", out_dtype = "f32", cold = "int8", masked_row = "nan" }',
        "variants.toml:",
        "masked_row='nan' is not one of",
    ),
    (
        'params = { q_dtype = "f32", out_dtype = "f32", cold = "int8" }',
        'params = { q_dtype = "f32", out_dtype = "f32", cold = "int8", hot_ring = true }',
        "variants.toml:",
        "unknown parameter 'hot_ring'",
    ),
]


@pytest.mark.parametrize(("old", "new", "where", "message"), BAD_TIERED)
def test_bad_tiered_parameters_are_rejected(
    project_copy: Path, old: str, new: str, where: str, message: str
) -> None:
    before = snapshot(project_copy / "generated")
    edit(project_copy / "variants.toml", old, new)
    result = run_process(project_copy, "generate")
    assert result.returncode == 2
    line = assert_one_line_error(result.stderr)
    assert where in line and message in line, line
    assert snapshot(project_copy / "generated") == before


def test_list_and_show_cover_the_tiered_variants() -> None:
    listing = run_cli(REPO_ROOT, "list")
    assert listing.exit_code == 0
    for name in TIERED:
        assert name in listing.output
    shown = run_cli(REPO_ROOT, "show", "attention_decode_tiered_int4_f16kv", "--raw")
    assert (
        shown.output
        == (REPO_ROOT / "generated/attention_decode_tiered_int4_f16kv.wgsl").read_text()
    )


def test_list_counts_storage_buffers_against_webgpu_defaults() -> None:
    """The quantized split kernels' partials pass binds 9 storage buffers, one over WebGPU's
    default maxStorageBuffersPerShaderStage: list called them within the defaults on their
    workgroup storage and invocations alone (the reduce pass is what exceeded them)."""
    rows = {r["name"]: r for r in json.loads(run_cli(REPO_ROOT, "list", "--json").stdout)}
    for name in (
        "attention_decode_tiered_split_int8_f16kv",
        "attention_decode_tiered_split_int4_f16kv",
    ):
        assert "partials: 9 storage buffers > 8" in rows[name]["over_webgpu_defaults"]
        assert not rows[name]["fits_webgpu_defaults"]
    assert not any(
        "storage buffers" in o
        for o in rows["attention_decode_tiered_split_f16"]["over_webgpu_defaults"]
    )
    assert rows["attention_decode_tiered_int4_f16kv"]["over_webgpu_defaults"] == []
    assert rows["attention_decode_tiered_int4_f16kv"]["fits_webgpu_defaults"]


@pytest.mark.gpu
@pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
def test_the_zero_contract_is_a_template_parameter_the_validator_holds_it_to(
    project_copy: Path,
) -> None:
    """A tiered variant generated with masked_row = "zero" passes against the zero contract,
    and the default ("mean_v") kernel fails when held to it: the contract is real."""
    with (project_copy / "variants.toml").open("a") as config:
        config.write(
            '\n[[variant]]\nname = "tiered_zero"\ntemplate = "attention_decode_tiered"\n'
            'output = "generated/tiered_zero.wgsl"\nrequires = ["shader-f16"]\n'
            'params = { q_dtype = "f32", out_dtype = "f32", masked_row = "zero" }\n'
        )
    project = load_project(project_copy)
    write(plan(project))
    assert (
        'masked_row = "zero": no unmasked key'
        in (project_copy / "generated/tiered_zero.wgsl").read_text()
    )
    run = validate(project, ("tiered_zero", "attention_decode_tiered_f16kv"))
    assert [v.status for v in run.variants] == ["PASS", "PASS"], [v.reason for v in run.variants]
    # hold the mean_v kernel to the zero contract: its fully masked rows must now fail
    kernel = Renderer(project).render(
        project.variant("attention_decode_tiered_f16kv"), with_origins=True
    )
    entry = variant_entry(kernel, parse_kernel(kernel))
    entry["metadata"]["masked_row"] = "zero"
    device = open_run_device(get_backend("wgpu"), [kernel], None, "adapter")
    try:
        runner = KernelRunner(device, kernel, entry)
        spec = CaseSpec(
            "fully masked row",
            cold_len=0,
            hot_len=5,
            hot_start=20,
            hot_window=8,
            start_pos=3,
            head_dim=16,
            seed=7,
        )
        assert not runner.run_case(spec).passed
    finally:
        device.close()


LONG_COLD = CaseSpec(
    "long cold tier, GQA 4, head_dim 128",
    num_heads=4,
    num_kv_heads=1,
    cold_len=5000,
    hot_len=100,
    hot_start=5000,
    hot_window=128,
    start_pos=5099,
    head_dim=128,
    seed=3,
)
RAGGED = CaseSpec(
    "head_dim 13, window",
    num_heads=3,
    num_kv_heads=1,
    cold_len=77,
    hot_len=5,
    hot_start=80,
    hot_window=8,
    start_pos=84,
    sliding_window=40,
    head_dim=13,
    seed=5,
)


@pytest.mark.gpu
@pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
@pytest.mark.parametrize(
    "name", ["attention_decode_tiered_f16kv", "attention_decode_tiered_int4_f16kv_sg"]
)
def test_any_workgroup_size_up_to_the_maximum_runs_correctly(name: str) -> None:
    """WORKGROUP_SIZE only sets how many lane groups run side by side: narrow, non-power-of-two
    and the widest sizes give the reference result, on a cold tier far beyond 2048 keys."""
    project = load_project(REPO_ROOT)
    kernel = Renderer(project).render(project.variant(name), with_origins=True)
    entry = variant_entry(kernel, parse_kernel(kernel))
    device = open_run_device(get_backend("wgpu"), [kernel], None, "adapter")
    try:
        for size in (32, 96, 1024):
            runner = KernelRunner(device, kernel, entry, {"WORKGROUP_SIZE": size})
            for spec in (LONG_COLD, RAGGED):
                result = runner.run_case(spec)
                assert result.passed, (size, spec.name, result.refused, result.verdict)
    finally:
        device.close()


@pytest.mark.gpu
@pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
def test_the_workgroup_size_limits_are_refused_before_dispatch() -> None:
    """head_dim is split over at most WORKGROUP_SIZE lanes of DIMS_PER_LANE elements, and the
    exchange buffer holds MAX_WORKGROUP_SIZE lanes: beyond either, the case is refused."""
    project = load_project(REPO_ROOT)
    name = "attention_decode_tiered_int8_f16kv"
    kernel = Renderer(project).render(project.variant(name), with_origins=True)
    entry = variant_entry(kernel, parse_kernel(kernel))
    assert entry["constants"]["DIMS_PER_LANE"] == 8
    device = open_run_device(get_backend("wgpu"), [kernel], None, "adapter")
    try:
        wide = CaseSpec("d256", cold_len=3, hot_len=2, hot_window=2, start_pos=4, head_dim=256)
        assert KernelRunner(device, kernel, entry, {"WORKGROUP_SIZE": 32}).run_case(wide).passed
        narrow = KernelRunner(device, kernel, entry, {"WORKGROUP_SIZE": 16}).run_case(wide)
        assert narrow.refused and "head_dim 256 exceeds the kernel's maximum 128" in narrow.refused
        huge = KernelRunner(device, kernel, entry, {"WORKGROUP_SIZE": 2048}).run_case(wide)
        assert huge.refused and "exceeds the kernel's MAX_WORKGROUP_SIZE 1024" in huge.refused
    finally:
        device.close()
