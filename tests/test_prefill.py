"""The prefill family (templates/attention_prefill.wgsl.j2, templates/attention_streaming.wgsl.j2).

The new kernels keep the seed tiled interface (a host binds them exactly like `attention`), each
tier fits the limits it is named after, the seed-named variants stay byte-identical, bad tile
parameters are refused at generate time, and planted bugs in the new templates fail validation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import (
    REPO_ROOT,
    assert_one_line_error,
    edit,
    render_variant,
    run_process,
    snapshot,
)
from gpu_support import adapter_problem, dawn_problem, open_run_device

from doppler_gen.backends import get_backend
from doppler_gen.config import load_project
from doppler_gen.families.attention import CaseSpec
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.outputs import plan, write
from doppler_gen.runtime.runner import KernelRunner
from doppler_gen.validate import validate
from doppler_gen.wgsl import Module, parse_module

PREFILL = "templates/attention_prefill.wgsl.j2"
STREAMING = "templates/attention_streaming.wgsl.j2"
LIB = "templates/lib/attention_prefill.wgsl.j2"
WEBGPU_DEFAULT_STORAGE = 16384
WEBGPU_DEFAULT_INVOCATIONS = 256


def _variants(prefix: str) -> list[str]:
    return [v.name for v in load_project(REPO_ROOT).variants if v.name.startswith(prefix)]


PREFILL_VARIANTS = _variants("attention_prefill_") + _variants("attention_streaming")


def _module(name: str) -> Module:
    return parse_module((REPO_ROOT / "generated" / f"{name}.wgsl").read_text(encoding="utf-8"))


def _host_view(module: Module) -> tuple:
    """What the host binds: every binding (slot, access, the element type it fills the buffer
    with: array<vec4<f16>> is filled like array<f16>) and the uniform struct."""
    bindings = tuple(
        (b.group, b.binding, b.name, b.address_space, b.access, b.type.kind, b.element_type)
        for b in module.bindings
    )
    return bindings, module.structs["Uniforms"].fields


def test_there_are_twenty_nine_prefill_variants() -> None:
    tiers = {"large": 12, "small": 8}  # each with its subgroup twins of the f16 variants
    for tier, count in tiers.items():
        assert len(_variants(f"attention_prefill_{tier}_")) == count
    assert len(_variants("attention_streaming")) == 9
    assert len(_variants("attention_streaming_sg")) == 6


@pytest.mark.parametrize("name", PREFILL_VARIANTS)
def test_prefill_variants_keep_the_seed_tiled_interface(name: str) -> None:
    seed = {"f32": "attention", "f16": "attention_f16"}
    module = _module(name)
    q_type = next(b for b in module.bindings if b.name == "Q").element_type
    kv_type = next(b for b in module.bindings if b.name == "K").element_type
    reference = _module(seed[q_type] if q_type == kv_type else "attention_f16kv")
    assert _host_view(module) == _host_view(reference)
    assert module.entry_point == "main"
    # K/V read as vec4s (head_dim a multiple of 4) exactly where the variant says kv_vec4
    widths = {b.name: b.vector_width for b in module.bindings}
    expected = 4 if load_project(REPO_ROOT).variant(name).params.get("kv_vec4") else 1
    assert widths["K"] == widths["V"] == expected and widths["Q"] == widths["output"] == 1


@pytest.mark.parametrize("name", PREFILL_VARIANTS)
def test_each_tier_fits_its_limits(name: str) -> None:
    module = _module(name)
    invocations = module.workgroup_size_values()[0]
    storage = module.workgroup_storage_bytes
    entry = load_project(REPO_ROOT).variant(name)
    if "_small_" in name:
        assert storage <= WEBGPU_DEFAULT_STORAGE and invocations <= WEBGPU_DEFAULT_INVOCATIONS
    elif "_large_" in name:
        assert storage <= 49152  # the H200's maximum
    else:
        assert storage == 0 and entry.template.dispatch == "query_len * num_heads"
    if "streaming" not in name:
        assert entry.template.dispatch == "ceil(query_len / BLOCK_Q) * num_heads"
        assert "BLOCK_Q" in module.overrides
    assert module.constants["MAX_HEAD_DIM"] == entry.metadata["max_head_dim"]


def test_seed_named_variants_are_byte_identical_to_the_seed_template() -> None:
    """The faster kernels are new names beside the seed ones; the seed template is untouched."""
    for name in ("attention", "attention_f16", "attention_f16kv"):
        text = (REPO_ROOT / "generated" / f"{name}.wgsl").read_text(encoding="utf-8")
        assert "templates/attention.wgsl.j2" in text.splitlines()[0]
        assert "BLOCK_SIZE" in text and "BLOCK_Q" not in text


BAD = [
    (
        "attention_prefill_small_d64_f16",
        'q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", storage_budget = 16384, block_q = 128',
        "workgroup storage; the tier allows 16384 B",
    ),
    (
        "attention_prefill_large_d64",
        'p_dtype = "f16"',
        "p_dtype f16 is only for f16-output variants",
    ),
    (
        "attention_prefill_large_d64",
        "block_q = 64, tile_q = 3",
        "must be a positive multiple of tile_q",
    ),
    (
        "attention_streaming_sg_d128_f16",
        'q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", workgroup_size = 48',
        "needs a power-of-two workgroup_size",
    ),
    (
        # head_dim 48 in 4 key columns: tile rows of 12 vec4s, which an XOR cannot permute
        "attention_prefill_large_d64",
        "max_head_dim = 48, block_q = 64, block_k = 32, tile_q = 4, workgroup_size = 64, "
        'tile_layout = "swizzled"',
        'tile_layout "swizzled" needs tile rows of a power-of-two number of vec4s',
    ),
]


@pytest.mark.parametrize(("name", "params", "message"), BAD)
def test_bad_tile_parameters_are_refused_at_the_template_line(
    project_copy: Path, name: str, params: str, message: str
) -> None:
    config = project_copy / "variants.toml"
    text = config.read_text(encoding="utf-8")
    start = text.index(f'name = "{name}"\n')
    line_start = text.index("params = {", start)
    line_end = text.index("\n", line_start)
    config.write_text(text[:line_start] + f"params = {{ {params} }}" + text[line_end:])
    before = snapshot(project_copy / "generated")
    result = run_process(project_copy, "generate")
    assert result.returncode == 2
    line = assert_one_line_error(result.stderr)
    template = STREAMING if "streaming" in name else PREFILL
    assert template in line and message in line, line
    assert snapshot(project_copy / "generated") == before


# (id, file, original text, planted text, variant that must fail)
MUTATIONS = [
    (
        "online-rescale-dropped",
        PREFILL,
        "acc[{{ i * td4 + j }}] = acc[{{ i * td4 + j }}] * correction;",
        "acc[{{ i * td4 + j }}] = acc[{{ i * td4 + j }}];",
        "attention_prefill_small_d64_f16kv",
    ),
    (
        "edge-tiles-not-masked",
        LIB,
        "    if (k0 + BLOCK_K > kv_len) {\n        return true;",
        "    if (k0 + BLOCK_K > kv_len) {\n        return false;",
        "attention_prefill_small_d64_f16kv",
    ),
    (
        "window-start-off-by-one",
        LIB,
        "let lowest = first_abs - u.sliding_window + 1u;",
        "let lowest = first_abs - u.sliding_window;",
        "attention_streaming_f16kv",
    ),
    (
        "heavy-first-block-wrong",
        PREFILL,
        "let q0 = (blocks - 1u - block) * BLOCK_Q;",
        "let q0 = (blocks - 1u - block / 2u) * BLOCK_Q;",
        # 32-query blocks: the quick matrix's longest queries span several of them (with
        # small_d64_f16kv's 64-query blocks they fit one, and the planted bug cannot show)
        "attention_prefill_small_d64",
    ),
]


@pytest.mark.gpu
@pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
@pytest.mark.parametrize(
    ("file", "old", "new", "variant"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_planted_bugs_in_the_prefill_templates_fail_validation(
    project_copy: Path, file: str, old: str, new: str, variant: str
) -> None:
    edit(project_copy / file, old, new)
    project = load_project(project_copy)
    write(plan(project))
    run = validate(project, (variant,), quick=True)
    assert [v.status for v in run.variants] == ["FAIL"], [v.reason for v in run.variants]


@pytest.mark.gpu
@pytest.mark.skipif(
    (adapter_problem() or dawn_problem()) is not None,
    reason=str(adapter_problem() or dawn_problem()),
)
def test_webgpu_default_tiers_compile_and_pass_on_tint() -> None:
    """Tint is stricter than naga (uniformity, operator precedence): the tiers meant for any
    browser must pass there, within WebGPU's default limits."""
    project = load_project(REPO_ROOT)
    names = ("attention_prefill_small_d64_f16kv", "attention_streaming_f16kv")
    run = validate(project, names, backend_name="dawn", limits="webgpu-default", quick=True)
    assert [v.status for v in run.variants] == ["PASS", "PASS"], [v.reason for v in run.variants]


