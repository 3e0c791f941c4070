"""`doppler-gen check`: exit 0 when generated/ is current, else 1 naming every difference.

Check never writes: every run here snapshots the whole project before and after.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import Result
from conftest import edit, project_snapshot, run_cli

FIX = "doppler-gen generate"


def check(root: Path, *args: str) -> Result:
    """Run check and assert it wrote nothing."""
    before = project_snapshot(root)
    result = run_cli(root, "check", *args)
    assert project_snapshot(root) == before, "check must never write (beyond its memo)"
    return result


def assert_out_of_date(result: Result, *paths: str) -> None:
    assert result.exit_code == 1, result.output
    for path in paths:
        assert path in result.stdout, f"{path} not named in:\n{result.stdout}"
    assert result.stderr.count("\n") == 1, result.stderr
    assert "generated/ is out of date" in result.stderr
    assert f"fix with: {FIX}" in result.stderr
    assert "Traceback" not in result.output


def test_fresh_tree_is_clean(fresh_project: Path) -> None:
    result = check(fresh_project)
    assert result.exit_code == 0, result.output
    files = sum(1 for p in (fresh_project / "generated").rglob("*") if p.is_file())
    assert result.stdout == f"generated/ is up to date ({files} files)\n"
    assert result.stderr == ""


def test_hand_edit_of_a_kernel(fresh_project: Path) -> None:
    kernel = fresh_project / "generated/attention_f16.wgsl"
    original = kernel.read_text(encoding="utf-8")
    assert "const MAX_BLOCK_SIZE: u32 = 64u;" in original
    kernel.write_text(
        original.replace("const MAX_BLOCK_SIZE: u32 = 64u;", "const MAX_BLOCK_SIZE: u32 = 32u;"),
        encoding="utf-8",
    )
    result = check(fresh_project)
    assert_out_of_date(result, "stale:    generated/attention_f16.wgsl")
    out = result.stdout
    # a unified diff from the file on disk to what generate would write
    assert "--- generated/attention_f16.wgsl (on disk)\n" in out
    assert "+++ generated/attention_f16.wgsl (generated)\n" in out
    assert "\n-const MAX_BLOCK_SIZE: u32 = 32u;\n" in out
    assert "\n+const MAX_BLOCK_SIZE: u32 = 64u;\n" in out
    assert "@@ -" in out
    # only that file: the manifest records the sha of what generate writes, which is unchanged
    assert out.count("stale:") == 1


def test_hand_edit_removing_the_final_newline(fresh_project: Path) -> None:
    kernel = fresh_project / "generated/attention.wgsl"
    kernel.write_text(kernel.read_text(encoding="utf-8").rstrip("\n"), encoding="utf-8")
    result = check(fresh_project)
    assert_out_of_date(result, "stale:    generated/attention.wgsl")
    assert "\\ No newline at end of file" in result.stdout


def test_hand_edit_of_the_manifest(fresh_project: Path) -> None:
    manifest = fresh_project / "generated/manifest.json"
    manifest.write_text(manifest.read_text(encoding="utf-8").replace('"format": 1', '"format": 2'))
    result = check(fresh_project)
    assert_out_of_date(result, "stale:    generated/manifest.json")


def test_non_utf8_kernel_is_stale(fresh_project: Path) -> None:
    (fresh_project / "generated/attention.wgsl").write_bytes(b"\xff\xfe garbage")
    result = check(fresh_project)
    assert_out_of_date(result, "stale:    generated/attention.wgsl")


def test_template_edit(fresh_project: Path) -> None:
    edit(
        fresh_project / "templates/attention.wgsl.j2",
        "// Tile sizes for blocked attention",
        "// Tile sizes for the blocked attention",
    )
    result = check(fresh_project)
    assert_out_of_date(
        result,
        "stale:    generated/attention.wgsl",
        "stale:    generated/attention_f16.wgsl",
        "stale:    generated/attention_small_f16kv.wgsl",
        "stale:    generated/manifest.json",  # the kernels' sha256 changed
        "+// Tile sizes for the blocked attention",
    )


def test_template_comment_edit_changes_only_the_hash(fresh_project: Path) -> None:
    edit(fresh_project / "templates/attention.wgsl.j2", "-#}\n", "-#}\n{# a Jinja comment #}\n")
    result = check(fresh_project)
    assert_out_of_date(result, "stale:    generated/attention.wgsl")
    changed = [line for line in result.stdout.splitlines() if line.startswith(("-//", "+//"))]
    assert changed and all("source-hash: sha256:" in line for line in changed), changed


def test_lib_template_edit(fresh_project: Path) -> None:
    edit(
        fresh_project / "templates/lib/attention_common.wgsl.j2",
        "// GQA: multiple query heads share one KV head",
        "// GQA: several query heads share one KV head",
    )
    result = check(fresh_project)
    assert_out_of_date(
        result, "stale:    generated/attention.wgsl", "stale:    generated/attention_f16kv.wgsl"
    )


def test_variants_toml_param_edit(fresh_project: Path) -> None:
    edit(
        fresh_project / "variants.toml",
        'params = { kv_dtype = "f16", block_size = 16 }',
        'params = { kv_dtype = "f16", block_size = 32 }',
    )
    result = check(fresh_project)
    assert_out_of_date(
        result,
        "stale:    generated/attention_small_f16kv.wgsl",
        "stale:    generated/manifest.json",
    )
    assert "+const MAX_BLOCK_SIZE: u32 = 32u;" in result.stdout
    assert "stale:    generated/attention.wgsl" not in result.stdout


def test_variants_toml_description_edit(fresh_project: Path) -> None:
    # a description lives only in the manifest and the Doppler registry fragment, not in kernels
    toml = fresh_project / "variants.toml"
    text = toml.read_text(encoding="utf-8")
    start = text.index('name = "attention_f16kv"')
    start = text.index('description = "', start) + len('description = "')
    toml.write_text(text[:start] + "Reworded: " + text[start:], encoding="utf-8")
    result = check(fresh_project)
    assert_out_of_date(
        result, "stale:    generated/manifest.json", '+      "description": "Reworded: '
    )
    assert "stale:    generated/doppler/registry.json" in result.stdout
    assert result.stdout.count("stale:") == 2


def test_missing_kernel(fresh_project: Path) -> None:
    (fresh_project / "generated/attention_f16kv.wgsl").unlink()
    result = check(fresh_project)
    assert_out_of_date(result, "missing:  generated/attention_f16kv.wgsl")


def test_missing_manifest_and_directory(fresh_project: Path) -> None:
    (fresh_project / "generated/manifest.json").unlink()
    assert_out_of_date(check(fresh_project), "missing:  generated/manifest.json")
    shutil.rmtree(fresh_project / "generated")
    result = check(fresh_project)
    assert_out_of_date(
        result, "missing:  generated/attention.wgsl", "missing:  generated/manifest.json"
    )
    assert not (fresh_project / "generated").exists()


def test_orphan(fresh_project: Path) -> None:
    orphan = fresh_project / "generated/attention_old.wgsl"
    orphan.write_bytes((fresh_project / "generated/attention.wgsl").read_bytes())
    result = check(fresh_project)
    assert_out_of_date(result, "orphaned: generated/attention_old.wgsl (no variant produces it")


def test_renamed_output_is_missing_plus_orphan(fresh_project: Path) -> None:
    # an output is always named after its variant, so renaming one renames both
    edit(
        fresh_project / "variants.toml",
        'name = "attention_f16kv"\ntemplate = "attention"\noutput = "generated/attention_f16kv.wgsl"',
        'name = "attention_kv16"\ntemplate = "attention"\noutput = "generated/attention_kv16.wgsl"',
    )
    result = check(fresh_project)
    assert_out_of_date(
        result,
        "missing:  generated/attention_kv16.wgsl",
        "orphaned: generated/attention_f16kv.wgsl",
        "stale:    generated/manifest.json",
    )


def test_generate_fixes_what_check_reports(fresh_project: Path) -> None:
    (fresh_project / "generated/attention_f16.wgsl").unlink()
    edit(  # the old file becomes an orphan that doppler-gen wrote
        fresh_project / "variants.toml",
        'name = "attention_f16kv"\ntemplate = "attention"\noutput = "generated/attention_f16kv.wgsl"',
        'name = "attention_kv16"\ntemplate = "attention"\noutput = "generated/attention_kv16.wgsl"',
    )
    kernel = fresh_project / "generated/attention.wgsl"
    kernel.write_text(kernel.read_text(encoding="utf-8") + "// edit\n", encoding="utf-8")
    assert check(fresh_project).exit_code == 1
    assert run_cli(fresh_project, "generate").exit_code == 0
    assert check(fresh_project).exit_code == 0


def test_only_check_computes_diffs(fresh_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`generate` and the stale-tree refusal of validate/bench/tune name stale files without
    diffing them (difflib is quadratic; a shared-macro edit stales every kernel)."""
    from doppler_gen import outputs

    kernel = fresh_project / "generated/attention.wgsl"
    kernel.write_text(kernel.read_text(encoding="utf-8") + "// edit\n", encoding="utf-8")
    calls: list[str] = []
    real = outputs.unified_diff
    monkeypatch.setattr(
        outputs, "unified_diff", lambda path, *a: calls.append(path) or real(path, *a)
    )
    refused = run_cli(fresh_project, "validate", "--quick", "attention")
    assert refused.exit_code == 1 and "stale generated/attention.wgsl" in refused.stderr
    assert calls == []
    assert check(fresh_project).exit_code == 1
    assert calls == ["generated/attention.wgsl"]
    assert run_cli(fresh_project, "generate").exit_code == 0
    assert calls == ["generated/attention.wgsl"]
    assert check(fresh_project).exit_code == 0


