"""Text output shared by every printed table: aligned columns (one format everywhere)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def number(value: float, digits: int = 4) -> str:
    """The one number format of every table: ``digits`` decimals below 1,000, whole numbers
    with thousands separators from 1,000 on (``53,411``), significant digits for tiny values
    (``3.2e-07``); NaN prints ``nan``. Units go in the column or row label."""
    x = float(value)
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if x != 0 and abs(x) < 10 ** -digits:
        return f"{x:.{max(digits - 2, 1)}e}"
    return f"{x:.{digits}f}"


def text_table(rows: Sequence[Sequence[object]], header: Sequence[str] | None = None) -> str:
    """A plain text table: columns aligned, a dashed rule under ``header``."""
    cells = [[str(c) for c in row] for row in ([header] if header else []) + list(rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
