"""Text output shared by every verb: aligned tables, and strict JSON for ``--json``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any


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


def data_size(num_bytes: float) -> str:
    """A byte count with its unit, in decimal units as link and HBM figures are quoted
    (1 GB = 1e9 bytes): ``825.2 GB``, ``87.69 TB``, ``44.04 MB``, ``512 B``; 4 significant
    digits, never an exponent; NaN prints ``nan``."""
    x = float(num_bytes)
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            v = x / scale
            return f"{v:,.0f} {unit}" if abs(v) >= 1000 else f"{v:.4g} {unit}"
    return f"{x:.0f} B"


def text_table(rows: Sequence[Sequence[object]], header: Sequence[str] | None = None) -> str:
    """A plain text table: columns aligned, a dashed rule under ``header``."""
    cells = [[str(c) for c in row] for row in ([header] if header else []) + list(rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if hasattr(obj, "item") and hasattr(obj, "dtype") and getattr(obj, "ndim", 1) == 0:
        return _finite(obj.item())  # a numpy scalar
    return obj


def json_text(obj: Any, **kw: Any) -> str:
    """``obj`` as strict JSON (RFC 8259): NaN and infinities become ``null``, never the
    ``NaN`` / ``Infinity`` tokens that JSON parsers reject; other types via ``default=str``."""
    kw.setdefault("default", str)
    return json.dumps(_finite(obj), allow_nan=False, **kw)
