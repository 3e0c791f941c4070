"""What one `check` actually looked at, so that only that is remembered as clean.

`check` records a tree as clean (``check_memo``) by its digest, taken before anything is
compared. Comparing the digests before and after the check is not enough: a file changed while
the check read it and changed back before the second digest (A, then B, then A again) leaves
both digests at A, though the check saw B. So every filesystem question whose answer decides the
result goes through this module while a check records (``recording``):
- ``read_bytes``, ``read_head`` and ``missing``: a file's bytes (its digest, also where only
  its head is kept), or that it was not a readable regular file;
- ``resolve``: where a path led (a symlink retargeted and restored mid-check reads the right
  bytes at the wrong place);
- ``is_symlink``: whether a path was a link;
- ``regular_files``: a directory's entries and which were files, or that it was no directory.

Each answer is keyed by the path as the check named it (absolute, links *not* resolved).
``check_memo`` saves the memo only when the tree its first digest described answers every
question the same way.

Outside ``recording`` these functions only do their filesystem work: generate, validate and the
rest pay nothing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

# a file that the check looked for and did not find, or found but could not read as a file; a
# path that did not resolve; a directory that was not there to list
ABSENT = "absent"

# the kinds of question a log holds (the first half of each key)
READ, RESOLVE, LINK, LIST = "read", "resolve", "link", "list"
# the most symlinks one path lookup may follow (Linux's MAXSYMLINKS; ELOOP past it)
MAX_LINKS = 40


@dataclass
class ReadLog:
    """What one check asked: (question, path as named) -> answer."""

    facts: dict[tuple[str, str], object] = field(default_factory=dict)
    # the same question answered twice differently: the tree changed under the check
    inconsistent: bool = False

    def note(self, question: str, path: Path, answer: object) -> None:
        key = (question, named(path))
        if self.facts.setdefault(key, answer) != answer:
            self.inconsistent = True


_LOG: ContextVar[ReadLog | None] = ContextVar("doppler_gen_read_log", default=None)


@contextlib.contextmanager
def recording() -> Iterator[ReadLog]:
    """Record every question asked through this module until the block ends."""
    log = ReadLog()
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def named(path: Path | str) -> str:
    """``path`` made absolute from the working directory, with no link resolved: the key under
    which a log and ``check_memo``'s snapshot meet."""
    return os.path.join(os.getcwd(), os.fspath(path))


def _note(question: str, path: Path, answer: object) -> None:
    log = _LOG.get()
    if log is not None:
        log.note(question, path, answer)


# The most bytes a read here holds in memory. The largest file doppler-gen reads or writes
# (generated/manifest.json) is under 1 MiB. Some files never end: /proc/self/pagemap says it is
# a regular file of size 0 and yields bytes for hundreds of gigabytes, so `check` on a link to
# it hung.
READ_LIMIT = 64 << 20
_CHUNK = 1 << 20


class TooLarge(OSError):
    """A file that went on past what the read allows (``errno`` EFBIG)."""

    def __init__(self) -> None:
        super().__init__(
            errno.EFBIG, f"larger than {READ_LIMIT >> 20} MiB, no file doppler-gen reads"
        )


def _chunks(path: Path, *, streamed: bool = False) -> Iterator[bytes]:
    """The file's bytes in chunks; TooLarge past READ_LIMIT, or (``streamed``: nothing is kept
    but a digest) past the larger of READ_LIMIT and the size the file reports, so that an
    honest large file is digested whole and only one that runs past its own size is cut."""
    total = 0
    with path.open("rb") as stream:
        limit = max(READ_LIMIT, os.fstat(stream.fileno()).st_size) if streamed else READ_LIMIT
        while chunk := stream.read(_CHUNK):
            total += len(chunk)
            if total > limit:
                raise TooLarge
            yield chunk


def read_capped(path: Path) -> bytes:
    """The bytes of ``path``, at most READ_LIMIT (TooLarge past it); nothing noted."""
    return b"".join(_chunks(path))


def read_bytes(path: Path) -> bytes:
    """``read_capped``; a failed read is noted as ABSENT."""
    try:
        data = read_capped(path)
    except OSError:
        _note(READ, path, ABSENT)
        raise
    _note(READ, path, hashlib.sha256(data).hexdigest())
    return data


def read_head(path: Path, limit: int) -> bytes:
    """The first ``limit`` bytes of ``path``, noted as ``read_bytes`` notes the whole file (its
    digest, streamed in chunks: a huge file is never held whole; TooLarge for one that runs on
    past its own size and READ_LIMIT)."""
    digest = hashlib.sha256()
    head = b""
    try:
        for chunk in _chunks(path, streamed=True):
            if len(head) < limit:
                head += chunk[: limit - len(head)]
            digest.update(chunk)
    except OSError:
        _note(READ, path, ABSENT)
        raise
    _note(READ, path, digest.hexdigest())
    return head


def missing(path: Path) -> None:
    """Note that the check relied on ``path`` not being a readable regular file."""
    _note(READ, path, ABSENT)


def resolve(path: Path) -> Path:
    """The real path ``path`` leads to (``real_path``); FileNotFoundError (a missing path or a
    dangling link) is noted as ABSENT and raised, any other OSError raised."""
    try:
        resolved = Path(real_path(path))
    except FileNotFoundError:
        _note(RESOLVE, path, ABSENT)
        raise
    _note(RESOLVE, path, str(resolved))
    return resolved


def real_path(path: Path | str) -> str:
    """Where ``path`` leads, resolved component by component as the kernel opens it: at most
    MAX_LINKS links (ELOOP), and nothing below a file, not even ``..`` (ENOTDIR).

    Not ``os.path.realpath``: it follows any number of links, recursively, and steps back out of
    a file through ``..``, so a path it resolves may be one no read can open, and the memo
    (``check_memo``) must answer exactly as the reads would.
    """
    pending = named(path).split("/")[::-1]  # a stack: the next component last
    current, links = "/", 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        here = os.path.join(current, part)
        mode = os.lstat(here).st_mode
        if stat.S_ISLNK(mode):
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fspath(path))
            target = os.readlink(here)
            if target.startswith("/"):
                current = "/"
            pending.extend(target.split("/")[::-1])
            continue
        if pending and not stat.S_ISDIR(mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), here)
        current = here
    return current


def is_symlink(path: Path) -> bool:
    """``path.is_symlink()``, noted."""
    answer = path.is_symlink()
    _note(LINK, path, answer)
    return answer


def regular_files(directory: Path) -> list[Path]:
    """The regular files (links followed) in ``directory``, sorted; [] when it is missing or
    not a directory (OSError when it cannot be listed). Noted with every entry's name and
    whether it counted, since a check's verdict rests on both (an orphan swapped for a
    directory of the same name is no longer seen), or as ABSENT."""
    try:
        entries = [(path, path.is_file()) for path in sorted(directory.iterdir())]
    except (FileNotFoundError, NotADirectoryError):
        _note(LIST, directory, ABSENT)
        return []
    # any other OSError (a directory that cannot be listed) is the caller's to report
    _note(LIST, directory, tuple((path.name, is_file) for path, is_file in entries))
    return [path for path, is_file in entries if is_file]
