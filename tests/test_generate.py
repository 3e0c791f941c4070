"""`doppler-gen generate`: determinism, idempotence, selection, atomic writes, orphans, format."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import tomllib
from pathlib import Path

import jinja2
import pytest
from conftest import (
    assert_one_line_error,
    copy_project,
    edit,
    project_snapshot,
    run_cli,
    snapshot,
)

from doppler_gen import outputs
from doppler_gen import render as render_module
from doppler_gen.config import load_project
from doppler_gen.render import HEADER_MARK, Renderer

OLD_MTIME_NS = 1_000_000_000 * 1_000_000_000  # 2001-09-09: anything written now is newer


def variant_names(root: Path) -> list[str]:
    data = tomllib.loads((root / "variants.toml").read_text(encoding="utf-8"))
    return [entry["name"] for entry in data["variant"]]


def variant_outputs(root: Path) -> dict[str, tuple[str, ...]]:
    """Every file each variant generates: its output, or one file per pass."""
    return {variant.name: variant.outputs for variant in load_project(root).variants}


def clear_generated(root: Path) -> None:
    for path in (root / "generated").iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()  # generated/doppler/ too


def age_files(directory: Path) -> None:
    for path in directory.iterdir():
        os.utime(path, ns=(OLD_MTIME_NS, OLD_MTIME_NS))


def mtimes(directory: Path) -> dict[str, int]:
    return {path.name: path.stat().st_mtime_ns for path in directory.iterdir()}


def file_hashes(root: Path) -> dict[str, str]:
    """The source hash of every generated file (one per pass), by file."""
    project = load_project(root)
    renderer = Renderer(project)
    return {p.output: p.source_hash for v in project.variants for p in renderer.render(v).passes}


def source_hashes(root: Path) -> dict[str, str]:
    """Per variant, its source hash (its passes' hashes, joined, for a multi-pass variant)."""
    project = load_project(root)
    renderer = Renderer(project)
    return {
        v.name: "+".join(p.source_hash for p in renderer.render(v).passes) for v in project.variants
    }


# -- determinism and idempotence -----------------------------------------------------------------


def test_two_runs_are_byte_identical(tmp_path: Path) -> None:
    # two copies at different paths, generated from scratch: no path, time or ordering leaks in
    first = copy_project(tmp_path / "a")
    second = copy_project(tmp_path / "somewhere" / "else")
    for root in (first, second):
        clear_generated(root)
        result = run_cli(root, "generate")
        assert result.exit_code == 0, result.output
    snap = snapshot(first / "generated")
    assert snap == snapshot(second / "generated")
    files = {Path(p).name for outputs in variant_outputs(first).values() for p in outputs}
    expected = files | {"manifest.json"}
    expected |= {"doppler/registry.json", "doppler/digests.json"}
    assert set(snap) == expected
    # and a second run over the first copy changes nothing
    result = run_cli(first, "generate")
    assert result.exit_code == 0, result.output
    assert snapshot(first / "generated") == snap


def test_up_to_date_tree_writes_nothing(fresh_project: Path) -> None:
    generated = fresh_project / "generated"
    age_files(generated)
    before_bytes, before_mtimes = snapshot(generated), mtimes(generated)
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 0, result.output
    assert "wrote" not in result.output
    assert re.search(r"\b0 written, \d+ unchanged, 0 removed", result.output), result.output
    assert snapshot(generated) == before_bytes
    assert mtimes(generated) == before_mtimes


def test_only_changed_files_are_rewritten(fresh_project: Path) -> None:
    generated = fresh_project / "generated"
    target = generated / "attention_f16.wgsl"
    target.write_text(target.read_text(encoding="utf-8") + "// hand edit\n", encoding="utf-8")
    age_files(generated)
    before = mtimes(generated)
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 0, result.output
    assert "wrote     generated/attention_f16.wgsl" in result.output
    after = mtimes(generated)
    changed = {name for name in before if after[name] != before[name]}
    assert changed == {"attention_f16.wgsl"}
    assert "// hand edit" not in target.read_text(encoding="utf-8")


# -- selection -------------------------------------------------------------------------------------


def test_generate_selected_name_writes_only_that_variant(fresh_project: Path) -> None:
    generated = fresh_project / "generated"
    (generated / "attention.wgsl").unlink()
    (generated / "attention_f16.wgsl").unlink()
    result = run_cli(fresh_project, "generate", "attention_f16")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "wrote     generated/attention_f16.wgsl"
    assert (generated / "attention_f16.wgsl").is_file()
    assert not (generated / "attention.wgsl").exists()  # not selected: left alone


def test_generate_glob_selection(fresh_project: Path) -> None:
    generated = fresh_project / "generated"
    for path in generated.glob("*.wgsl"):
        path.unlink()
    result = run_cli(fresh_project, "generate", "attention_f16*", "*_small_*")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    written = {Path(line.split()[-1]).name for line in lines if line.startswith("wrote")}
    expected = {
        Path(output).name
        for name, outputs in variant_outputs(fresh_project).items()
        for output in outputs
        if fnmatch.fnmatchcase(name, "attention_f16*") or fnmatch.fnmatchcase(name, "*_small_*")
    }
    assert {"attention_f16.wgsl", "attention_f16kv.wgsl", "attention_small_f16kv.wgsl"} <= expected
    assert "attention.wgsl" not in expected
    assert written == expected
    assert {p.name for p in generated.glob("*.wgsl")} == expected


def test_selection_keeps_orphans_and_unselected_stale_files(fresh_project: Path) -> None:
    generated = fresh_project / "generated"
    orphan = generated / "retired.wgsl"
    orphan.write_bytes((generated / "attention.wgsl").read_bytes())
    stale = generated / "attention.wgsl"
    stale.write_text(stale.read_text(encoding="utf-8") + "// edit\n", encoding="utf-8")
    result = run_cli(fresh_project, "generate", "attention_small_*")
    assert result.exit_code == 0, result.output
    assert orphan.exists()  # a partial run never removes anything
    assert stale.read_text(encoding="utf-8").endswith("// edit\n")


def test_selection_updates_only_its_own_manifest_entries(fresh_project: Path) -> None:
    """`generate NAME` must not record sha256 values for kernels it did not write."""
    import hashlib
    import json

    generated = fresh_project / "generated"
    manifest = generated / "manifest.json"
    before = json.loads(manifest.read_text(encoding="utf-8"))["variants"]
    edit(fresh_project / "templates/attention.wgsl.j2", "fn is_masked(", "// v2\nfn is_masked(")
    result = run_cli(fresh_project, "generate", "attention_f16")
    assert result.exit_code == 0, result.output
    assert "wrote     generated/attention_f16.wgsl" in result.output
    after = json.loads(manifest.read_text(encoding="utf-8"))["variants"]
    assert after["attention_f16"] != before["attention_f16"]
    assert {name: entry for name, entry in after.items() if name != "attention_f16"} == {
        name: entry for name, entry in before.items() if name != "attention_f16"
    }
    for name, entry in after.items():  # every recorded sha256 is that of the file on disk
        for record in entry["passes"]:  # one per pass of a multi-pass variant
            data = (fresh_project / record["file"]).read_bytes()
            assert record["sha256"] == hashlib.sha256(data).hexdigest(), name
    assert run_cli(fresh_project, "check").exit_code == 1  # the other kernels are stale
    assert run_cli(fresh_project, "generate").exit_code == 0
    assert run_cli(fresh_project, "check").exit_code == 0


def test_unmatched_selection_is_an_error(fresh_project: Path) -> None:
    before = snapshot(fresh_project / "generated")
    result = run_cli(fresh_project, "generate", "attention", "no_such_kernel*")
    assert result.exit_code == 2
    assert "no variant matches 'no_such_kernel*'" in result.stderr
    assert result.stderr.count("\n") == 1
    assert snapshot(fresh_project / "generated") == before


# -- atomic writes ---------------------------------------------------------------------------------


def test_atomic_write_leaves_no_temporary_files(project_copy: Path) -> None:
    clear_generated(project_copy)
    result = run_cli(project_copy, "generate")
    assert result.exit_code == 0, result.output
    files = [p for p in (project_copy / "generated").rglob("*") if p.is_file()]
    names = [p.name for p in files]
    assert not [n for n in names if n.startswith(".") or n.endswith(".tmp")], names
    for path in files:
        assert path.stat().st_mode & 0o777 == 0o644


def test_failed_write_removes_its_temporary_file(fresh_project: Path, monkeypatch) -> None:
    generated = fresh_project / "generated"
    target = generated / "attention.wgsl"
    original = target.read_bytes()

    def broken_replace(source, destination):
        raise OSError("disk full")

    monkeypatch.setattr(outputs.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        outputs.atomic_write(target, "new content\n")
    assert target.read_bytes() == original
    assert sorted(p.name for p in generated.iterdir() if p.name.startswith(".")) == []


# -- orphans ---------------------------------------------------------------------------------------


RENAMED_OUTPUT = (  # an output is named after its variant, so a rename renames both
    'name = "attention_f16kv"\ntemplate = "attention"\noutput = "generated/attention_f16kv.wgsl"',
    'name = "attention_kv16"\ntemplate = "attention"\noutput = "generated/attention_kv16.wgsl"',
)


def test_orphan_written_by_doppler_gen_is_removed(fresh_project: Path) -> None:
    """A kernel whose output was renamed: its old file is exactly what the manifest records."""
    generated = fresh_project / "generated"
    edit(fresh_project / "variants.toml", *RENAMED_OUTPUT)
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 0, result.output
    assert "removed   generated/attention_f16kv.wgsl" in result.output
    assert "1 removed" in result.output
    assert not (generated / "attention_f16kv.wgsl").exists()
    assert (generated / "attention_kv16.wgsl").is_file()
    assert run_cli(fresh_project, "check").exit_code == 0


@pytest.mark.parametrize(
    ("name", "how"),
    [
        ("attention_experiment.wgsl", "copy"),  # a copy under another name: not written there
        ("attention_f16kv.wgsl", "edit"),  # retired, but hand-edited since it was written
        ("notes.txt", "copy"),
        (".hidden.wgsl", "copy"),
    ],
)
def test_orphan_not_written_by_doppler_gen_is_refused(
    fresh_project: Path, name: str, how: str
) -> None:
    generated = fresh_project / "generated"
    edit(fresh_project / "variants.toml", *RENAMED_OUTPUT)
    path = generated / name
    if how == "copy":
        path.write_bytes((generated / "attention_f16.wgsl").read_bytes())
    else:
        path.write_bytes(path.read_bytes() + b"// my experiment\n")
    keep = path.read_bytes()
    before = snapshot(generated)
    check = run_cli(fresh_project, "check")
    assert check.exit_code == 1
    assert f"orphaned: generated/{name} (no variant produces it; not as doppler-gen wrote it" in (
        check.stdout
    )
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert f"generated/{name}" in line and "move or delete them" in line, line
    assert snapshot(generated) == before  # refused before anything was written
    assert path.read_bytes() == keep
    path.unlink()
    if how == "copy":  # the real retired file is removable: generate goes through
        result = run_cli(fresh_project, "generate")
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("handwritten.wgsl", "// my own kernel\nfn f() {}\n"),
        ("README.md", "# notes about generated/\n"),
        # mentions the header, but not as its first line: not ours
        ("quoted.wgsl", f"// copied:\n// {HEADER_MARK} templates/x for variant y by doppler-gen\n"),
        ("empty.wgsl", ""),
    ],
)
def test_hand_written_file_is_never_removed(fresh_project: Path, name: str, content: str) -> None:
    path = fresh_project / "generated" / name
    path.write_text(content, encoding="utf-8")
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 0, result.output
    assert "removed" not in result.output.replace("0 removed", "")
    assert path.read_text(encoding="utf-8") == content
    check = run_cli(fresh_project, "check")
    assert check.exit_code == 0, check.output  # not an orphan either


