"""`tune --write` edge cases, without a GPU: a refused write keeps the report, a variant whose
multi-line description has a line starting with `[` is found, and a symlinked variants.toml is
edited through the link with its mode kept."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_one_line_error, run_cli

from doppler_gen.config import load_project
from doppler_gen.config_edit import edit_variant_entry, table_header_lines
from doppler_gen.runtime.measure import BenchRow, Settings, Timing
from doppler_gen.tune import (
    CandidateRenderer,
    CandidateResult,
    TuneRun,
    enumerate_candidates,
    write_winner,
)

VARIANT = "attention_small_f16kv"


def _synthetic_run(root: Path, full_validation: str) -> TuneRun:
    """A finished tune run whose winner is block_size=32 (no GPU involved)."""
    project = load_project(root)
    variant = project.variant(VARIANT)
    candidates = enumerate_candidates(
        variant.params,
        variant.overrides,
        variant.template.tunable,
        CandidateRenderer(project, variant).entry,
    )
    current = candidates[0]
    winner = next(c for c in candidates if c.label(current) == "block_size=32 HEAD_TILE=32")

    def timed(candidate: Any, label: str, us: float) -> CandidateResult:
        row = BenchRow(VARIANT, "prefill", "ok", timing=Timing(tuple([us * 1e3] * 20)))
        return CandidateResult(candidate, label, "PASS", row=row)

    return TuneRun(
        VARIANT,
        "prefill",
        "synthetic",
        False,
        Settings(),
        [timed(current, "current", 300.0), timed(winner, winner.label(current), 200.0)],
        42,
        32,
        winner_full_validation=full_validation,
    )


def test_a_refused_write_still_prints_and_writes_the_report(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _synthetic_run(fresh_project, full_validation="FAIL (planted)")
    monkeypatch.setattr("doppler_gen.tune.run_tune", lambda *args, **kwargs: run)
    before = (fresh_project / "variants.toml").read_bytes()
    output = tmp_path / "tune.json"
    result = run_cli(fresh_project, "tune", VARIANT, "--write", "--output", str(output))
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert "did not pass the full validation matrix" in line
    assert "winner: block_size=32 HEAD_TILE=32" in result.stdout  # the measurements survive
    assert "--write refused (nothing written)" in result.stdout
    document = json.loads(output.read_text(encoding="utf-8"))
    assert document["written"]["refused"] is True and document["written"]["changed"] is False
    assert len(document["candidates"]) == 2
    assert (fresh_project / "variants.toml").read_bytes() == before
    as_json = run_cli(fresh_project, "tune", VARIANT, "--write", "--json")
    assert as_json.exit_code == 2
    assert json.loads(as_json.stdout)["written"]["refused"] is True  # one document on stdout


MULTILINE = '''description = """attention_f16kv tiled 16 x 64
[not a table header: a line of the description]
[[nor this]]
"""'''


def test_a_description_line_starting_with_a_bracket_is_not_a_header(fresh_project: Path) -> None:
    path = fresh_project / "variants.toml"
    text = path.read_text(encoding="utf-8")
    old = next(
        line
        for line in text.splitlines()
        if line.startswith('description = "attention_f16kv tiled')
    )
    text = text.replace(old, MULTILINE)
    path.write_text(text, encoding="utf-8")
    lines = text.splitlines(keepends=True)
    headers = [lines[i].strip() for i in table_header_lines(lines)]
    assert "[not a table header: a line of the description]" not in headers
    assert "[[nor this]]" not in headers
    edited = edit_variant_entry(text, VARIANT, {"block_size": 32}, {})
    assert 'params = { kv_dtype = "f16", block_size = 32 }' in edited
    assert MULTILINE in edited
    run = _synthetic_run(fresh_project, full_validation="PASS")
    written = write_winner(load_project(fresh_project), run)
    assert written["changed"] is True
    assert load_project(fresh_project).variant(VARIANT).params["block_size"] == 32


def test_headers_ignore_brackets_in_arrays_strings_and_comments() -> None:
    text = (
        "[a]\n"
        'x = [\n  [1, 2],\n  ["[", "]"],\n]\n'
        "y = '''\n[literal]\n'''\n"
        's = "[not]"  # [comment]\n'
        "[[b]]  # trailing comment\n"
        "  [ c ]\n"
    )
    lines = text.splitlines(keepends=True)
    assert [lines[i].strip() for i in table_header_lines(lines)] == [
        "[a]",
        "[[b]]  # trailing comment",
        "[ c ]",
    ]


def test_a_symlinked_variants_toml_stays_a_link_with_its_mode(fresh_project: Path) -> None:
    real = fresh_project / "config" / "variants.real.toml"
    real.parent.mkdir()
    (fresh_project / "variants.toml").rename(real)
    os.chmod(real, 0o664)
    link = fresh_project / "variants.toml"
    link.symlink_to(os.path.relpath(real, fresh_project))
    run = _synthetic_run(fresh_project, full_validation="PASS")
    written = write_winner(load_project(fresh_project), run)
    assert written["changed"] is True
    assert link.is_symlink()
    assert stat.S_IMODE(real.stat().st_mode) == 0o664
    assert "block_size = 32" in real.read_text(encoding="utf-8")
    assert run_cli(fresh_project, "check").exit_code == 0
