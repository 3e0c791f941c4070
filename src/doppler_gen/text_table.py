"""Plain text tables: every command's report (list, validate, bench, tune) prints with this, so
no command imports another for it."""

from __future__ import annotations


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain left-aligned text table."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
    return "\n".join(lines)
