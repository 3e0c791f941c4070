"""generated/manifest.json agrees with the WGSL it describes and with the seed JS host.

The WGSL is re-read here with a deliberately minimal, independent regex extraction (not
doppler_gen.wgsl), so a bug in the generator's parser cannot hide behind itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from conftest import SEEDS, SEEDS_MISSING

SCALAR_SIZES = {"f32": 4, "u32": 4, "i32": 4, "f16": 2}
JS_TYPES = {"Uint32": "u32", "Float32": "f32", "Int32": "i32"}
TILED_UNIFORM_OFFSETS = list(range(0, 60, 4))  # 15 four-byte fields, 0..56
TILED_UNIFORM_BUFFER = 64


# -- independent minimal WGSL extraction ---------------------------------------------------------

_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(r"//[^\n]*")
_BINDING = re.compile(
    r"@group\(\s*(\d+)\s*\)\s*@binding\(\s*(\d+)\s*\)\s*"
    r"var<\s*(\w+)\s*(?:,\s*(\w+)\s*)?>\s*(\w+)\s*:\s*([^;]+?)\s*;"
)
_STRUCT = re.compile(r"\bstruct\s+(\w+)\s*\{([^}]*)\}")
_FIELD = re.compile(r"(\w+)\s*:\s*([A-Za-z_]\w*(?:<[^>]*>)?)")
_OVERRIDE = re.compile(r"^\s*override\s+(\w+)\s*:\s*(\w+)\s*=\s*([^;]+?)\s*;", re.M)
_CONST = re.compile(r"^\s*const\s+(\w+)\s*:\s*(\w+)\s*=\s*([^;]+?)\s*;", re.M)
_WORKGROUP_VAR = re.compile(r"^\s*var<\s*workgroup\s*>\s*(\w+)\s*:\s*([^;]+?)\s*;", re.M)
_ENTRY = re.compile(r"@compute\s*@workgroup_size\(([^)]*)\)\s*fn\s+(\w+)")


def strip(text: str) -> str:
    return _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", text))


def literal(text: str) -> int | float:
    text = text.strip()
    if re.fullmatch(r"\d+[ui]?", text):
        return int(text.rstrip("ui"))
    if re.fullmatch(r"-?\d+\.\d*(e[+-]?\d+)?f?|-?\d+e[+-]?\d+f?", text):
        return float(text.rstrip("f"))
    raise AssertionError(f"the test's minimal extractor reads literals only, not {text!r}")


def product(expr: str, names: dict[str, int | float]) -> int:
    """``A * B * 4u``: all this extractor needs for array lengths."""
    value = 1
    for factor in expr.split("*"):
        factor = factor.strip()
        value *= names[factor] if factor in names else literal(factor)
    return int(value)


def extract(text: str) -> dict[str, Any]:
    code = strip(text)
    bindings = []
    for group, binding, space, access, name, wgsl_type in _BINDING.findall(code):
        # the scalar the host fills: array<vec4<f16>> is filled with f16 like array<f16>
        element = re.fullmatch(r"array<\s*(?:vec[234]<\s*(\w+)\s*>|(\w+))\s*>", wgsl_type)
        bindings.append(
            {
                "group": int(group),
                "binding": int(binding),
                "address_space": space,
                "access": access or "read",
                "name": name,
                "type": re.sub(r"\s+", "", wgsl_type),
                "element_type": (element.group(1) or element.group(2)) if element else None,
            }
        )
    structs = {name: _FIELD.findall(body) for name, body in _STRUCT.findall(code)}
    constants = {name: literal(value) for name, _, value in _CONST.findall(code)}
    overrides = {
        name: (wgsl_type, literal(value)) for name, wgsl_type, value in _OVERRIDE.findall(code)
    }
    names = {**constants, **{name: value for name, (_, value) in overrides.items()}}
    storage = 0
    for var_name, wgsl_type in _WORKGROUP_VAR.findall(code):
        if len(re.findall(rf"\b{var_name}\b", code)) < 2:
            continue  # declared, never used: WebGPU counts only what the entry point uses
        array = re.fullmatch(r"array<\s*(?:vec([24])<\s*(\w+)\s*>|(\w+))\s*,\s*([^>]+)>", wgsl_type)
        atomic = re.fullmatch(r"atomic<\s*(\w+)\s*>", wgsl_type)
        if array:
            lanes, vector_scalar, scalar, count = array.groups()
            element = SCALAR_SIZES[vector_scalar or scalar] * int(lanes or 1)
            size = element * product(count, names)
        else:
            size = SCALAR_SIZES[atomic.group(1) if atomic else wgsl_type]
        storage += -(-size // 16) * 16
    entry = _ENTRY.search(code)
    return {
        "enables": re.findall(r"^\s*enable\s+(\w+)\s*;", code, re.M),
        "bindings": sorted(bindings, key=lambda b: (b["group"], b["binding"])),
        "structs": structs,
        "constants": constants,
        "overrides": overrides,
        "workgroup_storage_bytes": storage,
        "entry_point": entry.group(2) if entry else None,
        "workgroup_size": [part.strip() for part in entry.group(1).split(",")] if entry else [],
    }


def scalar_layout(fields: list[tuple[str, str]]) -> tuple[list[int], int]:
    """Offsets and size of a struct of 4-byte scalars (what the uniform structs hold)."""
    offsets = []
    for index, (name, wgsl_type) in enumerate(fields):
        assert wgsl_type in ("u32", "f32", "i32"), (
            f"uniform field {name}: {wgsl_type} is not a 4-byte scalar"
        )
        offsets.append(4 * index)
    return offsets, 4 * len(fields)


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifest_text(pristine_project: Path) -> str:
    return (pristine_project / "generated/manifest.json").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def manifest(manifest_text: str) -> dict[str, Any]:
    return json.loads(manifest_text)


@pytest.fixture(scope="module")
def variants_toml(pristine_project: Path) -> dict[str, Any]:
    return tomllib.loads((pristine_project / "variants.toml").read_text(encoding="utf-8"))


def per_file(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One entry per generated file: a single-pass variant's entry as it is, and for each pass of
    a multi-pass variant the variant's keys overlaid with that pass's (file, bindings, uniforms,
    overrides, constants, entry point, workgroup size and storage), keyed "NAME.PASS"."""
    files = {}
    for name, entry in manifest["variants"].items():
        if len(entry["passes"]) == 1:
            files[name] = entry
            continue
        for record in entry["passes"]:
            files[f"{name}.{record['name']}"] = {**entry, **record, "variant": name}
    return files


