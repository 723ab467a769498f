"""Tables from result frames: Markdown (no extra dependency) and CSV, written atomically."""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd

from eplb.args import check_bool, check_int, check_str, check_type
from eplb.atomic import atomic_write_text
from eplb.format import number


def _cell(value, digits: int) -> str:
    if isinstance(value, (float, np.floating)):
        if np.isnan(value):
            return ""
        return number(value, digits)  # the one number format (eplb.format.number)
    return str(value)


def markdown(frame: pd.DataFrame, *, digits: int = 4, index: bool = True) -> str:
    """A GitHub-flavoured Markdown table of ``frame`` (index included unless ``index=False``)."""

    check_type("frame", frame, pd.DataFrame, "a pandas DataFrame")
    digits = check_int("digits", digits, 0, 17)
    index = check_bool("index", index)
    df = frame.reset_index() if index and not isinstance(frame.index, pd.RangeIndex) else frame
    header = [str(c) for c in df.columns]
    rows = [[_cell(v, digits) for v in rec] for rec in df.itertuples(index=False)]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_csv(frame: pd.DataFrame, path: str | os.PathLike) -> None:
    """``frame`` as CSV (no index), written atomically."""

    check_type("frame", frame, pd.DataFrame, "a pandas DataFrame")
    atomic_write_text(path, frame.to_csv(index=False))


def slug(text: str) -> str:
    """``text`` as a file-name stem: runs of anything but letters, digits and ``._+-`` -> ``_``."""

    check_str("text", text)
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("_")

