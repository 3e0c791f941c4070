"""The CLI's error contract: exit codes 0/1/2/3, one line per error, --debug, --json error
objects, --root after the subcommand, doctor without an adapter, a closed stdout pipe, shell
completion, name and encoding problems in variants.toml, and the bench caps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import (
    REPO_ROOT,
    assert_one_line_error,
    doppler_gen_command,
    edit,
    line_of,
    run_cli,
    snapshot,
)

from doppler_gen import cli as cli_module
from doppler_gen.cli import cli

# -- exit 3: internal errors ----------------------------------------------------------------------


def _crash(*_args: Any, **_kwargs: Any) -> Any:
    raise ValueError("planted bug\nsecond line")


def test_an_internal_error_exits_3_with_one_line(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("doppler_gen.listing.listing_rows", _crash)
    result = run_cli(fresh_project, "list")
    assert result.exit_code == 3
    line = assert_one_line_error(result.stderr)
    assert line == (
        "error: internal error (a bug in doppler-gen): ValueError: planted bug; "
        "rerun with --debug for the traceback"
    )
    assert result.stdout == ""


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setattr("doppler_gen.listing.listing_rows", _crash)
    args = ["--debug", "list"] if where == "before" else ["list", "--debug"]
    result = run_cli(fresh_project, *args)
    assert result.exit_code == 3
    assert "Traceback (most recent call last)" in result.stderr
    assert "ValueError: planted bug" in result.stderr
    assert result.stderr.rstrip("\n").splitlines()[-1] == (
        "error: internal error (a bug in doppler-gen): ValueError: planted bug"
    )


def test_an_internal_error_with_json_is_a_json_object(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("doppler_gen.listing.listing_rows", _crash)
    result = run_cli(fresh_project, "list", "--json")
    assert result.exit_code == 3
    document = json.loads(result.stdout)
    assert document == {
        "ok": False,
        "error": {
            "type": "InternalError",
            "message": "ValueError: planted bug",
            "location": None,
            "exit_code": 3,
        },
    }


def test_stale_is_1_config_is_2_crash_is_3_in_a_real_process(fresh_project: Path) -> None:
    """The codes as CI sees them (a separate process), not only through click's runner."""
    planted = (
        "import sys, doppler_gen.listing as listing\n"
        "listing.listing_rows = lambda *args: 1 / 0\n"
        f"sys.argv = ['doppler-gen', '--root', {str(fresh_project)!r}, 'list']\n"
        "from doppler_gen.cli import main\n"
        "main()\n"
    )
    crash = subprocess.run([sys.executable, "-c", planted], capture_output=True, text=True)
    assert crash.returncode == 3
    assert "ZeroDivisionError: division by zero" in assert_one_line_error(crash.stderr)
    command = doppler_gen_command()
    kernel = fresh_project / "generated/attention.wgsl"
    kernel.write_text(kernel.read_text(encoding="utf-8") + "// edit\n", encoding="utf-8")
    stale = subprocess.run(
        [*command, "check", "--root", str(fresh_project)], capture_output=True, text=True
    )
    assert stale.returncode == 1, stale.stderr
    (fresh_project / "variants.toml").write_text("[[variant]\n", encoding="utf-8")
    bad = subprocess.run(
        [*command, "check", "--root", str(fresh_project)], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert_one_line_error(bad.stderr)


# -- --json errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [("check", "--json"), ("list", "--json")])
def test_json_config_errors_are_a_json_object_on_stdout(
    fresh_project: Path, command: tuple[str, ...]
) -> None:
    (fresh_project / "variants.toml").write_text("[[variant]\n", encoding="utf-8")
    result = run_cli(fresh_project, *command)
    assert result.exit_code == 2
    assert_one_line_error(result.stderr)
    error = json.loads(result.stdout)["error"]
    assert error["type"] == "ConfigError" and error["location"].startswith("variants.toml:1")
    assert error["exit_code"] == 2


def test_json_usage_errors_are_a_json_object_on_stdout(fresh_project: Path) -> None:
    result = run_cli(fresh_project, "check", "--json", "--no-such-option")
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["error"]["type"] == "UsageError"
    assert "--no-such-option" in document["error"]["message"]


# -- usage errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("check", "--no-such-option"), "error: No such option '--no-such-option'."),
        (("--no-such-option", "check"), "error: No such option '--no-such-option'."),
        (("no-such-command",), "error: No such command 'no-such-command'."),
        (("validate", "--quick", "--large"), "error: tiers large and quick asked at once"),
        (("validate", "--quick", "--tier", "large"), "error: tiers large and quick asked at once"),
        (("validate", "--large", "--tier", "quick"), "error: tiers large and quick asked at once"),
        (("tune", "x", "--time-limit", "nan"), "error: Invalid value for '--time-limit': nan is"),
        (("tune", "x", "--time-limit", "inf"), "error: Invalid value for '--time-limit': inf is"),
        (("tune", "x", "--shape", "a", "--shape", "b"), "error: --shape given 2 times: tune"),
        (("bench", "--warmup", "-1"), "error: Invalid value for '--warmup': -1 is not in"),
    ],
)
def test_usage_errors_are_one_line(
    fresh_project: Path, args: tuple[str, ...], message: str
) -> None:
    """README: every error prints one line; click's own form is four (usage, hint, blank, error)."""
    result = run_cli(fresh_project, *args)
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert line.startswith(message) and line.endswith(" --help')"), line
    assert result.stdout == ""