ALTERNATE_PATHS = [
    # prefetch: K/V loads through registers, a ragged last register (544 elements, 128 lanes)
    ('kv_dtype = "f16", block_q = 32, block_k = 32, tile_q = 4, prefetch = true',
     "var pre: array<vec4<f16>, 5>;"),
    # f32 tiles of f16 data, converted once at the load (plain and prefetched loads)
    ('q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", block_q = 32, block_k = 32, '
     'tile_q = 4, tile_dtype = "f32"', "var<workgroup> tile_kv: array<vec4<f32>, 544>;"),
    ('kv_dtype = "f16", block_q = 32, block_k = 32, tile_q = 4, tile_dtype = "f32", '
     "prefetch = true", "= vec4<f32>(pre[4]);"),
    # f16 pairs packed in u32 words, unpacked with unpack2x16float (plain and prefetched loads)
    ('q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", block_q = 32, block_k = 32, '
     'tile_q = 4, tile_dtype = "packed", p_dtype = "f16"',
     "var<workgroup> tile_kv: array<vec2<u32>, 544>;"),
    ('q_dtype = "f16", kv_dtype = "f16", block_q = 32, block_k = 32, tile_q = 4, '
     'tile_dtype = "packed", prefetch = true', "= pack4(pre[4]);"),
    # unpadded rows with XOR-swizzled columns: f16 tiles through the prefetch registers, and
    # f32 K/V tiles loaded straight from the buffers (large_sg_d64_f16's tiles)
    ('q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", block_q = 32, block_k = 32, '
     'tile_q = 4, p_dtype = "f16", tile_layout = "swizzled", prefetch = true',
     "tile_kv[(t + 3u * WORKGROUP_SIZE) ^ (((t + 3u * WORKGROUP_SIZE) / ROW4) & (ROW4 - 1u))] = pre[3];"),
    ('q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", block_q = 32, block_k = 32, '
     'tile_q = 4, p_dtype = "f16", tile_layout = "swizzled", tile_dtype = "kv_f32"',
     "var<workgroup> tile_kv: array<vec4<f32>, 512>;"),
    # K and V bound as vec4s (one load a vec4; head_dim a multiple of 4), prefetched
    ('kv_dtype = "f16", block_q = 32, block_k = 32, tile_q = 4, kv_vec4 = true, prefetch = true',
     "    return K[base / 4u + d4];"),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
@pytest.mark.parametrize(("params", "marker"), ALTERNATE_PATHS)
def test_tunable_code_paths_pass_validation(project_copy: Path, params: str, marker: str) -> None:
    """`prefetch`, `tile_dtype`, `tile_layout` and `kv_vec4` are tunables: other code paths for
    the K/V loads and tiles than the committed variants use, validated here so `tune` starts
    from correct kernels."""
    with (project_copy / "variants.toml").open("a") as config:
        config.write(
            '\n[[variant]]\nname = "prefill_alt"\ntemplate = "attention_prefill"\n'
            'output = "generated/prefill_alt.wgsl"\nrequires = ["shader-f16"]\n'
            f"params = {{ {params}, workgroup_size = 128 }}\n"
        )
    project = load_project(project_copy)
    write(plan(project))
    assert marker in (project_copy / "generated/prefill_alt.wgsl").read_text(encoding="utf-8")
    run = validate(project, ("prefill_alt",))
    assert [v.status for v in run.variants] == ["PASS"], [v.reason for v in run.variants]


ODD_CASES = [
    CaseSpec("head_dim 6, GQA 2", num_heads=4, num_kv_heads=2, query_len=37, kv_len=50,
             start_pos=13, head_dim=6, seed=1),
    CaseSpec("head_dim 10, window 9", num_heads=2, num_kv_heads=1, query_len=70, kv_len=70,
             sliding_window=9, head_dim=10, seed=2),
    CaseSpec("head_dim 62, paged (3-row pages)", query_len=40, kv_len=90, start_pos=50,
             kv_layout="paged", page_size=3, head_dim=62, seed=4),
    CaseSpec("window past kv_start", query_len=20, kv_len=20, kv_start=100, start_pos=110,
             sliding_window=5, head_dim=8, seed=6),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem()))
def test_head_dims_that_are_not_multiples_of_4() -> None:
    """The matrix's head_dims are all multiples of 4; the vec4 tiles must also handle the rest
    (the tail reads as zeros, is never stored) on each template's code path. The tiled kernel
    loads K/V element by element for that (`kv_vec4 = false`; the shipped variants bind them
    as vec4s and take head_dims that are multiples of 4)."""
    kernels = [
        render_variant(REPO_ROOT, "attention_prefill_small_d64_f16kv", {"kv_vec4": False})[0],
        render_variant(REPO_ROOT, "attention_streaming")[0],
    ]
    device = open_run_device(get_backend("wgpu"), kernels, None, "adapter")
    try:
        for kernel in kernels:
            runner = KernelRunner(device, kernel, variant_entry(kernel, parse_kernel(kernel)))
            for spec in ODD_CASES:
                assert runner.run_case(spec).passed, (kernel.variant.name, spec.name)
    finally:
        device.close()
