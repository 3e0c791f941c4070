"""Project state: the ignored ``.doppler-gen/`` directory of a project, and its generate lock.

doppler-gen keeps what it remembers about a project (the `check` memo, the `generate` lock) inside
the project, never in the user's home: state that belongs to one checkout is deleted with it,
cannot leak between checkouts of the same path, and is never confused with another project's.
Everything in it is safe to lose: a missing or unreadable memo only means a full check. The
directory holds a ``.gitignore`` of ``*``, so git ignores it even where the project's own
.gitignore does not mention it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from doppler_gen.errors import DopplerGenError

STATE_DIR = ".doppler-gen"
LOCK_NAME = "generate.lock"
# how long a second `generate` waits for the first one before giving up (seconds)
LOCK_WAIT_S = 10.0
_LOCK_POLL_S = 0.05


class LockError(DopplerGenError):
    """Another `generate` holds the project lock, or the lock cannot be taken."""


def state_dir(root: Path) -> Path:
    """Where the project's state lives (not created)."""
    return root / STATE_DIR


def ensure_state_dir(root: Path) -> Path:
    """Create ``.doppler-gen/`` (with its ``.gitignore``) if needed; raises OSError."""
    directory = state_dir(root)
    directory.mkdir(exist_ok=True)
    ignore = directory / ".gitignore"
    if not ignore.exists():
        with contextlib.suppress(OSError):  # a full disk: the directory works without it
            ignore.write_text("# doppler-gen's project state (memo, lock): never commit it\n*\n")
    return directory


@contextlib.contextmanager
def generate_lock(root: Path, wait_s: float | None = None) -> Iterator[None]:
    """Hold the project's exclusive generate lock; wait up to ``wait_s``, then exit 2.

    An advisory ``flock`` on ``.doppler-gen/generate.lock``: the kernel drops it when the
    process dies, so a killed `generate` never leaves the project locked.
    """
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    where = f"{STATE_DIR}/{LOCK_NAME}"
    try:
        path = ensure_state_dir(root) / LOCK_NAME
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        reason = exc.strerror or exc
        raise LockError(f"cannot create the generate lock: {reason}", location=where) from None
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise LockError(f"cannot lock: {exc.strerror or exc}", location=where) from None
                if time.monotonic() >= deadline:
                    holder = _holder(handle)
                    raise LockError(
                        f"another doppler-gen generate{holder} is writing this project; "
                        f"waited {wait_s:g} s - try again when it has finished",
                        location=where,
                    ) from None
                time.sleep(_LOCK_POLL_S)
        with contextlib.suppress(OSError):  # who holds it: only for the message above
            os.ftruncate(handle, 0)
            os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(handle)  # releases the lock


def _holder(handle: int) -> str:
    """`` (pid N)`` of the process holding the lock, when it recorded itself."""
    try:
        text = os.pread(handle, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {text})" if text.isdigit() else ""
