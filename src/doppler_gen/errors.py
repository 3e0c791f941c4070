"""Errors a user can act on.

Every error the CLI reports is one of these: it prints as one line (``location: message``), and
the CLI turns it into a non-zero exit without a Python traceback. Anything else escaping is a bug
in doppler-gen itself.
"""

from __future__ import annotations


class DopplerGenError(Exception):
    """A problem with the user's input or environment, reported as one line."""

    exit_code = 2

    def __init__(self, message: str, *, location: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


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
    """Generated WGSL disagrees with the metadata variants.toml declares for it."""


class ShapeError(DopplerGenError):
    """A problem shape the kernel does not support; refused before any dispatch."""


class BackendUnavailable(DopplerGenError):
    """A WebGPU implementation (wgpu-py, pydawn) or adapter is missing."""


class ShaderCompileError(DopplerGenError):
    """The WGSL implementation rejected a generated kernel.

    ``diagnostics`` holds ``(line, column, message)`` in generated-file coordinates; the
    validator maps them back to template lines.
    """

    def __init__(self, message: str, diagnostics: list[tuple[int, int, str]], backend: str) -> None:
        super().__init__(message)
        self.diagnostics = diagnostics
        self.backend = backend
