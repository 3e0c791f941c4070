"""generated/doppler/: the registry fragment and digests Doppler loads, `check`, and `export`.

Layouts are re-derived here from the WGSL with the minimal independent extractor of
test_manifest.py and from the byte offsets the seed JS host writes, never from doppler_gen.wgsl.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    REPO_ROOT,
    assert_one_line_error,
    edit,
    project_snapshot,
    run_cli,
    run_process,
    snapshot,
)
from test_manifest import extract, js_uniform_writers, scalar_layout

from doppler_gen.config import load_project
from doppler_gen.errors import InterfaceError
from doppler_gen.export import (
    content_digest,
    differences,
    digests_document,
    export_files,
    merge_bindings,
    registry_document,
)

GOLDEN = Path(__file__).resolve().parent / "golden" / "doppler"
UPDATE_GOLDEN = "DOPPLER_GEN_UPDATE_GOLDEN"
EXPORT_FILES = ("registry.json", "digests.json")
# which seed host function writes the uniforms of which registry operation
JS_WRITERS = {
    "attention": "createAttentionUniformBuffer",
    "attention_tiered": "createTieredAttentionUniformBuffer",
    "attention_tiered_quant": "createTieredQuantAttentionUniformBuffer",
}
# the declared placement of the seed host's variants (variants.toml), written out by hand
EXPECTED_IDS = {
    "attention": {
        "prefill": "attention.wgsl",
        "prefill_f16": "attention_f16.wgsl",
        "prefill_f16kv": "attention_f16kv.wgsl",
        "prefill_small_f16kv": "attention_small_f16kv.wgsl",
        "decode_small_f16kv": "attention_small_f16kv.wgsl",
    },
    "attention_tiered": {
        "decode_tiered_f16": "attention_decode_tiered_f16.wgsl",
        "decode_tiered_f16kv": "attention_decode_tiered_f16kv.wgsl",
    },
    "attention_tiered_quant": {
        "decode_tiered_int8_f16kv": "attention_decode_tiered_int8_f16kv.wgsl",
        "decode_tiered_int4_f16kv": "attention_decode_tiered_int4_f16kv.wgsl",
    },
}


@pytest.fixture(scope="module")
def exported(pristine_project: Path) -> dict[str, Any]:
    directory = pristine_project / "generated" / "doppler"
    return {name: json.loads((directory / name).read_text("utf-8")) for name in EXPORT_FILES}


@pytest.fixture(scope="module")
def entries(pristine_project: Path) -> dict[str, Any]:
    manifest = (pristine_project / "generated/manifest.json").read_text("utf-8")
    return json.loads(manifest)["variants"]


def resolved(registry: dict[str, Any]):
    """(operation, id, variant, bindings, uniforms) as Doppler's host resolves each entry."""
    for op, schema in sorted(registry["operations"].items()):
        for vid, variant in sorted(schema["variants"].items()):
            bindings = merge_bindings(schema["baseBindings"], variant.get("bindingsOverride"))
            uniforms = variant.get("uniformsOverride", schema["baseUniforms"])
            yield op, vid, variant, bindings, uniforms


def resolved_passes(registry: dict[str, Any]):
    """(operation, id, variant, pass, bindings, uniforms) for each pass the host dispatches: a
    single-pass variant is its own pass; a multi-pass one lists its passes, each with its
    bindings and uniforms."""
    for op, vid, variant, bindings, uniforms in resolved(registry):
        if "passes" not in variant:
            yield op, vid, variant, variant, bindings, uniforms
            continue
        for record in variant["passes"]:
            yield op, vid, variant, record, record["bindings"], record["uniforms"]


def kernel_files(variant: dict[str, Any]) -> str | tuple[str, ...]:
    """The generated file a registry entry points at, or its passes' files in order."""
    if "passes" in variant:
        return tuple(p["wgsl"] for p in variant["passes"])
    return variant["wgsl"]


# -- golden ----------------------------------------------------------------------------------------


def test_export_equals_the_golden_files(pristine_project: Path) -> None:
    """The committed golden export (tests/golden/doppler/) is what `generate` writes today.

    After an intended change to kernels or variants.toml, refresh it with
    DOPPLER_GEN_UPDATE_GOLDEN=1 pytest tests/test_export.py -k golden, and review the diff.
    """
    for name in EXPORT_FILES:
        actual = (pristine_project / "generated" / "doppler" / name).read_bytes()
        if os.environ.get(UPDATE_GOLDEN):
            GOLDEN.mkdir(parents=True, exist_ok=True)
            (GOLDEN / name).write_bytes(actual)
        assert actual == (GOLDEN / name).read_bytes(), (
            f"generated/doppler/{name} differs from tests/golden/doppler/{name}; if intended, "
            f"rerun with {UPDATE_GOLDEN}=1"
        )


def test_export_places_the_declared_ids(exported: dict[str, Any]) -> None:
    registry = exported["registry.json"]
    assert registry["generator"] == "doppler-gen"
    placed = {
        op: {vid: kernel_files(v) for vid, v in schema["variants"].items()}
        for op, schema in registry["operations"].items()
    }
    for operation, ids in EXPECTED_IDS.items():
        assert {vid: placed[operation].get(vid) for vid in ids} == ids, operation
    # every id variants.toml declares is placed at its variant's file, and nothing else is
    declared: dict[str, dict[str, str]] = {}
    not_exported = []
    for variant in load_project(REPO_ROOT).variants:
        if variant.doppler is None:  # the rmsnorm variants: no Doppler registry slot yet
            not_exported.append(variant.name)
            continue
        for vid in variant.doppler.ids:
            names = tuple(Path(o).name for o in variant.outputs)
            declared.setdefault(variant.doppler.operation, {})[vid] = (
                names if variant.template.multi_pass else names[0]
            )
    assert placed == declared
    assert registry["notExported"] == not_exported == ["rmsnorm", "rmsnorm_f16"]
    tiers = {vid: v["variantMetadata"].get("tier") for _, vid, v, _, _ in resolved(registry)}
    assert tiers["prefill"] == tiers["prefill_f16kv"] == "tiled_large"
    assert tiers["prefill_small_f16kv"] == tiers["decode_small_f16kv"] == "tiled_small"
    assert tiers["decode_tiered_int8_f16kv"] is None


