"""Errors a user can act on.

Every error the CLI reports is one of these: it prints as one line (``location: message``), and
the CLI turns it into a non-zero exit without a Python traceback. Anything else escaping is a bug
in doppler-gen itself.
"""

from __future__ import annotations

import re
import stat

# C0 and C1 control characters, DEL and the Unicode line and paragraph separators (any of them in
# a message would break "one line per error", or the terminal), and lone surrogates (which no
# stream can encode)
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` with every control character written as its escape (``\\n``, ``\\x1b``), so
    that user-supplied names and a template's ``fail()`` message keep an error on one line."""
    return _CONTROL_RE.sub(_escape, text)


def printable_lines(text: str) -> str:
    """``text`` with every control character escaped but newlines and tabs: file contents shown
    on a terminal (`check`'s diffs), whose escape sequences could otherwise clear the screen or
    hide the lines that say the tree is stale."""
    return _CONTROL_RE.sub(
        lambda match: match.group() if match.group() in "\n\t" else _escape(match), text
    )


def _escape(match: re.Match[str]) -> str:
    return repr(match.group())[1:-1]


_LONGEST = 1_000


def _shortened(text: str) -> str:
    if len(text) <= _LONGEST:
        return text
    left_out = len(text) - 800
    return f"{text[:600]} ... ({left_out} characters left out) ... {text[-200:]}"


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words, for an error ("a FIFO")."""
    for test, word in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return word
    return "not a regular file"


def line_at(text: str, offset: int) -> int:
    """The 1-based line of ``offset`` in ``text``, as an error location counts it."""
    return text.count("\n", 0, offset) + 1


def not_utf8(data: bytes, error: UnicodeDecodeError) -> tuple[int, str]:
    """(line, message) for bytes that are not UTF-8: the line and the column as an editor
    counts them (characters, not bytes, before the bad one)."""
    line = data.count(b"\n", 0, error.start) + 1
    before = data[data.rfind(b"\n", 0, error.start) + 1 : error.start]
    column = len(before.decode("utf-8", "replace")) + 1
    return line, f"not valid UTF-8: byte 0x{data[error.start]:02x} at column {column}"


class DopplerGenError(Exception):
    """A problem with the user's input or environment, reported as one line."""

    exit_code = 2

    def __init__(self, message: str, *, location: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        """``location: message`` as one printable line (see ``printable``), cut in the middle
        past 1,000 characters: a 100,000-character name echoed back is no message."""
        text = f"{self.location}: {self.message}" if self.location else self.message
        return _shortened(printable(text))


class Terminated(KeyboardInterrupt):
    """SIGTERM while a command had worker processes running: raised in the main thread so the
    command stops its workers before it ends, as it does on Ctrl-C. The CLI exits 143, the
    shell's code for a process ended by SIGTERM."""

    exit_code = 143


class ConfigError(DopplerGenError):
    """variants.toml is malformed or inconsistent."""


class TemplateError(DopplerGenError):
    """A template failed to render (syntax error, undefined variable, failed assertion)."""


class InterfaceError(DopplerGenError):
    """Generated WGSL disagrees with the metadata variants.toml declares for it.

    ``line``: the generated line a WGSL parse failure is at (when known), so that the caller
    can name the template line that produced it.
    """

    line: int | None = None


class ShapeError(DopplerGenError):
    """A problem shape the kernel does not support; refused before any dispatch."""


class BackendUnavailable(DopplerGenError):
    """A WebGPU implementation (wgpu-py, pydawn) or adapter is missing."""


class GpuTimeout(DopplerGenError):
    """GPU work did not finish within the time limit (``backends.base.gpu_wait_seconds``).
    The device that ran it is spent: its kernel may still be running, so nothing more can
    be asked of it (``validate`` goes on in a fresh worker process)."""


class ShaderCompileError(DopplerGenError):
    """The WGSL implementation rejected a generated kernel.

    ``diagnostics`` holds ``(line, column, message)`` in generated-file coordinates; the
    validator maps them back to template lines.
    """

    def __init__(self, message: str, diagnostics: list[tuple[int, int, str]], backend: str) -> None:
        super().__init__(message)
        self.diagnostics = diagnostics
        self.backend = backend
