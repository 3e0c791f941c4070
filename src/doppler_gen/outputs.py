"""Render every variant in memory, then write or compare ``generated/``.

Third stage of the pipeline. Nothing touches the disk until every selected variant has rendered
and passed its metadata check, so a template error never leaves ``generated/`` half-updated. Files
are written atomically (temporary file + rename) and only when their content changed. A file in
``generated/`` that no variant produces is removed only if it carries our generated header: a
hand-written file there is never deleted.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

from doppler_gen.config import Project, Variant
from doppler_gen.errors import ConfigError
from doppler_gen.manifest import (
    MANIFEST_PATH,
    build_manifest,
    check_metadata,
    parse_kernel,
    variant_entry,
)
from doppler_gen.render import RenderedKernel, Renderer, is_generated_file


@dataclass
class Plan:
    """Everything ``generate`` would write: path (relative to root) -> content."""

    project: Project
    kernels: dict[str, RenderedKernel]  # by variant name, all variants
    files: dict[str, str]  # relative path -> expected text (selected kernels + manifest)
    full: bool  # every variant selected: orphans may be removed


@dataclass
class Status:
    """How ``generated/`` differs from the plan."""

    stale: dict[str, str] = field(default_factory=dict)  # path -> unified diff
    missing: list[str] = field(default_factory=list)
    orphaned: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.stale or self.missing or self.orphaned)


def select(project: Project, patterns: tuple[str, ...]) -> list[Variant]:
    """Variants matching any NAME or glob; an unmatched pattern is an error, not a no-op."""
    if not patterns:
        return list(project.variants)
    chosen: list[Variant] = []
    for pattern in patterns:
        matched = [v for v in project.variants if fnmatch.fnmatchcase(v.name, pattern)]
        if not matched:
            known = ", ".join(v.name for v in project.variants)
            raise ConfigError(f"no variant matches {pattern!r} (known: {known})")
        chosen.extend(v for v in matched if v not in chosen)
    return [v for v in project.variants if v in chosen]


def plan(
    project: Project, patterns: tuple[str, ...] = (), renderer: Renderer | None = None
) -> Plan:
    """Render all variants (the manifest needs all) and collect the files to write."""
    renderer = renderer or Renderer(project)
    selected = {v.name for v in select(project, patterns)}
    kernels: dict[str, RenderedKernel] = {}
    entries = {}
    for variant in project.variants:
        kernel = renderer.render(variant)
        module = parse_kernel(kernel)
        check_metadata(variant, module)
        kernels[variant.name] = kernel
        entries[variant.name] = variant_entry(kernel, module)
    files = {
        rendered.output: rendered.text
        for name, kernel in kernels.items()
        if name in selected
        for rendered in kernel.passes
    }
    files[MANIFEST_PATH] = build_manifest(entries)
    return Plan(project, kernels, files, full=len(selected) == len(project.variants))


def compare(plan: Plan) -> Status:
    """Compare the plan with the disk (never writes)."""
    status = Status()
    root = plan.project.root
    for relative, expected in sorted(plan.files.items()):
        path = root / relative
        try:
            # bytes, not text: text mode would read CRLF as LF and pass a file whose sha256
            # differs from the manifest's
            actual = path.read_bytes()
        except FileNotFoundError:
            status.missing.append(relative)
            continue
        except OSError:
            actual = b""
        if actual == expected.encode("utf-8"):
            status.unchanged.append(relative)
        else:
            shown = actual.decode("utf-8", errors="replace").replace("\r", "\\r")
            status.stale[relative] = unified_diff(relative, shown, expected)
    if plan.full:
        status.orphaned = orphans(plan)
    return status


def orphans(plan: Plan) -> list[str]:
    """Files in generated/ with our header that no variant produces."""
    directory = plan.project.generated_dir
    if not directory.is_dir():
        return []
    produced = {Path(p).name for p in plan.files}
    found = []
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name not in produced and is_generated_file(path):
            found.append(path.relative_to(plan.project.root).as_posix())
    return found


def unified_diff(relative: str, actual: str, expected: str) -> str:
    """What ``generate`` would change in ``relative``, as a unified diff."""
    import difflib  # only a stale file needs it; `check` on a clean tree stays lighter

    lines = difflib.unified_diff(
        actual.splitlines(keepends=True),
        expected.splitlines(keepends=True),
        fromfile=f"{relative} (on disk)",
        tofile=f"{relative} (generated)",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


@dataclass
class WriteResult:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def write(plan: Plan) -> WriteResult:
    """Apply the plan: atomic writes of changed files, removal of our orphans."""
    status = compare(plan)
    result = WriteResult(unchanged=status.unchanged)
    plan.project.generated_dir.mkdir(parents=True, exist_ok=True)
    for relative in sorted([*status.stale, *status.missing]):
        atomic_write(plan.project.root / relative, plan.files[relative])
        result.written.append(relative)
    for relative in status.orphaned:
        (plan.project.root / relative).unlink()
        result.removed.append(relative)
    return result


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and rename over the target."""
    import tempfile  # only writing needs it, not `check`

    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