def test_metadata_comes_from_the_manifest(exported: dict[str, Any], entries: dict) -> None:
    by_file = {Path(p["file"]).name: (e, p) for e in entries.values() for p in e["passes"]}
    for _, vid, variant, record, _, _ in resolved_passes(exported["registry.json"]):
        entry, manifest_pass = by_file[record["wgsl"]]
        meta = entry["metadata"]
        assert record["entryPoint"] == manifest_pass["entry_point"] == "main"
        # the default workgroup size, with the variant's pipeline constants applied
        constants = entry["pipeline_constants"]
        workgroup = [
            constants.get(expr, default)
            for expr, default in zip(
                manifest_pass["workgroup_size"],
                manifest_pass["workgroup_size_default"],
                strict=True,
            )
        ]
        assert record["workgroup"] == workgroup, vid
        if record is not variant:  # a pass of a multi-pass variant: its own storage
            assert record["requiredShared"] == manifest_pass["workgroup_storage_bytes"], vid
        assert variant["requires"] == entry["requires"]
        assert (variant["inputDtype"], variant["kvDtype"], variant["outputDtype"]) == (
            meta["q_dtype"],
            meta["kv_dtype"],
            meta["out_dtype"],
        )
        # each pass gets the constants it declares (a pass without one must not be given it:
        # createComputePipeline rejects an unknown override name)
        assert record["wgslOverrides"] == manifest_pass.get(
            "pipeline_constants", entry["pipeline_constants"]
        ), vid
        extra = variant["variantMetadata"]
        assert extra["maxHeadDim"] == meta["max_head_dim"]
        assert extra.get("maxKVLen") == meta["max_kv_len"]
        assert extra["requiredShared"] == entry["workgroup_storage_bytes"]
        block = re.match(r"ceil\(query_len / (\w+)\)", entry["passes"][0]["dispatch"])
        if block:  # e.g. ceil(query_len / BLOCK_SIZE) * num_heads: the override's default
            defaults = {o["name"]: o["default"] for o in entry["overrides"]}
            assert extra["queryBlockSize"] == defaults[block.group(1)], vid
        else:  # one workgroup per query, or per head
            assert "queryBlockSize" not in extra


# -- layouts: independent computation and the seed JS host -----------------------------------------


