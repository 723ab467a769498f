"""The requests of a run and where each one is: prompt and output lengths, prefix blocks, the
rank serving it and what is left of it (the working state the handlers change)."""

from __future__ import annotations

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.config import ClusterConfig
from eplb.evaluation.serving.workload.model import Workload


class Requests:
    """The ``n`` requests that arrive before the end, in arrival order (index ``i``).

    Shape: every array is ``[n]``. Given: ``arrival: float64`` seconds (``arrival_l`` the same
    as a list), ``inp`` / ``out: int64`` prompt and output tokens, ``hashes`` (a list of
    prefix-block hash lists, or None). Working state: ``gen: int64`` output tokens produced so
    far; ``p_len: int64`` tokens the (latest) prefill covers; ``p_blocks: float64`` KV blocks
    it adds to its prefill rank's state; ``d_kv: int64`` KV reserved on its decode rank
    (prompt + the output tokens reserved, set when it is reserved); ``d_phase: int8`` 0 no
    decode KV, 1 KV reserved on ``d_rank`` (not running yet), 2 running there; ``p_unit``,
    ``p_rank``, ``d_unit``, ``d_rank: int64`` where it runs (-1: nowhere yet);
    ``retries: int64`` times a failure sent it back; ``d_k0: int64`` the decode step it
    joined at, ``d_need: int64`` tokens it emits in decode, ``d_steps: int64``
    the steps that takes (drawn at admission), ``d_final: float64`` its context at the end
    (taken off its rank's sum). ``done``: requests finished.
    """

    def __init__(self, workload: Workload, duration_s: float | None, config: ClusterConfig):
        df = workload.requests
        arr = df["arrival_s"].to_numpy(dtype=np.float64)
        self.cut = False  # True when duration_s left later arrivals out
        if duration_s is not None:
            keep = int(np.searchsorted(arr, float(duration_s), side="left"))
            self.cut = keep < len(df)
            df = df.iloc[:keep]
            arr = arr[:keep]
        n = self.n = len(df)
        self.frame = df
        self.arrival = arr
        self.arrival_l = arr.tolist()
        self.inp = df["input_tokens"].to_numpy(dtype=np.int64)
        self.out = df["output_tokens"].to_numpy(dtype=np.int64)
        self.hashes = (
            [h.tolist() for h in df["block_hashes"]] if "block_hashes" in df.columns else None
        )
        self.p_unit = np.full(n, -1, dtype=np.int64)
        self.p_rank = np.full(n, -1, dtype=np.int64)
        self.d_unit = np.full(n, -1, dtype=np.int64)
        self.d_rank = np.full(n, -1, dtype=np.int64)
        self.retries = np.zeros(n, dtype=np.int64)
        self.gen = np.zeros(n, dtype=np.int64)
        self.p_len = self.inp.copy()
        self.p_blocks = np.zeros(n)
        self.d_kv = self.inp + self.out
        self.d_phase = np.zeros(n, dtype=np.int8)
        self.d_steps = np.zeros(n, dtype=np.int64)
        self.d_k0 = np.zeros(n, dtype=np.int64)
        self.d_need = np.zeros(n, dtype=np.int64)
        self.d_final = np.zeros(n)
        self.done = 0
        self._check_fits(config)

    def arrivals_end(self, duration_s: float | None) -> float:
        """The end of the window in which requests arrive (s; half-open ``[0, end)``):
        ``duration_s`` when it cut the workload's arrivals, else just past the last arrival
        (a workload that ends before ``duration_s`` stops arriving there)."""
        if self.cut and duration_s is not None:
            return float(duration_s)
        last = float(self.arrival[-1]) if self.n else 0.0
        return float(np.nextafter(last, np.inf))

    def _check_fits(self, config: ClusterConfig) -> None:
        du, bs = config.decode, config.kv.block_size
        if du.kv_capacity_tokens is not None:
            need = -(-(self.inp + self.out) // bs) * bs
            bad = np.flatnonzero(need > du.kv_capacity_tokens)
            if bad.size:
                i = int(bad[0])
                rid = self.frame["request_id"].iloc[i]
                raise InputError(
                    f"request {rid} needs {int(self.inp[i] + self.out[i]):,} KV "
                    f"tokens (prompt + output) but a decode rank holds "
                    f"decode.kv_capacity_tokens = {du.kv_capacity_tokens:,}; it could never be "
                    "served: raise the capacity or drop the request"
                )

    def finish(self, i: int) -> None:
        """Request ``i`` has emitted its last token."""
        self.gen[i] = self.out[i]
        self.done += 1

    def finish_many(self, idx: np.ndarray) -> None:
        """The requests ``idx: int64[m]`` have emitted their last tokens."""
        self.gen[idx] = self.out[idx]
        self.done += idx.size


