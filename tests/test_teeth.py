"""The validator has teeth: every planted semantic bug makes `validate` fail.

Each mutation edits one line of a copy of the templates (the shared macros or a family
template), regenerates, and validates the variants whose code the line reaches. A mutation that
no longer applies (its text is gone from the template) fails the test too, so this file cannot
silently decay into testing nothing. The unmutated copy must pass, otherwise every "caught" bug
below would prove nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import copy_project
from gpu_support import adapter_problem

from doppler_gen.config import load_project
from doppler_gen.outputs import plan, write
from doppler_gen.validate import validate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(adapter_problem() is not None, reason=str(adapter_problem())),
]

COMMON = "templates/lib/attention_common.wgsl.j2"
COLD = "templates/lib/cold_tier.wgsl.j2"
TILED = "templates/attention.wgsl.j2"
TIERED = "templates/attention_decode_tiered.wgsl.j2"
DECODE = "templates/lib/attention_decode.wgsl.j2"
SPLIT_REDUCE = "templates/attention_decode_split_reduce.wgsl.j2"
RMSNORM = "templates/rmsnorm.wgsl.j2"
TIERED_LIB = "templates/lib/tiered_decode.wgsl.j2"

SMALL = "attention_small_f16kv"  # the tiled variant inside lavapipe's limits
SG = "attention_decode_sg_d64_f16kv"  # one-dispatch decode, subgroup reductions
WG = "attention_decode_wg_d64"  # one-dispatch decode, workgroup-memory reductions

# (id, file, original text, planted text, variants that must fail)
MUTATIONS = [
    (
        "causal-off-by-one",
        COMMON,
        "{{ abs_key }} > {{ abs_query }}) { return true; }",
        "{{ abs_key }} >= {{ abs_query }}) { return true; }",
        [SMALL],
    ),
    (
        "tiered-causal-bound-off-by-one",
        COMMON,
        "if (u.is_causal != 0u) { last = {{ abs_query }}; }",
        "if (u.is_causal != 0u) { last = {{ abs_query }} - 1u; }",
        ["attention_decode_tiered_int8_f16kv"],
    ),
    (
        "softcap-dropped",
        COMMON,
        "{{ score }} = {{ capped(score) }};",
        "{{ score }} = {{ score }};",
        [SMALL, "attention_decode_tiered_f16kv"],
    ),
    (
        "gqa-mapping-wrong",
        COMMON,
        "return query_head_idx / heads_per_kv;",
        "return query_head_idx % u.num_kv_heads;",
        [SMALL, "attention_decode_tiered_f16", SG],
    ),
    (
        "page-table-ignored",
        COMMON,
        "let phys_page = {{ table }}[page_idx];",
        "let phys_page = page_idx;",
        [SMALL, "attention_decode_tiered_f16kv", WG],
    ),
    (
        "ring-modulo-dropped",
        COMMON,
        "{{ abs }} % {{ window }}",
        "{{ abs }}",
        [SMALL, "attention_decode_tiered_int4_f16kv"],
    ),
    (
        "window-off-by-one",
        COMMON,
        "{{ abs_query }} - u.sliding_window + 1u)",
        "{{ abs_query }} - u.sliding_window)",
        [SMALL],
    ),
    (
        "tiered-window-bound-off-by-one",
        COMMON,
        "first = {{ abs_query }} - u.sliding_window + 1u;",
        "first = {{ abs_query }} - u.sliding_window;",
        ["attention_decode_tiered_f16"],
    ),
    (
        "int8-sign-extension-dropped",
        COLD,
        "let lo = packed_val ^ {{",
        "let lo = packed_val;\n    let sign_flip_dropped = {{",
        ["attention_decode_tiered_int8_f16kv", "attention_decode_tiered_int4_f16kv"],
    ),
    (
        # the seed's `if (q >= 128)` as `q > 128`: only the most negative code decodes wrong
        "most-negative-code-decoded-positive",
        COLD,
        '    return fma(bitcast<vec4<f32>>(bits), vec4<f32>({{ ns.factor | join(", ") }}), '
        'vec4<f32>({{ ns.offset | join(", ") }}));',
        '    let r = fma(bitcast<vec4<f32>>(bits), vec4<f32>({{ ns.factor | join(", ") }}), '
        'vec4<f32>({{ ns.offset | join(", ") }}));\n'
        "    return select(r, -r, r == vec4<f32>({{ -(2 ** (bits - 1)) }}.0));",
        ["attention_decode_tiered_int8_f16kv", "attention_decode_tiered_int4_f16kv"],
    ),
    (
        # a fully masked row then averages V over the hot keys only
        "tiered-cold-loop-skips-keys-before-the-window",
        TIERED_LIB,
        '("0u", "u.cold_len")',
        '("min(open_first, u.cold_len)", "u.cold_len")',
        ["attention_decode_tiered_f16kv", "attention_decode_tiered_int8_f16kv"],
    ),
    (
        # cold keys taken to be always in the past
        "tiered-causal-mask-skipped-for-cold-keys",
        TIERED_LIB,
        "let open{{ s }} = abs{{ s }} >= open_first && abs{{ s }} <= open_last;",
        "let open{{ s }} = abs{{ s }} >= open_first && "
        '{{ "true" if tier == "cold" else "abs%d <= open_last" % s }};',
        ["attention_decode_tiered_f16kv", "attention_decode_tiered_int4_f16kv"],
    ),
    (
        "int4-lane-position-wrong",
        COLD,
        "{% set p = (i * bits) % 16 %}",
        "{% set p = (i * 8) % 16 %}",
        ["attention_decode_tiered_int4_f16kv"],
    ),
    (
        "output-conversion-wrong",
        COMMON,
        '{% if dtype == "f32" %}{{ value }}{% else %}{{ dtype }}({{ value }}){% endif %}',
        '{% if dtype == "f32" %}{{ value }}{% else %}{{ dtype }}(f32({{ dtype }}({{ value }})) * 0.999){% endif %}',
        ["attention_f16", "attention_decode_tiered_f16"],
    ),
    (
        "kv-start-ignored",
        TILED,
        "fn get_kv_pos(key_pos: u32) -> u32 {\n    let abs_key = u.kv_start + key_pos;",
        "fn get_kv_pos(key_pos: u32) -> u32 {\n    let abs_key = key_pos;",
        [SMALL],
    ),
    ("kv-len-buffer-ignored", TILED, "return kv_len_buffer[0];", "return u.seq_len;", [SMALL]),
    (
        "online-softmax-rescale-dropped",
        TILED,
        "acc[d] = acc[d] * correction;",
        "acc[d] = acc[d];",
        [SMALL],
    ),
    (
        "last-query-not-written",
        TILED,
        "    if (valid_query) {\n        let out_offset",
        "    if (valid_query && query_pos + 1u < query_len) {\n        let out_offset",
        [SMALL],
    ),
    (
        "decode-key-range-causal-off-by-one",
        DECODE,
        "min(kv_len, abs_query - u.kv_start + 1u)",
        "min(kv_len, abs_query - u.kv_start)",
        [SG, WG],
    ),
    (
        "decode-window-start-off-by-one",
        DECODE,
        "let first = abs_query - u.sliding_window + 1u;",
        "let first = abs_query - u.sliding_window + 2u;",
        [SG],
    ),
    (
        "decode-shuffle-step-dropped",
        DECODE,
        "{% for mask in [1, 2, 4, 8, 16] if mask < lanes_per_key %}",
        "{% for mask in [1, 2, 4, 8, 16] if mask < lanes_per_key and mask != 2 %}",
        [SG],
    ),
    (
        "decode-partial-dots-one-lane",
        DECODE,
        "for (var i: u32 = 0u; i < LANES_PER_KEY; i = i + 1u) {",
        "for (var i: u32 = 0u; i < 1u; i = i + 1u) {",
        [WG],
    ),
    (
        "decode-online-rescale-dropped",
        DECODE,
        "acc{{ hs[h] }}[j] = acc{{ hs[h] }}[j] * correction{{ hs[h] }}{% for",
        "acc{{ hs[h] }}[j] = acc{{ hs[h] }}[j]{% for",
        [WG, "attention_decode_split_d64_f16kv"],
    ),
    (
        "decode-merge-rescale-dropped",
        DECODE,
        "let scaled = acc[j] * rescale;",
        "let scaled = acc[j];",
        [SG],
    ),
    (
        "split-reduce-weight-dropped",
        SPLIT_REDUCE,
        "a_p = a_p * keep + dot(weight, a4);",
        "a_p = a_p * keep + dot(select(vec4<f32>(0.0), vec4<f32>(1.0), real), a4);",
        ["attention_decode_split_d64_f16kv"],
    ),
    (
        "hot-start-ignored",
        TIERED,
        'return {{ common.ring_row("u.hot_start", "u.hot_window") }};',
        "return 0u;",
        ["attention_decode_tiered_f16kv"],
    ),
    (
        "tiered-split-chunk-offset-dropped",
        TIERED,
        "let first_head = (rest / chunks_per_kv) * group + first_in_group;",
        "let first_head = (rest / chunks_per_kv) * group;",
        ["attention_decode_tiered_split_int8_f16kv"],
    ),
    (
        "tiered-split-heads-share-one-q",
        TIERED_LIB,
        "let q_base{{ sfx }} = {{ head }}{{ sfx }} * head_dim + dim0;",
        "let q_base{{ sfx }} = {{ head }}{{ hs[0] }} * head_dim + dim0;",
        ["attention_decode_tiered_split_f16"],
    ),
    (
        "masked-score-not-applied",
        TIERED,
        "    return select(MASKED_SCORE, s, open);",
        "    return s;",
        ["attention_decode_tiered_int8_f16kv"],
    ),
    (
        "rmsnorm-eps-dropped",
        RMSNORM,
        "partial_sums[0] / f32(u.size) + u.eps",
        "partial_sums[0] / f32(u.size)",
        ["rmsnorm", "rmsnorm_f16"],
    ),
    (
        "rmsnorm-mean-over-size-minus-one",
        RMSNORM,
        "partial_sums[0] / f32(u.size) + u.eps",
        "partial_sums[0] / f32(max(u.size, 2u) - 1u) + u.eps",
        ["rmsnorm", "rmsnorm_f16"],
    ),
    (
        "rmsnorm-weight-ignored",
        RMSNORM,
        "* inv_rms * f32(weight[i]);",
        "* inv_rms;",
        ["rmsnorm", "rmsnorm_f16"],
    ),
    (
        "rmsnorm-reduction-drops-a-half",
        RMSNORM,
        "for (var stride = WORKGROUP_SIZE / 2u;",
        "for (var stride = WORKGROUP_SIZE / 4u;",
        ["rmsnorm"],
    ),
]


# Bugs that appear only past a size: the quick tier (small feature cases) passes every one of
# them, the default tier (size cases from ``doppler_gen.tiers``) must fail each.
TIERED_INT8 = "attention_decode_tiered_int8_f16kv"
SIZE_MUTATIONS = [
    (
        "head-index-aliases-above-32-heads",
        TILED,
        "let q_offset = query_pos * u.num_heads * head_dim + head_idx * head_dim;",
        "let q_offset = query_pos * u.num_heads * head_dim + (head_idx % 32u) * head_dim;",
        [SMALL],
    ),
    (
        "tiered-head-index-aliases-above-32-heads",
        TIERED_LIB,
        "let q_base{{ sfx }} = {{ head }}{{ sfx }} * head_dim + dim0;",
        "let q_base{{ sfx }} = ({{ head }}{{ sfx }} % 32u) * head_dim + dim0;",
        [TIERED_INT8],
    ),
    (
        "keys-beyond-1024-ignored",
        TILED,
        "let num_kv_blocks = (seq_len + BLOCK_SIZE - 1u) / BLOCK_SIZE;",
        "let num_kv_blocks = min((seq_len + BLOCK_SIZE - 1u) / BLOCK_SIZE, 1024u / BLOCK_SIZE);",
        [SMALL],
    ),
    (
        "queries-beyond-256-never-written",
        TILED,
        "let valid_query = query_pos < query_len;",
        "let valid_query = query_pos < min(query_len, 256u);",
        [SMALL],
    ),
    (
        "kv-start-beyond-4095-dropped",
        TILED,
        "fn get_kv_pos(key_pos: u32) -> u32 {\n    let abs_key = u.kv_start + key_pos;",
        "fn get_kv_pos(key_pos: u32) -> u32 {\n    let abs_key = (u.kv_start & 4095u) + key_pos;",
        [SMALL],
    ),
    (
        "start-pos-beyond-4095-dropped",
        TILED,
        "let abs_query = query_pos + u.start_pos;",
        "let abs_query = query_pos + (u.start_pos & 4095u);",
        [SMALL],
    ),
    (
        "tiered-start-pos-beyond-4095-dropped",
        TIERED,
        'common.open_bounds("u.start_pos")',
        'common.open_bounds("(u.start_pos & 4095u)")',
        [TIERED_INT8],
    ),
    (
        "tiered-hot-start-beyond-4095-dropped-in-mask",
        TIERED,
        '"u.hot_start + ", "get_hot_pos"',  # the absolute key position the mask sees
        '"(u.hot_start & 4095u) + ", "get_hot_pos"',
        ["attention_decode_tiered_f16kv"],
    ),
    (
        "gqa-head-map-shifts-instead-of-dividing",  # right only for power-of-two groups
        "templates/lib/attention_common.wgsl.j2",
        "    return query_head_idx / heads_per_kv;",
        "    return query_head_idx >> firstTrailingBit(heads_per_kv);",
        [SMALL, "attention_decode_tiered_f16kv"],
    ),
    (
        "nan-for-kv-lengths-1500-to-3000",
        TILED,
        "let inv_l_i = select(0.0, 1.0 / l_i, l_i > 0.0);",
        "let inv_l_i = select(select(0.0, 1.0 / l_i, l_i > 0.0), sqrt(-1.0 - l_i), "
        "seq_len >= 1500u && seq_len < 3000u);",
        [SMALL],
    ),
]


def _validate(root: Path, names: list[str], *, quick: bool = False, fail_fast: bool = False):
    """Regenerate the copy, then validate it (the default tier unless ``quick``)."""
    project = load_project(root)
    write(plan(project))
    return validate(project, tuple(names), storage_overrun=True, quick=quick, fail_fast=fail_fast)


def _plant(root: Path, file: str, original: str, planted: str) -> None:
    path = root / file
    text = path.read_text()
    assert text.count(original) >= 1, f"mutation no longer applies to {file}: {original!r}"
    path.write_text(text.replace(original, planted))


def test_unmutated_templates_pass(tmp_path: Path) -> None:
    names = sorted({n for *_, variants in MUTATIONS + SIZE_MUTATIONS for n in variants})
    run = _validate(copy_project(tmp_path / "clean"), names)
    assert run.ok, [(v.name, v.status, v.reason) for v in run.variants]
    assert all(v.status == "PASS" and v.cases for v in run.variants)


@pytest.mark.parametrize(
    ("file", "original", "planted", "variants"),
    [m[1:] for m in MUTATIONS],
    ids=[m[0] for m in MUTATIONS],
)
def test_planted_bug_fails_validation(
    tmp_path: Path, file: str, original: str, planted: str, variants: list[str]
) -> None:
    root = copy_project(tmp_path / "mutant")
    _plant(root, file, original, planted)
    run = _validate(root, variants, fail_fast=True)  # the default tier, up to the first failure
    statuses = {v.name: (v.status, v.reason) for v in run.variants}
    assert not run.ok
    for name in variants:
        assert statuses[name][0] == "FAIL", f"{name} did not catch the bug: {statuses[name]}"


@pytest.mark.parametrize(
    ("file", "original", "planted", "variants"),
    [m[1:] for m in SIZE_MUTATIONS],
    ids=[m[0] for m in SIZE_MUTATIONS],
)
def test_size_only_bug_passes_quick_and_fails_the_default_tier(
    tmp_path: Path, file: str, original: str, planted: str, variants: list[str]
) -> None:
    root = copy_project(tmp_path / "mutant")
    _plant(root, file, original, planted)
    quick = _validate(root, variants, quick=True)
    assert quick.ok, "not a size-only bug: the quick tier already catches it " + str(
        [(v.name, v.reason) for v in quick.variants]
    )
    run = validate(load_project(root), tuple(variants), storage_overrun=True, fail_fast=True)
    statuses = {v.name: (v.status, v.reason) for v in run.variants}
    for name in variants:
        assert statuses[name][0] == "FAIL", f"{name} did not catch the bug: {statuses[name]}"


def test_at_least_eight_distinct_bugs() -> None:
    assert len({m[0] for m in MUTATIONS}) >= 8
    assert len({m[0] for m in SIZE_MUTATIONS}) >= 5