def test_help_is_still_help() -> None:
    result = CliRunner().invoke(cli, ["check", "--help"], prog_name="doppler-gen")
    assert result.exit_code == 0 and result.stdout.startswith("Usage: doppler-gen check")


@pytest.mark.parametrize(("command", "how_often"), [("bench", "repeatable"), ("tune", "once")])
def test_shape_help_says_how_often_shape_may_be_given(command: str, how_often: str) -> None:
    result = CliRunner().invoke(cli, [command, "--help"], prog_name="doppler-gen")
    assert f"Shapes (--shape KIND[:key=value,...], {how_often};" in result.stdout


# -- control characters in what the user wrote --------------------------------------------------------


def test_a_newline_in_a_directory_name_stays_escaped(tmp_path: Path) -> None:
    root = tmp_path / "two\nlines"
    root.mkdir()
    result = run_cli(root, "check")
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert "two\\nlines/variants.toml: not found" in line, line


def test_a_newline_in_an_override_name_stays_escaped(fresh_project: Path) -> None:
    edit(
        fresh_project / "variants.toml",
        'name = "attention_f16kv"',
        'name = "attention_f16kv"\noverrides = { "A\\u001b[2J\\nB" = "x" }',
    )
    result = run_cli(fresh_project, "check")
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert "override A\\x1b[2J\\nB must be a number" in line, line


def test_a_newline_in_a_template_fail_message_stays_escaped(fresh_project: Path) -> None:
    edit(
        fresh_project / "templates/attention.wgsl.j2",
        "fn is_masked(",
        '{{ fail("first\\nsecond") }}\nfn is_masked(',
    )
    for command in ("generate", "check"):
        result = run_cli(fresh_project, command)
        assert result.exit_code == 2
        line = assert_one_line_error(result.stderr)
        assert "first\\nsecond (variant attention)" in line, line
    # the JSON object keeps the message as it is: JSON escapes it
    document = json.loads(run_cli(fresh_project, "check", "--json").stdout)
    assert "first\nsecond" in document["error"]["message"]


def test_a_malformed_completion_request_is_one_line(fresh_project: Path) -> None:
    environment = {
        "_DOPPLER_GEN_COMPLETE": "bash_complete",
        "COMP_WORDS": f"doppler-gen --root {fresh_project} show att",
        "COMP_CWORD": "not-a-number",
    }
    result = CliRunner().invoke(cli, [], prog_name="doppler-gen", env=environment)
    assert result.exit_code == 2, result.output
    assert "not-a-number" in assert_one_line_error(result.stderr)


# -- --root on every subcommand ---------------------------------------------------------------------

SUBCOMMANDS = ["generate", "check", "export", "list", "show", "validate", "doctor", "bench", "tune"]


