"""vLLM's recorded expert load (offline EPLB, vLLM PR #41141), every revision of the stats file
found in the PR's history (docs/deployment.md, "vLLM"):

- revision A (commit ``63727bfc``): ``eplb_load_stats`` records only, no meta record; each
  record carries ``model``, ``num_ranks``, ``num_layers``;
- revision B (commit ``8f4722ce``): one ``eplb_load_meta`` record (model, num_ranks,
  num_groups, num_nodes, num_layers, num_redundant_experts) first, then the same records;
- revision C (``write_stats_path``): the meta record, then records holding only ``step``,
  ``expert_load`` and ``p2l_map``.

Every ``eplb_load_stats`` record is one forward pass: ``expert_load: [L][P]`` per *physical*
slot, ``p2l_map: [L][P]`` the slot's logical expert, summed onto logical experts (one window per
record, in file order: ``step`` restarts at each online rearrangement). Records of another
``record_type`` (the PR's own ``session_metadata`` / ``bench_run_start`` markers) are skipped
and counted. A main model and its MTP/draft model write records of different shapes into one
file: they are grouped by (model, layers, slots) and the group with the most MoE layers is read
(``meta["notes"]`` says what was left out). Rows are MoE-layer indices ``0..L-1``.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np

from eplb.errors import TraceError
from eplb.safeload import check_size, read_text
from eplb.traces.checks import check_values, fail, make_trace
from eplb.traces.model import Trace

META, STATS = "eplb_load_meta", "eplb_load_stats"
MAPPING = "eplb_initial_mapping"  # the placement file vLLM loads (eplb.io writes it)
REVISIONS = {"A": "63727bfc (no eplb_load_meta record)",
             "B/C": "8f4722ce or later (eplb_load_meta first)"}


def looks_like_vllm(head: bytes) -> bool:
    """True when the first line of a file is a JSON record with a ``record_type`` (vLLM's
    EPLB JSON-lines files: stats, markers, or the mapping record)."""
    first = head.split(b"\n", 1)[0].lstrip(b"\xef\xbb\xbf \t\r")
    return first[:1] == b"{" and b'"record_type"' in first


def _table(where: str, rec: dict, name: str, ints: bool) -> np.ndarray:
    raw = rec.get(name)
    if not isinstance(raw, list) or not raw or not all(isinstance(r, list) and r for r in raw):
        raise fail(where, f"{name} must be a non-empty [layers][slots] list of lists")
    if len({len(r) for r in raw}) != 1:
        raise fail(where, f"{name} is ragged: rows have lengths {sorted({len(r) for r in raw})}")
    if ints:
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31
                   for r in raw for v in r):
            raise fail(where, f"{name} must hold logical expert ids (integers >= 0)")
        return np.asarray(raw, dtype=np.int64)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for r in raw for v in r):
        raise fail(where, f"{name} must hold numbers")
    return check_values(where, np.asarray(raw, dtype=np.float64), name)


def _records(path) -> tuple[dict | None, list[tuple[str, dict]], Counter, bool]:
    """``(meta, [(where, stats record)], skipped record types, saw a mapping record)``."""
    text = read_text(path, "vLLM stats file", lambda msg: fail(path, msg))  # regular, sized
    meta, stats, skipped, mapping = None, [], Counter(), False
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            raise fail(where, f"not valid JSON ({type(exc).__name__}); the file may be "
                       "truncated (a server stopped mid-write)") from None
        kind = rec.get("record_type") if isinstance(rec, dict) else None
        if isinstance(rec, dict) and rec.get("version", 1) != 1 and kind in (META, STATS):
            raise fail(where, f"{kind} version {rec.get('version')!r}; this eplb reads version 1 "
                       "(vLLM PR #41141 revisions A to C)")
        if kind == META:
            if meta is not None:
                raise fail(where, f"a second {META} record; one run per file (split the file "
                           "at this line)")
            if stats:
                raise fail(where, f"{META} record after {STATS} records; it must come first "
                           "(two files concatenated? split them)")
            meta = rec
        elif kind == STATS:
            stats.append((where, rec))
        else:
            mapping |= kind == MAPPING
            skipped[str(kind)] += 1
    return meta, stats, skipped, mapping


def read_vllm(path: str | os.PathLike) -> Trace:
    """A trace from vLLM's expert-load stats JSONL (``counts: float64[passes, L, E]``), any
    revision of PR #41141 (module docstring); `TraceError` naming the line otherwise."""
    meta, stats, skipped, mapping = _records(path)
    if not stats:
        if mapping:
            raise fail(path, f"is vLLM's mapping file (an {MAPPING} record): a placement, not "
                       "recorded load; give it to eplb evaluate PLACEMENT TRACE or eplb solve "
                       "--previous")
        if meta is None:
            raise fail(path, f"no {META} or {STATS} record found; not a vLLM expert-load stats "
                       "file")
        raise fail(path, f"no {STATS} records found (the run recorded no steps)")
    groups: dict[tuple, list] = {}
    for where, rec in stats:
        load = _table(where, rec, "expert_load", False)
        p2l = _table(where, rec, "p2l_map", True)
        if load.shape != p2l.shape:
            raise fail(where, f"expert_load has shape {list(load.shape)} but p2l_map "
                       f"{list(p2l.shape)}; they must match")
        model = rec.get("model", (meta or {}).get("model"))
        model = model if isinstance(model, str) else None
        groups.setdefault((model, *load.shape), []).append((rec, load, p2l))
    # the main model has the most MoE layers (an MTP / draft model has one or a few)
    key = max(groups, key=lambda k: (k[1], len(groups[k])))
    chosen = groups[key]
    model, L, _ = key
    notes = []
    for other, recs in groups.items():
        if other != key:
            name = other[0] or "unnamed"
            notes.append(f"left out {len(recs)} {STATS} records of another model or shape "
                         f"({other[1]} layers x {other[2]} slots, model {name}: an MTP or "
                         f"draft model); read the {L}-layer model")
    if skipped:
        kinds = ", ".join(f"{k} x{v}" for k, v in sorted(skipped.items()))
        notes.append(f"skipped {sum(skipped.values())} records of other types ({kinds})")
    if meta is not None and isinstance(meta.get("num_layers"), int) and \
            meta["num_layers"] not in {k[1] for k in groups}:
        raise fail(path, f"{META} says num_layers {meta['num_layers']} but the stats have "
                   f"{sorted({k[1] for k in groups})} layers")
    E = int(max(p2l.max() for _, _, p2l in chosen)) + 1
    # the largest expert id sets the size: checked before the counts are allocated
    check_size(f"{path}: the counts p2l_map implies (largest expert id {E - 1})",
               (len(chosen), L, E), 8, fix="are the p2l_map expert ids right?",
               error=TraceError)
    counts = np.zeros((len(chosen), L, E))
    rows = np.arange(L)[:, None]
    for t, (_, load, p2l) in enumerate(chosen):
        np.add.at(counts[t], (np.broadcast_to(rows, p2l.shape), p2l), load)
    first = chosen[0][0]
    head = meta or {}
    prov = {"format": "vllm", "path": str(path),
            "revision": REVISIONS["A" if meta is None else "B/C"],
            "steps": [rec.get("step") for rec, _, _ in chosen]}
    for k in ("num_ranks", "num_nodes", "num_redundant_experts"):
        value = head.get(k, first.get(k))
        if value is not None:
            prov[k] = value
    info = {"provenance": prov,
            "layer_ids": "vLLM MoE-layer index (0..L-1), not the model layer id"}
    if model is not None:
        info["model"] = model
    if notes:
        info["notes"] = notes
    groups_n = head.get("num_groups")
    if isinstance(groups_n, int) and not isinstance(groups_n, bool) and groups_n > 1 \
            and E % groups_n == 0:
        info["num_groups"] = groups_n
    return make_trace(path, counts, np.arange(L), meta=info)
