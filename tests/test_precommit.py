"""The README's pre-commit configuration for a project in a subdirectory, run by the real
`pre-commit` tool, offline, in a throwaway git repository: clean passes, stale fails.

pre-commit is in the `dev` extra; where it is not installed, the test skips and says so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, copy_project, doppler_gen_command


def _pre_commit() -> list[str] | None:
    """How to run pre-commit here: the module next to this interpreter, else one on PATH."""
    probe = subprocess.run(
        [sys.executable, "-m", "pre_commit", "--version"], capture_output=True, check=False
    )
    if probe.returncode == 0:
        return [sys.executable, "-m", "pre_commit"]
    found = shutil.which("pre-commit")
    return [found] if found else None


PRE_COMMIT = _pre_commit()
needs_pre_commit = pytest.mark.skipif(
    PRE_COMMIT is None or shutil.which("git") is None,
    reason="pre-commit is not installed (pip install 'doppler-gen[dev]')"
    if PRE_COMMIT is None
    else "git is not installed",
)


def readme_config() -> str:
    """The YAML block between the pre-commit-subdirectory markers of README.md."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(
        r"<!-- pre-commit-subdirectory:start -->\s*```yaml\n(.*?)```\s*"
        r"<!-- pre-commit-subdirectory:end -->",
        text,
        re.S,
    )
    assert match, "README.md lost its pre-commit-subdirectory block"
    return match.group(1)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _run_hooks(repo: Path, home: Path) -> subprocess.CompletedProcess[str]:
    assert PRE_COMMIT is not None
    # the hook runs `doppler-gen` from PATH: the console script of this test run comes first
    script_dir = Path(doppler_gen_command()[0]).parent
    environment = {
        **os.environ,
        "PATH": f"{script_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PRE_COMMIT_HOME": str(home),
        "PRE_COMMIT_COLOR": "never",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    _git(repo, "add", "-A")
    return subprocess.run(
        [*PRE_COMMIT, "run", "--all-files"],
        cwd=repo,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@needs_pre_commit
def test_readme_hook_for_a_subdirectory_project(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    copy_project(repo / "kernels")
    (repo / ".pre-commit-config.yaml").write_text(readme_config(), encoding="utf-8")
    (repo / "README.txt").write_text("a repository whose kernels live in kernels/\n")
    _git(repo, "init", "-q")
    home = tmp_path / "pre-commit-home"
    # generated/ as the repository holds it may be stale on this branch: make it current first
    generate = subprocess.run(
        [*doppler_gen_command(), "generate", "--root", str(repo / "kernels")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert generate.returncode == 0, generate.stderr

    clean = _run_hooks(repo, home)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert re.search(r"doppler-gen check \(kernels/\)\.+Passed", clean.stdout), clean.stdout

    template = repo / "kernels/templates/attention.wgsl.j2"
    template.write_text(template.read_text(encoding="utf-8") + "// a change\n", encoding="utf-8")
    stale = _run_hooks(repo, home)
    assert stale.returncode == 1, stale.stdout + stale.stderr
    assert re.search(r"doppler-gen check \(kernels/\)\.+Failed", stale.stdout), stale.stdout
    assert "Skipped" not in stale.stdout
    assert "out of date" in stale.stdout and "fix with: doppler-gen generate" in stale.stdout
