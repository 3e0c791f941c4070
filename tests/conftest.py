"""Shared fixtures and helpers for the generator tests.

Every test that writes works on a copy of the project (variants.toml, templates/, generated/) in
pytest's tmp_path, never on the repository itself: other work happens in the real tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from gpu_support import open_run_device

from doppler_gen.backends import get_backend
from doppler_gen.cli import cli
from doppler_gen.config import load_project
from doppler_gen.manifest import parse_kernel, variant_entry
from doppler_gen.render import Renderer

pytest_plugins = ["claims"]  # --claim DIR: slices that take tests one at a time (.ci/test)

REPO_ROOT = Path(__file__).resolve().parents[1]
# Split-KV overrides that deal a small case's keys to up to 8 splits of one key or more, so that
# the quick matrix exercises the partials' combine and the reduce pass (read-only: shared)
MANY_SPLITS = {"KV_SPLITS": 8, "MIN_SPLIT_KEYS": 1}
SHARED = REPO_ROOT.parent / "shared"
SEEDS = SHARED / "seeds" / "extracted"
SEEDS_MISSING = f"seed kernels not available ({SEEDS} is absent; it lives in ../shared)"

PROJECT_ESSENTIALS = ("variants.toml", "templates", "generated")


def copy_project(destination: Path) -> Path:
    """Copy the project essentials (no pyproject, no sources) into ``destination``."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_ESSENTIALS:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, destination / name)
        else:
            shutil.copy2(source, destination / name)
    return destination


def mesa_shader_cache_dir() -> str:
    """Where Mesa keeps compiled pipelines for this user: MESA_SHADER_CACHE_DIR, else the XDG
    cache directory (Mesa's own default)."""
    chosen = os.environ.get("MESA_SHADER_CACHE_DIR")
    if chosen:
        return chosen
    return os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")


@pytest.fixture(scope="session", autouse=True)
def _isolated_user_cache(tmp_path_factory: pytest.TempPathFactory):
    """doppler-gen keeps its state inside each project (.doppler-gen/); should anything write
    under XDG_CACHE_HOME again, it lands in a temporary directory, not in the user's home.

    Mesa's shader cache stays where it was: lavapipe spends most of this suite compiling
    pipelines (12 s for the largest kernel), and the kernels `.ci/setup` validated, or an
    earlier run compiled, need not compile again. The cache is keyed by the shader and the
    driver build, so a hit runs the same machine code."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MESA_SHADER_CACHE_DIR", mesa_shader_cache_dir())
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """A copy of the project essentials, as they are in the repository right now."""
    return copy_project(tmp_path / "project")


@pytest.fixture(scope="session")
def pristine_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One project copy per session, regenerated, so that the tests do not depend on the
    repository's generated/ being up to date. Read-only: use ``fresh_project`` to modify."""
    root = copy_project(tmp_path_factory.mktemp("pristine") / "project")
    result = run_cli(root, "generate")
    assert result.exit_code == 0, result.output + result.stderr
    return root


@pytest.fixture
def fresh_project(pristine_project: Path, tmp_path: Path) -> Path:
    """A private copy of the project whose generated/ is exactly what `generate` writes."""
    return Path(shutil.copytree(pristine_project, tmp_path / "project"))


def run_cli(root: Path, *args: str) -> Result:
    """Run `doppler-gen --root ROOT ARGS...` in-process; stdout and stderr stay separate."""
    runner = CliRunner()
    return runner.invoke(cli, ["--root", str(root), *args], prog_name="doppler-gen")


def doppler_gen_command() -> list[str]:
    """The real console script next to the running interpreter, else `python -m doppler_gen`."""
    script = Path(sys.executable).with_name("doppler-gen")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "doppler_gen"]


def run_process(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run doppler-gen as a separate process (exit codes and stderr as a user sees them)."""
    return subprocess.run(
        [*doppler_gen_command(), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (relative posix path -> bytes), hidden files included."""
    return {
        path.relative_to(directory).as_posix(): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def project_snapshot(root: Path) -> dict[str, bytes]:
    """``snapshot`` of a project without its ``.doppler-gen/`` state (memo, lock)."""
    return {
        name: data for name, data in snapshot(root).items() if not name.startswith(".doppler-gen/")
    }


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    """Replace ``old`` by ``new`` in a text file; the edit must apply (guards stale tests)."""
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not found in {path}"
    path.write_text(text.replace(old, new, count), encoding="utf-8")


def line_of(text: str, needle: str, occurrence: int = 0) -> int:
    """1-based number of the line holding the ``occurrence``-th match of ``needle`` (-1: last)."""
    hits = [number for number, line in enumerate(text.splitlines(), 1) if needle in line]
    assert hits, f"{needle!r} not found"
    return hits[occurrence]


def assert_one_line_error(stderr: str) -> str:
    """stderr is exactly one `error: ...` line without a traceback; returns that line."""
    assert stderr.endswith("\n"), repr(stderr)
    assert stderr.count("\n") == 1, f"expected one line on stderr, got:\n{stderr}"
    assert "Traceback" not in stderr
    assert stderr.startswith("error: "), stderr
    return stderr.rstrip("\n")


def representatives(project: Any) -> tuple[str, ...]:
    """One variant per (template, Q, K/V and cold formats): every kernel body, without the
    head-dim and tuning siblings that share it. The suite validates these where a test would
    otherwise take every variant (over three minutes on two cores each); `.ci/setup` validates
    every variant (`doppler-gen validate`), and `validate --backend all` compares them all."""
    chosen: dict[tuple[str, ...], str] = {}
    for variant in project.variants:
        chosen.setdefault(kernel_body(variant), variant.name)
    return tuple(chosen.values())


def kernel_body(variant: Any) -> tuple[str, ...]:
    """What tells kernel bodies apart: the template and the Q, K/V and cold formats (head-dim
    and tuning siblings share a body)."""
    return (
        variant.template.name,
        *(str(variant.params.get(p)) for p in ("q_dtype", "kv_dtype", "cold")),
    )


def render_variant(root: Path, name: str, params: dict | None = None) -> tuple[Any, dict]:
    """Variant ``name`` of the project at ``root`` rendered, with ``params`` over its own (a
    tuning or test configuration that needs no variants.toml entry), and its manifest entry."""
    project = load_project(root)
    variant = project.variant(name)
    if params:
        variant = replace(variant, params={**variant.params, **params})
    kernel = Renderer(project).render(variant)
    return kernel, variant_entry(kernel, parse_kernel(kernel))


def subgroup_device(names: Iterable[str]) -> Iterator[Any]:
    """The body of a module-scoped ``device`` fixture: a run device on the default adapter for
    the shipped variants ``names``; skips the module when the adapter offers no subgroups."""
    kernels = [render_variant(REPO_ROOT, name)[0] for name in names]
    dev = open_run_device(get_backend("wgpu"), kernels, None, "adapter")
    if "subgroups" not in dev.features:
        dev.close()
        pytest.skip("the adapter offers no subgroups")
    yield dev
    dev.close()


def subgroup_lanes(device: Any) -> int:
    """The subgroup width ``device`` gives a compute pipeline, measured (at least 4 lanes)."""
    from doppler_gen.runtime.session import subgroup_width

    width = subgroup_width(device)
    assert width is not None and width >= 4
    return width
