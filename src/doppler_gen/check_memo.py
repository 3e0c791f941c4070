"""A memo of the last clean `check`, so an unchanged tree is confirmed without re-rendering.

`check` runs in pre-commit hooks and CI on trees that are almost always clean. Rendering needs
Jinja and the WGSL parser, most of the command's time. The memo is a sha256 over *everything*
the result depends on: variants.toml, every file under templates/ and generated/ (names and
contents, so an orphan or a hand edit changes it), doppler-gen's own source files, and the Jinja
and Python versions. When the digest equals the one stored after the last clean full check, the
tree is clean by construction. Any difference (or a missing/unreadable memo) means a full check.
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib import metadata
from pathlib import Path

from doppler_gen.config import CONFIG_NAME, GENERATED_DIR, TEMPLATES_DIR


def _files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def tree_digest(root: Path) -> str:
    """sha256 over every input of generation and every output, with their relative names."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent
    try:
        jinja = metadata.version("jinja2")
    except metadata.PackageNotFoundError:
        jinja = "?"
    digest.update(f"python {sys.version}\njinja2 {jinja}\n".encode())
    groups = [
        ("config", [root / CONFIG_NAME]),
        ("templates", _files(root / TEMPLATES_DIR)),
        ("generated", _files(root / GENERATED_DIR)),
        ("package", [p for p in _files(package) if p.suffix == ".py"]),
    ]
    for label, paths in groups:
        for path in paths:
            name = (
                path.name if label in ("config", "package") else path.relative_to(root).as_posix()
            )
            data = path.read_bytes()
            digest.update(f"\0{label}:{name}:{len(data)}\0".encode())  # unambiguous framing
            digest.update(data)
    return digest.hexdigest()


def _memo_path(root: Path) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return Path(base) / "doppler-gen" / "check" / key


def is_known_clean(root: Path, digest: str) -> bool:
    """True when ``digest`` (of the tree now) is the one a full `check` found clean."""
    try:
        return _memo_path(root).read_text().strip() == digest
    except OSError:
        return False


def remember_clean(root: Path, digest: str) -> None:
    """Record ``digest`` as clean (best effort: no cache directory, no memo).

    The digest must be the one taken *before* the check compared anything, so a file saved
    while the check ran can never be recorded as verified.
    """
    path = _memo_path(root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(digest + "\n")
        os.replace(temporary, path)
    except OSError:
        pass
