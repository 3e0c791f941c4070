"""Is the code that runs the code on disk?

Python runs a module from its cached bytecode (``__pycache__/NAME.cpython-3XX.pyc``) when the
cache records the source's modification time, in whole seconds, and its size. A source edited
within the same second at the same size, or whose time was put back (``touch -r``, a checkout
tool), keeps running as it was before the edit. `generate` would then write, and `check` would
accept, what the old code renders, and the check memo (``check_memo``), which hashes the sources,
would record that verdict under the new sources' digest.

`running_code_is_on_disk` compares, for every module of doppler-gen that Python took from a
timestamp-checked cache, the cached code with the source compiled now, and names the
first that differs. It is called after rendering, when every module that rendered is loaded.
About 0.1 s the first time in a process (only what is loaded is compiled), then nothing until
a file changes.
"""

from __future__ import annotations

import _imp
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import warnings
from types import CodeType
from typing import Any

from doppler_gen.errors import DopplerGenError

# the packages whose code shapes what `check` and `generate` produce (the memo hashes them all)
CODE_PACKAGES = ("doppler_gen", "jinja2", "markupsafe")
# the ones whose caches are compared with their sources: doppler-gen's own, which is edited in
# place. Jinja and MarkupSafe are installed, not edited, and their caches may come from another
# patch release of Python, whose compiler can lay out line tables differently: a refusal there
# would be wrong, and could name a file the user cannot delete.
EDITED_PACKAGES = ("doppler_gen",)
_HEADER = 16  # magic, flags, then the source's time and size (or a hash) of a .pyc


def running_code_is_on_disk(packages: tuple[str, ...]) -> None:
    """Refuse (exit 2, one line) when a loaded module of ``packages`` ran from bytecode that is
    not its source's code."""
    for name in sorted(sys.modules):
        if not any(name == package or name.startswith(package + ".") for package in packages):
            continue
        stale = _stale_cache(sys.modules[name])
        if stale is not None:
            source, cached = stale
            raise DopplerGenError(
                f"Python ran {cached}, which is not this file's code (the file changed without "
                "changing its size or the second of its modification time, or the cache came "
                "from another Python); delete that cache and run again",
                location=source,
            )


def _stale_cache(module: object) -> tuple[str, str] | None:
    """(source, cache) when ``module`` came from a cache that Python accepted by the source's
    time and size and that holds other code than the source compiles to; else None."""
    spec = getattr(module, "__spec__", None)
    loader = getattr(spec, "loader", None)
    if not isinstance(loader, importlib.machinery.SourceFileLoader):
        return None
    source, cached = spec.origin, spec.cached
    if not source or not cached:
        return None
    try:
        key = (source, cached, _identity(source), _identity(cached), _imp.check_hash_based_pycs)
    except OSError:  # no cache: the source itself was compiled when it was imported
        return None
    if key not in _VERDICTS:
        _VERDICTS[key] = _compare(source, cached)
    return _VERDICTS[key]


# verdicts by the two files' identities: a process plans many times (the test suite hundreds),
# and compiling every loaded module each time would cost ~0.1 s a plan. Any write to a file
# changes its ctime, which no one can set back, so a changed file is never judged by an old
# verdict.
_VERDICTS: dict[tuple[Any, ...], tuple[str, str] | None] = {}


def _identity(path: str) -> tuple[int, ...]:
    status = os.stat(path)
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def _compare(source: str, cached: str) -> tuple[str, str] | None:
    try:
        data = _read(cached)
        text = _read(source)
        status = os.stat(source)
    except OSError:
        return None
    if not _accepted_by_time_and_size(data, status):
        return None
    try:
        ran = marshal.loads(data[_HEADER:])
        with warnings.catch_warnings():  # a compile-time warning is no verdict (nor, under
            warnings.simplefilter("ignore")  # -W error, a SyntaxError)
            now = compile(text, source, "exec", dont_inherit=True)
    except (ValueError, EOFError, TypeError, SyntaxError):
        return source, cached  # a source that no longer compiles is not the code that ran
    return None if isinstance(ran, CodeType) and ran == now else (source, cached)


def _read(path: str) -> bytes:
    with open(path, "rb") as stream:
        return stream.read()


def _accepted_by_time_and_size(data: bytes, status: os.stat_result) -> bool:
    """Whether Python takes this cache for the source without reading the source: a
    timestamp cache that records the source's time and size, or a hash cache it does not
    check (an unchecked one, or any under ``--check-hash-based-pycs never``). A hash cache it
    checks is validated against the source's bytes on import."""
    if len(data) < _HEADER or data[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(data[4:8], "little")
    if flags & 0b1:  # hash-based: bit 1 says whether the import checks it, unless the
        checking = _imp.check_hash_based_pycs  # interpreter was told otherwise
        return checking == "never" or (checking == "default" and not flags & 0b10)
    recorded_time = int.from_bytes(data[8:12], "little")
    recorded_size = int.from_bytes(data[12:16], "little")
    return (
        recorded_time == int(status.st_mtime) & 0xFFFFFFFF
        and recorded_size == status.st_size & 0xFFFFFFFF
    )
