"""Per-rank CSV directories (HarMoEny / ExFlow layout, e.g. ``qwen1.5-moe-harmoeny``).

``<dir>/<rank>/moe_layer-<l>.csv``: iterations become windows, ranks ``source_counts[T, L, R, E]``.
See docs/data.md, section "Reading traces" (``rankdir``).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from eplb.errors import TraceError
from eplb.safeload import check_size, json_loads, read_text
from eplb.traces.checks import FIX_FORMAT, check_values, fail, make_trace
from eplb.traces.model import Trace

_LAYER_FILE = re.compile(r"^moe_layer-(\d+)\.csv$", re.ASCII)
_LAYER_LIKE = re.compile(r"^moe_layer-(\w+)\.csv$")  # \w: also digits of other scripts
MAX_RANKS = 100_000  # rank folders (and data.json world_size) one trace may declare
_DIST_COLUMN = "expert distribution"


def read_rankdir(path: str | os.PathLike) -> Trace:
    """The trace of a per-rank CSV directory (``source_counts: float64[T, L, R, E]``)."""
    root = Path(path)
    entries = _entries(root)
    # ASCII digits only: '²'.isdigit() is true but int('²') fails, and '٣' (Arabic-Indic)
    # would be a second rank 3
    for p in entries:
        if p.name.isdigit() and not p.name.isascii():
            raise fail(p, f"rank folder name {p.name!r} is not written in ASCII digits; rank "
                       "ids are 0, 1, ... in ASCII (rename or remove that folder)")
    ranks = sorted(int(p.name) for p in entries
                   if p.is_dir() and p.name.isascii() and p.name.isdigit())
    if not ranks:
        raise fail(path, "no rank folders (0, 1, ...) holding moe_layer-<l>.csv; not a per-rank "
                    f"trace directory ({FIX_FORMAT})")
    info: dict[str, Any] = {}
    if os.path.lexists(root / "data.json"):  # a FIFO or device is refused, not read
        err = lambda msg: fail(root / "data.json", msg)  # noqa: E731
        text = read_text(root / "data.json", "data.json", err)
        try:
            info = json_loads(text, "data.json", err)
        except TraceError:
            info = {}  # optional run facts: malformed JSON is left out
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
        names = [f.name for f in _entries(root / str(r))]
        for name in names:
            m = _LAYER_LIKE.match(name)
            if m and m.group(1).isdigit() and not m.group(1).isascii():
                raise fail(root / str(r) / name, "the layer id is not written in ASCII digits; "
                           "layer files are moe_layer-<l>.csv with l in ASCII (rename or "
                           "remove it)")
        layer_sets[r] = sorted(int(m.group(1)) for name in names
                               if (m := _LAYER_FILE.match(name)))
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
                shape = (len(iters), len(layers), len(ranks), E)
                check_size(f"{path}: the per-rank counts", shape, 8,
                           error=lambda msg: TraceError(msg))
                data = np.zeros(shape)
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


def _entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        raise fail(folder, f"cannot list the folder: {exc.strerror or exc}") from None


def _read_rank_csv(f: Path) -> tuple[list[int], np.ndarray]:
    # a regular file within EPLB_MAX_BYTES (a FIFO would block, /dev/zero never end)
    text = read_text(f, "layer file", lambda msg: fail(f, msg))
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
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
        cell = row[it_col].strip() if it_col is not None else ""
        iters.append(int(cell) if cell.isascii() and cell.isdigit() else i - 2)
    lens = {v.size for v in out}
    if len(lens) > 1:
        raise fail(f, f"'{header[col]}' lists {sorted(lens)} experts on different lines; "
                    "every iteration needs the same expert count")
    return iters, np.stack(out)

