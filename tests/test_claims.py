"""tests/claims.py: pytest processes sharing one suite through ``--claim DIR`` (.ci/test)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

SUITE = """
import os, time
import pytest

LOG = os.environ["CLAIMS_LOG"]


def note(text):
    with open(LOG, "a") as handle:
        handle.write(f"{os.getpid()} {text}\\n")


@pytest.fixture(scope="module")
def shared():
    note("setup {module}")
    yield
    note("teardown {module}")


@pytest.mark.parametrize("n", range(12))
def test_one(shared, n):
    time.sleep(0.02 * (n % 3))
    note(f"ran {module}-{n}")
"""


def _suite(root: Path) -> None:
    for module in ("a", "b"):
        (root / f"test_{module}.py").write_text(SUITE.replace("{module}", module))


def _pytest(root: Path, claims: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "CLAIMS_LOG": str(root / "log.txt")}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "claims", "-p", "no:cacheprovider",
         "--claim", str(claims), *args],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_two_processes_run_every_test_once_and_keep_their_module_fixtures(tmp_path: Path) -> None:
    _suite(tmp_path)
    runs = [_pytest(tmp_path, tmp_path / "claims") for _ in range(2)]
    outputs = [run.communicate(timeout=120)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    lines = [line.split(" ", 1) for line in (tmp_path / "log.txt").read_text().splitlines()]
    ran = Counter(text for _, text in lines if text.startswith("ran "))
    assert ran == Counter({f"ran {m}-{n}": 1 for m in "ab" for n in range(12)})
    for pid in {pid for pid, _ in lines}:
        mine = [text for p, text in lines if p == pid]
        assert any(text.startswith("ran ") for text in mine), "a process ran nothing"
        # every setup is torn down, and a module's fixture is not set up again for each test
        setups = [t.split()[1] for t in mine if t.startswith("setup ")]
        assert sorted(setups) == sorted(t.split()[1] for t in mine if t.startswith("teardown "))
        assert len(setups) < sum(text.startswith("ran ") for text in mine)
    assert (tmp_path / "claims/collection").read_text().startswith("24 ")
    assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == sorted(
        ["collection", *(str(i) for i in range(24))]
    )


def test_a_process_that_collected_other_tests_stops_with_a_usage_error(tmp_path: Path) -> None:
    _suite(tmp_path)
    first = _pytest(tmp_path, tmp_path / "claims")
    assert first.communicate(timeout=120)[0] and first.returncode == 0
    other = _pytest(tmp_path, tmp_path / "claims", "-k", "test_one and 1")  # 6 of the 24
    output = other.communicate(timeout=120)[0]
    assert other.returncode == 4, output
    assert "another process collected different tests" in output


SLOW_SUITE = """
import os, time
import pytest


@pytest.mark.parametrize("n", range(4))
def test_slow(n):
    open(os.path.join(os.environ["STARTED"], str(os.getpid())), "w").close()
    time.sleep(60)
