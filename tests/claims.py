"""pytest plugin: ``--claim DIR`` lets several pytest processes share one suite, test by test.

`.ci/test` runs one pytest per core. A fixed split (every N-th test) balances test counts, not
time: most of this suite's time is lavapipe compiling pipelines, a few tests compile for tens
of seconds, and adding one test moved 90 s from one slice to the other. With ``--claim`` every
process collects the whole suite and runs each test only if it is the first to create
``DIR/<index>`` (``O_CREAT | O_EXCL``, atomic on a local filesystem), so a process that
finishes its test takes the next unclaimed one and the slices end within about one test of each
other.

A process claims the test it will run next before running the current one: pytest tears a
test's fixtures down knowing the next test (``nextitem``), and keeps the module- and
session-scoped ones that the next test shares. Every process must collect the same tests in
the same order (the first writes their number and a digest of their ids to ``DIR/collection``;
another that collects differently stops with a usage error instead of running a different
suite). When all have finished, ``DIR`` holds one claim per test that ran (`.ci/test` checks).

Ctrl-C stops a process of ``--claim`` as it stops any pytest (KeyboardInterrupt, then the
summary), though the shell started it as a background job, with SIGINT ignored. A Ctrl-C in a
terminal reaches every slice and `.ci/test`, which forwards it to each slice (for a SIGINT or
SIGTERM sent to it alone): a second SIGINT within a second is that same Ctrl-C and is dropped,
so that it cannot break into the summary the first one started.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType

import pytest

COLLECTION = "collection"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--claim",
        default=None,
        metavar="DIR",
        help="run the tests this process claims first in DIR, shared with other pytest "
        "processes of the same command (.ci/test runs one per core)",
    )


REPEAT_S = 1.0  # a second SIGINT sooner than this is the same Ctrl-C (module doc)


class _Interrupt:
    """SIGINT's handler in a process of ``--claim``: KeyboardInterrupt, once per Ctrl-C."""

    def __init__(self) -> None:
        self.last: float | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True  # pytest reports where the test was, not this line
        if frame is not None and frame.f_code is _Interrupt.__call__.__code__:
            # The second SIGINT of one Ctrl-C broke into this handler before its first line ran:
            # raising here made pytest report the outer call's `def` line, not the test's.
            return
        now = time.monotonic()
        if self.last is not None and now - self.last < REPEAT_S:
            return
        self.last = now
        raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--claim") is not None and (
        threading.current_thread() is threading.main_thread()
    ):
        signal.signal(signal.SIGINT, _Interrupt())


class ClaimQueue:
    """The indices of the collected tests, each handed to the first process that claims it."""

    def __init__(self, directory: Path, ids: list[str]) -> None:
        self.directory = directory
        self.position = 0
        self.size = len(ids)
        directory.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()
        self._same_collection(f"{len(ids)} {digest}")

    def _same_collection(self, collection: str) -> None:
        """Record ``collection`` (the test count, then the digest of the test ids) or, when
        another process recorded it first, require the same."""
        path = self.directory / COLLECTION
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            recorded = ""
            for _ in range(200):  # the first process may not have written it yet
                recorded = path.read_text(encoding="ascii")
                if recorded.endswith("\n"):  # written whole
                    break
                time.sleep(0.05)
            if recorded != collection + "\n":
                raise pytest.UsageError(
                    f"--claim {self.directory}: another process collected different tests "
                    "(every process of one run needs the same arguments)"
                ) from None
            return
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(collection + "\n")

    def next(self) -> int | None:
        """The next test no process has claimed, now claimed by this one; None when none is left."""
        while self.position < self.size:
            index = self.position
            self.position += 1
            try:
                os.close(os.open(self.directory / str(index), os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                continue
            return index
        return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """pytest's own loop over the tests, over the claimed ones only (None: no --claim)."""
    directory = session.config.getoption("--claim")
    if directory is None:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    if session.config.option.collectonly:
        return True
    items = session.items
    queue = ClaimQueue(Path(directory), [item.nodeid for item in items])
    current = queue.next()
    while current is not None:
        following = queue.next()
        nextitem = items[following] if following is not None else None
        items[current].config.hook.pytest_runtest_protocol(item=items[current], nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        current = following
    return True
