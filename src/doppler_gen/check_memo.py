"""A memo of the last clean `check`, so an unchanged tree is confirmed without re-rendering.

`check` runs in pre-commit hooks and CI on trees that are almost always clean. The memo is a
sha256 over *everything* the result depends on:
- variants.toml;
- every file under templates/ and generated/, with names and contents (an orphan or a hand edit
  changes it), and every symlink there (and variants.toml, if it is one) with its target text
  and the content of the file or directory it resolves to. The renderer reads only files that
  resolve inside templates/ (``render``), so hashing the tree plus its links covers all it can
  read;
- the content of the code that renders: doppler-gen's own sources and the Jinja and MarkupSafe
  packages that Python imports (their files, not their version strings), and the Python version.

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
import sys
from pathlib import Path
from typing import Any

from doppler_gen.config import CONFIG_NAME, GENERATED_DIR, TEMPLATES_DIR
from doppler_gen.state import ensure_state_dir, state_dir

MEMO_NAME = "check-memo"
# the packages whose code shapes what `check` and `generate` produce
CODE_PACKAGES = ("doppler_gen", "jinja2", "markupsafe")


def _entries(directory: Path) -> list[tuple[str, Path]]:
    """Every file and symlink under ``directory`` (links not followed), by relative name."""
    found: list[tuple[str, Path]] = []
    if not directory.is_dir():
        return found
    for parent, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        base = Path(parent)
        # os.walk lists a symlinked directory among dirnames without entering it: record it
        for name in [*dirnames, *filenames]:
            path = base / name
            if name in filenames or path.is_symlink():
                found.append((path.relative_to(directory).as_posix(), path))
    return sorted(found)


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


def _update(digest: Any, label: str, name: str, path: Path, seen: set[Path]) -> None:
    """Hash one entry; a symlink also by what it points at (`check` and `generate` read
    variants.toml, outputs and generated/doppler/ through links)."""
    link = path.is_symlink()
    try:
        if link:
            data = os.readlink(path).encode("utf-8", "surrogateescape")
            label = f"{label}-link"
        elif path.is_file():
            data = path.read_bytes()
        else:  # a FIFO, socket or device: its name counts, reading it could block forever
            data = b""
            label = f"{label}-special"
    except OSError as exc:  # the full check that follows reports it properly
        data = f"{exc.errno}".encode()
        label = f"{label}-unreadable"
    digest.update(f"\0{label}:{name}:{len(data)}\0".encode("utf-8", "surrogateescape"))
    digest.update(data)
    if link:
        _update_target(digest, label, name, path, seen)


def _update_target(digest: Any, label: str, name: str, link: Path, seen: set[Path]) -> None:
    """Hash the file or directory tree a symlink resolves to (once: links may form a cycle)."""
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling or a loop: the link text is hashed already
        return
    if target in seen:
        return
    seen.add(target)
    if not target.is_dir():
        _update(digest, f"{label}>", name, target, seen)
        return
    for sub, path in _entries(target):
        _update(digest, f"{label}>", f"{name}/{sub}", path, seen)


def tree_digest(root: Path) -> str:
    """sha256 over every input of generation and every output, with their relative names."""
    digest = hashlib.sha256()
    digest.update(f"python {sys.version} {sys.implementation.cache_tag}\n".encode())
    seen: set[Path] = set()
    config = root / CONFIG_NAME
    _update(digest, "config", CONFIG_NAME, config, seen)
    for label in (TEMPLATES_DIR, GENERATED_DIR):
        for name, path in _entries(root / label):
            _update(digest, label, name, path, seen)
    for package in CODE_PACKAGES:
        directory = _package_dir(package)
        if directory is None:
            digest.update(f"\0{package}:missing\0".encode())
            continue
        for name, path in _entries(directory):
            if not name.endswith((".pyc", ".pyo")):
                _update(digest, package, name, path, seen)
    return digest.hexdigest()


def _memo_path(root: Path) -> Path:
    return state_dir(root) / MEMO_NAME


def is_known_clean(root: Path, digest: str) -> bool:
    """True when ``digest`` (of the tree now) is the one a full `check` found clean."""
    try:
        return _memo_path(root).read_text().strip() == digest
    except (OSError, UnicodeDecodeError):
        return False


def remember_clean(root: Path, before: str) -> bool:
    """Record the tree as clean, if it did not change while it was checked.

    ``before`` is the digest taken before the check compared anything. The tree is hashed again
    now: only when both agree was the clean result about *this* tree, so a file saved while the
    check ran can never be recorded as verified. Best effort: returns whether a memo was saved.
    """
    if tree_digest(root) != before:
        forget(root)
        return False
    try:
        path = ensure_state_dir(root) / MEMO_NAME
        temporary = path.with_name(f"{MEMO_NAME}.{os.getpid()}.tmp")
        try:
            temporary.write_text(before + "\n")
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    except OSError:
        return False
    return True


def forget(root: Path) -> None:
    """Delete the memo (after a failed check: a stale tree must never be confirmed)."""
    with contextlib.suppress(OSError):
        _memo_path(root).unlink(missing_ok=True)
