"""Window selections written as text (``"3"``, ``"0,3,5"``, ``"a:b"`` or ``"a:b:step"``) and
windows of N forward passes (`group_passes`)."""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError, TraceError
from eplb.traces.model import Trace


def parse_windows(spec: str | None, name: str = "windows") -> int | list[int] | slice | None:
    """``spec`` as a selection for `Trace.window_index`: ``None`` (all windows), a list of
    indices (``"3"``, ``"0,3,5"``) or a slice (``"a:b"``, ``"a:b:step"``); ``name`` is what an
    `InputError` calls the value (e.g. a command-line flag)."""
    if spec is None:
        return None
    try:
        if ":" in spec:
            parts = [int(x) if x.strip() else None for x in spec.split(":")]
            if len(parts) > 3:
                raise ValueError
            return slice(*parts)
        if "," in spec:
            return [int(x) for x in spec.split(",") if x.strip()]
        return [int(spec)]
    except ValueError:
        raise InputError(f"{name} {spec!r} is not an index, a slice a:b or a list "
                         "0,3,5") from None


def group_passes(trace: Trace, passes: int) -> Trace:
    """``trace`` with every ``passes`` consecutive windows summed into one (the last window
    holds what is left over): a runtime records one window per forward pass (vLLM's stats
    records, SGLang's per-pass and stat dumps), a few dozen picks per layer each; grouping N
    passes gives windows worth solving or replaying. ``source_counts`` are summed alike;
    token-level arrays (not per window) are kept. ``meta["provenance"]["passes_per_window"]``
    records ``passes``."""
    if not isinstance(trace, Trace):
        raise TraceError(f"group_passes takes a Trace, got {type(trace).__name__}")
    if isinstance(passes, bool) or not isinstance(passes, (int, np.integer)) or passes < 1:
        raise TraceError(f"passes per window must be a whole number >= 1, got {passes!r}")
    T = trace.num_windows
    starts = np.arange(0, T, int(passes))
    counts = np.add.reduceat(trace.counts, starts, axis=0)
    src = (None if trace.source_counts is None
           else np.add.reduceat(trace.source_counts, starts, axis=0))
    meta = dict(trace.meta)
    prov = dict(meta.get("provenance") or {})
    prov["passes_per_window"] = int(passes)
    prov["passes"] = T
    meta["provenance"] = prov
    return Trace(counts, trace.layer_ids, src, trace.topk_ids, trace.token_rank, meta)
