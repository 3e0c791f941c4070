"""Render every variant in memory, then write or compare ``generated/``.

Third stage of the pipeline. Nothing touches the disk until every selected variant has rendered
and passed its metadata check, so a template error never leaves ``generated/`` half-updated.

Writing is one transaction under the project's generate lock (``state.generate_lock``):
1. every changed file is written to a temporary file ``.NAME.xxxxxxxx.tmp`` next to its target;
2. each old file is hard-linked to a backup name of the same shape, then the temporary file is
   renamed over it; kernels first, then orphans are renamed to backup names, the manifest last;
3. on success the backups are deleted; on any failure (a full disk, a read-only or immutable
   file) every renamed file is put back from its backup, so the tree is all old or all new,
   and the error is one line.
Ctrl-C and SIGTERM are held while the transaction runs (``interrupts``): one that landed
between a rename and the record of it could leave that file new and the rest old. They act
once the tree is all new (or, after a failure, all old). A process killed with SIGKILL can
still stop between two renames; every file is then its old or its new version, and the backups
are still there: `check` names the stale files and reports the temporary files
(``leftovers``) as the sign of an interrupted run, and the next `generate` finishes the job
and deletes them.

A file in ``generated/`` that no variant produces is removed only when it is a ``*.wgsl`` file
whose bytes are exactly what the manifest records doppler-gen wrote at that path. Any other file
that carries the generated header (a hand-edited copy) makes `generate` refuse, naming it; files
without the header are the user's and never touched.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doppler_gen import observed
from doppler_gen.bytecode import EDITED_PACKAGES, running_code_is_on_disk
from doppler_gen.config import (
    CONFIG_NAME,
    GENERATED_DIR,
    Project,
    Variant,
    read_config,
    universal_newlines,
)
from doppler_gen.errors import (
    ConfigError,
    DopplerGenError,
    InterfaceError,
    file_kind,
    printable_lines,
)
from doppler_gen.export import EXPORT_DIR, export_files, orphaned_exports
from doppler_gen.interrupts import deferred_signals
from doppler_gen.manifest import (
    MANIFEST_PATH,
    build_manifest,
    check_metadata,
    parse_kernel,
    variant_entry,
    well_formed_entry,
)
from doppler_gen.render import RenderedKernel, Renderer, is_generated_file
from doppler_gen.state import generate_lock

# ".NAME.xxxxxxxx.tmp": tempfile.mkstemp's names, and the backups of a transaction
_TEMP_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789_"
LEFTOVER_RE = re.compile(r"^\.(?P<name>.+\.(?:wgsl|json))\.[a-z0-9_]{8}\.tmp\Z")


class OutputError(DopplerGenError):
    """generated/ cannot be read or written as required (exit 2, nothing changed)."""


@dataclass
class Plan:
    """Everything ``generate`` would write: path (relative to root) -> content."""

    project: Project
    kernels: dict[str, RenderedKernel]  # by variant name, all variants
    files: dict[str, str]  # relative path -> expected text (selected kernels + manifest)
    full: bool  # every variant selected: orphans may be removed
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # manifest entries, all
    selected: tuple[str, ...] = ()  # names of the selected variants
    renderer: Renderer | None = None  # what rendered it, with the template texts it read


@dataclass
class Status:
    """How ``generated/`` differs from the plan."""

    stale: dict[str, str] = field(default_factory=dict)  # path -> unified diff ("" unless asked)
    missing: list[str] = field(default_factory=list)
    orphaned: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)  # temporary files of an interrupted run
    foreign: list[str] = field(default_factory=list)  # orphans generate will not remove

    @property
    def clean(self) -> bool:
        return not (self.stale or self.missing or self.orphaned or self.leftovers)


def select(project: Project, patterns: tuple[str, ...]) -> list[Variant]:
    """Variants matching any NAME or glob; an unmatched pattern is an error, not a no-op."""
    if not patterns:
        return list(project.variants)
    chosen: list[Variant] = []
    for pattern in patterns:
        matched = [v for v in project.variants if fnmatch.fnmatchcase(v.name, pattern)]
        if not matched:
            raise ConfigError(f"no variant matches {pattern!r} ({project.name_hint(pattern)})")
        chosen.extend(v for v in matched if v not in chosen)
    return [v for v in project.variants if v in chosen]


def plan(
    project: Project, patterns: tuple[str, ...] = (), renderer: Renderer | None = None
) -> Plan:
    """Render all variants (the manifest needs all) and collect the files to write."""
    renderer = renderer or Renderer(project)
    selected = tuple(v.name for v in select(project, patterns))
    kernels: dict[str, RenderedKernel] = {}
    entries = {}
    for variant in project.variants:
        kernel = renderer.render(variant)
        try:
            module = parse_kernel(kernel)
        except InterfaceError:  # render again with the source map: the error's template line
            module = parse_kernel(renderer.render(variant, with_origins=True))
        check_metadata(variant, module)
        kernels[variant.name] = kernel
        entries[variant.name] = variant_entry(kernel, module)
        _check_family_constraints(variant, entries[variant.name])
    files = {
        rendered.output: rendered.text
        for name, kernel in kernels.items()
        if name in selected
        for rendered in kernel.passes
    }
    full = len(selected) == len(project.variants)
    result = Plan(project, kernels, files, full, entries, selected, renderer)
    files[MANIFEST_PATH] = build_manifest(entries) if full else partial_manifest(result)
    files.update(plan_exports(result))
    running_code_is_on_disk(EDITED_PACKAGES)  # what rendered is what the sources say
    return result


def _check_family_constraints(variant: Variant, entry: dict[str, Any]) -> None:
    """A variant's override values meet its family's constraints, the ones `tune` prunes its
    candidates by (``Family.constraints``): rmsnorm with WORKGROUP_SIZE = 512 over its
    256-slot reduction once generated, then failed validation by its numbers alone."""
    if not variant.overrides:
        return
    from doppler_gen.families import get_family

    # an override without a default has no value here (the host supplies one): not a constant
    constants = {
        o["name"]: o["default"]
        for p in entry["passes"]
        for o in p["overrides"]
        if o["default"] is not None
    }
    constants.update(variant.overrides)
    unmet = get_family(entry["family"]).constraints(entry, constants)
    if unmet:
        named = [name for name in variant.overrides if re.search(rf"\b{re.escape(name)}\b", unmet)]
        line = variant.override_lines.get(named[0], variant.line) if named else variant.line
        raise ConfigError(
            f"variant {variant.name!r}: {unmet} (a constraint of the {entry['family']} family)",
            location=f"{CONFIG_NAME}:{line}" if line else CONFIG_NAME,
        )


def plan_exports(plan: Plan) -> dict[str, str]:
    """generated/doppler/: Doppler's registry fragment and digests, from the same entries as the
    manifest. After a partial `generate NAME`, the variants not selected keep the entries and
    the kernel text on disk (what the host will load), like the partial manifest."""
    if plan.full:
        entries = plan.entries
        texts = {r.output: r.text for k in plan.kernels.values() for r in k.passes}
    else:
        entries = dict(_recorded_entries(plan.project))
        entries.update({name: plan.entries[name] for name in plan.selected})
        texts = {}
        for name, kernel in plan.kernels.items():
            for rendered in kernel.passes:
                keep = name not in plan.selected
                on_disk = _read_text(plan.project.root, rendered.output) if keep else None
                texts[rendered.output] = rendered.text if on_disk is None else on_disk
    return export_files(entries, texts)


def _read_text(root: Path, relative: str) -> str | None:
    try:
        return observed.read_capped(root / relative).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def partial_manifest(plan: Plan) -> str:
    """The manifest after writing only the selected variants: the one on disk, with only the
    entries of the selected variants replaced. The others keep the sha256 (and the rest) of
    what was last written for them, since their files are not touched."""
    entries = dict(_recorded_entries(plan.project))
    _refuse_unrecorded(plan, entries)
    entries.update({name: plan.entries[name] for name in plan.selected})
    return build_manifest(entries)


def _refuse_unrecorded(plan: Plan, recorded: dict[str, dict[str, Any]]) -> None:
    """A partial generate takes every other variant's entry from the manifest on disk; one
    without a usable entry (a missing, unreadable or damaged manifest, a variant never
    generated) would silently drop out of the manifest and the export: refuse instead."""
    absent = [v.name for v in plan.project.variants if v.name not in plan.selected]
    absent = [name for name in absent if name not in recorded]
    if absent:
        raise OutputError(
            f"no usable entry for {len(absent)} variant(s) not named ({absent[0]}"
            f"{', ...' if len(absent) > 1 else ''}), which a partial generate keeps from it; "
            "run `doppler-gen generate` without names to rebuild it",
            location=MANIFEST_PATH,
        )


def _recorded_entries(project: Project) -> dict[str, dict[str, Any]]:
    """The variant entries of the manifest on disk ({} when it is missing or unreadable).

    An entry without the shape doppler-gen writes (hand-edited, damaged) counts as absent, as
    does a document nested too deeply for the JSON decoder: `check` then reports the manifest
    stale and `generate` rewrites it.
    """
    path = project.root / MANIFEST_PATH
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            observed.missing(path)
            return {}
        document = json.loads(observed.read_bytes(path).decode("utf-8"))
    except OSError:
        observed.missing(path)  # the verdict rests on there being no manifest to read
        return {}
    except (ValueError, RecursionError):
        return {}
    variants = document.get("variants") if isinstance(document, dict) else None
    if not isinstance(variants, dict):
        return {}
    return {name: entry for name, entry in variants.items() if well_formed_entry(entry)}


def generated_directory(project: Project) -> Path:
    """generated/, after refusing one that is not a directory or lies outside the project.

    A missing generated/ is fine (everything is missing; `generate` creates it). One that
    cannot be searched (mode 000, say) is one error line: the questions below raise
    PermissionError for what lies in it.
    """
    try:
        return _generated_directory(project)
    except OSError as exc:
        where = GENERATED_DIR
        with contextlib.suppress(ValueError, TypeError):
            where = Path(exc.filename).relative_to(project.root).as_posix()
        raise OutputError(f"cannot inspect: {exc.strerror or exc}", location=where) from None


def _generated_directory(project: Project) -> Path:
    directory = project.generated_dir
    if directory.is_symlink() and not directory.exists():
        target = os.readlink(directory)
        raise OutputError(f"is a symlink to {target}, which does not exist", location=GENERATED_DIR)
    if directory.exists() and not directory.is_dir():
        raise OutputError(
            f"exists but is not a directory ({_kind(directory)})", location=GENERATED_DIR
        )
    _refuse_outside(project, directory, GENERATED_DIR)
    export = project.root / EXPORT_DIR
    if export.is_symlink() and not export.exists():
        raise OutputError(
            f"is a symlink to {os.readlink(export)}, which does not exist", location=EXPORT_DIR
        )
    if export.exists() and not export.is_dir():
        raise OutputError(f"exists but is not a directory ({_kind(export)})", location=EXPORT_DIR)
    # generated/doppler/ is written and cleaned like generated/: the same containment rule
    _refuse_outside(project, export, EXPORT_DIR)
    return directory


def _refuse_outside(project: Project, directory: Path, location: str) -> None:
    """Refuse a directory that resolves (through symlinks) outside the project root."""
    if directory.exists():
        resolved, root = directory.resolve(), project.root.resolve()
        if not resolved.is_relative_to(root):
            raise OutputError(
                f"resolves to {resolved}, outside the project root {root}: doppler-gen refuses "
                "to write or remove files there",
                location=location,
            )


def _kind(path: Path) -> str:
    """What a non-regular file is, in words."""
    return file_kind(path.stat().st_mode)


# What read_output gives for a file past observed.READ_LIMIT: unequal to every file doppler-gen
# writes (each starts with its header or `{`), and shown as such in a diff
OVERSIZED = f"<larger than {observed.READ_LIMIT >> 20} MiB: not read>\n".encode()


def read_output(root: Path, relative: str) -> bytes | None:
    """The bytes of an output file; None when missing. Refuses anything but a regular file
    (reading a FIFO would block forever; a directory cannot be replaced)."""
    path = root / relative
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise OutputError(
                f"is {_kind(path)}, not a regular file: doppler-gen refuses to read or replace it",
                location=relative,
            )
        # bytes, not text: text mode would read CRLF as LF and pass a file whose sha256
        # differs from the manifest's
        return observed.read_bytes(path)
    except FileNotFoundError:
        observed.missing(path)
        return None
    except observed.TooLarge:
        return OVERSIZED  # stale (generate replaces it), and no orphan doppler-gen wrote
    except OSError as exc:
        raise OutputError(f"cannot read: {exc.strerror or exc}", location=relative) from None


def compare(plan: Plan, *, diffs: bool = False) -> Status:
    """Compare the plan with the disk (never writes).

    ``diffs`` fills ``stale`` with unified diffs, for a caller that shows them (`check`).
    Otherwise each stale path maps to "": difflib is quadratic in the lines that changed, and a
    change to a shared macro makes every kernel stale, so `generate` and the stale-tree refusal
    would spend seconds on diffs nobody reads.
    """
    status = Status()
    root = plan.project.root
    generated_directory(plan.project)
    for relative, expected in sorted(plan.files.items()):
        actual = read_output(root, relative)
        if actual is None:
            status.missing.append(relative)
        elif actual == expected.encode("utf-8"):
            status.unchanged.append(relative)
        else:
            status.stale[relative] = ""
            if diffs:  # control characters escaped: a terminal shows them, never obeys them
                shown = printable_lines(actual.decode("utf-8", errors="replace"))
                status.stale[relative] = unified_diff(relative, shown, printable_lines(expected))
    status.leftovers = leftovers(plan.project)
    if plan.full:
        # generated/doppler/: only JSON files doppler-gen wrote (`generator` key) count
        status.orphaned = orphans(plan) + orphaned_exports(root, plan.files)
        status.foreign = foreign_orphans(plan, status.orphaned)
    return status


def _top_level_files(project: Project) -> list[Path]:
    return _files_in(project.generated_dir, GENERATED_DIR)  # [] when there is no directory


def _export_files(project: Project) -> list[Path]:
    directory = project.root / EXPORT_DIR
    if observed.is_symlink(directory):
        return []
    return _files_in(directory, EXPORT_DIR)


def _files_in(directory: Path, location: str) -> list[Path]:
    """The regular files in a directory of outputs; one error line when it cannot be listed."""
    try:
        return observed.regular_files(directory)
    except OSError as exc:
        raise OutputError(f"cannot list: {exc.strerror or exc}", location=location) from None


def leftovers(project: Project) -> list[str]:
    """Temporary files (``.NAME.xxxxxxxx.tmp``) that an interrupted `generate` left behind."""
    return [
        path.relative_to(project.root).as_posix()
        for path in [*_top_level_files(project), *_export_files(project)]
        if LEFTOVER_RE.match(path.name)
    ]


def orphans(plan: Plan) -> list[str]:
    """Files in generated/ with our header that no variant produces."""
    produced = {Path(p).name for p in plan.files}
    return [
        path.relative_to(plan.project.root).as_posix()
        for path in _top_level_files(plan.project)
        if path.name not in produced
        and not LEFTOVER_RE.match(path.name)
        and is_generated_file(path)
    ]


def foreign_orphans(plan: Plan, orphaned: list[str]) -> list[str]:
    """The orphans that are not doppler-gen's to delete.

    Deletable: a non-hidden ``*.wgsl`` whose sha256 is what the manifest on disk records for a
    variant written at that path. A hand-edited copy, a renamed file, a ``notes.txt`` or a
    hidden file that merely starts with the header is not. Nor is an orphan in
    generated/doppler/: the manifest records no sha256 for the export, so a JSON file there that
    says ``"generator": "doppler-gen"`` may be a hand-made copy (``registry.backup.json``).
    """
    recorded = {
        (record["file"], record["sha256"])
        for entry in _recorded_entries(plan.project).values()  # well-formed ones only
        for record in [entry, *(entry.get("passes") or [])]
        if isinstance(record.get("file"), str) and isinstance(record.get("sha256"), str)
    }
    foreign = []
    for relative in orphaned:
        name = Path(relative).name
        data = read_output(plan.project.root, relative) or b""
        ours = (relative, hashlib.sha256(data).hexdigest()) in recorded
        if not (ours and name.endswith(".wgsl") and not name.startswith(".")):
            foreign.append(relative)
    return foreign


def removable_orphans(plan: Plan, orphaned: list[str]) -> list[str]:
    """The orphans `generate` may delete; refuses (one line, listing them) if any other is left."""
    refused = foreign_orphans(plan, orphaned)
    if refused:
        raise OutputError(
            f"{len(refused)} file(s) are marked as generated, but no variant produces them "
            f"and they are not what doppler-gen wrote there: {', '.join(refused)}; move or "
            "delete them, then run `doppler-gen generate` again",
            location=f"{GENERATED_DIR}/",
        )
    return list(orphaned)


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
    cleaned: list[str] = field(default_factory=list)  # leftovers of an interrupted run


def write(plan: Plan) -> WriteResult:
    """Apply the plan under the project lock: one all-or-nothing transaction (module doc)."""
    project = plan.project
    first = compare(plan)
    if first.clean:  # nothing to write: no lock needed (a read-only checkout stays fine)
        return WriteResult(unchanged=first.unchanged)
    with generate_lock(project.root):
        _refuse_changed_inputs(plan)
        if not plan.full:  # what the manifest on disk says now, not when rendering began
            plan.files[MANIFEST_PATH] = partial_manifest(plan)
            plan.files.update(plan_exports(plan))
        status = compare(plan)
        removals = removable_orphans(plan, status.orphaned)
        changed = sorted([*status.stale, *status.missing])
        created = _ensure_directory(project) if changed else False
        try:
            Transaction(project.root).run({r: plan.files[r] for r in changed}, removals)
        except BaseException:
            if created:
                with contextlib.suppress(OSError):
                    project.generated_dir.rmdir()
            raise
        cleaned = [r for r in status.leftovers if _unlink(project.root / r)]
    return WriteResult(
        written=changed, unchanged=status.unchanged, removed=removals, cleaned=cleaned
    )


def _refuse_changed_inputs(plan: Plan) -> None:
    """Refuse to write a plan whose inputs changed after it was rendered: it was rendered
    before the lock was taken, and another `generate` or `tune --write` may have written a newer
    variants.toml and its outputs while this one waited. Writing then would replace those
    outputs with ones rendered from the old text, and report success on a stale tree."""
    project = plan.project
    changed = None
    if project.config_text:
        try:
            now = read_config(project.root, newline=None)
        except ConfigError:
            now = None
        if now != universal_newlines(project.config_text):
            changed = CONFIG_NAME
    if changed is None and plan.renderer is not None:
        changed = plan.renderer.changed_source()
    if changed is not None:
        raise OutputError(
            "changed after this generate read it (another generate or an edit while it "
            "rendered); nothing written: run `doppler-gen generate` again",
            location=changed,
        )


def _ensure_directory(project: Project) -> bool:
    """Create generated/ if missing; True when this call created it."""
    if project.generated_dir.is_dir():
        return False
    try:
        project.generated_dir.mkdir(parents=True)
    except OSError as exc:
        raise OutputError(
            f"cannot create the directory: {exc.strerror or exc}", location=GENERATED_DIR
        ) from None
    return True


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError:
        return False
    return True


class Transaction:
    """Replace and remove files so that, whatever fails, all of it or none of it happened."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.staged: dict[Path, Path] = {}  # target -> its new content, in a temporary file
        self.undo: list[tuple[Path, Path | bytes | None]] = []  # target -> old state, in order
        self.backups: list[Path] = []

    def run(self, changes: dict[str, str], removals: list[str]) -> None:
        """Write ``changes`` (relative path -> text) and delete ``removals``; one-line errors.

        The manifest is replaced last, after the orphans are gone: until then the manifest on
        disk still records every orphan, so a run killed half-way leaves orphans that the next
        run may remove.
        """
        with deferred_signals():  # a Ctrl-C between a rename and its undo record: module doc
            self._run(changes, removals)

    def _run(self, changes: dict[str, str], removals: list[str]) -> None:
        current = ""
        kernels = [r for r in changes if r != MANIFEST_PATH]
        steps = [
            *((self._replace, r) for r in kernels),
            *((self._remove, r) for r in removals),
            *((self._replace, r) for r in changes if r == MANIFEST_PATH),
        ]
        try:
            for relative, text in changes.items():
                # a temporary file is created in the directory: a failure there (immutable,
                # read-only, full) is the directory's, not the file's it was for
                current = f"{Path(relative).parent.as_posix()}/"
                self.staged[self.root / relative] = stage(self.root / relative, text)
            for step, relative in steps:
                current = relative
                step(self.root / relative)
        except BaseException as exc:
            problems = self._rollback()
            if not isinstance(exc, OSError):
                raise
            reason = exc.strerror or str(exc)
            undone = "nothing was changed" if not problems else f"COULD NOT RESTORE {problems}"
            raise OutputError(f"cannot write: {reason}; {undone}", location=current) from None
        for backup in self.backups:
            _unlink(backup)

    def _replace(self, target: Path) -> None:
        backup = self._backup(target)
        os.replace(self.staged[target], target)  # atomic: if it fails, nothing changed
        del self.staged[target]
        self.undo.append((target, backup))

    def _remove(self, target: Path) -> None:
        backup = _spare_name(target)
        os.replace(target, backup)
        self.backups.append(backup)
        self.undo.append((target, backup))

    def _backup(self, target: Path) -> Path | bytes | None:
        """A hard link to the old file (no data copied, so no space needed), else its bytes."""
        if not os.path.lexists(target):
            return None
        backup = _spare_name(target)
        try:
            os.link(target, backup, follow_symlinks=False)  # a symlink stays a symlink
        except OSError:
            return target.read_bytes()
        self.backups.append(backup)
        return backup

    def _rollback(self) -> str:
        """Undo in reverse order; returns the paths that could not be restored (or "")."""
        failed = []
        for target, old in reversed(self.undo):
            try:
                if old is None:
                    target.unlink(missing_ok=True)
                elif isinstance(old, Path):
                    os.replace(old, target)
                else:
                    os.replace(stage(target, old), target)
            except OSError:
                failed.append(str(target.relative_to(self.root)))
        for temporary in [*self.staged.values(), *self.backups]:
            _unlink(temporary)
        return ", ".join(failed)


def _spare_name(target: Path) -> Path:
    """An unused ``.NAME.xxxxxxxx.tmp`` next to ``target``."""
    while True:
        token = "".join(secrets.choice(_TEMP_ALPHABET) for _ in range(8))
        candidate = target.with_name(f".{target.name}.{token}.tmp")
        if not candidate.exists() and not candidate.is_symlink():
            return candidate


def stage(path: Path, content: str | bytes, *, make_parent: bool = True) -> Path:
    """Write ``content`` to a new temporary file next to ``path``; returns its path."""
    import tempfile  # only writing needs it, not `check`

    # generated/doppler/ is created on first use (an empty one left by a rollback is harmless)
    if make_parent:
        path.parent.mkdir(exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.chmod(temporary, 0o644)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return Path(temporary)


def atomic_write(path: Path, text: str, *, make_parent: bool = True) -> None:
    """Write via a temporary file in the same directory and rename over the target (signals
    held until the temporary file is renamed or gone)."""
    with deferred_signals():
        temporary = stage(path, text, make_parent=make_parent)
        try:
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
