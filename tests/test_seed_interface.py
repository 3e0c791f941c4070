"""The generated kernels present the seed kernels' interface; unit tests of doppler_gen.wgsl."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import SEEDS, SEEDS_MISSING

from doppler_gen.errors import InterfaceError
from doppler_gen.wgsl import Module, evaluate, parse_module, strip_comments


def seed(name: str) -> str:
    path = SEEDS / name
    if not path.is_file():
        pytest.skip(SEEDS_MISSING if not SEEDS.is_dir() else f"seed kernel {path} is absent")
    return path.read_text(encoding="utf-8")


def f32_from_f16kv_seed(text: str) -> str:
    """The f32 kernel's expected source: the f16-KV seed with K/V f16 -> f32 and no `enable f16`."""
    text, enables = re.subn(r"^\s*enable\s+f16\s*;\s*$", "", text, flags=re.M)
    assert enables == 1
    text, arrays = re.subn(r"(var<storage,\s*read>\s*[KV]\s*:\s*array<)f16>", r"\1f32>", text)
    assert arrays == 2
    return text


SEED_PAIRS = [
    ("attention_f16", lambda: seed("attention_f16.wgsl")),
    ("attention_f16kv", lambda: seed("attention_f16kv.wgsl")),
    ("attention", lambda: f32_from_f16kv_seed(seed("attention_f16kv.wgsl"))),
]


@pytest.mark.parametrize(("variant", "seed_text"), SEED_PAIRS, ids=[p[0] for p in SEED_PAIRS])
def test_generated_interface_equals_seed(pristine_project: Path, variant: str, seed_text) -> None:
    expected = parse_module(seed_text())
    generated = parse_module(
        (pristine_project / "generated" / f"{variant}.wgsl").read_text(encoding="utf-8")
    )
    assert generated.interface() == expected.interface()
    # beyond the host interface: the same tile constants and workgroup memory
    assert generated.constants == expected.constants
    assert generated.workgroup_storage_bytes == expected.workgroup_storage_bytes
    assert generated.enables == expected.enables


def test_interface_detects_a_difference() -> None:
    text = f32_from_f16kv_seed(seed("attention_f16kv.wgsl"))
    base = parse_module(text).interface()
    swapped = text.replace("@binding(5)", "@binding(9)", 1)
    assert parse_module(swapped).interface() != base
    reordered = text.replace("    kv_start: u32,", "", 1).replace(
        "    _pad: u32,", "    kv_start: u32,\n    _pad: u32,", 1
    )
    assert parse_module(reordered).interface() != base


# -- struct layout (WGSL memory layout rules) ------------------------------------------------------


def struct_layout(source: str, name: str) -> tuple[list[tuple[str, int, int]], int, int]:
    struct = parse_module(source).structs[name]
    return [(f.name, f.offset, f.size) for f in struct.fields], struct.size, struct.align


def test_vec3_is_aligned_to_16() -> None:
    fields, size, align = struct_layout("struct S { a: f32, b: vec3<f32>, c: f32 }", "S")
    assert fields == [("a", 0, 4), ("b", 16, 12), ("c", 28, 4)]
    assert (size, align) == (32, 16)
    fields, size, _ = struct_layout("struct T { a: vec3<f32>, b: f32 }", "T")
    assert fields == [("a", 0, 12), ("b", 12, 4)]  # a scalar fills the vec3's tail
    assert size == 16


def test_vec2_and_vec4_alignment() -> None:
    fields, size, align = struct_layout("struct S { a: f32, b: vec2<f32>, c: vec4<u32> }", "S")
    assert fields == [("a", 0, 4), ("b", 8, 8), ("c", 16, 16)]
    assert (size, align) == (32, 16)


def test_f16_fields() -> None:
    fields, size, align = struct_layout(
        "enable f16;\nstruct H { a: f16, b: f16, c: f32, d: f16, e: vec3<f16>, f: vec2<f16> }", "H"
    )
    assert fields == [
        ("a", 0, 2),
        ("b", 2, 2),
        ("c", 4, 4),
        ("d", 8, 2),
        ("e", 16, 6),
        ("f", 24, 4),
    ]
    assert (size, align) == (32, 8)
    fields, size, align = struct_layout("struct G { a: f16 }", "G")
    assert (size, align) == (2, 2)


def test_nested_struct() -> None:
    source = """
    struct Inner { x: vec3<f32> }
    struct Outer { a: f32, inner: Inner, b: f32, c: array<Inner, 2> }
    """
    assert struct_layout(source, "Inner")[1:] == (16, 16)
    fields, size, align = struct_layout(source, "Outer")
    assert fields == [("a", 0, 4), ("inner", 16, 16), ("b", 32, 4), ("c", 48, 32)]
    assert (size, align) == (80, 16)


def test_array_stride() -> None:
    source = """
    enable f16;
    struct A {
        a: array<vec3<f32>, 4>,
        b: array<f16, 3>,
        c: array<vec2<f16>, 3>,
        d: array<f32, 2>,
    }
    """
    fields, size, align = struct_layout(source, "A")
    # vec3<f32> has stride 16 in an array; f16 stride 2; vec2<f16> stride 4
    assert fields == [("a", 0, 64), ("b", 64, 6), ("c", 72, 12), ("d", 84, 8)]
    assert (size, align) == (96, 16)


def test_matrix_layout() -> None:
    source = "struct M { a: mat3x3<f32>, b: mat2x2<f32>, c: f32, d: mat4x2<f32> }"
    fields, size, align = struct_layout(source, "M")
    assert fields == [("a", 0, 48), ("b", 48, 16), ("c", 64, 4), ("d", 72, 32)]
    assert (size, align) == (112, 16)


