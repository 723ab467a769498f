"""Per-rank CSV directories (HarMoEny / ExFlow layout, e.g. ``qwen1.5-moe-harmoeny``).

``<dir>/<rank>/moe_layer-<l>.csv``: iterations become windows, ranks ``source_counts[T, L, R, E]``.
See docs/data.md, section "Reading traces" (``rankdir``).
"""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from eplb.traces.checks import FIX_FORMAT, check_values, fail, make_trace
from eplb.traces.model import Trace

_LAYER_FILE = re.compile(r"^moe_layer-(\d+)\.csv$", re.ASCII)
MAX_RANKS = 100_000  # rank folders (and data.json world_size) one trace may declare
_DIST_COLUMN = "expert distribution"


def read_rankdir(path: str | os.PathLike) -> Trace:
    """The trace of a per-rank CSV directory (``source_counts: float64[T, L, R, E]``)."""
    root = Path(path)
    # ASCII digits only: '²'.isdigit() is true but int('²') fails
    ranks = sorted(int(p.name) for p in root.iterdir()
                   if p.is_dir() and p.name.isascii() and p.name.isdigit())
    if not ranks:
        raise fail(path, "no rank folders (0, 1, ...) holding moe_layer-<l>.csv; not a per-rank "
                    f"trace directory ({FIX_FORMAT})")
    info: dict[str, Any] = {}
    if (root / "data.json").is_file():
        try:
            info = json.loads((root / "data.json").read_text(encoding="utf-8"))
        except (ValueError, OSError, UnicodeDecodeError, RecursionError):
            info = {}
        if not isinstance(info, dict):
            info = {}
    world = info.get("world_size")
    for what, n in (("rank folder", ranks[-1] + 1), ("data.json world_size", world)):
        if isinstance(n, int) and not isinstance(n, bool) and n > MAX_RANKS:
            raise fail(path, f"{what} implies {n:,} ranks, over the limit of {MAX_RANKS:,}; "
                       "the folder names or world_size are corrupt")
    expected = max(ranks[-1] + 1, world if isinstance(world, int) else 0)
    missing = sorted(set(range(expected)) - set(ranks))
    if missing:
        raise fail(path, f"missing rank folder(s) {', '.join(map(str, missing))}; expected "
                    f"0..{expected - 1}" + (f" (data.json world_size={world})" if world else "")
                    + "; copy the missing ranks or remove the partial run")
    layer_sets = {}
    for r in ranks:
        layer_sets[r] = sorted(int(m.group(1)) for f in (root / str(r)).iterdir()
                               if (m := _LAYER_FILE.match(f.name)))
    layers = layer_sets[ranks[0]]
    if not layers:
        raise fail(path, "rank folder 0 has no moe_layer-<l>.csv files")
    for r in ranks:
        if layer_sets[r] != layers:
            diff = sorted(set(layers) ^ set(layer_sets[r]))
            raise fail(root / str(r), f"has layers {_span(layer_sets[r])} but rank "
                        f"{ranks[0]} has {_span(layers)} (differ at moe_layer-{diff[0]}.csv); "
                        "mismatched layer counts between ranks")
    data = None  # [T, L, R, E]
    windows = None
    for li, lyr in enumerate(layers):
        for r in ranks:
            f = root / str(r) / f"moe_layer-{lyr}.csv"
            iters, rows = _read_rank_csv(f)
            if data is None:
                windows, E = iters, rows.shape[1]
                data = np.zeros((len(iters), len(layers), len(ranks), E))
            if rows.shape[0] != data.shape[0]:
                raise fail(f, f"has {rows.shape[0]} iteration rows but "
                            f"{root / str(ranks[0]) / f'moe_layer-{layers[0]}.csv'} has "
                            f"{data.shape[0]}; every rank and layer needs the same iterations")
            if rows.shape[1] != data.shape[3]:
                raise fail(f, f"'{_DIST_COLUMN}' lists {rows.shape[1]} experts but other files "
                            f"list {data.shape[3]}")
            data[:, li, r] = rows
    meta: dict[str, Any] = {
        "provenance": {"format": "rankdir", "path": str(path), "iterations": windows,
                       "num_ranks": len(ranks)},
    }
    if isinstance(info.get("model_name"), str):
        meta["model"] = info["model_name"]
    for k in ("dataset", "batch_size", "seq_len", "world_size", "num_experts"):
        if isinstance(info.get(k), (int, str)):
            meta["provenance"][k] = info[k]
    return make_trace(path, data.sum(axis=2), np.array(layers, dtype=np.int64), data, meta=meta)


def _span(ids: list[int]) -> str:
    return f"{len(ids)} ({ids[0]}..{ids[-1]})" if ids else "none"


def _read_rank_csv(f: Path) -> tuple[list[int], np.ndarray]:
    try:
        with open(f, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise fail(f, f"cannot read: {exc}") from None
    if not rows:
        raise fail(f, "file is empty; expected a header and one row per iteration")
    header = [h.strip().lower() for h in rows[0]]
    col = header.index(_DIST_COLUMN) if _DIST_COLUMN in header else len(header) - 1
    it_col = header.index("iteration") if "iteration" in header else None
    if len(rows) < 2:
        raise fail(f, "has a header but no iteration rows")
    iters, out = [], []
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise fail(f, f"line {i} has {len(row)} fields, the header {len(header)}")
        try:
            dist = json.loads(row[col])
            vec = np.array(dist, dtype=np.float64)
        except (json.JSONDecodeError, ValueError, TypeError, OverflowError, RecursionError):
            raise fail(f, f"line {i}: '{header[col]}' is {row[col][:40]!r}, expected a list of "
                        "per-expert counts like [12, 166, ...]") from None
        if vec.ndim != 1 or vec.size == 0:
            raise fail(f, f"line {i}: '{header[col]}' must be a flat list of counts")
        out.append(check_values(f, vec, f"line {i} '{header[col]}'"))
        iters.append(int(row[it_col]) if it_col is not None and row[it_col].strip().isdigit()
                     else i - 2)
    lens = {v.size for v in out}
    if len(lens) > 1:
        raise fail(f, f"'{header[col]}' lists {sorted(lens)} experts on different lines; "
                    "every iteration needs the same expert count")
    return iters, np.stack(out)

