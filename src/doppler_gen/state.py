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
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from doppler_gen.errors import DopplerGenError

STATE_DIR = ".doppler-gen"
LOCK_NAME = "generate.lock"
# how long a second `generate` waits for the first one before giving up (seconds)
LOCK_WAIT_S = 10.0
_LOCK_POLL_S = 0.05
# projects (resolved roots) whose lock this process holds: taking it again inside is a no-op
_HELD: set[Path] = set()


class LockError(DopplerGenError):
    """Another `generate` holds the project lock, or the lock cannot be taken."""


def state_dir(root: Path) -> Path:
    """Where the project's state lives (not created)."""
    return root / STATE_DIR


def ensure_state_dir(root: Path) -> Path:
    """Create ``.doppler-gen/`` (with its ``.gitignore``) if needed; raises OSError.

    Refuses a ``.doppler-gen`` that is a symlink or not a directory: every write below would
    otherwise land wherever it points, outside the project.
    """
    directory = state_dir(root)
    with contextlib.suppress(FileExistsError):
        directory.mkdir()
    if directory.is_symlink() or not directory.is_dir():
        what = "a symlink" if directory.is_symlink() else "not a directory"
        raise OSError(
            errno.ENOTDIR,
            f"{STATE_DIR} is {what}; doppler-gen keeps its state (memo, lock) only in a real "
            f"directory of that name in the project: move it away",
        )
    with contextlib.suppress(OSError):  # a full disk: the directory works without it
        write_state_file(
            directory / ".gitignore",
            "# doppler-gen's project state (memo, lock): never commit it\n*\n",
            replace=False,
        )
    return directory


def read_state_file(path: Path, limit: int) -> bytes | None:
    """The first ``limit`` bytes of a state file; None when it is missing, unreadable, not a
    regular file, reached through a symlink, or in a ``.doppler-gen`` that is not a real
    directory. Never blocks (a FIFO put in its place would hang every pre-commit hook)."""
    if path.parent.is_symlink():
        return None
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            return None
        return os.read(handle, limit)
    except OSError:
        return None
    finally:
        os.close(handle)


def write_state_file(path: Path, text: str, replace: bool = True) -> None:
    """Write a state file through a new temporary file that cannot be a planted symlink, then
    rename it into place (``replace``) or link it only where nothing exists yet; raises
    OSError."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        handle = os.open(temporary, flags, 0o644)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        if replace:
            os.replace(temporary, path)  # a symlink at ``path`` is replaced, never followed
        else:
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def generate_lock(root: Path, wait_s: float | None = None) -> Iterator[None]:
    """Hold the project's exclusive generate lock; wait up to ``wait_s``, then exit 2.

    An advisory ``flock`` on ``.doppler-gen/generate.lock``: the kernel drops it when the
    process dies, so a killed `generate` never leaves the project locked. Reentrant within a
    process: a second ``flock`` on a new descriptor would wait for the first, its own.
    """
    held = root.resolve()
    if held in _HELD:  # `tune --write` holds it over its check, edit and `write` (reentrant)
        yield
        return
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    where = f"{STATE_DIR}/{LOCK_NAME}"
    handle = _open_lock(root, where)
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
        _HELD.add(held)
        yield
    finally:
        _HELD.discard(held)
        os.close(handle)  # releases the lock


def _open_lock(root: Path, where: str) -> int:
    """Open (creating) the lock file; never through a symlink, never anything but a file."""
    try:
        path = ensure_state_dir(root) / LOCK_NAME
        handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        reason = "it is a symlink" if exc.errno == errno.ELOOP else exc.strerror or exc
        raise LockError(f"cannot create the generate lock: {reason}", location=where) from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise LockError(
            "cannot create the generate lock: it exists and is not a regular file",
            location=where,
        )
    return handle


def _holder(handle: int) -> str:
    """`` (pid N)`` of the process holding the lock: as the kernel lists it (Linux's
    /proc/locks), else the pid the holder recorded in the file, if that process is alive. The
    recorded pid alone named an earlier, finished run whenever the holder was not a doppler-gen
    that writes it (a `flock` from a script, a reentrant `tune --write`)."""
    pid = _kernel_lock_holder(handle) or _recorded_holder(handle)
    return f" (pid {pid})" if pid else ""


def _kernel_lock_holder(handle: int) -> int | None:
    """The pid /proc/locks gives for the flock on ``handle``'s file; None where it cannot say."""
    try:
        info = os.fstat(handle)
        lines = Path("/proc/locks").read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 17788 fe:00:2211852 0 EOF" ("1: -> FLOCK ..." for a waiter)
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode:
            return int(fields[4]) if fields[4].isdigit() else None
    return None


def _recorded_holder(handle: int) -> int | None:
    try:
        text = os.pread(handle, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.isdigit():
        return None
    try:
        os.kill(int(text), 0)  # no signal: does that process exist?
    except (ProcessLookupError, OverflowError):
        return None
    except OSError:  # it exists (EPERM: another user's)
        pass
    return int(text)