def test_layouts_match_an_independent_reading_of_the_wgsl(
    pristine_project: Path, exported: dict[str, Any]
) -> None:
    kinds = {("uniform", "read"): "uniform", ("storage", "read"): "read-only-storage"}
    kinds[("storage", "read_write")] = "storage"
    for _, vid, _, record, bindings, uniforms in resolved_passes(exported["registry.json"]):
        wgsl = extract((pristine_project / "generated" / record["wgsl"]).read_text("utf-8"))
        assert bindings == [
            {
                "index": b["binding"],
                "name": b["name"],
                "type": kinds[b["address_space"], b["access"]],
            }
            for b in wgsl["bindings"]
        ], vid
        struct = next(b["type"] for b in wgsl["bindings"] if b["address_space"] == "uniform")
        fields = wgsl["structs"][struct]
        offsets, size = scalar_layout(fields)
        assert [(f["name"], f["type"]) for f in uniforms["fields"]] == fields, vid
        assert [f["offset"] for f in uniforms["fields"]] == offsets, vid
        assert uniforms["size"] == -(-size // 16) * 16, vid


def test_layouts_match_the_bytes_the_seed_js_host_writes(exported: dict[str, Any]) -> None:
    writers = js_uniform_writers()
    seen = set()
    for op, vid, _, _, _, uniforms in resolved_passes(exported["registry.json"]):
        size, sets = writers[JS_WRITERS[op]]
        assert [(f["offset"], f["type"]) for f in uniforms["fields"]] == sets, (op, vid)
        assert uniforms["size"] == size, (op, vid)
        seen.add(op)
    assert seen == set(JS_WRITERS)
    assert {JS_WRITERS[op]: writers[JS_WRITERS[op]][0] for op in seen} == {
        "createAttentionUniformBuffer": 64,
        "createTieredAttentionUniformBuffer": 80,
        "createTieredQuantAttentionUniformBuffer": 64,
    }


# -- digests ---------------------------------------------------------------------------------------


def test_digest_of_a_tiny_source_is_the_hand_computed_one() -> None:
    # printf 'fn main() {}\n\n@@entry:main' | sha256sum
    expected = "d238d1e970ac91ce7e17ad07a473830cf529b26fc3c425d85479c8be8c39f4ce"
    assert content_digest("fn main() {}\n", "main") == expected
    assert content_digest("fn main() {}\r\n", "main") == expected  # CRLF counts as LF
    assert content_digest("fn main() {}\n", "other") != expected


def test_digest_of_a_generated_kernel(pristine_project: Path, exported: dict[str, Any]) -> None:
    data = (pristine_project / "generated/attention_f16kv.wgsl").read_bytes()
    expected = hashlib.sha256(data.replace(b"\r\n", b"\n") + b"\n@@entry:main").hexdigest()
    digests = exported["digests.json"]["digests"]
    assert digests["attention_f16kv.wgsl#main"] == expected
    files = {p["wgsl"] for _, _, _, p, _, _ in resolved_passes(exported["registry.json"])}
    assert set(digests) == {f"{name}#main" for name in files}
    for key, value in digests.items():
        kernel = (pristine_project / "generated" / key.split("#")[0]).read_bytes()
        assert value == hashlib.sha256(kernel + b"\n@@entry:main").hexdigest(), key


# -- determinism and generate/check ----------------------------------------------------------------


def test_export_is_deterministic(pristine_project: Path, entries: dict[str, Any]) -> None:
    sources = {
        p["file"]: (pristine_project / p["file"]).read_text("utf-8")
        for e in entries.values()
        for p in e["passes"]
    }
    first = export_files(entries, sources)
    shuffled = dict(reversed(list(entries.items())))
    assert export_files(shuffled, sources) == first
    for path, text in first.items():
        assert (pristine_project / path).read_text("utf-8") == text
        assert "\r" not in text and text.endswith("}\n") and not text.endswith("\n\n")
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_check_reports_stale_missing_and_orphaned_exports(fresh_project: Path) -> None:
    export = fresh_project / "generated" / "doppler"
    edit(export / "registry.json", '"size": 80', '"size": 64')
    (export / "digests.json").unlink()
    (export / "old.json").write_text('{"generator": "doppler-gen"}\n', encoding="utf-8")
    (export / "notes.json").write_text('{"mine": true}\n', encoding="utf-8")
    before = project_snapshot(fresh_project)
    result = run_cli(fresh_project, "check")
    assert project_snapshot(fresh_project) == before
    assert result.exit_code == 1, result.output
    assert "stale:    generated/doppler/registry.json\n" in result.stdout
    assert '\n-        "size": 64\n+        "size": 80\n' in result.stdout
    assert "missing:  generated/doppler/digests.json\n" in result.stdout
    assert "orphaned: generated/doppler/old.json (no variant produces it; not as" in result.stdout
    assert "notes.json" not in result.stdout  # not ours: never reported, never removed
    assert "out of date (3 file(s))" in result.stderr

    # the manifest records no sha256 for exports: an orphan there may be a hand-made copy
    refused = run_cli(fresh_project, "generate")
    assert refused.exit_code == 2, refused.output
    assert "generated/doppler/old.json" in assert_one_line_error(refused.stderr)
    assert project_snapshot(fresh_project) == before
    (export / "old.json").unlink()
    generated = run_cli(fresh_project, "generate")
    assert generated.exit_code == 0, generated.output
    assert (export / "notes.json").exists()
    assert run_cli(fresh_project, "check").exit_code == 0


def test_a_hidden_copy_of_the_registry_is_an_orphan_like_a_hidden_kernel(
    fresh_project: Path,
) -> None:
    """generated/.x.wgsl with the header is reported; generated/doppler/.registry.json saying
    doppler-gen wrote it once was not. Both are now orphans that `generate` refuses to delete."""
    export = fresh_project / "generated" / "doppler"
    hidden = export / ".registry.json"
    hidden.write_bytes((export / "registry.json").read_bytes())
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 1, result.output
    assert "orphaned: generated/doppler/.registry.json (no variant produces it" in result.stdout
    refused = run_cli(fresh_project, "generate")
    assert refused.exit_code == 2 and hidden.is_file()
    assert "generated/doppler/.registry.json" in assert_one_line_error(refused.stderr)


def test_a_hand_made_copy_of_the_registry_is_never_deleted(fresh_project: Path) -> None:
    export = fresh_project / "generated" / "doppler"
    backup = export / "registry.backup"
    shutil.copyfile(export / "registry.json", backup)  # says "generator": "doppler-gen" too
    before = project_snapshot(fresh_project)
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert "generated/doppler/registry.backup" in line and "move or delete" in line
    assert project_snapshot(fresh_project) == before


@pytest.mark.parametrize("command", ["generate", "check"])
def test_a_symlinked_export_directory_leading_out_of_the_project_is_refused(
    fresh_project: Path, tmp_path: Path, command: str
) -> None:
    outside = tmp_path / "elsewhere"
    shutil.move(fresh_project / "generated" / "doppler", outside)
    (outside / "theirs.json").write_text('{"generator": "doppler-gen"}\n', encoding="utf-8")
    (fresh_project / "generated" / "doppler").symlink_to(outside)
    before, theirs = project_snapshot(fresh_project), snapshot(outside)
    result = (
        run_cli(fresh_project, command, "--full")
        if command == "check"
        else (run_cli(fresh_project, command))
    )
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line.startswith("error: generated/doppler: resolves to ") and "outside" in line
    assert project_snapshot(fresh_project) == before and snapshot(outside) == theirs


def test_an_export_directory_that_is_a_file_is_one_line(fresh_project: Path) -> None:
    shutil.rmtree(fresh_project / "generated" / "doppler")
    (fresh_project / "generated" / "doppler").write_text("mine\n", encoding="utf-8")
    before = project_snapshot(fresh_project)
    for args in (("generate",), ("check", "--full")):
        result = run_cli(fresh_project, *args)
        assert result.exit_code == 2, result.output
        line = assert_one_line_error(result.stderr)
        assert line == "error: generated/doppler: exists but is not a directory (a regular file)"
    assert project_snapshot(fresh_project) == before


def test_a_variant_without_doppler_id_is_generated_but_listed_as_not_exported(
    fresh_project: Path,
) -> None:
    edit(
        fresh_project / "variants.toml",
        'doppler_id = "prefill_f16"\ndoppler_tier = "tiled_large"\n',
        "",
    )
    assert run_cli(fresh_project, "generate").exit_code == 0
    registry = json.loads((fresh_project / "generated/doppler/registry.json").read_text())
    not_exported = [n for n in registry["notExported"] if not n.startswith("attention_decode_")]
    assert not_exported == ["attention_f16", "rmsnorm", "rmsnorm_f16"]
    assert "prefill_f16" not in registry["operations"]["attention"]["variants"]
    digests = json.loads((fresh_project / "generated/doppler/digests.json").read_text())
    assert "attention_f16.wgsl#main" not in digests["digests"]
    listing = run_cli(fresh_project, "export")
    assert listing.exit_code == 0
    assert "not exported: attention_f16 (no doppler_id in variants.toml)\n" in listing.stdout
    assert "attention.prefill_f16kv: attention_f16kv.wgsl#main (tier tiled_large)\n" in (
        listing.stdout
    )


# -- variants.toml declarations are validated at load ----------------------------------------------

BAD_DECLARATIONS = [
    (
        "id-without-operation",
        ('doppler_operation = "attention_tiered"\n', ""),
        'doppler_id = "decode_tiered_f16"',
        "doppler_id needs a registry operation",
    ),
    (
        "unknown-tier",
        ('doppler_tier = "tiled_small"', 'doppler_tier = "tiled_smal"'),
        'doppler_tier = "tiled_smal"',
        "doppler_tier 'tiled_smal' is not one of tiled_large, tiled_small",
    ),
    (
        "duplicate-id",
        ('doppler_id = "prefill_f16"', 'doppler_id = "prefill"'),
        'doppler_id = "prefill"',
        "doppler_id 'prefill' of operation 'attention' is already declared by variant 'attention'",
    ),
    (
        "bad-id",
        ('doppler_id = "prefill_f16"', 'doppler_id = ["Prefill-F16"]'),
        'doppler_id = ["Prefill-F16"]',
        "doppler_id must be a name or a list of distinct names",
    ),
    (
        "operation-without-id",
        (
            'doppler_id = "decode_tiered_int4_f16kv"\n',
            "",
        ),
        'doppler_operation = "attention_tiered_quant"',
        "doppler_operation without doppler_id",
    ),
    (
        "bad-template-operation",
        ('doppler_operation = "attention"', "doppler_operation = 3"),
        "doppler_operation = 3",
        "doppler_operation must be a name",
    ),
]


@pytest.mark.parametrize(
    ("change", "needle", "message"),
    [c[1:] for c in BAD_DECLARATIONS],
    ids=[c[0] for c in BAD_DECLARATIONS],
)
def test_bad_doppler_declarations(
    fresh_project: Path, change: tuple[str, str], needle: str, message: str
) -> None:
    toml = fresh_project / "variants.toml"
    old, new = change
    edited_line = None  # the error names the needle's last line up to the edit
    if old == 'doppler_id = "decode_tiered_int4_f16kv"\n':  # the last occurrence: the int4 variant
        text = toml.read_text("utf-8")
        head, _, tail = text.rpartition(old)
        toml.write_text(head + new + tail, encoding="utf-8")
        edited_line = head.count("\n") + 1
    else:
        edit(toml, old, new)
    text = toml.read_text("utf-8")
    lines = [n for n, line in enumerate(text.splitlines(), 1) if needle in line]
    expected = max(n for n in lines if edited_line is None or n <= edited_line)
    before = snapshot(fresh_project / "generated")
    for command in ("generate", "check", "export"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2, (command, result.output)
        line = assert_one_line_error(result.stderr)
        assert message in line, line
        assert line.startswith(f"error: variants.toml:{expected}: "), line
    assert snapshot(fresh_project / "generated") == before


# -- export --check-against ------------------------------------------------------------------------


def checkout(pristine_project: Path, tmp_path: Path) -> Path:
    """A Doppler checkout's registry and digest table, equal to the export."""
    return Path(shutil.copytree(pristine_project / "generated" / "doppler", tmp_path / "doppler"))


def rewrite(path: Path, change) -> None:
    document = json.loads(path.read_text("utf-8"))
    change(document)
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")


def test_check_against_an_identical_checkout(pristine_project: Path, tmp_path: Path) -> None:
    directory = checkout(pristine_project, tmp_path)
    result = run_cli(pristine_project, "export", "--check-against", str(directory))
    assert result.exit_code == 0, result.output
    registry = json.loads((directory / "registry.json").read_text(encoding="utf-8"))
    count = sum(len(op["variants"]) for op in registry["operations"].values())
    assert result.stdout == f"{directory} matches the export ({count} variants)\n"


def test_check_against_lists_each_planted_difference_on_its_own_line(
    pristine_project: Path, tmp_path: Path
) -> None:
    directory = checkout(pristine_project, tmp_path)
    digest = json.loads((directory / "digests.json").read_text())["digests"]

    def plant(registry: dict[str, Any]) -> None:
        ops = registry["operations"]
        # a size mismatch: 64 B recorded for the tiered 80 B uniform buffer
        tiered = copy.deepcopy(ops["attention_tiered"]["baseUniforms"])
        tiered["size"] = 64
        ops["attention_tiered"]["variants"]["decode_tiered_f16kv"]["uniformsOverride"] = tiered
        # a renamed field: offset 12 called kv_len where the WGSL has seq_len
        tiled = copy.deepcopy(ops["attention"]["baseUniforms"])
        assert tiled["fields"][3]["name"] == "seq_len"
        tiled["fields"][3]["name"] = "kv_len"
        ops["attention"]["variants"]["prefill_f16kv"]["uniformsOverride"] = tiled
        # a missing variant
        del ops["attention"]["variants"]["decode_small_f16kv"]

    rewrite(directory / "registry.json", plant)
    rewrite(
        directory / "digests.json",
        lambda d: d["digests"].update({"attention_f16.wgsl#main": "0" * 64}),
    )
    result = run_cli(pristine_project, "export", "--check-against", str(directory))
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [
        "attention.decode_small_f16kv: missing from the registry",
        f"attention.prefill_f16: stale digest attention_f16.wgsl#main: table {'0' * 64}, "
        f"WGSL {digest['attention_f16.wgsl#main']}",
        "attention.prefill_f16kv: layout mismatch: uniforms field 3 (offset 12): registry names "
        'it "kv_len", WGSL "seq_len"',
        "attention_tiered.decode_tiered_f16kv: layout mismatch: uniforms size: registry 64, "
        "WGSL 80",
    ]
    assert result.stderr == f"4 difference(s) from {directory}\n"


def test_names_from_the_checkout_are_escaped_one_difference_a_line(
    pristine_project: Path, tmp_path: Path
) -> None:
    """An id or digest key read from the checkout was printed as it was: a newline in it split
    a difference over two lines (the second could read "DIR matches the export") and an escape
    sequence reached the terminal."""
    directory = checkout(pristine_project, tmp_path)
    forged = f"x\n{directory} matches the export (1 variants)\x1b[2K"
    rewrite(
        directory / "registry.json",
        lambda r: r["operations"]["attention"]["variants"].update(
            {forged: {"wgsl": "attention.wgsl", "entryPoint": "main"}}
        ),
    )
    rewrite(
        directory / "digests.json", lambda d: d["digests"].update({"attention.wgsl#\x1b[31m": "0"})
    )
    result = run_cli(pristine_project, "export", "--check-against", str(directory))
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("attention.x\\n") and "\x1b" not in result.stdout
    assert lines[1].startswith("attention.wgsl#\\x1b[31m: extra digest")
    assert result.stderr == f"2 difference(s) from {directory}\n"


def _entry(registry: dict[str, Any], vid: str) -> dict[str, Any]:
    return next(
        op["variants"][vid] for op in registry["operations"].values() if vid in op["variants"]
    )


# each edit gives a registry a host would run differently; each is one line of the report
KEYS_THE_EXPORT_DOES_NOT_WRITE_THERE = [
    (
        "a passes list on a one-kernel variant",
        lambda r: _entry(r, "prefill").update(passes=[{"wgsl": "attention.wgsl"}]),
        'attention.prefill: passes: registry [{"wgsl": "attention.wgsl"}], WGSL absent',
    ),
    (
        "a top-level kernel beside the passes",
        lambda r: _entry(r, "decode_split_d128_f16").update(
            wgsl="attention_decode_split_d128_f16.partials.wgsl"
        ),
        'attention.decode_split_d128_f16: wgsl: registry "attention_decode_split_d128_f16'
        '.partials.wgsl", WGSL absent',
    ),
    (
        "dispatchFold on a kernel that does not fold",
        lambda r: _entry(r, "prefill")["variantMetadata"].update(dispatchFold=True),
        "attention.prefill: variantMetadata: dispatchFold: registry true, WGSL absent",
    ),
    (
        "another pass encoding",
        lambda r: _entry(r, "decode_split_d64").update(passEncoding="compute-pass-each"),
        'attention.decode_split_d64: passEncoding: registry "compute-pass-each", WGSL '
        '"one-compute-pass"',
    ),
    (
        "a key the export writes elsewhere, in a pass",
        lambda r: _entry(r, "decode_split_d64")["passes"][1].update(dispatchFold=True),
        "attention.decode_split_d64: pass 1: dispatchFold: registry true, WGSL absent",
    ),
    (
        "another split count for the dispatch rule",
        lambda r: _entry(r, "decode_split_d64_f16")["constants"].update(KV_SPLITS=32),
        'attention.decode_split_d64_f16: constants: registry {"KV_SPLITS": 32}, WGSL '
        '{"KV_SPLITS": 64}',
    ),
    (
        # Python's True == 1 hid this; a host testing `dispatchFold === true` would not fold
        "dispatchFold 1 instead of true",
        lambda r: _entry(r, "prefill_streaming")["variantMetadata"].update(dispatchFold=1),
        "attention.prefill_streaming: variantMetadata.dispatchFold: registry 1, WGSL true",
    ),
    (
        # a JSON null was shown as "absent", the line contradicting itself
        "a null where the export has no key",
        lambda r: _entry(r, "decode_sg_d64")["variantMetadata"].update(minSubgroupSize=None),
        "attention.decode_sg_d64: variantMetadata: minSubgroupSize: registry null, WGSL absent",
    ),
    (
        "a null where the export has a value",
        lambda r: _entry(r, "decode_sg_d64")["variantMetadata"].update(maxHeadDim=None),
        "attention.decode_sg_d64: variantMetadata.maxHeadDim: registry null, WGSL 64",
    ),
    (
        "an unknown id whose passes are this project's kernels",
        lambda r: r["operations"]["attention"]["variants"].update(
            decode_other={"passes": [{"wgsl": "attention_decode_split_d64.partials.wgsl"}]}
        ),
        "attention.decode_other: extra: the registry points at "
        "attention_decode_split_d64.partials.wgsl, which doppler-gen generates, but no variant "
        "declares doppler_id 'decode_other' in 'attention'",
    ),
]


@pytest.mark.parametrize(
    ("change", "line"),
    [c[1:] for c in KEYS_THE_EXPORT_DOES_NOT_WRITE_THERE],
    ids=[c[0] for c in KEYS_THE_EXPORT_DOES_NOT_WRITE_THERE],
)
def test_check_against_reports_keys_that_change_how_a_host_runs_the_kernel(
    pristine_project: Path, tmp_path: Path, change, line: str
) -> None:
    directory = checkout(pristine_project, tmp_path)
    rewrite(directory / "registry.json", change)
    result = run_cli(pristine_project, "export", "--check-against", str(directory))
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines() == [line]


def test_a_multi_pass_variant_carries_its_dispatch_rules_and_their_constants(
    pristine_project: Path,
) -> None:
    """A host needs each pass's workgroup count and the scratch sizes: the rules, and the
    value of every name in them that is not a uniform field (the WGSL override defaults)."""
    registry = json.loads(
        (pristine_project / "generated/doppler/registry.json").read_text(encoding="utf-8")
    )
    manifest = json.loads(
        (pristine_project / "generated/manifest.json").read_text(encoding="utf-8")
    )["variants"]
    for vid, name in [
        ("decode_split_d64_f16", "attention_decode_split_d64_f16"),
        ("decode_split_long_d128_f16", "attention_decode_split_long_d128_f16"),
        ("decode_tiered_split_int4_f16kv", "attention_decode_tiered_split_int4_f16kv"),
    ]:
        exported = _entry(registry, vid)
        entry = manifest[name]
        assert [p["dispatch"] for p in exported["passes"]] == [
            p["dispatch"] for p in entry["passes"]
        ]
        defaults = {o["name"]: o["default"] for o in entry["passes"][0]["overrides"]}
        defaults.update(entry["passes"][0]["constants"])
        assert exported["constants"] == {k: defaults[k] for k in exported["constants"]}
        assert "KV_SPLITS" in exported["constants"]
    assert _entry(registry, "decode_split_d64_f16")["constants"] == {"KV_SPLITS": 64}
    assert _entry(registry, "decode_split_long_d128_f16")["constants"] == {"KV_SPLITS": 33}
    assert _entry(registry, "decode_tiered_split_int4_f16kv")["constants"] == {
        "HEADS_PER_WORKGROUP": 4,
        "KV_SPLITS": 33,
    }


def test_a_family_without_host_formulas_exports_its_dispatch_rule_and_dtypes(
    fresh_project: Path, tmp_path: Path
) -> None:
    """Doppler's host counts attention's workgroups by tier, so attention's one-kernel entries
    leave the rule out; for another family the rule is all a host has to count them with, and
    its dtypes come from its roles (the first input's and the output's element types)."""
    edit(
        fresh_project / "variants.toml",
        'name = "rmsnorm_f16"\n',
        'name = "rmsnorm_f16"\ndoppler_operation = "norms"\ndoppler_id = "rmsnorm_f16"\n',
    )
    assert run_cli(fresh_project, "generate").exit_code == 0
    registry = json.loads((fresh_project / "generated/doppler/registry.json").read_text())
    exported = registry["operations"]["norms"]["variants"]["rmsnorm_f16"]
    entry = json.loads((fresh_project / "generated/manifest.json").read_text())["variants"][
        "rmsnorm_f16"
    ]
    assert exported["dispatch"] == entry["passes"][0]["dispatch"] == "num_rows"
    assert exported["constants"] == {}  # num_rows is a uniform field
    assert (exported["inputDtype"], exported["outputDtype"]) == ("f16", "f16")
    assert "kvDtype" not in exported
    for operation in ("attention", "attention_tiered", "attention_tiered_quant"):
        for vid, variant in registry["operations"][operation]["variants"].items():
            if "passes" not in variant:
                assert "dispatch" not in variant, vid
                assert "constants" not in variant, vid
    # a checkout without the rule (or with another) differs where a host would count wrongly
    checkout = tmp_path / "doppler"
    shutil.copytree(fresh_project / "generated/doppler", checkout)
    theirs = copy.deepcopy(registry)
    del theirs["operations"]["norms"]["variants"]["rmsnorm_f16"]["dispatch"]
    (checkout / "registry.json").write_text(json.dumps(theirs), encoding="utf-8")
    result = run_cli(fresh_project, "export", "--check-against", str(checkout))
    assert result.exit_code == 1
    assert 'norms.rmsnorm_f16: dispatch: registry absent, WGSL "num_rows"' in result.output


def test_a_number_written_as_a_float_is_the_same_number(
    pristine_project: Path, tmp_path: Path
) -> None:
    """JSON (and a JS host) has one number type: 64.0 is 64, only true is not 1."""
    directory = checkout(pristine_project, tmp_path)
    rewrite(
        directory / "registry.json",
        lambda r: _entry(r, "decode_split_d64_f16")["constants"].update(KV_SPLITS=64.0),
    )
    result = run_cli(pristine_project, "export", "--check-against", str(directory))
    assert result.exit_code == 0, result.output


def test_a_huge_number_is_a_difference_not_a_crash(pristine_project: Path, tmp_path: Path) -> None:
    """Comparing numbers through float() raised OverflowError (exit 3) on a 400-digit one."""
    directory = checkout(pristine_project, tmp_path)
    rewrite(
        directory / "registry.json",
        lambda r: _entry(r, "decode_split_d64_f16")["constants"].update(KV_SPLITS=10**400),
    )
    result = run_cli(pristine_project, "export", "--check-against", str(directory))
    assert result.exit_code == 1, result.output
    assert "decode_split_d64_f16: constants: registry" in result.stdout


def test_a_digest_prefix_in_capitals_is_accepted(pristine_project: Path, tmp_path: Path) -> None:
    directory = checkout(pristine_project, tmp_path)
    digests = json.loads((directory / "digests.json").read_text())["digests"]
    flat = {k: f"SHA256:{v.upper()}" for k, v in digests.items()}
    (directory / "digests.json").write_text(json.dumps(flat), encoding="utf-8")
    result = run_cli(pristine_project, "export", "--check-against", str(directory))
    assert result.exit_code == 0, result.output


def test_check_against_upstream_style_drift(pristine_project: Path, tmp_path: Path) -> None:
    """A hand-typed registry as Doppler had it: flat digest table, shifted names, wrong sizes."""
    directory = checkout(pristine_project, tmp_path)
    digests = json.loads((directory / "digests.json").read_text())["digests"]
    flat = {k: f"sha256:{v}" for k, v in digests.items()}  # Doppler's table: a flat object
    flat["attention_f16kv.wgsl#other"] = "ab" * 32
    (directory / "digests.json").write_text(json.dumps(flat), encoding="utf-8")

    def drift(registry: dict[str, Any]) -> None:
        attention = registry["operations"]["attention"]
        attention["baseBindings"] = attention["baseBindings"][:5]  # kv_len, page_table dropped
        attention["variants"]["prefill"]["workgroup"] = [32, 1, 1]
        attention["variants"]["decode_f16kv"] = {"wgsl": "attention_f16kv.wgsl"}  # not declared
        attention["variants"]["decode_streaming"] = {"wgsl": "upstream_streaming.wgsl"}  # not ours
        quant = registry["operations"]["attention_tiered_quant"]["variants"]
        quant["decode_tiered_int4_f16kv"]["variantMetadata"].pop("maxKVLen")

    rewrite(directory / "registry.json", drift)
    result = run_cli(pristine_project, "export", "--check-against", str(directory))
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert "attention.prefill: workgroup: registry [32, 1, 1], WGSL [64, 1, 1]" in lines
    for vid in EXPECTED_IDS["attention"]:
        assert (
            f"attention.{vid}: layout mismatch: binding 5: missing from registry (WGSL "
            '{"index": 5, "name": "kv_len_buffer", "type": "read-only-storage"})'
        ) in lines
    assert (
        "attention_tiered_quant.decode_tiered_int4_f16kv: variantMetadata.maxKVLen: registry "
        "absent, WGSL 131072"
    ) in lines
    assert any(line.startswith("attention.decode_f16kv: extra: ") for line in lines)
    assert not any("decode_streaming" in line for line in lines)
    assert (
        "attention_f16kv.wgsl#other: extra digest: no exported variant uses this file and "
        "entry point" in lines
    )
    assert not any("stale digest" in line for line in lines)  # sha256: prefix accepted
    exported = json.loads((pristine_project / "generated/doppler/registry.json").read_text())
    # each single-pass variant lost bindings 5 and 6 (a multi-pass one lists its passes' own)
    variants = exported["operations"]["attention"]["variants"].values()
    tiled = sum("passes" not in v for v in variants)
    assert 0 < tiled < len(variants)
    assert len(lines) == len(set(lines)) == 1 + 2 * tiled + 1 + 1 + 1


def _first_pass(directory: Path, key: str, value: Any) -> None:
    """Set ``key`` of the first pass of the registry's first multi-pass variant."""

    def change(registry: dict[str, Any]) -> None:
        variants = [v for op in registry["operations"].values() for v in op["variants"].values()]
        next(v for v in variants if "passes" in v)["passes"][0][key] = value

    rewrite(directory / "registry.json", change)


def test_check_against_a_fifo_is_one_line_not_a_hang(
    pristine_project: Path, tmp_path: Path
) -> None:
    directory = checkout(pristine_project, tmp_path)
    (directory / "registry.json").unlink()
    os.mkfifo(directory / "registry.json")
    result = run_process(pristine_project, "export", "--check-against", str(directory))
    assert result.returncode == 2, result.stdout + result.stderr
    line = assert_one_line_error(result.stderr)
    assert line.endswith("registry.json: not a regular file; doppler-gen refuses to read it")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: shutil.rmtree(d), "not a directory"),
        (lambda d: (d / "digests.json").unlink(), "digests.json: not found"),
        (lambda d: (d / "registry.json").write_text('{"operations": {'), "invalid JSON"),
        (lambda d: (d / "registry.json").write_text('{"operations": []}'), "expected an object"),
        (
            lambda d: (d / "registry.json").write_text(
                '{"operations": {"attention": {"baseBindings": [{"index": "0"}]}}}'
            ),
            "operations.attention.baseBindings[0]: expected an object with an integer",
        ),
        (lambda d: (d / "digests.json").write_text('{"a#main": 3}'), "sha256 hex"),
        (lambda d: _first_pass(d, "bindings", 5), ".passes[0].bindings: expected a list"),
        (lambda d: _first_pass(d, "uniforms", [1]), ".passes[0].uniforms: expected an object"),
        (
            lambda d: _first_pass(d, "uniforms", {"fields": [5]}),
            ".passes[0].uniforms.fields: expected a list of objects",
        ),
        (
            lambda d: _first_pass(d, "bindings", [{"index": "x"}]),
            '.passes[0].bindings[0]: expected an object with an integer "index"',
        ),
        (
            lambda d: (d / "registry.json").write_text("[" * 100_000 + "]" * 100_000),
            "registry.json: invalid JSON: nested too deeply",
        ),
        (
            lambda d: (d / "registry.json").write_text('{"a": ' + "1" * 5000 + "}"),
            "registry.json: invalid JSON: Exceeds the limit (4300 digits)",
        ),
        # Python's json reads NaN and Infinity; JSON.parse (Doppler's host) refuses the file:
        # the top-level note is not compared, so this matched the export (exit 0)
        (
            lambda d: rewrite(d / "registry.json", lambda r: r.update(note=float("nan"))),
            "registry.json: invalid JSON: NaN is not a JSON value",
        ),
        (
            lambda d: rewrite(d / "digests.json", lambda r: r.update(note=-float("inf"))),
            "digests.json: invalid JSON: -Infinity is not a JSON value",
        ),
    ],
    ids=[
        "no-dir",
        "no-digests",
        "bad-json",
        "operations-list",
        "bad-binding",
        "bad-digest",
        "pass-bindings-not-a-list",
        "pass-uniforms-not-an-object",
        "pass-uniform-field-not-an-object",
        "pass-binding-index-not-an-integer",
        "registry-nested-too-deeply",
        "registry-integer-past-the-digit-limit",
        "registry-nan",
        "digests-minus-infinity",
    ],
)
def test_check_against_unreadable_input_is_one_line_exit_2(
    pristine_project: Path, tmp_path: Path, setup, message: str
) -> None:
    directory = checkout(pristine_project, tmp_path)
    setup(directory)
    result = run_cli(pristine_project, "export", "--check-against", str(directory))
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert message in line and str(directory) in line, line
    assert result.stdout == ""


