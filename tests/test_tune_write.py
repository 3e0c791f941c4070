"""`tune --write` edge cases, without a GPU: a refused write keeps the report, a variant whose
multi-line description has a line starting with `[` is found, and a symlinked variants.toml is
edited through the link with its mode kept."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_one_line_error, project_snapshot, run_cli

from doppler_gen.config import load_project
from doppler_gen.config_edit import edit_variant_entry, table_header_lines
from doppler_gen.errors import ConfigError, DopplerGenError
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


def test_an_unwritable_variants_toml_is_refused_in_one_line_with_the_report(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`chattr +i variants.toml` (or a full disk) made --write exit 3 and lose the report."""
    import errno

    def refuse(path: Path, text: str) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    run = _synthetic_run(fresh_project, full_validation="PASS")
    monkeypatch.setattr("doppler_gen.tune.run_tune", lambda *args, **kwargs: run)
    monkeypatch.setattr("doppler_gen.tune._atomic", refuse)
    before = project_snapshot(fresh_project)
    output = tmp_path / "tune.json"
    result = run_cli(fresh_project, "tune", VARIANT, "--write", "--output", str(output))
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert "variants.toml: Operation not permitted; nothing written" in line
    assert "winner: block_size=32 HEAD_TILE=32" in result.stdout
    assert json.loads(output.read_text(encoding="utf-8"))["written"]["refused"] is True
    assert project_snapshot(fresh_project) == before