# -- output format ---------------------------------------------------------------------------------


def test_output_format(fresh_project: Path) -> None:
    project = load_project(fresh_project)
    for variant in project.variants:
        multi = variant.template.multi_pass
        for spec in variant.template.passes:
            output = variant.pass_output(spec)
            raw = (fresh_project / output).read_bytes()
            assert b"\r" not in raw, output
            text = raw.decode("utf-8")
            assert text.endswith("\n") and not text.endswith("\n\n"), output
            lines = text.split("\n")[:-1]
            for number, line in enumerate(lines, 1):
                assert line == line.rstrip(), f"{output}:{number}: trailing whitespace"
            for number in range(1, len(lines)):
                assert lines[number] or lines[number - 1], f"{output}:{number + 1}: double blank"
            of = f"variant {variant.name}" + (f" pass {spec.name}" if multi else "")
            assert lines[0] == (
                f"// AUTO-GENERATED from {spec.source_path} for {of} by doppler-gen - do not edit."
            )
            assert (
                lines[1]
                == "// Edit the template and variants.toml, then run `doppler-gen generate`."
            )
            assert re.fullmatch(r"// source-hash: sha256:[0-9a-f]{64}", lines[2]), lines[2]
            assert lines[3] == ""
            assert lines[4].startswith("//")
    manifest = (fresh_project / "generated" / "manifest.json").read_bytes()
    assert b"\r" not in manifest and manifest.endswith(b"}\n")


