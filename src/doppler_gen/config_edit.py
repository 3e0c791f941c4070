"""Comment-preserving edits of variants.toml ``[[variant]]`` entries (used by ``tune --write``).

Only the entry's ``params = { ... }`` and ``overrides = { ... }`` inline-table lines change (or
are inserted after the entry's last key, or, for an emptied overrides table, removed); every
other line, comment and blank stays as it was. A form this module cannot edit safely (a
``[variant.params]`` sub-table, a multi-line table) is refused with the line to fix by hand.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from typing import Any

from doppler_gen.config import CONFIG_NAME, ParamValue, table_name, toml_code
from doppler_gen.errors import ConfigError


def edit_variant_entry(
    text: str, name: str, params: Mapping[str, ParamValue], overrides: Mapping[str, int]
) -> str:
    """variants.toml text with variant ``name``'s params updated and its overrides replaced.

    Only the two inline-table lines change (or are inserted after the entry's last key, or, for an
    emptied overrides table, removed); every other line, comment and blank stays as it was.
    """
    lines = text.splitlines(keepends=True)
    start, end = _variant_block(lines, name)
    if params:
        existing = _inline_table(lines, start, end, "params")
        merged = {**(existing[1] if existing else {}), **params}
        lines, end = _set_line(lines, start, end, existing, "params", merged)
    existing = _inline_table(lines, start, end, "overrides")
    if overrides:
        lines, end = _set_line(lines, start, end, existing, "overrides", dict(overrides))
    elif existing:
        del lines[existing[0]]
    return "".join(lines)


def table_header_lines(lines: list[str]) -> list[int]:
    """Indices of the lines that are TOML table headers (``[x]``, ``[[x]]``).

    A line starting with ``[`` inside a multi-line string (a description) or a multi-line array
    is not a header (``toplevel_lines``).
    """
    top = toplevel_lines(lines)
    return [i for i, line in enumerate(lines) if top[i] and line.lstrip().startswith("[")]


def toplevel_lines(lines: list[str]) -> list[bool]:
    """For each line, whether it starts outside every multi-line string and array: only such a
    line can be a header or a key (``config.toml_code``), so that a description's line reading
    ``overrides = { ... }`` is never edited."""
    return [code is not None for code in toml_code(lines)]


def _variant_block(lines: list[str], name: str) -> tuple[int, int]:
    """[start, end) line indices of the [[variant]] entry named ``name`` (header included)."""
    headers = table_header_lines(lines)
    for position, index in enumerate(headers):
        if table_name(lines[index]) != "[[variant]]":
            continue
        end = headers[position + 1] if position + 1 < len(headers) else len(lines)
        body = "".join(lines[index + 1 : end])
        try:
            entry = tomllib.loads(body)
        except tomllib.TOMLDecodeError:
            continue
        if entry.get("name") != name:
            continue
        if end < len(lines) and table_name(lines[end]).startswith("[variant."):
            raise ConfigError(
                f"--write: variant {name} uses a {table_name(lines[end])} sub-table; "
                "set the tuned values there by hand",
                location=f"{CONFIG_NAME}:{end + 1}",
            )
        return index, end
    raise ConfigError(f"--write: no [[variant]] entry named {name!r} found", location=CONFIG_NAME)


def _inline_table(
    lines: list[str], start: int, end: int, key: str
) -> tuple[int, dict[str, Any]] | None:
    """(line index, table) of ``key = { ... }`` within the entry, if present (never a line of a
    multi-line string or array)."""
    top = toplevel_lines(lines)
    for index in range(start + 1, end):
        stripped = lines[index].lstrip()
        if not top[index]:
            continue
        if not stripped.startswith(key) or stripped[len(key) :].lstrip()[:1] not in ("=", "."):
            continue
        table = _parse_inline(lines[index], key)
        if table is None:
            raise ConfigError(
                f"--write: cannot edit `{stripped.strip()}`; write {key} as one inline table line",
                location=f"{CONFIG_NAME}:{index + 1}",
            )
        return index, table
    return None


def _parse_inline(line: str, key: str) -> dict[str, Any] | None:
    """The table of a one-line ``key = { ... }  # comment``; None for any other form."""
    for position, char in enumerate(line):
        if char != "}":
            continue
        try:
            value = tomllib.loads(line[: position + 1]).get(key)
        except tomllib.TOMLDecodeError:
            continue
        return value if isinstance(value, dict) else None
    return None


def _set_line(
    lines: list[str],
    start: int,
    end: int,
    existing: tuple[int, dict[str, Any]] | None,
    key: str,
    table: dict[str, Any],
) -> tuple[list[str], int]:
    """Replace (keeping indentation and a trailing comment) or insert ``key = { ... }``."""
    if existing:
        index = existing[0]
        old = lines[index]
        indent = old[: len(old) - len(old.lstrip())]
        comment = _trailing_comment(old, key)
        ending = old[len(old.rstrip("\r\n")) :]  # the line's own: LF, CRLF or none
        lines[index] = f"{indent}{key} = {inline_table(table)}{comment}{ending}"
        return lines, end
    last = max(
        (
            i
            for i in range(start + 1, end)
            if lines[i].strip() and not lines[i].lstrip().startswith("#")
        ),
        default=start,
    )
    indent = lines[last][: len(lines[last]) - len(lines[last].lstrip())] if last > start else ""
    ending = "\r\n" if any(line.endswith("\r\n") for line in lines) else "\n"
    if not lines[last].endswith("\n"):
        lines[last] += ending
    lines.insert(last + 1, f"{indent}{key} = {inline_table(table)}{ending}")
    return lines, end + 1


def _trailing_comment(line: str, key: str) -> str:
    body = line.rstrip("\r\n")
    for position, char in enumerate(body):
        if char == "}" and _parse_inline(body[: position + 1], key) is not None:
            rest = body[position + 1 :]
            return rest if rest.strip().startswith("#") else ""
    return ""


def inline_table(table: Mapping[str, Any]) -> str:
    """``{ a = 1, b = "x" }`` in the file's style."""
    return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in table.items()) + " }"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise ConfigError(f"--write: cannot write {value!r} into {CONFIG_NAME}")