def test_a_variants_toml_that_cannot_be_restored_says_so(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """generated/ refused the winner, and variants.toml then refused its old text."""
    from doppler_gen import tune
    from doppler_gen.errors import DopplerGenError
    from doppler_gen.outputs import OutputError

    def refuse(plan: Any) -> Any:
        raise OutputError("planted failure", location="generated/")

    writes = []

    def second_write_fails(path: Path, text: str) -> None:
        writes.append(text)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        real_atomic(path, text)

    real_atomic = tune._atomic
    monkeypatch.setattr("doppler_gen.outputs.write", refuse)
    monkeypatch.setattr(tune, "_atomic", second_write_fails)
    with pytest.raises(DopplerGenError) as error:
        write_winner(load_project(fresh_project), _synthetic_run(fresh_project, "PASS"))
    assert "No space left on device; it holds the winner, but generated/ does not" in str(
        error.value
    )
    assert str(error.value).endswith("(generated/: planted failure)")  # why generated/ failed


def test_an_interrupt_out_of_the_variants_toml_write_restores_it(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Signals are held over both writes (next test), but should a KeyboardInterrupt come out
    of the variants.toml write itself, before generated/ is written, the original goes back."""
    from doppler_gen import tune

    real_atomic = tune._atomic
    calls = []

    def write_then_ctrl_c(path: Path, text: str) -> None:
        real_atomic(path, text)
        calls.append(text)
        if len(calls) == 1:
            raise KeyboardInterrupt

    before = (fresh_project / "variants.toml").read_bytes()
    monkeypatch.setattr(tune, "_atomic", write_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        write_winner(load_project(fresh_project), _synthetic_run(fresh_project, "PASS"))
    assert (fresh_project / "variants.toml").read_bytes() == before
    assert len(calls) == 2  # the winner, then the original back


def test_a_ctrl_c_while_generated_is_written_leaves_both_with_the_winner(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real SIGINT landing while generated/'s files are replaced: the transaction held it and
    raised it once it committed, and --write then put the old variants.toml back over a
    generated/ holding the winner (`check` failed). Now it is held until both hold the winner."""
    import signal

    from doppler_gen.outputs import Transaction, compare, plan

    real_run = Transaction._run

    def ctrl_c_midway(self: Transaction, changes: Any, removals: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        real_run(self, changes, removals)

    monkeypatch.setattr(Transaction, "_run", ctrl_c_midway)
    before = (fresh_project / "variants.toml").read_text(encoding="utf-8")
    # a shard started in the background by .ci/test inherits SIGINT ignored: Ctrl-C as a
    # terminal delivers it needs Python's own handler
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_winner(load_project(fresh_project), _synthetic_run(fresh_project, "PASS"))
    finally:
        signal.signal(signal.SIGINT, previous)
    after = (fresh_project / "variants.toml").read_text(encoding="utf-8")
    assert after != before and "block_size = 32" in after  # the winner, recorded
    assert compare(plan(load_project(fresh_project))).clean  # and generated/ agrees


def test_a_second_write_waits_for_the_lock_then_refuses_a_changed_variants_toml(
    fresh_project: Path,
) -> None:
    """Two `tune --write` runs at once both reported success and one change was lost: the
    check that variants.toml is unchanged ran outside the generate lock. Another process holds
    the lock and edits variants.toml meanwhile; --write waits, then refuses."""
    import subprocess
    import sys
    import textwrap

    ready = fresh_project / "ready"
    holder = textwrap.dedent(
        f"""
        import fcntl, os, pathlib, time
        root = pathlib.Path({str(fresh_project)!r})
        (root / ".doppler-gen").mkdir(exist_ok=True)
        handle = os.open(root / ".doppler-gen" / "generate.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(handle, fcntl.LOCK_EX)
        pathlib.Path({str(ready)!r}).write_text("1")
        time.sleep(1.0)
        with open(root / "variants.toml", "a", encoding="utf-8") as stream:
            stream.write("# the other run's change\\n")
        os.close(handle)
        """
    )
    project = load_project(fresh_project)
    run = _synthetic_run(fresh_project, "PASS")
    other = subprocess.Popen([sys.executable, "-c", holder])
    try:
        for _ in range(200):
            if ready.exists():
                break
            time.sleep(0.05)
        with pytest.raises(DopplerGenError, match="changed while tune ran; nothing written"):
            write_winner(project, run)
    finally:
        other.wait(timeout=30)
    text = (fresh_project / "variants.toml").read_text(encoding="utf-8")
    assert text.endswith("# the other run's change\n") and "block_size = 32" not in text


def test_a_template_edited_while_tune_ran_is_not_written(fresh_project: Path) -> None:
    """The winner was validated as rendered when tune started; --write rendered the templates
    as they are now and recorded that kernel, never validated (and every other variant of the
    template with it)."""
    run = _synthetic_run(fresh_project, "PASS")
    template = fresh_project / "templates" / "attention.wgsl.j2"
    template.write_text(template.read_text(encoding="utf-8") + "// edited\n", encoding="utf-8")
    before = project_snapshot(fresh_project)
    with pytest.raises(DopplerGenError, match="renders differently now from the kernel tune"):
        write_winner(load_project(fresh_project), run)
    assert project_snapshot(fresh_project) == before


def test_a_write_that_would_rewrite_another_variant_is_refused(fresh_project: Path) -> None:
    """A stale kernel of another variant would have been regenerated, unvalidated, with the
    winner."""
    run = _synthetic_run(fresh_project, "PASS")
    other = fresh_project / "generated" / "attention.wgsl"
    other.write_text(other.read_text(encoding="utf-8") + "// by hand\n", encoding="utf-8")
    before = project_snapshot(fresh_project)
    with pytest.raises(DopplerGenError, match=r"would also rewrite generated/attention\.wgsl"):
        write_winner(load_project(fresh_project), run)
    assert project_snapshot(fresh_project) == before


def test_the_current_configuration_writes_nothing_even_with_a_default_pinned(
    fresh_project: Path,
) -> None:
    """An override that restates its default (pinned, with a comment) was removed, comment and
    all, when the winner was the current configuration."""
    config = fresh_project / "variants.toml"
    text = config.read_text(encoding="utf-8")
    pinned = 'params = { kv_dtype = "f16", block_size = 16 }\n'
    assert text.count(pinned) == 1
    config.write_text(
        text.replace(pinned, pinned + "overrides = { WORKGROUP_SIZE = 16 }  # the host reads\n"),
        encoding="utf-8",
    )
    run_cli(fresh_project, "generate")
    run = _synthetic_run(fresh_project, "PASS")
    run.results = run.results[:1]  # only the current configuration ran
    before = project_snapshot(fresh_project)
    written = write_winner(load_project(fresh_project), run)
    assert written["changed"] is False and "current configuration" in written["message"]
    assert project_snapshot(fresh_project) == before


def test_ctrl_c_while_generated_is_written_restores_variants_toml(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(plan: Any) -> Any:
        raise KeyboardInterrupt

    before = (fresh_project / "variants.toml").read_bytes()
    monkeypatch.setattr("doppler_gen.outputs.write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_winner(load_project(fresh_project), _synthetic_run(fresh_project, "PASS"))
    assert (fresh_project / "variants.toml").read_bytes() == before


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


def _crlf(root: Path) -> bytes:
    """Rewrite variants.toml with CRLF line endings; returns its bytes."""
    path = root / "variants.toml"
    data = path.read_bytes().replace(b"\n", b"\r\n")
    path.write_bytes(data)
    return data


def test_a_crlf_variants_toml_keeps_its_line_endings(fresh_project: Path) -> None:
    before = _crlf(fresh_project)
    run = _synthetic_run(fresh_project, full_validation="PASS")
    assert write_winner(load_project(fresh_project), run)["changed"] is True
    after = (fresh_project / "variants.toml").read_bytes()
    assert after.count(b"\n") == after.count(b"\r\n") == before.count(b"\r\n") + 1  # + overrides
    assert b"block_size = 32 }\r\n" in after and b"overrides = { HEAD_TILE = 32 }\r\n" in after


def test_a_failed_write_restores_a_crlf_variants_toml_byte_for_byte(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from doppler_gen.outputs import OutputError

    def refuse(plan: Any) -> Any:
        raise OutputError("planted failure", location="generated/")

    before = _crlf(fresh_project)
    run = _synthetic_run(fresh_project, full_validation="PASS")
    monkeypatch.setattr("doppler_gen.outputs.write", refuse)
    with pytest.raises(OutputError, match="planted failure"):
        write_winner(load_project(fresh_project), run)
    assert (fresh_project / "variants.toml").read_bytes() == before


def test_an_edit_that_makes_the_config_invalid_points_at_the_variant(fresh_project: Path) -> None:
    """The edited text exists only in memory: its line numbers would mislead."""
    run = _synthetic_run(fresh_project, full_validation="PASS")
    path = fresh_project / "variants.toml"
    text = path.read_text(encoding="utf-8")
    choices = "[templates.attention.choices]\n"
    text = text.replace(choices, f"{choices}block_size = [16, 64]\n", 1)
    # the tunable list must keep to the choices too (config load refuses it otherwise)
    tunable = "[templates.attention.tunable]\nblock_size = [16, 32, 64]\n"
    assert tunable in text
    path.write_text(text.replace(tunable, "[templates.attention.tunable]\nblock_size = [16, 64]\n"))
    before = path.read_bytes()
    project = load_project(fresh_project)
    with pytest.raises(ConfigError) as raised:
        write_winner(project, run)
    error = raised.value
    assert error.location == f"variants.toml:{project.variant(VARIANT).line}"
    assert error.message.startswith(
        f"--write: recording the winner in variant {VARIANT} would make variants.toml invalid "
        "(line "
    )
    assert "parameter block_size=32 is not one of 16, 64; nothing written" in error.message
    assert path.read_bytes() == before


def test_an_unwritable_output_is_refused_before_tune_changes_anything(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked first: --write would otherwise edit variants.toml and generated/, then lose the
    report it could not write."""
    run = _synthetic_run(fresh_project, full_validation="PASS")
    monkeypatch.setattr("doppler_gen.tune.run_tune", lambda *args, **kwargs: run)
    before = project_snapshot(fresh_project)
    output = tmp_path / "no-such-directory" / "tune.json"
    result = run_cli(fresh_project, "tune", VARIANT, "--write", "--output", str(output))
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line == f"error: --output {output}: cannot write: no directory {output.parent}"
    assert result.stdout == ""
    assert project_snapshot(fresh_project) == before


@pytest.mark.parametrize(
    ("command", "target"),
    [
        ("bench", "variants.toml"),
        ("bench", "templates/rmsnorm.wgsl.j2"),
        ("tune", "generated/rmsnorm.wgsl"),
        ("tune", ".doppler-gen/report.json"),
    ],
)
def test_a_report_is_never_written_over_the_project_s_own_files(
    fresh_project: Path, command: str, target: str
) -> None:
    """`--output variants.toml` replaced the config with JSON (exit 0); with `tune --write`
    after the winner had been recorded in it."""
    before = project_snapshot(fresh_project)
    result = run_cli(fresh_project, command, "rmsnorm", "--output", str(fresh_project / target))
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert "cannot write: it is the project's own" in line, line
    assert project_snapshot(fresh_project) == before


@pytest.mark.parametrize("option", ["--output", "--plot"])
def test_an_unwritable_bench_output_is_refused_before_measuring(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str
) -> None:
    def measure(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("bench measured although its report could not be written")

    monkeypatch.setattr("doppler_gen.bench.run_bench", measure)
    path = tmp_path / "no-such-directory" / "bench.out"
    result = run_cli(fresh_project, "bench", option, str(path))
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line == f"error: {option} {path}: cannot write: no directory {path.parent}"


def test_an_output_that_fails_late_still_prints_the_report(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writable when checked, gone when written: the report is printed, then one error line."""
    run = _synthetic_run(fresh_project, full_validation="PASS")
    output = tmp_path / "later" / "tune.json"
    output.parent.mkdir()

    def tune_then_lose_the_directory(*args: Any, **kwargs: Any) -> TuneRun:
        output.parent.rmdir()
        return run

    monkeypatch.setattr("doppler_gen.tune.run_tune", tune_then_lose_the_directory)
    result = run_cli(fresh_project, "tune", VARIANT, "--output", str(output), "--json")
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout)["variant"] == VARIANT  # one document: the report
    assert "cannot write" in assert_one_line_error(result.stderr)


def _no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench must refuse its --output before it measures anything."""

    def measure(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("bench measured although its report could not be written")

    monkeypatch.setattr("doppler_gen.bench.run_bench", measure)


def _character_device(path: Path) -> None:
    """A /dev/null node at ``path`` (needs root; skips otherwise)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root")


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        pytest.param(os.mkfifo, "a FIFO", id="fifo"),
        pytest.param(_character_device, "a character device", id="device"),
    ],
)
def test_an_output_that_is_not_a_regular_file_is_refused_before_measuring(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any, kind: str
) -> None:
    """`--output FIFO` (or a device, /dev/null as root) passed the W_OK check, and after the
    measurement the report's rename replaced the node by a regular file."""
    _no_measuring(monkeypatch)
    target = tmp_path / "node"
    make(target)
    result = run_cli(fresh_project, "bench", "--output", str(target))
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line == f"error: --output {target}: cannot write: it is {kind}, not a regular file"
    assert not stat.S_ISREG(target.lstat().st_mode)


def test_a_plot_may_go_to_a_device_or_a_pipe(tmp_path: Path) -> None:
    """matplotlib writes --plot in place, not by a rename: /dev/null and a FIFO are fine
    there (the --output refusals were applied to it too)."""
    from doppler_gen.cli import _check_writable

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (Path("/dev/null"), fifo, tmp_path / "new.png"):
        _check_writable("--plot", target, replaced=False)  # no error
    with pytest.raises(DopplerGenError, match="is a directory"):
        _check_writable("--plot", tmp_path, replaced=False)
    with pytest.raises(DopplerGenError, match="no directory"):
        _check_writable("--plot", tmp_path / "missing" / "x.png", replaced=False)


def test_an_output_in_a_directory_that_refuses_new_files_is_refused_before_measuring(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writable file in an immutable directory passed the permission checks and failed only
    at the rename, after the whole measurement; the probe file fails up front."""
    _no_measuring(monkeypatch)
    directory = tmp_path / "immutable"
    directory.mkdir()
    target = directory / "bench.json"
    target.write_text("{}\n")
    made = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {made.stderr.decode().strip()}")
    try:
        result = run_cli(fresh_project, "bench", "--output", str(target))
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line.startswith(f"error: --output {target}: cannot write: cannot create a file in ")
    assert target.read_text() == "{}\n"


def test_a_symlinked_output_is_written_through_and_stays_a_link(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report's rename used to replace the link itself by a regular file."""
    run = _synthetic_run(fresh_project, full_validation="PASS")
    monkeypatch.setattr("doppler_gen.tune.run_tune", lambda *args, **kwargs: run)
    real = tmp_path / "reports" / "tune.json"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    result = run_cli(fresh_project, "tune", VARIANT, "--output", str(link))
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text())["variant"] == VARIANT
