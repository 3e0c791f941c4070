"""The bytes and directory listings one `check` actually compared, so only they are remembered.

`check` records a tree as clean (``check_memo``) by its digest, taken before anything is
compared. Comparing the digests before and after the check is not enough: a file changed while
the check read it and changed back before the second digest (A, then B, then A again) leaves
both digests at A, though the check saw B. So every read that decides the result goes through
this module while a check records (``recording``): ``read_bytes`` and ``missing`` for files,
``regular_files`` for directories. ``check_memo`` then saves the memo only when each recorded read
equals what the first digest hashed at the same real path.

Outside ``recording`` these functions only read: generate, validate and the rest pay nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

# a file that the check looked for and did not find, or found but could not read as a file
ABSENT = "absent"


@dataclass
class ReadLog:
    """What one check read: real path -> sha256 (or ABSENT), real directory -> its names."""

    files: dict[str, str] = field(default_factory=dict)
    # real directory -> (name, whether it was a regular file, links followed) per entry
    listings: dict[str, tuple[tuple[str, bool], ...]] = field(default_factory=dict)
    # a path read twice with different results: the tree changed under the check
    inconsistent: bool = False

    def note(self, table: dict, key: str, value: object) -> None:
        if table.setdefault(key, value) != value:
            self.inconsistent = True


_LOG: ContextVar[ReadLog | None] = ContextVar("doppler_gen_read_log", default=None)


@contextlib.contextmanager
def recording() -> Iterator[ReadLog]:
    """Record every read made through this module until the block ends."""
    log = ReadLog()
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def real(path: Path) -> str:
    """The key of ``path`` in a log and in ``check_memo``'s snapshot: its real path."""
    return os.path.realpath(path)


def read_bytes(path: Path) -> bytes:
    """``path.read_bytes()``, noted while recording (a failed read notes the file ABSENT)."""
    log = _LOG.get()
    try:
        data = path.read_bytes()
    except OSError:
        if log is not None:
            log.note(log.files, real(path), ABSENT)
        raise
    if log is not None:
        log.note(log.files, real(path), hashlib.sha256(data).hexdigest())
    return data


def missing(path: Path) -> None:
    """Note that the check relied on ``path`` not being a readable file."""
    log = _LOG.get()
    if log is not None:
        log.note(log.files, real(path), ABSENT)


def regular_files(directory: Path) -> list[Path]:
    """The regular files (links followed) in ``directory``, sorted; noted while recording with
    every entry's name and whether it counted, since a check's verdict rests on both (an orphan
    swapped for a directory of the same name is no longer seen)."""
    entries = [(path, path.is_file()) for path in sorted(directory.iterdir())]
    log = _LOG.get()
    if log is not None:
        names = tuple((path.name, is_file) for path, is_file in entries)
        log.note(log.listings, real(directory), names)
    return [path for path, is_file in entries if is_file]
