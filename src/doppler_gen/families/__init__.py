"""Kernel families: a registry of plug-ins, imported only when asked for (like ``backends``).

``FAMILIES`` maps a family name (what variants.toml's ``family`` says) to ``"module:attribute"``
naming a ``Family`` instance, or to the instance itself once registered at run time. A family
that is not listed here is a configuration error at its variants.toml line.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING

from doppler_gen.errors import ConfigError

if TYPE_CHECKING:
    from doppler_gen.families.base import Family

FAMILIES: dict[str, object] = {
    "tiled": "doppler_gen.families.tiled:FAMILY",
    "tiered": "doppler_gen.families.tiered:FAMILY",
    "rmsnorm": "doppler_gen.families.rmsnorm:FAMILY",
}


def get_family(name: str) -> Family:
    """The family called ``name``, imported on first use."""
    try:
        target = FAMILIES[name]
    except KeyError:
        raise ConfigError(
            f"unknown kernel family {name!r} (registered: {', '.join(FAMILIES)})"
        ) from None
    if isinstance(target, str):
        module_name, attribute = target.split(":")
        target = getattr(import_module(module_name), attribute)
        FAMILIES[name] = target
    return target  # type: ignore[return-value]


_AT_RUN_TIME: dict[str, Family] = {}  # what register_family added, by name


def register_family(family: Family) -> None:
    """Add (or replace) a family at run time, e.g. a project's own or a test's."""
    FAMILIES[family.name] = family
    _AT_RUN_TIME[family.name] = family


def registered_at_run_time() -> list[Family]:
    """The families ``register_family`` added that are still registered: a worker process
    starts from a fresh import, so validate's workers register them again (by pickle: the
    family's class must be importable there, as a spawned process shares sys.path)."""
    return [f for name, f in _AT_RUN_TIME.items() if FAMILIES.get(name) is f]


def all_families() -> list[Family]:
    """Every registered family, in registration order."""
    return [get_family(name) for name in FAMILIES]


# a frame line of a traceback as text (what a validate worker sends back)
_FRAME_LINE = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$', re.MULTILINE)


def _family_files() -> set[str]:
    """The modules that hold family code: this package's, and those of families registered
    at run time (a project's own)."""
    here = Path(__file__).resolve().parent
    # the framework every family builds on (registry, base class, memo) is the core's code
    core = {"__init__.py", "base.py", "memo.py", "roles.py"}
    files = {str(path) for path in here.glob("*.py") if path.name not in core}
    for family in _AT_RUN_TIME.values():
        module = sys.modules.get(type(family).__module__)
        if getattr(module, "__file__", None):
            files.add(str(Path(module.__file__).resolve()))  # type: ignore[arg-type]
    return files


def family_code_at(error: BaseException) -> str | None:
    """``path:line (in function)`` of the innermost traceback frame of ``error`` in family
    code (a worker's traceback text included), or None: an internal error that a family
    module raised should name that module, not only blame doppler-gen."""
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(error.__traceback__)]
    frames += [(m[1], int(m[2]), m[3]) for m in _FRAME_LINE.finditer(str(error))]
    if isinstance(error, SyntaxError) and error.filename:
        frames.append((error.filename, error.lineno or 0, "<module>"))
    files = _family_files()
    for filename, line, function in reversed(frames):
        if str(Path(filename).resolve()) in files:
            relative = os.path.relpath(filename)
            shown = filename if relative.startswith("..") else relative
            return f"{shown}:{line} (in {function})"
    return None