def test_array_length_from_constants() -> None:
    module = parse_module(
        "const A: u32 = 4u;\nconst B: u32 = A * 2u;\nstruct S { x: array<f32, A * B>, y: u32 }"
    )
    assert module.constants == {"A": 4, "B": 8}
    assert [(f.name, f.offset) for f in module.structs["S"].fields] == [("x", 0), ("y", 128)]


# -- workgroup storage -----------------------------------------------------------------------------


def test_workgroup_storage_rounds_each_variable_to_16() -> None:
    module = parse_module(
        """
        enable f16;
        const N: u32 = 5u;
        var<workgroup> a: array<f16, 3>;   // 6 -> 16
        var<workgroup> b: f32;             // 4 -> 16
        var<workgroup> c: array<f32, N>;   // 20 -> 32
        var<workgroup> d: array<f32, 64>;  // 256
        var<private> p: array<f32, 1000>;  // not workgroup memory
        """
    )
    assert module.workgroup_storage_bytes == 16 + 16 + 32 + 256


def test_workgroup_storage_of_a_tiled_kernel() -> None:
    module = parse_module(
        "const MAX_BLOCK_SIZE: u32 = 64u;\nconst MAX_HEAD_TILE: u32 = 64u;\n"
        "override BLOCK_SIZE: u32 = 32u;\n"
        "var<workgroup> shared_K: array<f32, MAX_BLOCK_SIZE * MAX_HEAD_TILE>;\n"
        "var<workgroup> shared_scores: array<f32, MAX_BLOCK_SIZE * MAX_BLOCK_SIZE>;\n"
    )
    assert module.workgroup_storage_bytes == 4 * (64 * 64 + 64 * 64)
    assert module.overrides["BLOCK_SIZE"].default == 32


# -- const-expression evaluation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("64u", 64),
        ("0x10u", 16),
        ("(64u + 1) * 2 - 3 % 2", 129),
        ("7 / 2", 3),
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("20 - 4 - 3", 13),
        ("64 / 4 / 2", 8),
        ("-(3 + 4)", -7),
        ("--5", 5),
        ("1.5 * 2.0", 3.0),
        ("1e3", 1000.0),
        ("0.5f", 0.5),
        (".25", 0.25),
        ("-3.402823e+38", -3.402823e38),
        ("true", True),
        ("A * B + 1", 33),
        # WGSL integer division and remainder truncate toward zero
        ("-7 / 2", -3),
        ("-7 % 2", -1),
        ("7 % -2", 1),
        ("-7.5 % 2.0", -1.5),
    ],
)
def test_evaluate(expr: str, value: float) -> None:
    result = evaluate(expr, {"A": 4, "B": 8})
    assert result == value
    assert type(result) is type(value)


@pytest.mark.parametrize(
    "expr", ["NOPE + 1", "(1 + 2", "1 +", "1 $ 2", "", "1 2", "1 / 0", "4u % 0u", "1.0 / 0.0"]
)
def test_evaluate_rejects(expr: str) -> None:
    with pytest.raises(InterfaceError):
        evaluate(expr, {})


def test_override_default_from_expression() -> None:
    module = parse_module("const T: u32 = 16u;\noverride WG: u32 = T * 4u;\noverride F = 1.5;")
    assert module.overrides["WG"].default == 64
    assert module.overrides["F"].type == "f32"


# -- comment stripping -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "stripped"),
    [
        ("a /* x /* y */ z */ b", "a  b"),
        ("a /* 1\n2\n */ b", "a \n\n b"),
        ("x // c\ny", "x \ny"),
        ("/* // */ y", " y"),
        ("x // /* not a block\ny", "x \ny"),
        ("a /* b \n c", "a \n"),
        ("a */ b", "a */ b"),
        ("/*/ still a comment */ k", " k"),
        ("a /* /* */ still */ b // end", "a  b "),
        ("no comments\n", "no comments\n"),
        ("", ""),
    ],
)
def test_strip_comments(source: str, stripped: str) -> None:
    assert strip_comments(source) == stripped
    assert strip_comments(source).count("\n") == source.count("\n")


def test_commented_out_declarations_are_ignored() -> None:
    module = parse_module(
        """
        /* @group(0) @binding(0) var<uniform> u: U;
           /* nested */ @group(0) @binding(1) var<storage, read> X: array<f32>;
        */
        // @group(0) @binding(2) var<storage, read> Y: array<f32>;
        @group(0) @binding(3) var<storage, read_write> Z: array<u32>;
        """
    )
    assert [(b.binding, b.name, b.access) for b in module.bindings] == [(3, "Z", "read_write")]


def test_error_line_numbers_survive_comment_stripping() -> None:
    with pytest.raises(InterfaceError, match="line 4"):
        parse_module("/* one\ntwo\n*/\nconst X: u32 = 1u")


def test_interface_shape() -> None:
    module: Module = parse_module(
        """
        struct U { n: u32, s: f32 }
        override WG: u32 = 64u;
        @group(0) @binding(1) var<storage, read> Q: array<f32>;
        @group(0) @binding(0) var<uniform> u: U;
        @compute @workgroup_size(WG, 1, 1) fn main() { let x = u.n; }
        """
    )
    interface = module.interface()
    assert interface["bindings"] == [
        (0, 0, "uniform", "read", "U", "u"),
        (0, 1, "storage", "read", "array<f32>", "Q"),
    ]
    assert interface["uniforms"] == [("n", "u32", 0), ("s", "f32", 4)]
    assert interface["overrides"] == [("WG", "u32", 64)]
    assert interface["entry_point"] == "main"
    assert module.workgroup_size_values() == (64, 1, 1)
    assert module.workgroup_size_values({"WG": 128}) == (128, 1, 1)