def test_the_subcommand_list_is_every_subcommand() -> None:
    assert sorted(SUBCOMMANDS) == sorted(cli.commands)  # a new command must be listed above


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_accepts_root_and_debug(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--help"], prog_name="doppler-gen")
    assert result.exit_code == 0
    assert "--root" in result.output and "--debug" in result.output


def test_root_after_the_subcommand(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no variants.toml here or above
    runner = CliRunner()
    after = runner.invoke(cli, ["check", "--root", str(fresh_project)], prog_name="doppler-gen")
    assert after.exit_code == 0, after.stderr
    assert "up to date" in after.stdout
    listed = runner.invoke(
        cli, ["list", "--json", "--root", str(fresh_project)], prog_name="doppler-gen"
    )
    assert listed.exit_code == 0 and json.loads(listed.stdout)
    # the subcommand's --root wins over the group's
    both = runner.invoke(
        cli,
        ["--root", str(elsewhere), "show", "attention", "--raw", "--root", str(fresh_project)],
        prog_name="doppler-gen",
    )
    assert both.exit_code == 0
    assert both.stdout == (fresh_project / "generated/attention.wgsl").read_text()
    none = runner.invoke(cli, ["check"], prog_name="doppler-gen")
    assert none.exit_code == 2 and "no variants.toml found" in none.stderr


# -- doctor ---------------------------------------------------------------------------------------


class _NoAdapters:
    name = "wgpu"

    def version(self) -> str:
        return "wgpu (test double)"

    def adapters(self) -> list[Any]:
        return []


def test_doctor_without_any_adapter_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("doppler_gen.backends.get_backend", lambda name: _NoAdapters())
    result = CliRunner().invoke(cli, ["doctor", "--backend", "wgpu"], prog_name="doppler-gen")
    assert result.exit_code == 2
    assert "adapters:\n  none" in result.stdout
    line = assert_one_line_error(result.stderr)
    assert "no WebGPU adapter found" in line
    as_json = CliRunner().invoke(
        cli, ["doctor", "--backend", "wgpu", "--json"], prog_name="doppler-gen"
    )
    assert as_json.exit_code == 2
    assert json.loads(as_json.stdout)["ok"] is False


# -- a closed stdout pipe ---------------------------------------------------------------------------


def test_show_into_a_closed_pipe_exits_0_quietly(fresh_project: Path) -> None:
    """`doppler-gen show NAME | head -1`: the reader is gone before the writer finishes."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE: deterministic, unlike a real `head`
    try:
        process = subprocess.run(
            [*doppler_gen_command(), "--root", str(fresh_project), "show", "attention"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert process.returncode == 0
    assert process.stderr == ""


# -- shell completion -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (
            "show attention_decode_tiered_int8",
            {"attention_decode_tiered_int8_f16kv", "attention_decode_tiered_int8_f16kv_sg"},
        ),
        ("validate attention_f16", {"attention_f16", "attention_f16kv"}),
        ("tune attention_sm", {"attention_small_f16kv"}),
        ("generate attention_decode_tiered_f16k", {"attention_decode_tiered_f16kv"}),
    ],
)
def test_completion_offers_variant_names(
    fresh_project: Path, words: str, expected: set[str]
) -> None:
    for prefix in (f"doppler-gen --root {fresh_project}", "doppler-gen"):
        line = f"{prefix} {words}"
        if prefix == "doppler-gen":  # --root after the subcommand
            command, partial = words.split(" ")
            line = f"doppler-gen {command} --root {fresh_project} {partial}"
        environment = {
            "_DOPPLER_GEN_COMPLETE": "bash_complete",
            "COMP_WORDS": line,
            "COMP_CWORD": str(len(line.split(" ")) - 1),
        }
        result = CliRunner().invoke(cli, [], prog_name="doppler-gen", env=environment)
        assert result.exit_code == 0, result.output
        offered = {entry.split(",", 1)[1] for entry in result.stdout.splitlines()}
        assert offered == expected


# -- names and encodings in variants.toml ----------------------------------------------------------

F16KV_OUTPUT = 'output = "generated/attention_f16kv.wgsl"'


def _refused(root: Path, needle: str, message: str) -> None:
    before = snapshot(root / "generated")
    line = line_of((root / "variants.toml").read_text(encoding="utf-8"), needle)
    for command in ("generate", "check"):
        result = run_cli(root, command)
        assert result.exit_code == 2, (command, result.output)
        error = assert_one_line_error(result.stderr)
        assert error.startswith(f"error: variants.toml:{line}: "), error
        assert message in error, error
    assert snapshot(root / "generated") == before


def test_a_bom_gets_a_hint(fresh_project: Path) -> None:
    path = fresh_project / "variants.toml"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    result = run_cli(fresh_project, "generate")
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert line.startswith("error: variants.toml:1: ")
    assert "byte-order mark (BOM)" in line and "without BOM" in line


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (
            '"generated/.wgsl"',
            "has no file name (or a hidden one); use generated/attention_f16kv.wgsl",
        ),
        ('"generated/.attention_f16kv.wgsl"', "has no file name (or a hidden one)"),
        (
            '"generated/attention_kv.wgsl"',
            "must be generated/attention_f16kv.wgsl (named after the variant",
        ),
        ('"generated/attention_f16kv\\n.wgsl"', "contains a control character"),
        ('"generated/attentio\\u0301n_f16kv.wgsl"', "is not in Unicode NFC form"),
        ('"generated/attenti\\u00f3n_f16kv.wgsl"', "must be generated/attention_f16kv.wgsl"),
    ],
)
def test_output_names(fresh_project: Path, output: str, message: str) -> None:
    edit(fresh_project / "variants.toml", F16KV_OUTPUT, f"output = {output}")
    _refused(fresh_project, f"output = {output}", message)


def test_nfc_and_nfd_twins_cannot_both_be_outputs(fresh_project: Path) -> None:
    """Two spellings of one name on macOS: NFD is refused, so only one can ever be written."""
    edit(
        fresh_project / "variants.toml", F16KV_OUTPUT, 'output = "generated/caf\\u0065\\u0301.wgsl"'
    )
    _refused(fresh_project, "caf\\u0065\\u0301", "is not in Unicode NFC form")


@pytest.mark.parametrize(
    "name", ['"attention_f16kv\\n"', '"attention_f16kv\\nx"', '"attention_f16kv\\t"']
)
def test_a_newline_in_a_name_is_refused(fresh_project: Path, name: str) -> None:
    edit(fresh_project / "variants.toml", 'name = "attention_f16kv"', f"name = {name}")
    _refused(fresh_project, f"name = {name}", "name must match [a-z][a-z0-9_]*")


# -- bench caps -------------------------------------------------------------------------------------


def test_repeat_and_warmup_caps_agree_and_are_enforced() -> None:
    from doppler_gen.backends.base import MAX_PASSES_PER_COMMAND_BUFFER, warmup_batches
    from doppler_gen.errors import DopplerGenError
    from doppler_gen.runtime.measure import (
        DEFAULT_WARMUP_MS,
        MAX_REPEATS,
        MAX_WARMUP,
        MAX_WARMUP_MS,
        Settings,
    )

    assert (cli_module.MAX_REPEATS, cli_module.MAX_WARMUP) == (MAX_REPEATS, MAX_WARMUP)
    assert (cli_module.DEFAULT_WARMUP_MS, cli_module.MAX_WARMUP_MS) == (
        DEFAULT_WARMUP_MS,
        MAX_WARMUP_MS,
    )
    with pytest.raises(DopplerGenError, match="--warmup-ms 6000: 0 to 5000"):
        Settings(warmup_ms=6000)
    with pytest.raises(DopplerGenError, match="--warmup-ms -1"):
        Settings(warmup_ms=-1)
    with pytest.raises(DopplerGenError, match="at most 10000"):
        Settings(repeats=MAX_REPEATS + 1)
    with pytest.raises(DopplerGenError, match="at most 1000"):
        Settings(warmup=MAX_WARMUP + 1)
    assert warmup_batches(0) == []
    assert warmup_batches(5) == [5]
    batches = warmup_batches(MAX_WARMUP)
    assert sum(batches) == MAX_WARMUP
    assert max(batches) == MAX_PASSES_PER_COMMAND_BUFFER


@pytest.mark.parametrize(
    ("option", "value"), [("--warmup", "1000000000"), ("--repeats", "1000000"), ("--warmup", "-1")]
)
@pytest.mark.parametrize("command", ["bench", "tune"])
def test_huge_warmup_or_repeats_are_usage_errors(command: str, option: str, value: str) -> None:
    args = [command, *(["attention"] if command == "tune" else []), option, value]
    result = CliRunner().invoke(cli, args, prog_name="doppler-gen")
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.stderr


def test_duration_text() -> None:
    from doppler_gen.bench import duration_text

    assert [duration_text(s) for s in (0.44, 12.4, 210.0, 9000.0)] == [
        "0.4 s",
        "12 s",
        "3.5 min",
        "2.5 h",
    ]


def _cpu_adapter_problem() -> str | None:
    try:
        from doppler_gen.backends import get_backend, select_adapter
        from doppler_gen.errors import DopplerGenError

        adapter = select_adapter(get_backend("wgpu").adapters(), "cpu")
    except (DopplerGenError, ImportError, RuntimeError) as error:
        return f"no CPU WebGPU adapter: {error}"
    return None if adapter.is_cpu else "no CPU WebGPU adapter"


@pytest.mark.skipif(_cpu_adapter_problem() is not None, reason=str(_cpu_adapter_problem()))
def test_cpu_bench_estimates_its_duration_and_batches_warmups(fresh_project: Path) -> None:
    """More warm-ups than one command buffer holds, and the estimate lines on stderr."""
    result = run_cli(
        fresh_project,
        "bench",
        "attention_small_f16kv",
        "--adapter",
        "cpu",
        "--allow-cpu",
        "--warmup",
        "300",
        "--repeats",
        "20",
        "--copy-mib",
        "0",
        "--no-sdpa",
        "--shape",
        "decode:kv=8,h=2,kvh=1,d=8",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert "1 measurement(s) of 321 dispatches each (1 check + 300 warm-up + 20 timed)" in (
        result.stderr
    )
    assert "bench: estimated duration of this run: about " in result.stderr
    assert re.search(
        r"attention_small_f16kv on decode:kv=8,h=2,kvh=1,d=8: one dispatch took [\d.]+ \w+; "
        r"320 more take about",
        result.stderr,
    )
    rows = json.loads(result.stdout)["rows"]
    assert rows[0]["status"] == "ok" and rows[0]["timing"]["runs"] == 20


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (("show", "attention_f16kvv"), "(did you mean attention_f16kv, "),
        (("generate", "zzz*"), "(`doppler-gen list` shows the "),
    ],
)
def test_an_unknown_variant_gets_a_short_hint_not_every_name(
    fresh_project: Path, args: tuple[str, ...], hint: str
) -> None:
    """Every name on one line was some 3,000 characters."""
    result = run_cli(fresh_project, *args)
    assert result.exit_code == 2, result.output
    line = assert_one_line_error(result.stderr)
    assert hint in line and len(line) < 200, line


# -- standard output that cannot take the output --------------------------------------------------


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [("list",), ("check", "--json", "--full"), ("show", "rmsnorm")])
def test_a_full_stdout_is_an_environment_error_not_a_bug(args: tuple[str, ...]) -> None:
    """stdout on /dev/full (a full disk) was exit 3, "a bug in doppler-gen"."""
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [*doppler_gen_command(), "--root", str(REPO_ROOT), *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 2, result.stderr
    line = assert_one_line_error(result.stderr)
    assert line == "error: cannot write to standard output: No space left on device", line


def test_a_closed_stdout_is_refused_not_silently_empty() -> None:
    """`doppler-gen list >&-` printed nothing and exited 0."""
    result = subprocess.run(
        [*doppler_gen_command(), "--root", str(REPO_ROOT), "list"],
        stdout=None,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == "error: standard output is closed; nothing could be printed\n"


def test_ctrl_c_under_json_still_prints_a_json_document(
    fresh_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr("doppler_gen.outputs.plan", interrupted)
    result = run_cli(fresh_project, "check", "--json", "--full")
    assert result.exit_code == 130
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["error"]["type"] == "Interrupted"
    assert result.stderr == "interrupted\n"


def test_a_huge_value_echoed_back_is_cut_in_the_middle(fresh_project: Path) -> None:
    """A 100,000-character name made a 100 KB error line."""
    result = run_cli(fresh_project, "show", "x" * 100_000)
    assert result.exit_code == 2
    line = assert_one_line_error(result.stderr)
    assert len(line) < 1_100 and "characters left out" in line, len(line)