@pytest.fixture(scope="module")
def files(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return per_file(manifest)


@pytest.fixture(scope="module")
def extracted(
    pristine_project: Path, files: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    return {
        name: extract((pristine_project / entry["file"]).read_text(encoding="utf-8"))
        for name, entry in files.items()
    }


def js_uniform_writers() -> dict[str, tuple[int, list[tuple[int, str]]]]:
    """function name -> (buffer size, [(offset, wgsl scalar type)]) for every uniform writer in
    the seed host, from its `createUniformBufferWithView(LABEL, SIZE, ...)` and
    `view.setUint32(OFFSET, ...)` / `view.setFloat32(OFFSET, ...)` lines."""
    path = SEEDS / "attention.js"
    if not path.is_file():
        pytest.skip(SEEDS_MISSING)
    source = path.read_text(encoding="utf-8")
    writers = {}
    for match in re.finditer(r"^function\s+(\w+)\s*\(", source, re.M):
        body = source[match.end() : source.find("\n}\n", match.end())]
        size = re.search(r"createUniformBufferWithView\(\s*'[^']*',\s*(\d+)", body)
        if size is None:
            continue
        sets = [
            (int(o), JS_TYPES[t])
            for t, o in re.findall(r"view\.set(Uint32|Float32|Int32)\(\s*(\d+)\s*,", body)
        ]
        writers[match.group(1)] = (int(size.group(1)), sets)
    return writers


# -- the manifest matches the WGSL -----------------------------------------------------------------


def test_manifest_lists_every_variant(
    manifest: dict[str, Any], variants_toml: dict[str, Any]
) -> None:
    assert manifest["generator"] == "doppler-gen"
    expected = {entry["name"]: entry for entry in variants_toml["variant"]}
    assert set(manifest["variants"]) == set(expected)
    for name, entry in manifest["variants"].items():
        stem = expected[name]["output"].removesuffix(".wgsl")
        wanted = (
            [expected[name]["output"]]
            if len(entry["passes"]) == 1
            else [f"{stem}.{p['name']}.wgsl" for p in entry["passes"]]
        )
        assert [p["file"] for p in entry["passes"]] == wanted, name
        assert entry["template_name"] == expected[name]["template"]
        assert entry["requires"] == sorted(expected[name].get("requires", []))
        for param, value in expected[name].get("params", {}).items():
            assert entry["params"][param] == value, (name, param)


def test_bindings(files: dict[str, dict[str, Any]], extracted: dict[str, dict[str, Any]]) -> None:
    outputs = {}
    for name, entry in files.items():
        ours = extracted[name]["bindings"]
        theirs = [
            {k: v for k, v in b.items() if k != "role"} | {"type": re.sub(r"\s+", "", b["type"])}
            for b in entry["bindings"]
        ]
        assert theirs == ours, name
        roles = {b["name"]: b["role"] for b in entry["bindings"]}
        variant = entry.get("variant", name)
        outputs[variant] = outputs.get(variant, 0) + (roles.get("output") == "output")
        if entry["family"] in ("tiled", "tiered") and "Q" in roles:
            assert roles["Q"] == "input", name
        assert {r for n, r in roles.items() if n == "u"} == {"uniform"}, name
        if "variant" not in entry:
            assert entry["passes"][0]["bindings"] == entry["bindings"], name
        assert len({(b["group"], b["binding"]) for b in ours}) == len(ours), (
            f"{name}: binding reused"
        )
    assert set(outputs.values()) == {1}  # exactly one pass of each variant writes the output


def test_uniform_struct(
    files: dict[str, dict[str, Any]], extracted: dict[str, dict[str, Any]]
) -> None:
    for name, entry in files.items():
        uniform = [b for b in extracted[name]["bindings"] if b["address_space"] == "uniform"]
        assert len(uniform) == 1, name
        struct_name = uniform[0]["type"]
        fields = extracted[name]["structs"][struct_name]
        layout = entry["uniforms"]
        assert layout["struct"] == struct_name
        assert [(f["name"], f["type"]) for f in layout["fields"]] == fields, name
        offsets, size = scalar_layout(fields)
        assert [f["offset"] for f in layout["fields"]] == offsets, name
        assert layout["size"] == size
        assert layout["buffer_size"] == -(-size // 16) * 16
        assert layout["buffer_size"] % 16 == 0


def test_overrides_and_constants(
    files: dict[str, dict[str, Any]], extracted: dict[str, dict[str, Any]]
) -> None:
    for name, entry in files.items():
        ours = extracted[name]
        assert {o["name"]: (o["type"], o["default"]) for o in entry["overrides"]} == ours[
            "overrides"
        ], name
        assert [o["name"] for o in entry["overrides"]] == sorted(ours["overrides"])
        assert entry["constants"] == ours["constants"], name


def test_entry_point_and_features(
    manifest: dict[str, Any], files: dict[str, dict[str, Any]], extracted: dict[str, dict[str, Any]]
) -> None:
    enables: dict[str, set[str]] = {}
    for name, entry in files.items():
        ours = extracted[name]
        enables.setdefault(entry.get("variant", name), set()).update(ours["enables"])
        assert entry["entry_point"] == ours["entry_point"] == "main"
        assert entry["workgroup_size"] == ours["workgroup_size"]
        names = {**ours["constants"], **{k: v for k, (_, v) in ours["overrides"].items()}}
        assert entry["workgroup_size_default"] == [
            product(p, names) for p in ours["workgroup_size"]
        ]
        assert entry["metadata"]["requires"] == entry["requires"]
    for name, entry in manifest["variants"].items():  # a feature any pass enables
        assert ("f16" in enables[name]) == ("shader-f16" in entry["requires"]), name
        assert ("subgroups" in enables[name]) == ("subgroups" in entry["requires"]), name


def _all_bindings(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for record in entry["passes"] for b in record["bindings"]]


def test_dtypes_match_bindings(manifest: dict[str, Any]) -> None:
    roles = {"tiled": ("Q", "K", "output"), "tiered": ("Q", "K_hot", "output")}
    rmsnorm = [e for e in manifest["variants"].values() if e["family"] == "rmsnorm"]
    assert len(rmsnorm) == 2
    for entry in rmsnorm:
        element = {b["name"]: b["element_type"] for b in entry["bindings"]}
        assert element["input"] == element["weight"] == element["output"]
        assert element["output"] == entry["metadata"]["dtype"]
    for entry in manifest["variants"].values():
        if entry["family"] == "rmsnorm":
            continue
        q, kv, out = roles[entry["family"]]
        element = {b["name"]: b["element_type"] for b in _all_bindings(entry)}
        meta = entry["metadata"]
        assert (element[q], element[kv], element[out]) == (
            meta["q_dtype"],
            meta["kv_dtype"],
            meta["out_dtype"],
        )


def test_sha256_matches_file(pristine_project: Path, files: dict[str, dict[str, Any]]) -> None:
    for name, entry in files.items():
        data = (pristine_project / entry["file"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest(), name


def test_workgroup_storage(
    manifest: dict[str, Any], files: dict[str, dict[str, Any]], extracted: dict[str, dict[str, Any]]
) -> None:
    tiles_64 = []
    for name, entry in files.items():
        assert entry["workgroup_storage_bytes"] == extracted[name]["workgroup_storage_bytes"], name
    for name, entry in manifest["variants"].items():
        # a variant needs the largest of its passes
        largest = max(p["workgroup_storage_bytes"] for p in entry["passes"])
        assert entry["workgroup_storage_bytes"] == largest, name
        params = entry["params"]
        if entry["template_name"] == "attention":
            block, tile = params["block_size"], params["head_tile"]
            # shared_K and shared_V: block x head_tile f32; shared_scores: block x block f32
            assert entry["workgroup_storage_bytes"] == 4 * (2 * block * tile + block * block), name
            if block == tile == 64:
                tiles_64.append(name)
                assert entry["workgroup_storage_bytes"] == 49152, name
    assert "attention" in tiles_64 and "attention_f16" in tiles_64


def test_tiled_uniforms_fixed_layout(files: dict[str, dict[str, Any]]) -> None:
    tiled = {n: e for n, e in files.items() if e["family"] == "tiled"}
    assert tiled
    for name, entry in tiled.items():
        assert [f["offset"] for f in entry["uniforms"]["fields"]] == TILED_UNIFORM_OFFSETS, name
        assert entry["uniforms"]["buffer_size"] == TILED_UNIFORM_BUFFER, name


def test_tiled_uniforms_match_seed_host(manifest: dict[str, Any]) -> None:
    writers = js_uniform_writers()
    assert "createAttentionUniformBuffer" in writers
    size, sets = writers["createAttentionUniformBuffer"]
    assert [offset for offset, _ in sets] == TILED_UNIFORM_OFFSETS
    assert size == TILED_UNIFORM_BUFFER
    for name, entry in per_file(manifest).items():  # every pass binds the same struct
        if entry["family"] != "tiled":
            continue
        fields = entry["uniforms"]["fields"]
        assert [(f["offset"], f["type"]) for f in fields] == sets, name
        assert entry["uniforms"]["buffer_size"] == size, name


# which seed host function writes which variant's uniforms
TIERED_WRITERS = {
    "f16": "createTieredAttentionUniformBuffer",
    "int8": "createTieredQuantAttentionUniformBuffer",
    "int4": "createTieredQuantAttentionUniformBuffer",
}


def test_tiered_uniforms_match_seed_host(manifest: dict[str, Any]) -> None:
    # every pass of a split variant binds the same struct
    tiered = {n: e for n, e in per_file(manifest).items() if e["family"] == "tiered"}
    if not tiered:
        pytest.skip("no tiered variants declared")
    assert any("." in name for name in tiered), "no multi-pass tiered variant checked"
    writers = js_uniform_writers()
    for name, entry in tiered.items():
        function = TIERED_WRITERS.get(entry["params"].get("cold"))
        assert function in writers, (
            f"{name}: no seed host writer known for cold={entry['params'].get('cold')}"
        )
        size, sets = writers[function]
        assert [(f["offset"], f["type"]) for f in entry["uniforms"]["fields"]] == sets, (
            name,
            function,
        )
        assert entry["uniforms"]["buffer_size"] == size, (name, function)


# -- determinism -----------------------------------------------------------------------------------


def _keys_sorted(value: Any) -> bool:
    if isinstance(value, dict):
        return list(value) == sorted(value) and all(_keys_sorted(v) for v in value.values())
    if isinstance(value, list):
        return all(_keys_sorted(v) for v in value)
    return True


def test_manifest_is_deterministic(manifest_text: str, manifest: dict[str, Any]) -> None:
    assert _keys_sorted(manifest)
    assert (
        manifest_text == json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    )
    for entry in per_file(manifest).values():
        assert [(b["group"], b["binding"]) for b in entry["bindings"]] == sorted(
            (b["group"], b["binding"]) for b in entry["bindings"]
        )


# -- layering --------------------------------------------------------------------------------------

COMMAND_MODULES = ("validate", "bench", "tune", "listing", "doctor", "export")


def test_no_command_module_imports_another() -> None:
    """The package reads as the pipeline: commands sit on config/render/runtime, never on each
    other (shared pieces such as the text table live in their own modules)."""
    import ast

    source = Path(__file__).resolve().parents[1] / "src" / "doppler_gen"
    for name in COMMAND_MODULES:
        tree = ast.parse((source / f"{name}.py").read_text())
        imported = {
            node.module.removeprefix("doppler_gen.")
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        }
        others = imported & (set(COMMAND_MODULES) - {name})
        assert not others, f"{name}.py imports command module(s) {sorted(others)}"


def test_subgroup_builtins_are_found_in_code_not_in_comments_or_names() -> None:
    """What needs `enable subgroups;` in Tint: calls and builtin values, not look-alike names."""
    from doppler_gen.wgsl import parse_module

    source = """
// subgroupAdd(x) in a comment
/* quadSwapX(x) */
fn f(subgroup_size: u32) -> u32 { let subgroupish = subgroup_size; return subgroupish; }
@compute @workgroup_size(32)
fn main(@builtin( subgroup_invocation_id ) lane: u32) {
    let a = subgroupShuffleXor (1.0, 1u);
    let b = subgroupExclusiveAdd(a);
    let c = quadSwapDiagonal(b);
}
"""
    found = parse_module(source).subgroup_builtins
    assert found == {
        "subgroup_invocation_id",
        "subgroupShuffleXor",
        "subgroupExclusiveAdd",
        "quadSwapDiagonal",
    }
    assert parse_module("fn g(subgroup_size: u32) {}").subgroup_builtins == frozenset()
    # a function of the module's own with a builtin's name: naga and Tint compile it as is
    own = "fn subgroupAdd(x: f32) -> f32 { return x; }\nfn h() { let y = subgroupAdd(1.0); }"
    assert parse_module(own).subgroup_builtins == frozenset()
