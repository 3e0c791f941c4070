""".ci/setup's virtual environment on a fresh Debian machine, run against fake system tools
(apt-get, dpkg-query, python3 and the .venv they make): nothing is installed for real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

# Debian's python3 without python3-venv: `-m venv` makes .venv/bin/python, then fails for want
# of ensurepip (Debian's message), leaving a .venv without pip
PYTHON3 = """#!/bin/sh
case "$1 $2" in
    "-m ensurepip") [ -e "$STATE/python3-venv" ] ;;
    "--version ") echo "Python 3.11.2" ;;
    "-m venv")
        shift 2
        [ "$1" = --clear ] && { shift; rm -rf "$1"; }
        mkdir -p "$1/bin"
        cp "$STATE/venv-python" "$1/bin/python"
        if [ ! -e "$STATE/python3-venv" ]; then
            echo "The virtual environment was not created successfully because ensurepip is not"
            echo "available.  On Debian/Ubuntu systems, you need to install the python3-venv"
            exit 1
        fi
        touch "$1/pip"
        printf '#!/bin/sh\\necho "doppler-gen $*" >>"$STATE/log"\\n' >"$1/bin/doppler-gen"
        chmod +x "$1/bin/doppler-gen" ;;
    *) exit 2 ;;
esac
"""

VENV_PYTHON = """#!/bin/sh
if [ "$1 $2" = "-m pip" ]; then
    [ -e "$(dirname "$0")/../pip" ] || { echo "$0: No module named pip" >&2; exit 1; }
    echo "pip $3" >>"$STATE/log"
    exit 0
fi
exec "%s" "$@"
"""

TOOLS = {
    "python3": PYTHON3,
    "apt-get": '#!/bin/sh\necho "apt-get $*" >>"$STATE/log"\n'
    'case "$*" in *python3-venv*) touch "$STATE/python3-venv" ;; esac\n',
    "dpkg-query": "#!/bin/sh\necho 25.0.7-1\n",  # Mesa's lavapipe is there already
    "sudo": '#!/bin/sh\nexec "$@"\n',
}


def run_setup(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    if shutil.which("bash") is None:
        pytest.skip("bash is needed to run .ci/setup")
    tree = tmp_path / "tree"
    (tree / ".ci").mkdir(parents=True, exist_ok=True)
    for name in ("setup", "lavapipe-env"):
        shutil.copy(REPO_ROOT / ".ci" / name, tree / ".ci" / name)
    (tree / "generated").mkdir(exist_ok=True)
    (tree / "generated" / "manifest.json").write_text('{"variants": {}}\n')
    state = tmp_path / "state"
    tools = state / "bin"
    tools.mkdir(parents=True, exist_ok=True)
    for name, text in TOOLS.items():
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    (state / "venv-python").write_text(VENV_PYTHON % sys.executable)
    (state / "venv-python").chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", "STATE": str(state)}
    env.pop("PYTHON", None)
    return subprocess.run(
        ["bash", ".ci/setup"], cwd=tree, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_fresh_debian_without_python3_venv_gets_it(tmp_path: Path) -> None:
    """A fresh Debian 12 or 13 has no python3-venv: `python3 -m venv` failed half way."""
    result = run_setup(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    log = (tmp_path / "state" / "log").read_text().splitlines()
    assert "apt-get install -y -qq python3-venv" in log
    assert "pip install" in log and "doppler-gen doctor" in log


def test_a_venv_left_without_pip_by_a_failed_run_is_made_again(tmp_path: Path) -> None:
    """A .venv whose python exists but whose pip does not (an earlier `python3 -m venv` that
    failed) was kept, and every later run stopped at "No module named pip"."""
    venv_bin = tmp_path / "tree" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "python3-venv").touch()  # installed since
    (venv_bin / "python").write_text(VENV_PYTHON % sys.executable)
    (venv_bin / "python").chmod(0o755)
    result = run_setup(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== creating .venv" in result.stdout
    log = (tmp_path / "state" / "log").read_text().splitlines()
    assert not any("python3-venv" in line for line in log)
    assert "doppler-gen doctor" in log
