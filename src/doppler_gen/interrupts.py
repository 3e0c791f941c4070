"""How doppler-gen takes Ctrl-C and SIGTERM around work that must not stop half-way.

`deferred_signals`: while files are replaced, Ctrl-C and SIGTERM are only noted. A signal that
lands between a rename and the bookkeeping of that rename in `generate`'s transaction
(``outputs.Transaction``), or between creating a temporary file and recording it, would leave
one file new and the rest old, or a stray ``.tmp`` file. When the block ends, the handlers
that were in place are put back and the noted signals raised again, in the order they came,
so that they act as they would have (Ctrl-C raises KeyboardInterrupt, SIGTERM ends the process
or raises what the caller installed), after the files are consistent. When the block itself
fails, its error wins: it says what state the files are in, which "interrupted" would not.

`sigterm_raises`: SIGTERM raises ``Terminated`` in the main thread, so that `validate --jobs`
stops its worker processes before it ends, as it does on Ctrl-C. Only around that: a Python
handler runs between bytecodes, so a process waiting in a long native call (a pipeline compile)
would no longer end on SIGTERM at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from doppler_gen.errors import Terminated

HELD = (signal.SIGINT, signal.SIGTERM)


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(f"signal {signum}")


def _main_thread() -> bool:
    """Python sets signal handlers only from the main thread; elsewhere nothing changes."""
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def handled_by(signum: int, handler: Any) -> Iterator[None]:
    """``handler`` takes ``signum`` for the duration of the block; the one before is put back
    after. Off the main thread nothing changes."""
    if not _main_thread():
        yield
        return
    previous = [(signum, signal.getsignal(signum))]
    try:
        signal.signal(signum, handler)
        yield
    finally:
        _restore(previous)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` for the duration of the block, unless it is ignored (a
    parent that set SIGTERM to be ignored meant it)."""
    ignored = signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    with contextlib.nullcontext() if ignored else handled_by(signal.SIGTERM, _raise_terminated):
        yield


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the duration of the block, then deliver them (module doc)."""
    if not _main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame: object) -> None:
        if signum not in noted:
            noted.append(signum)

    previous: list[tuple[int, Any]] = []
    try:
        for signum in HELD:  # recorded before it is replaced: a handler set is always put back
            previous.append((signum, signal.getsignal(signum)))
            signal.signal(signum, note)
        yield
    except BaseException:
        _restore(previous)
        raise  # the block's own error, not the signal held meanwhile
    _restore(previous)
    for signum in noted:  # the first whose handler raises ends the block
        signal.raise_signal(signum)


def _restore(previous: list[tuple[int, Any]]) -> None:
    """Put each handler back, each in a ``finally`` of the next: a signal whose own handler
    is back (and raises) while another is still being restored cannot leave that one
    replaced. None, a handler set outside Python, comes back as the default."""
    if not previous:
        return
    (signum, handler), rest = previous[0], previous[1:]
    try:
        _restore(rest)
    finally:
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