def test_crlf_templates_still_give_lf_output(fresh_project: Path) -> None:
    before = snapshot(fresh_project / "generated")
    for path in (fresh_project / "templates").rglob("*.j2"):
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 0, result.output
    after = snapshot(fresh_project / "generated")
    for name, data in after.items():
        assert b"\r" not in data, name
        if name.endswith(".wgsl"):
            # identical apart from the source hash: the template bytes changed
            def body(raw: bytes) -> list[bytes]:
                return [line for line in raw.split(b"\n") if not line.startswith(b"// source-hash")]

            assert body(data) == body(before[name]), name


# -- source hash -----------------------------------------------------------------------------------


def test_source_hash_is_in_the_header(fresh_project: Path) -> None:
    hashes = file_hashes(fresh_project)
    for files in variant_outputs(fresh_project).values():
        for output in files:
            third = (fresh_project / output).read_text(encoding="utf-8").split("\n")[2]
            assert third == f"// source-hash: sha256:{hashes[output]}"
    assert len(set(hashes.values())) == len(hashes)  # every variant (and pass) differs


def test_source_hash_does_not_depend_on_location(tmp_path: Path) -> None:
    assert source_hashes(copy_project(tmp_path / "one")) == source_hashes(
        copy_project(tmp_path / "two" / "deeper")
    )


