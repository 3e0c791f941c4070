"""Benchmark problem shapes: the `--shape` syntax shared by every family.

A shape is ``KIND[:key=value,...]``; every key has a default, so ``decode`` alone is a shape. The
kinds, their keys and defaults, and what a shape means belong to the family that registers the
kind (``Family.shape_keys`` / ``Family.make_shape``); this module reads the syntax and reports
errors as one line naming the offending token, because a benchmark command line is typed by
hand and a vague "invalid shape" costs a round trip.

The attention families' kinds:

* ``prefill:q=2048,kv=2048,h=32,kvh=8,d=64,causal=1`` runs on the tiled kernels: ``q`` queries
  at the end of ``kv`` keys (``q <= kv``; the queries are the last ``q`` positions, so causal
  masking is bottom-right aligned, as in chunked prefill). ``q`` and ``kv`` default to each other,
  and to 2048 when both are omitted.
* ``decode:kv=8192,h=32,kvh=8,d=64`` runs on the tiled kernels: one query after ``kv`` keys.
* ``tiered:cold=1536,hot=512,h=32,kvh=8,d=64`` runs on the tiered decode kernels: one query
  after ``cold`` contiguous cold-tier keys and a hot ring of ``hot`` keys (2048 in all by
  default).

``h`` is the number of query heads, ``kvh`` of K/V heads (GQA when smaller; must divide ``h``),
``d`` the head dimension. The defaults are a Llama-like model (32 query heads, 8 K/V heads,
head_dim 64). Which keys may be 0 (``cold``, ``hot``) and which are 0 or 1 (``causal``) is the
family's word (``shape_zero_keys``, ``shape_flag_keys``).
"""

from __future__ import annotations

import re
from typing import Any

from doppler_gen.errors import DopplerGenError


class ShapeSyntaxError(DopplerGenError):
    """A --shape the user typed cannot be understood; the message names the bad token."""


def kinds() -> dict[str, Any]:
    """Shape kind -> the family that registers it, over every registered family."""
    from doppler_gen.families import all_families

    return {kind: family for family in all_families() for kind in family.shape_keys}


def default_shapes() -> tuple[str, ...]:
    """The shapes bench runs when none is given: every family's defaults, in registry order."""
    from doppler_gen.families import all_families

    return tuple(text for family in all_families() for text in family.default_shapes)


def describe_kinds() -> list[str]:
    """One line per shape kind: its full default form and the family that runs it."""
    lines = []
    for kind, family in kinds().items():
        keys = ",".join(
            f"{key}={default}" if default is not None else key
            for key, default in family.shape_keys[kind].items()
        )
        lines.append(f"{kind}:{keys}")
        detail = family.shape_help.get(kind, "")
        lines.append(f"    {family.name} kernels{'; ' + detail if detail else ''}")
    defaults = " ".join(default_shapes())
    lines.append(f"Default: {defaults}")
    return lines


def __getattr__(name: str) -> Any:
    if name == "DEFAULT_SHAPES":
        return default_shapes()
    if name == "KINDS":
        return tuple(kinds())
    raise AttributeError(name)


def parse_shapes(texts: tuple[str, ...] | list[str]) -> list[Any]:
    """Parse every --shape (the defaults when none is given); duplicates are kept once."""
    shapes: list[Any] = []
    for text in texts or default_shapes():
        shape = parse_shape(text)
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def parse_shape(text: str) -> Any:
    """Parse one ``KIND[:key=value,...]``; raise ShapeSyntaxError naming the bad token."""
    kind, _, body = text.strip().partition(":")
    kind = kind.strip().lower()
    known = kinds()
    if kind not in known:
        raise _error(text, f"unknown kind {kind!r} (expected one of {', '.join(known)})")
    family = known[kind]
    allowed = family.shape_keys[kind]
    values = _key_values(text, kind, body, allowed, family)
    resolved = {key: default for key, default in allowed.items() if default is not None}
    resolved.update(values)
    return family.make_shape(kind, text, resolved)


def _key_values(text: str, kind: str, body: str, allowed: Any, family: Any) -> dict[str, int]:
    values: dict[str, int] = {}
    for token in (t.strip() for t in body.split(",")) if body.strip() else ():
        key, sep, raw = token.partition("=")
        key = key.strip().lower()
        if not sep or not key:
            raise _error(text, f"{token!r} is not key=value")
        if key not in allowed:
            raise _error(text, f"unknown key {key!r} ({kind} takes {', '.join(allowed)})")
        if key in values:
            raise _error(text, f"key {key!r} given twice")
        values[key] = _integer(text, key, raw.strip(), family)
    return values


# ASCII digits (int() takes any script's: ٤ is 4), `_` only between two of them, as in Python
_INTEGER_RE = re.compile(r"-?[0-9]+(?:_[0-9]+)*")
_MAX_DIGITS = 18


def _integer(text: str, key: str, raw: str, family: Any) -> int:
    if not _INTEGER_RE.fullmatch(raw):
        raise _error(text, f"{key}={raw!r} is not an integer")
    if len(raw.replace("_", "").lstrip("-")) > _MAX_DIGITS:
        raise _error(text, f"{key} has more than {_MAX_DIGITS} digits")
    value = int(raw.replace("_", ""))
    if key in family.shape_flag_keys:
        if value not in (0, 1):
            raise _error(text, f"{key}={raw} must be 0 or 1")
    elif key in family.shape_zero_keys:
        if value < 0:
            raise _error(text, f"{key}={raw} must not be negative")
    elif value < 1:
        raise _error(text, f"{key}={raw} must be a positive integer")
    return value


def _error(text: str, message: str) -> ShapeSyntaxError:
    return ShapeSyntaxError(f"--shape {text!r}: {message}")