def test_a_json_file_nested_too_deeply_in_the_export_directory_is_not_a_crash(
    fresh_project: Path,
) -> None:
    """Deciding whether a file in generated/doppler/ is an old export of ours decoded it
    without catching RecursionError: check and generate exited 3."""
    (fresh_project / "generated/doppler/extra.json").write_text("[" * 200_000 + "]" * 200_000)
    for command in ("check", "generate"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 0, result.output + result.stderr  # not ours: left alone
    assert (fresh_project / "generated/doppler/extra.json").exists()


# -- operations with differing layouts, and multi-pass variants ------------------------------------


def _variant(entries: dict[str, Any], name: str, ids: list[str], op: str = "op") -> dict:
    entry = copy.deepcopy(entries[name])
    entry["doppler"] = {"operation": op, "ids": ids, "tier": None}
    return entry


def test_base_layout_and_overrides(entries: dict[str, Any]) -> None:
    """baseBindings/baseUniforms hold what the variants share; each override resolves exactly."""
    a = _variant(entries, "attention_f16kv", ["a"])
    b = _variant(entries, "attention_f16", ["b"])
    c = _variant(entries, "attention_decode_tiered_f16kv", ["c"])  # other bindings and uniforms
    registry = registry_document({"a": a, "b": b, "c": c})
    op = registry["operations"]["op"]
    assert [x["index"] for x in op["baseBindings"]] == list(range(7))  # indices all three have
    assert op["baseUniforms"]["size"] == 64  # a and b agree: the most common layout
    variants = op["variants"]
    assert "bindingsOverride" not in variants["a"] and "uniformsOverride" not in variants["a"]
    assert variants["c"]["uniformsOverride"]["size"] == 80
    assert [x["index"] for x in variants["c"]["bindingsOverride"]] == [2, 3, 4, 5, 6, 7]
    for name, entry in (("a", a), ("b", b), ("c", c)):
        bindings = merge_bindings(op["baseBindings"], variants[name].get("bindingsOverride"))
        assert [(x["index"], x["name"]) for x in bindings] == [
            (x["binding"], x["name"]) for x in entry["bindings"]
        ]


def test_multi_pass_variant_lists_its_passes_and_scratch(entries: dict[str, Any]) -> None:
    base = _variant(entries, "attention_f16kv", ["decode_split_f16kv"], "attention")
    partials = {k: base[k] for k in ("bindings", "uniforms", "overrides", "constants")}
    partials.update(
        name="partials",
        file="generated/split_partials.wgsl",
        entry_point="partials",
        workgroup_size=["WORKGROUP_SIZE", "1", "1"],
        workgroup_storage_bytes=1024,
    )
    partials["bindings"] = [
        *base["bindings"],
        {
            "group": 0,
            "binding": 7,
            "name": "partial_acc",
            "address_space": "storage",
            "access": "read_write",
            "type": "array<f32>",
            "element_type": "f32",
        },
    ]
    reduce = {**partials, "name": "reduce", "file": "generated/split_reduce.wgsl"}
    reduce.update(entry_point="main", workgroup_storage_bytes=0, overrides=[], constants={})
    reduce["workgroup_size"] = ["256", "1", "1"]
    base.update(passes=[partials, reduce], scratch={"partial_acc": "num_heads * head_dim * 8"})
    entries_ = {"split": base}
    registry = registry_document(entries_)
    entry = registry["operations"]["attention"]["variants"]["decode_split_f16kv"]
    assert "wgsl" not in entry and "baseBindings" not in registry["operations"]["attention"]
    assert [(p["name"], p["wgsl"], p["entryPoint"], p["workgroup"]) for p in entry["passes"]] == [
        ("partials", "split_partials.wgsl", "partials", [64, 1, 1]),
        ("reduce", "split_reduce.wgsl", "main", [256, 1, 1]),
    ]
    assert entry["passes"][0]["bindings"][7] == {
        "index": 7,
        "name": "partial_acc",
        "type": "storage",
    }
    assert entry["scratch"] == [
        {
            "name": "partial_acc",
            "elements": "num_heads * head_dim * 8",
            "dtype": "f32",
            "bytesPerElement": 4,
        }
    ]
    assert entry["variantMetadata"]["requiredShared"] == 1024
    assert entry["passEncoding"] == "one-compute-pass"  # as validate and bench record it
    sources = {"generated/split_partials.wgsl": "// p\n", "generated/split_reduce.wgsl": "// r\n"}
    digests = digests_document(entries_, sources)["digests"]
    assert digests == {
        "split_partials.wgsl#partials": content_digest("// p\n", "partials"),
        "split_reduce.wgsl#main": content_digest("// r\n", "main"),
    }
    ours = {"digests": digests}
    assert differences(registry, ours, registry, digests, []) == []
    swapped = copy.deepcopy(registry)
    passes = swapped["operations"]["attention"]["variants"]["decode_split_f16kv"]["passes"]
    passes.reverse()
    lines = differences(registry, ours, swapped, digests, [])
    assert 'attention.decode_split_f16kv: pass 0 name: registry "reduce", WGSL "partials"' in (
        lines
    )


def test_group_other_than_zero_is_refused(entries: dict[str, Any]) -> None:
    entry = _variant(entries, "attention", ["x"])
    entry["bindings"][1]["group"] = 1
    entry["passes"][0]["bindings"][1]["group"] = 1  # the per-pass record is what is exported
    with pytest.raises(
        InterfaceError, match=re.escape("Doppler's registry describes bind group 0")
    ):
        registry_document({"attention": entry})


def test_check_memo_does_not_hide_an_edited_export(fresh_project: Path) -> None:
    """A clean check is memoized; editing generated/doppler/ afterwards must still fail check."""
    assert run_cli(fresh_project, "check").exit_code == 0
    assert "unchanged since the last full check" in run_cli(fresh_project, "check").stdout
    edit(
        fresh_project / "generated/doppler/digests.json",
        '"attention.wgsl#main": "',
        '"x": "0", "attention.wgsl#main": "',
    )
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 1, result.output
    assert "stale:    generated/doppler/digests.json\n" in result.stdout
