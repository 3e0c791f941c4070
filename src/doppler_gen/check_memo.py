"""A memo of the last clean `check`, so an unchanged tree is confirmed without re-rendering.

`check` runs in pre-commit hooks and CI on trees that are almost always clean. The memo is a
sha256 over *everything* the result depends on:
- variants.toml;
- what variants.toml, templates/ and generated/ are (file, directory, symlink, missing);
- every file under templates/ and generated/, with names and contents (an orphan or a hand edit
  changes it), and every symlink there (and variants.toml, if it is one) with its target text
  and the content of the file or directory it resolves to (a directory only inside the
  project). The renderer reads only files that resolve inside templates/ (``render``), so
  hashing the tree plus its links covers all it can read;
- the content of the code that renders: doppler-gen's own sources and the Jinja and MarkupSafe
  packages that Python imports (their files, not their version strings), and the Python version.

A clean full check is recorded only for the tree it compared: the digest is taken before
anything is read, every file and listing the check read (``observed``) must match what that
digest hashed, and a second digest afterwards must equal it (``remember_clean``).

When the digest equals the one stored after the last clean full check, the tree is clean by
construction. Any difference, or a missing or unreadable memo, means a full check. The memo lives
in the project's ``.doppler-gen/`` (``state``); it is safe to lose, and a full filesystem only
means no memo.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doppler_gen import observed
from doppler_gen.config import CONFIG_NAME, GENERATED_DIR, TEMPLATES_DIR
from doppler_gen.state import ensure_state_dir, read_state_file, state_dir, write_state_file

MEMO_NAME = "check-memo"
# the packages whose code shapes what `check` and `generate` produce
CODE_PACKAGES = ("doppler_gen", "jinja2", "markupsafe")


@dataclass
class Snapshot:
    """One digest of the tree, with the per-file hashes and listings it was made from.

    ``files`` maps the real path of every regular file hashed to its sha256, ``listings`` the
    real path of every directory walked to its entry names: `remember_clean` compares them with
    what the check read (``observed``).
    """

    digest: str
    files: dict[str, str] = field(default_factory=dict)
    listings: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class _Walk:
    """The state of one digest: the hash, what it covered, and the link targets already seen."""

    root: Path
    hash: Any = field(default_factory=hashlib.sha256)
    snapshot: Snapshot = field(default_factory=lambda: Snapshot(""))
    seen: set[Path] = field(default_factory=set)

    def entries(self, directory: Path, skip: tuple[str, ...] = ()) -> list[tuple[str, Path]]:
        """Every file and symlink under ``directory`` (links not followed), by relative name;
        directories named in ``skip`` are left out (``__pycache__`` of the code packages)."""
        found: list[tuple[str, Path]] = []
        if not directory.is_dir():
            return found
        for parent, dirnames, filenames in os.walk(directory):
            base = Path(parent)
            self.snapshot.listings[observed.real(base)] = tuple(sorted(dirnames + filenames))
            dirnames[:] = [d for d in dirnames if d not in skip]
            # os.walk lists a symlinked directory among dirnames without entering it: record it
            for name in [*dirnames, *filenames]:
                path = base / name
                if name in filenames or path.is_symlink():
                    found.append((path.relative_to(directory).as_posix(), path))
        return sorted(found)

    def update(self, label: str, name: str, path: Path) -> None:
        """Hash one entry by what it is; a symlink also by what it points at (`check` and
        `generate` read variants.toml, outputs and generated/doppler/ through links)."""
        kind, data = self.describe(path)
        self.hash.update(
            f"\0{label}-{kind}:{name}:{len(data)}\0".encode("utf-8", "surrogateescape")
        )
        self.hash.update(data)
        if kind == "link":
            self.update_target(f"{label}-link", name, path)

    def describe(self, path: Path) -> tuple[str, bytes]:
        """(kind, bytes to hash) of one path, never following a link and never blocking."""
        try:
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                return "link", os.fsencode(os.readlink(path))
            if stat.S_ISDIR(mode):
                return "directory", b""
            if not stat.S_ISREG(mode):  # a FIFO, socket or device: reading it could block
                return "special", b""
            data = path.read_bytes()
        except FileNotFoundError:
            return "missing", b""
        except OSError as exc:  # the full check that follows reports it properly
            return "unreadable", f"{exc.errno}".encode()
        self.snapshot.files[observed.real(path)] = hashlib.sha256(data).hexdigest()
        return "file", data

    def update_target(self, label: str, name: str, link: Path) -> None:
        """Hash the file or directory tree a symlink resolves to (once: links may form a cycle).

        A directory is walked only when it lies inside the project and does not contain the
        link: nothing doppler-gen reads can lie in a directory outside the project (templates
        must resolve inside templates/, generated/ and generated/doppler/ inside the project),
        and walking a link to ``/`` or ``/proc`` would never end.
        """
        try:
            target = link.resolve(strict=True)
        except (OSError, RuntimeError):  # dangling or a loop: the link text is hashed already
            return
        if target in self.seen:
            return
        self.seen.add(target)
        if not target.is_dir():
            self.update(f"{label}>", name, target)
            return
        inside = target.is_relative_to(self.root)
        inside = inside and not link.parent.resolve().is_relative_to(target)
        if not inside:
            self.hash.update(f"\0{label}>outside:{name}\0".encode("utf-8", "surrogateescape"))
            return
        self.update(f"{label}>", name, target)  # the directory itself (its listing, not a link)
        for sub, path in self.entries(target):
            self.update(f"{label}>", f"{name}/{sub}", path)


def _package_dir(name: str) -> Path | None:
    """Directory of the package ``name`` that is (or would be) imported; never imports it."""
    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec is not None else None
    return Path(origin).parent if origin else None


def snapshot(root: Path) -> Snapshot:
    """The digest of every input of generation and every output, with what it was made from.

    variants.toml, templates/ and generated/ are hashed by what they are (a file, a directory,
    a symlink with its target, missing), then everything under the two directories.
    """
    walk = _Walk(root.resolve())
    walk.hash.update(f"python {sys.version} {sys.implementation.cache_tag}\n".encode())
    for label in (CONFIG_NAME, TEMPLATES_DIR, GENERATED_DIR):
        top = root / label
        walk.update(label, label, top)
        if not top.is_symlink():  # a linked one was walked (or refused) as its target
            for name, path in walk.entries(top):
                walk.update(label, name, path)
    for package in CODE_PACKAGES:
        directory = _package_dir(package)
        if directory is None:
            walk.hash.update(f"\0{package}:missing\0".encode())
            continue
        for name, path in walk.entries(directory, skip=("__pycache__",)):
            if not name.endswith((".pyc", ".pyo")):
                walk.update(package, name, path)
    walk.snapshot.digest = walk.hash.hexdigest()
    return walk.snapshot


def tree_digest(root: Path) -> str:
    """sha256 over every input of generation and every output, with their relative names."""
    return snapshot(root).digest


def _memo_path(root: Path) -> Path:
    return state_dir(root) / MEMO_NAME


def is_known_clean(root: Path, digest: str) -> bool:
    """True when ``digest`` (of the tree now) is the one a full `check` found clean."""
    data = read_state_file(_memo_path(root), limit=256)
    return data is not None and data.strip() == digest.encode()


def remember_clean(root: Path, before: Snapshot, log: observed.ReadLog) -> bool:
    """Record the tree as clean, if what the check compared is exactly the tree ``before``.

    ``before`` was taken before the check read anything, and ``log`` holds what it read. The
    memo is saved only when
    - every file the check read had, at its real path, the bytes ``before`` hashed there (or
      was absent from it, when the check found it absent), and every directory it listed had
      the names ``before`` saw: a file changed while the check ran and changed back (A, B, A)
      differs here though both digests say A;
    - the tree hashed again now equals ``before``: nothing the check did not read changed.
    So the clean result recorded is about the tree the digest describes. Best effort: returns
    whether a memo was saved.
    """
    if not _read_what_was_hashed(before, log) or snapshot(root).digest != before.digest:
        forget(root)
        return False
    try:
        write_state_file(ensure_state_dir(root) / MEMO_NAME, before.digest + "\n")
    except OSError:
        return False
    return True


def _read_what_was_hashed(before: Snapshot, log: observed.ReadLog) -> bool:
    """Whether each read and listing in ``log`` agrees with the snapshot ``before``."""
    if log.inconsistent:
        return False
    for path, sha in log.files.items():
        if before.files.get(path, observed.ABSENT) != sha:
            return False
    for directory, entries in log.listings.items():
        if before.listings.get(directory) != tuple(name for name, _ in entries):
            return False
        for name, is_file in entries:
            if (observed.real(Path(directory, name)) in before.files) != is_file:
                return False
    return True


def forget(root: Path) -> None:
    """Delete the memo (after a failed check: a stale tree must never be confirmed)."""
    with contextlib.suppress(OSError):
        _memo_path(root).unlink(missing_ok=True)