def variants_using(root: Path, template_file: str) -> set[str]:
    """Variants whose template is, or (transitively) includes/imports, ``template_file``.

    Found with a regex over the template sources, independently of the renderer."""
    reference = re.compile(r"{%-?\s*(?:include|import|from|extends)\s+[\"']([^\"']+)[\"']")
    templates = root / "templates"

    def closure(name: str, seen: set[str]) -> set[str]:
        if name not in seen:
            seen.add(name)
            for ref in reference.findall((templates / name).read_text(encoding="utf-8")):
                closure(ref, seen)
        return seen

    data = tomllib.loads((root / "variants.toml").read_text(encoding="utf-8"))

    def sources(template: dict) -> list[str]:
        """The short form's source, or every pass's."""
        return (
            [template["source"]]
            if "source" in template
            else [p["source"] for p in template["pass"]]
        )

    return {
        entry["name"]
        for entry in data["variant"]
        if any(
            template_file in closure(source, set())
            for source in sources(data["templates"][entry["template"]])
        )
    }


def changed_hashes(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {name for name in before if after[name] != before[name]}


def test_source_hash_changes_with_main_template(project_copy: Path) -> None:
    before = source_hashes(project_copy)
    edit(project_copy / "templates/attention.wgsl.j2", "-#}\n", "-#}\n{# a comment only #}\n")
    expected = variants_using(project_copy, "attention.wgsl.j2")
    assert "attention" in expected
    assert changed_hashes(before, source_hashes(project_copy)) == expected


def test_source_hash_changes_with_included_lib_file(project_copy: Path) -> None:
    before = source_hashes(project_copy)
    lib = project_copy / "templates/lib/attention_common.wgsl.j2"
    lib.write_text(lib.read_text(encoding="utf-8") + "{# trailing comment #}\n", encoding="utf-8")
    expected = variants_using(project_copy, "lib/attention_common.wgsl.j2")
    assert variants_using(project_copy, "attention.wgsl.j2") <= expected
    assert changed_hashes(before, source_hashes(project_copy)) == expected


def test_source_hash_changes_with_a_param(project_copy: Path) -> None:
    before = source_hashes(project_copy)
    edit(
        project_copy / "variants.toml",
        'params = { kv_dtype = "f16", block_size = 16 }',
        'params = { kv_dtype = "f16", block_size = 32 }',
    )
    assert changed_hashes(before, source_hashes(project_copy)) == {"attention_small_f16kv"}


def test_source_hash_changes_with_a_template_default(project_copy: Path) -> None:
    before = source_hashes(project_copy)
    edit(project_copy / "variants.toml", "head_tile = 64\n", "head_tile = 128\n")
    data = tomllib.loads((project_copy / "variants.toml").read_text(encoding="utf-8"))
    expected = {entry["name"] for entry in data["variant"] if entry["template"] == "attention"}
    assert changed_hashes(before, source_hashes(project_copy)) == expected


def test_source_hash_stable_otherwise(project_copy: Path) -> None:
    before = source_hashes(project_copy)
    toml = project_copy / "variants.toml"
    # comments, descriptions, an explicit default, an unrelated new variant and template file
    edit(toml, "# doppler-gen:", "# a new comment\n# doppler-gen:")
    edit(toml, 'description = "Q, K, V and output f32"', 'description = "reworded"')
    edit(toml, 'params = { kv_dtype = "f16" }', 'params = { kv_dtype = "f16", block_size = 64 }')
    toml.write_text(
        toml.read_text(encoding="utf-8")
        + '\n[[variant]]\nname = "extra"\ntemplate = "attention"\noutput = "generated/extra.wgsl"\n'
        "params = { block_size = 32 }\n",
        encoding="utf-8",
    )
    (project_copy / "templates/unused.wgsl.j2").write_text("// not included anywhere\n")
    for path in (project_copy / "templates").rglob("*"):
        os.utime(path, ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    after = source_hashes(project_copy)
    assert {name: after[name] for name in before} == before


# -- compiled templates shared within a process (render._CompiledCode) ---------------------------


def test_renderers_of_one_project_compile_each_template_once(tmp_path: Path, monkeypatch) -> None:
    root = copy_project(tmp_path / "p")
    compiled: list[str] = []
    real_compile = jinja2.Environment.compile

    def counting_compile(self, source, name=None, filename=None, raw=False, defer_init=False):
        compiled.append(name)
        return real_compile(self, source, name, filename, raw, defer_init)

    monkeypatch.setattr(jinja2.Environment, "compile", counting_compile)
    first = load_project(root)
    text = Renderer(first).render(first.variant("attention_decode_tiered_f16")).only.text
    assert "attention_decode_tiered.wgsl.j2" in compiled
    count = len(compiled)
    second = load_project(root)  # a new project and renderer, as each test or command builds
    again = Renderer(second).render(second.variant("attention_decode_tiered_f16")).only.text
    assert again == text
    assert len(compiled) == count  # nothing compiled again


def test_a_template_edited_within_one_process_renders_its_new_text(tmp_path: Path) -> None:
    root = copy_project(tmp_path / "p")
    template = root / "templates" / "rmsnorm.wgsl.j2"
    original = template.read_text(encoding="utf-8")

    def render() -> str:
        project = load_project(root)
        return Renderer(project).render(project.variant("rmsnorm")).only.text

    before = render()
    edit(template, "@compute", "// edited between renders\n@compute")
    after = render()
    assert "// edited between renders" in after and "// edited between renders" not in before
    template.write_text(original, encoding="utf-8")
    assert render() == before  # and back: the cached code of the first text


def test_the_compiled_code_cache_drops_the_least_recently_used() -> None:
    cache = render_module._CompiledCode(capacity=2)
    env = jinja2.Environment()
    first = cache.get(env, "a", "a.j2", "A{{ 1 }}")
    cache.get(env, "b", "b.j2", "B")
    assert cache.get(env, "a", "a.j2", "A{{ 1 }}") is first  # a is now the most recent
    cache.get(env, "c", "c.j2", "C")  # evicts b
    assert len(cache) == 2
    assert cache.get(env, "a", "a.j2", "A{{ 1 }}") is first
    assert cache.get(env, "a", "a.j2", "A{{ 2 }}") is not first  # another source, another key


@pytest.mark.parametrize("edited", ["templates/lib/attention_common.wgsl.j2", "variants.toml"])
def test_a_generate_that_waited_for_the_lock_refuses_inputs_changed_since_it_rendered(
    tmp_path: Path, edited: str
) -> None:
    """`generate` renders before it takes the lock. Another `generate` (or `tune --write`) may
    write a newer input's outputs meanwhile; the waiting one must not replace them with what it
    rendered from the old text and report success on a stale tree."""
    root = copy_project(tmp_path / "project")
    (root / "generated/rmsnorm.wgsl").write_text("// AUTO-GENERATED by hand\n", encoding="utf-8")
    waiting = outputs.plan(load_project(root))  # rendered; now it would wait for the lock
    if edited == "variants.toml":  # the description goes into the manifest
        edit(root / edited, "input, weight and output f32", "f32 throughout")
    else:
        edit(root / edited, "\n", "\n// edited meanwhile\n")
    outputs.write(outputs.plan(load_project(root)))  # the other writer, holding the lock first
    newer = project_snapshot(root)
    assert run_cli(root, "check").exit_code == 0

    with pytest.raises(outputs.OutputError, match="changed after this generate read it") as error:
        outputs.write(waiting)
    assert error.value.location == edited
    assert project_snapshot(root) == newer  # nothing written
    assert run_cli(root, "check").exit_code == 0


def test_family_constraints_skip_an_override_the_host_supplies(tmp_path: Path) -> None:
    """An override declared without a default (the host passes its value) has no value to hold
    to a family's constraints: the attention constraints did int(None) on it, so a variant that
    set another override of the template stopped generate with an internal error (exit 3)."""
    root = copy_project(tmp_path / "project")
    edit(
        root / "templates/attention.wgsl.j2",
        "override HEAD_TILE: u32 = {{ head_tile | u32 }};",
        "override HEAD_TILE: u32;",
    )
    edit(
        root / "variants.toml",
        'params = { kv_dtype = "f16", block_size = 16 }',
        'params = { kv_dtype = "f16", block_size = 16 }\noverrides = { BLOCK_SIZE = 16 }',
    )
    result = run_cli(root, "generate")
    assert result.exit_code == 0, result.output
    assert run_cli(root, "check").exit_code == 0
