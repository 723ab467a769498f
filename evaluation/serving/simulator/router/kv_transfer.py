"""Prefilled requests' KV moves to their decode rank: one transfer at a time per prefill rank,
in order, at ``kv.transfer_gbps`` (`send`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from eplb.evaluation.serving.simulator.decode import DecodeUnit
from eplb.evaluation.serving.simulator.records import Records
from eplb.evaluation.serving.simulator.requests import Requests
from eplb.evaluation.serving.simulator.router.state import RouterState

__all__ = ["send"]


def send(st: RouterState, req: Requests, rec: Records, units: Sequence[DecodeUnit],
         got: np.ndarray, t: float) -> list[int]:
    """Start the KV transfers of the prefilled requests ``got: int64[m]`` to their decode ranks
    at ``t``; each decode unit learns when a request's KV arrives (`DecodeUnit.push`). Returns
    the decode units sent to, in index order."""
    s = st.settings
    src = (req.p_unit[got] * s.Gp + req.p_rank[got]).tolist()
    xfer = (req.p_len[got] * s.kv_bytes / s.xfer_bw).tolist()
    busy = st.xfer_busy
    woken = set()
    kv_ready = rec.kv_ready_s
    rows = zip(got.tolist(), req.d_unit[got].tolist(), req.d_rank[got].tolist(), src, xfer,
               strict=True)
    for i, v, r, g, d in rows:
        b = float(busy[g])
        ready = (t if t >= b else b) + d
        busy[g] = ready
        if kv_ready[i] != kv_ready[i]:  # NaN: the first attempt
            kv_ready[i] = ready
        units[v].push(ready, i, r)
        woken.add(v)
    return sorted(woken)
