"""Tint's diagnostics: the compiler's text turned into (line, column, message) and one line."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from doppler_gen.errors import ShaderCompileError

BACKEND_NAME = "dawn"

# A Tint diagnostic header: "FILE:LINE:COL severity: message"; FILE is empty for WGSL given as
# a string, and Dawn may prefix the first one ("Error while parsing WGSL: :5:9 error: ...").
_DIAGNOSTIC = re.compile(
    r"(?:^|\s|^[^\s:]*)(?P<file>[^\s:]*):(?P<line>\d+):(?P<col>\d+)\s+"
    r"(?P<severity>error|warning|note|info):\s*(?P<message>.*)$"
)
_CARETS = re.compile(r"^\s*\^+\s*$")
_CONTEXT = re.compile(r"^\s*-\s+While\b")
_PREFIX = re.compile(r"^(Error while parsing WGSL|Tint WGSL reader failure):\s*")


@dataclass(frozen=True)
class TintMessage:
    """One diagnostic of Tint's: where (1-based), how bad, what."""

    line: int
    column: int
    severity: str
    message: str

    def describe(self) -> str:
        """The message, with the severity spelled out for everything but errors."""
        return self.message if self.severity == "error" else f"{self.severity}: {self.message}"


def tint_messages(text: str) -> list[TintMessage]:
    """Every ``:LINE:COL severity: message`` header in a Dawn error text, in order."""
    found = []
    for raw in text.splitlines():
        match = _DIAGNOSTIC.search(_PREFIX.sub("", raw.strip()))
        if match:
            found.append(
                TintMessage(
                    int(match["line"]),
                    int(match["col"]),
                    match["severity"],
                    match["message"].strip(),
                )
            )
    return found


def _summary_lines(text: str) -> list[str]:
    """Dawn's error text without the source echoes, caret lines and "- While ..." context."""
    lines: list[str] = []
    echo = False  # a diagnostic header is followed by its source line and a caret line
    for raw in text.splitlines():
        stripped = _PREFIX.sub("", raw.strip())
        match = _DIAGNOSTIC.search(stripped)
        if match:
            severity = match["severity"]
            message = match["message"].strip()
            stripped = message if severity == "error" else f"{severity}: {message}"
            echo = True
        elif echo and _CARETS.match(raw):
            echo = False
            continue
        elif echo or not stripped or _CONTEXT.match(raw):
            continue
        if stripped not in lines:
            lines.append(stripped)
    return lines


def one_line(text: str) -> str:
    """Collapse Dawn's multi-line error text into one readable line."""
    lines = _summary_lines(text)
    return "; ".join(lines) if lines else " ".join(text.split())


def parse_diagnostics(text: str) -> list[tuple[int, int, str]]:
    """``(line, column, message)`` for Tint's diagnostics in ``text``: errors, then notes.

    Errors come first because the validator shows (and maps to template lines) the first
    few; notes (e.g. "control flow depends on possibly non-uniform value") follow.
    """
    messages = tint_messages(text)
    return _ordered(messages)


def _ordered(messages: Iterable[TintMessage]) -> list[tuple[int, int, str]]:
    ranked = sorted(messages, key=lambda m: m.severity != "error")  # stable: keeps text order
    return [(m.line, m.column, m.describe()) for m in ranked]


def compile_error(
    text: str, label: str, messages: list[TintMessage] | None = None, stage: str = "shader module"
) -> ShaderCompileError:
    """A one-line ShaderCompileError from Dawn's text; locations from ``messages`` or the text."""
    diagnostics = _ordered(messages) if messages else parse_diagnostics(text)
    where = f" at line {diagnostics[0][0]}:{diagnostics[0][1]}" if diagnostics else ""
    name = f" {label!r}" if label else ""
    summary = "; ".join(d[2] for d in diagnostics) if diagnostics else one_line(text)
    message = f"dawn rejected kernel{name} ({stage}){where}: {summary}{_hint(text)}"
    return ShaderCompileError(message, diagnostics=diagnostics, backend=BACKEND_NAME)


def _hint(text: str) -> str:
    """The fix for errors whose cause is the device, not the WGSL."""
    if "extension 'f16' is not allowed" in text:
        return " (open the device with features=['shader-f16'])"
    return ""


# --------------------------------------------------------------------------- names