"""


def _ci_test_tree(root: Path, suite: str, python: str | None = None) -> Path:
    """`.ci/test` with a fake `.venv` (check passes; pytest is this one's) around ``suite``."""
    if shutil.which("bash") is None:
        pytest.skip("bash is needed to run .ci/test")
    (root / ".ci").mkdir()
    for name in ("test", "lavapipe-env"):
        shutil.copy(TESTS.parent / ".ci" / name, root / ".ci" / name)
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "doppler-gen").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "python").write_text(python or f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    tests = root / "tests"
    tests.mkdir()
    shutil.copy(TESTS / "claims.py", tests / "claims.py")
    (tests / "conftest.py").write_text('pytest_plugins = ["claims"]\n')
    (tests / "test_suite.py").write_text(suite)
    return tests


# a slice whose pytest starts only once another has made the claims directory (a loaded machine)
LATE_SLICE = """#!/bin/sh
for arg; do
    case "$arg" in --claim=*) dir="${arg#--claim=}" ;; esac
    [ "$previous" = --claim ] && dir="$arg"
    previous="$arg"
done
if ! mkdir "$FIRST" 2>/dev/null; then
    while [ ! -d "$dir" ]; do sleep 0.05; done
fi
exec "%s" "$@"
"""


def test_ci_test_a_slice_that_starts_after_another_made_the_claims_directory(
    tmp_path: Path,
) -> None:
    """pytest reads its arguments once before plugins load: `--claim DIR` then made DIR a path
    to test, and a slice that got there after another had created DIR stopped with "unrecognized
    arguments: --claim" (exit 4), so .ci/test failed at random on a busy machine."""
    tests = _ci_test_tree(tmp_path, SUITE.replace("{module}", "a"), LATE_SLICE % sys.executable)
    env = {**os.environ, "DOPPLER_GEN_TEST_SHARDS": "2", "PYTHONPATH": str(tests)}
    env |= {"CLAIMS_LOG": str(tmp_path / "log.txt"), "FIRST": str(tmp_path / "first")}
    result = subprocess.run(
        ["bash", ".ci/test"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== pytest: all 2 slices passed (12 tests between them)" in result.stdout


@pytest.mark.parametrize(
    ("signum", "to_group", "code"),
    [
        pytest.param(signal.SIGINT, True, 130, id="ctrl-c"),
        pytest.param(signal.SIGTERM, False, 143, id="sigterm-to-ci-test"),
    ],
)
def test_ci_test_stops_its_slices_on_ctrl_c_and_sigterm(
    tmp_path: Path, signum: int, to_group: bool, code: int
) -> None:
    """`.ci/test`'s slices are background jobs, which start with SIGINT ignored: Ctrl-C reached
    none of them, and a SIGINT or SIGTERM that ended .ci/test left them running, their logs
    deleted. Now each slice stops as one pytest does on Ctrl-C, saying where, and the logs are
    printed."""
    suite = _ci_test_tree(tmp_path, SLOW_SUITE)
    started = tmp_path / "started"
    started.mkdir()
    env = {**os.environ, "DOPPLER_GEN_TEST_SHARDS": "2", "STARTED": str(started)}
    env["PYTHONPATH"] = str(suite)
    process = subprocess.Popen(
        ["bash", ".ci/test"], cwd=tmp_path, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(started.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(started.iterdir())) == 2, "the slices did not start"
        (os.killpg if to_group else os.kill)(process.pid, signum)
        output = process.communicate(timeout=30)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == code, output
    assert output.count("test_suite.py:9: KeyboardInterrupt") == 2, output
    assert "all 2 slices passed" not in output
    assert f"== pytest: interrupted (exit {code})" in output


def test_a_sigint_that_breaks_into_the_handler_is_the_same_ctrl_c() -> None:
    """A Ctrl-C reaches a slice twice (the terminal's SIGINT and `.ci/test`'s). When the second
    broke into the handler before its first line had run, the inner call raised, and pytest
    reported the outer call's `def` line (tests/claims.py) as where the slice stopped, not the
    test: CI failed at random. The inner call now returns, and the outer raises once."""
    import claims

    handler = claims._Interrupt()
    inner: list[object] = []

    def second_sigint(frame: object, event: str, arg: object) -> None:
        # the handler's frame exists and no line of it has run: where a signal breaks in
        if event == "call" and frame.f_code is claims._Interrupt.__call__.__code__ and not inner:
            inner.append(handler(signal.SIGINT, frame))

    sys.settrace(second_sigint)
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            handler(signal.SIGINT, None)
    finally:
        sys.settrace(None)
    shown = [entry for entry in info.traceback if not entry.ishidden(info)]
    assert (
        shown[-1].frame.code.name == "test_a_sigint_that_breaks_into_the_handler_is_the_same_ctrl_c"
    )
    assert inner == [None]