# -- --json ----------------------------------------------------------------------------------------


JSON_KEYS = {"ok", "stale", "missing", "orphaned", "diffs", "fix", "memo"}


def test_json_clean(fresh_project: Path) -> None:
    result = check(fresh_project, "--json")
    assert result.exit_code == 0
    assert result.stderr == ""
    report = json.loads(result.stdout)
    expected = {
        "ok": True,
        "stale": [],
        "missing": [],
        "orphaned": [],
        "diffs": {},
        "fix": None,
        "memo": False,
    }
    assert report == expected
    # the same schema when the memo confirms the tree: only "memo" differs
    again = json.loads(check(fresh_project, "--json").stdout)
    assert again == {**expected, "memo": True}


def test_json_dirty(fresh_project: Path) -> None:
    kernel = fresh_project / "generated/attention.wgsl"
    kernel.write_text(kernel.read_text(encoding="utf-8") + "// edit\n", encoding="utf-8")
    (fresh_project / "generated/attention_f16.wgsl").unlink()
    (fresh_project / "generated/old.wgsl").write_bytes(kernel.read_bytes())
    result = check(fresh_project, "--json")
    assert result.exit_code == 1
    assert result.stderr == ""  # stdout is pure JSON; nothing else
    report = json.loads(result.stdout)
    assert set(report) == JSON_KEYS
    assert report["ok"] is False
    assert report["fix"] == FIX
    assert report["stale"] == ["generated/attention.wgsl"]
    assert report["missing"] == ["generated/attention_f16.wgsl"]
    assert report["orphaned"] == ["generated/old.wgsl"]
    assert set(report["diffs"]) == {"generated/attention.wgsl"}
    diff = report["diffs"]["generated/attention.wgsl"]
    assert diff.startswith(
        "--- generated/attention.wgsl (on disk)\n+++ generated/attention.wgsl (generated)\n"
    )
    assert "\n-// edit\n" in diff
    # deterministic: sorted keys, two-space indent
    assert result.stdout == json.dumps(report, indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("args", [(), ("--json",)])
def test_check_with_bad_input_is_exit_2(fresh_project: Path, args: tuple[str, ...]) -> None:
    edit(fresh_project / "variants.toml", "head_tile = 64\n", "head_tile = sixty-four\n")
    result = check(fresh_project, *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: variants.toml:") and result.stderr.count("\n") == 1
    if not args:
        assert result.stdout == ""
        return
    # --json: stdout carries a JSON error object, never nothing
    document = json.loads(result.stdout)
    assert document["ok"] is False
    assert document["error"]["type"] == "ConfigError"
    assert document["error"]["location"].startswith("variants.toml:")
    assert document["error"]["exit_code"] == 2


def test_unchanged_tree_is_confirmed_from_the_memo_and_any_change_forces_a_full_check(
    fresh_project: Path,
) -> None:
    first = run_cli(fresh_project, "check", "--full")
    assert first.exit_code == 0 and "files)" in first.output
    memo = run_cli(fresh_project, "check")
    assert memo.exit_code == 0
    assert "unchanged since the last full check" in memo.output
    # a hand edit changes the digest: the memo cannot hide it
    edit(fresh_project / "generated/attention.wgsl", "let head_idx", "let  head_idx")
    stale = run_cli(fresh_project, "check")
    assert stale.exit_code == 1 and "stale:    generated/attention.wgsl" in stale.output
    # restoring the file restores the clean digest; a new orphan changes it again
    edit(fresh_project / "generated/attention.wgsl", "let  head_idx", "let head_idx")
    assert run_cli(fresh_project, "check").exit_code == 0
    orphan = fresh_project / "generated/old.wgsl"
    shutil.copy(fresh_project / "generated/attention.wgsl", orphan)
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 1 and "orphaned: generated/old.wgsl" in result.output


def test_memo_digest_covers_inputs_outputs_and_the_package(fresh_project: Path) -> None:
    from doppler_gen.check_memo import tree_digest

    before = tree_digest(fresh_project)
    assert tree_digest(fresh_project) == before
    edit(
        fresh_project / "templates/lib/attention_common.wgsl.j2", "// Causal mask", "// causal mask"
    )
    assert tree_digest(fresh_project) != before


def test_crlf_line_endings_in_a_generated_file_are_stale(fresh_project: Path) -> None:
    path = fresh_project / "generated/attention.wgsl"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    result = run_cli(fresh_project, "check", "--full")
    assert result.exit_code == 1 and "stale:    generated/attention.wgsl" in result.output
    assert run_cli(fresh_project, "generate").exit_code == 0
    assert b"\r" not in path.read_bytes()
    assert run_cli(fresh_project, "check", "--full").exit_code == 0
