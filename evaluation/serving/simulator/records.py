"""What a run records and reports: each request's times and counts, every unit step, rebalance
and fault, the per-rank utilisation buckets; `Records.result` turns them into a `SimResult`
(where latencies such as TTFT and TPOT are derived)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from eplb.evaluation.serving.config import ClusterConfig
from eplb.evaluation.serving.results.result import (
    FAULT_COLUMNS,
    REBALANCE_COLUMNS,
    STEP_COLUMNS,
    SimResult,
)
from eplb.evaluation.serving.simulator.requests import Requests
from eplb.evaluation.serving.steptime import BREAKDOWN, StepTime

if TYPE_CHECKING:  # (the units record their steps here: not imported at run time)
    from eplb.evaluation.serving.simulator.decode import DecodeUnit
    from eplb.evaluation.serving.simulator.units import Unit

COL_INPUT_DONE = STEP_COLUMNS.index("input_tokens_done")  # positions in a recorded step
COL_OUTPUT = STEP_COLUMNS.index("output_tokens")


class Records:
    """The records of one run over ``n`` requests.

    Shape: per request ``[n]``: ``routed_s``, ``decode_start_s``, ``finish_s: float64`` (NaN
    until it happens; the last attempt's), ``prefill_start_s``, ``prefill_end_s``,
    ``kv_ready_s`` (its KV at the decode rank), ``first_token_s`` (at the client: it joined
    a decode batch, or its one-token prefill ended) (the first attempt's), ``retractions:
    int64`` times decode retracted it, ``cached``,
    ``store_tokens: int64`` prompt tokens served from a cache / loaded from the store (last
    attempt), ``prefills: int64`` prefills completed. ``steps``: one tuple per unit step in
    `STEP_COLUMNS` order; ``rebalances``, ``faults``: one dict per event; ``util``: per unit
    name, per bucket index a ``float64[G]`` of rank load x seconds.
    """

    def __init__(self, n: int, bucket_s: float):
        self.bucket_s = float(bucket_s)
        self.routed_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.decode_start_s = np.full(n, np.nan)
        self.prefill_start_s = np.full(n, np.nan)
        self.prefill_end_s = np.full(n, np.nan)
        self.kv_ready_s = np.full(n, np.nan)
        self.retractions = np.zeros(n, dtype=np.int64)
        self.finish_s = np.full(n, np.nan)
        self.cached = np.zeros(n, dtype=np.int64)
        self.store_tokens = np.zeros(n, dtype=np.int64)
        self.prefills = np.zeros(n, dtype=np.int64)
        self.steps: list[tuple] = []
        self.rebalances: list[dict] = []
        self.faults: list[dict] = []
        self.util: dict[str, dict[int, np.ndarray]] = {}

    # ------------------------------------------------------------------ requests
    def finished(self, i: int, t: float) -> None:
        """Request ``i`` finished at ``t`` (once)."""
        if not math.isnan(self.finish_s[i]):  # pragma: no cover - a simulator bug
            raise AssertionError(f"request {i} finished twice")
        self.finish_s[i] = t

    def finished_many(self, idx: np.ndarray, t: float) -> None:
        """The requests ``idx: int64[m]`` (each once) finished at ``t``."""
        if not np.isnan(self.finish_s[idx]).all() or len(set(idx.tolist())) != idx.size:
            raise AssertionError("a request finished twice")  # pragma: no cover - a bug
        self.finish_s[idx] = t

    # ------------------------------------------------------------------ steps
    def step(
        self,
        unit: Unit,
        t: float,
        st: StepTime,
        tokens: float,
        requests: float,
        kv_tokens: float,
        input_done: float,
        out_tokens: float,
    ) -> None:
        """Record ``unit``'s step starting at ``t`` (its row index goes to ``unit.row``)."""
        unit.row = len(self.steps)
        ratio = st.gpu_load_max / np.where(st.gpu_load_mean > 0, st.gpu_load_mean, 1.0)
        b = st.breakdown
        self.steps.append(
            (
                unit.phase,
                unit.index,
                unit.k,
                t,
                st.total_s,
                tokens,
                requests,
                kv_tokens,
                input_done,
                out_tokens,
                float(np.add.reduce(ratio) / ratio.size),  # (ratio.mean())
                unit.version,
                *(b[key] for key in BREAKDOWN),
            )
        )

    def patch_step(self, row: int, column: int, delta: float) -> None:
        """Correct a recorded step (work a failure took away from its running step)."""
        rec = list(self.steps[row])
        rec[column] += delta
        self.steps[row] = tuple(rec)

    def busy(self, unit: Unit, t: float, dur: float, per_rank: np.ndarray) -> None:
        """Add ``per_rank: float[G]`` load over ``[t, t + dur)`` to ``unit``'s utilisation
        buckets it spans."""
        buckets = self.util.setdefault(unit.name, {})
        bs = self.bucket_s
        key = int(t // bs)
        end = t + dur
        while True:
            lo, hi = max(t, key * bs), min(end, (key + 1) * bs)
            if hi > lo or dur == 0:
                arr = buckets.get(key)
                if arr is None:
                    arr = buckets[key] = np.zeros(per_rank.size)
                arr += per_rank * (hi - lo)
            if end <= (key + 1) * bs:
                break
            key += 1

    # ------------------------------------------------------------------ result
    def result(self, req: Requests, decode: Sequence[DecodeUnit], config: ClusterConfig,
               seed: int, end: float, events: int, kv_store: dict, *,
               arrivals_end: float | None = None, duration_s: float | None = None,
               drain_cap: float = math.inf) -> SimResult:
        """The run as a `SimResult`: the requests ``req``, the ``decode`` units (steps run),
        ended at ``end`` seconds after ``events`` events; ``kv_store``: the store's counters
        (`KVStore.stats`); ``arrivals_end`` (s): the end of the window in which requests
        arrived, ``duration_s`` as asked (None: the whole workload), ``drain_cap`` (s): how
        long the run might go on after arrivals stopped."""
        df = req.frame
        first = self.first_token_s
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(req.out > 1, (self.finish_s - first) / (req.out - 1), np.nan)
        # the decode steps whose emissions each request's inter-token gaps are (latest attempt)
        k0 = np.where(req.d_unit >= 0, req.d_k0, 0)
        k1 = k0 + req.d_steps - 1
        in_decode = (req.d_phase == 2) | ~np.isnan(self.finish_s)
        k1 = np.where(in_decode & ~np.isnan(self.decode_start_s), k1, k0 - 1)
        for v, unit in enumerate(decode):
            mine = (req.d_unit == v) & (req.d_phase == 2)
            k1[mine] = np.minimum(k1[mine], unit.k - 1)  # still running: steps ended so far
        requests = pd.DataFrame(
            {
                "request_id": df["request_id"].to_numpy(),
                "arrival_s": req.arrival,
                "routed_s": self.routed_s,
                "prefill_start_s": self.prefill_start_s,
                "prefill_end_s": self.prefill_end_s,
                "kv_ready_s": self.kv_ready_s,
                "first_token_s": first,
                "decode_start_s": self.decode_start_s,
                "finish_s": self.finish_s,
                "input_tokens": req.inp,
                "cached_tokens": self.cached,
                "store_loaded_tokens": self.store_tokens,
                "output_tokens": req.out,
                "prefill_unit": req.p_unit,
                "prefill_rank": req.p_rank,
                "decode_unit": req.d_unit,
                "decode_rank": req.d_rank,
                "decode_first_step": np.where(k1 >= k0, k0, -1),
                "decode_last_step": np.where(k1 >= k0, k1, -1),
                "retries": req.retries,
                "retractions": self.retractions,
                "prefills": self.prefills,
                "ttft_s": first - req.arrival,
                "queue_s": self.prefill_start_s - req.arrival,
                "prefill_s": self.prefill_end_s - self.prefill_start_s,
                "transfer_s": self.kv_ready_s - self.prefill_end_s,
                "decode_admission_s": first - self.kv_ready_s,
                "tpot_s": tpot,
                "e2e_s": self.finish_s - req.arrival,
            }
        )
        steps = pd.DataFrame.from_records(self.steps, columns=list(STEP_COLUMNS))
        if len(steps):
            steps = steps.astype(
                {"unit": np.int64, "step": np.int64, "placement_version": np.int64}
            )
        rebalances = pd.DataFrame(self.rebalances, columns=list(REBALANCE_COLUMNS))
        faults = pd.DataFrame(self.faults, columns=list(FAULT_COLUMNS))
        util = {}
        for name, buckets in self.util.items():
            if not buckets:
                continue
            keys = sorted(buckets)
            frame = pd.DataFrame(
                np.stack([buckets[k] for k in keys]) / self.bucket_s,
                index=pd.Index([k * self.bucket_s for k in keys], name="time_s"),
            )
            frame.columns.name = "rank"
            util[name] = frame
        cfg = config
        meta = {
            "config": cfg.to_dict(),
            "config_name": cfg.name,
            "seed": seed,
            "end_s": float(end),
            "arrivals_end_s": float(end if arrivals_end is None else arrivals_end),
            "duration_s": duration_s,
            "drain_cap_s": float(drain_cap),
            "prefill_nodes": cfg.prefill.count * cfg.prefill.nodes,
            "decode_nodes": cfg.decode.count * cfg.decode.nodes,
            "prefill_gpus": cfg.prefill.num_gpus,
            "decode_gpus": cfg.decode.num_gpus,
            "slo": {"ttft_s": cfg.slo.ttft_s, "tpot_s": cfg.slo.tpot_s},
            "decode_max_running": cfg.decode.max_running_requests,
            "decode_kv_capacity_tokens": cfg.decode.kv_capacity_tokens,
            "prefill_units": cfg.prefill.count,
            "decode_units": cfg.decode.count,
            "admission": cfg.scheduler.describe(cfg.prefill.balancer, cfg.decode.balancer),
            "events": events,
            "kv_store": kv_store,
            # each phase's placement policy as run ([eplb] with [prefill.eplb] / [decode.eplb])
            "eplb": {ph: cfg.eplb_for(ph).to_dict() for ph in ("prefill", "decode")},
        }
        return SimResult(requests, steps, rebalances, faults, util, meta)
