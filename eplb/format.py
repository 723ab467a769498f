"""Text output shared by every printed table: aligned columns (one format everywhere)."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(rows: Sequence[Sequence[object]], header: Sequence[str] | None = None) -> str:
    """A plain text table: columns aligned, a dashed rule under ``header``."""
    cells = [[str(c) for c in row] for row in ([header] if header else []) + list(rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
