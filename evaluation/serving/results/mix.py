"""A workload's length mix as the batches a saturated unit runs (`steady_state` with ``mix=``).

Prefill: every DP rank has its own FIFO queue of prompts drawn independently from the mix, as
the simulator's admission fills it under saturation (``scheduler.prefill_admission``:
``rank_queues``, dispatch on arrival to unbounded rank queues, so every rank takes the same
token budget per step, but not the same attention; ``global_queue``, the former router-held
queue, a rank taking at most one budget of queued tokens); a step's chunks come from
`steptime.chunking.plan`, the rule `simulator.prefill` runs. Decode: every rank runs ``batch``
requests drawn from the mix in proportion to their output length (a request holds its slot for
that many steps), each at a uniformly drawn point of its generation. Seeded;
docs/serving-calibration.md, "Length mixes".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.config.schema import PREFILL_ADMISSION
from eplb.evaluation.serving.steptime import RankBatch
from eplb.evaluation.serving.steptime.chunking import DONE, TODO, plan, to_batch
from eplb.evaluation.serving.workload import Workload


@dataclass(frozen=True)
class LengthMix:
    """Per-request lengths of a workload. Shape ``int64[n]`` each: ``input_tokens`` (prompt),
    ``cached_tokens`` (prefix served from the KV cache, ``<= input_tokens``),
    ``output_tokens``."""

    input_tokens: np.ndarray
    cached_tokens: np.ndarray
    output_tokens: np.ndarray

    @classmethod
    def of(cls, mix, capacity_blocks: float | None = None) -> LengthMix:
        """From a `Workload` (cache hits replayed with ``capacity_blocks``, None: unbounded,
        0: none) or a `LengthMix`."""
        if isinstance(mix, LengthMix):
            return mix
        if not isinstance(mix, Workload):
            raise InputError(
                f"mix must be a Workload or a LengthMix, got {type(mix).__name__}; "
                "read one with serving.workload.read(path)"
            )
        if len(mix) == 0:
            raise InputError("mix is an empty workload; give one with at least one request")
        frame = mix.requests
        cached = (
            np.zeros(len(mix), dtype=np.int64)
            if capacity_blocks == 0
            else mix.cached_tokens(capacity_blocks)
        )
        return cls(
            frame["input_tokens"].to_numpy(np.int64),
            np.asarray(cached, dtype=np.int64),
            frame["output_tokens"].to_numpy(np.int64),
        )

    @property
    def new_tokens(self) -> np.ndarray:
        """``int64[n]``: tokens prefill computes per prompt (at least the last one)."""
        return np.maximum(self.input_tokens - self.cached_tokens, 1)


def _apply(chunks) -> None:
    """A step's chunks are computed: each entry's todo and done move by its chunks' tokens."""
    for _r, _owner, e, n, _c, _last in chunks:
        e[TODO] -= n
        e[DONE] += n


def prefill_batches(
    mix: LengthMix,
    G: int,
    budget: int,
    steps: int,
    warmup: int,
    seed: int,
    *,
    K: float = 0.0,
    chunking: str = "tokens",
    admission: str = "rank_queues",
) -> list[RankBatch]:
    """``steps`` consecutive prefill batches of a saturated unit of ``G`` ranks, after
    ``warmup`` steps (so queues are at a random point of their prompts); each step's chunks
    from `steptime.chunking.plan` (``chunking`` mode, ``K`` pairs per token: the simulator's
    rule), the queues refilled from the mix as the simulator admits prompts
    (``scheduler.prefill_admission``): ``rank_queues``, every rank's queue holds at least
    ``budget`` tokens not yet computed (a saturated unit's unbounded queues); ``global_queue``,
    first come first served, to the rank with the fewest tokens left among those where the
    prompt keeps its tokens not yet computed within ``budget``, or that hold none."""
    if admission not in PREFILL_ADMISSION:
        raise InputError(
            f"admission must be one of {', '.join(PREFILL_ADMISSION)}, got {admission!r}"
        )
    rng = np.random.default_rng(seed)
    new, cached = mix.new_tokens, mix.cached_tokens
    n = new.size
    queues: list[list[list]] = [[] for _ in range(G)]  # steptime.chunking entries
    head = int(rng.integers(n))  # the next prompt waiting, first come first served
    out = []
    for step in range(warmup + steps):
        if admission == "rank_queues":
            _fill(queues, new, cached, budget, rng)
        else:
            head = _admit_fcfs(queues, new, cached, budget, rng, head)
        chunks, _ = plan(queues, 0.0, budget, K, chunking)
        if step >= warmup:
            out.append(to_batch(chunks, G))
        _apply(chunks)
        for r in range(G):
            queues[r] = [e for e in queues[r] if e[TODO] > 0]
    return out


def _admit_fcfs(queues, new, cached, budget, rng, head: int) -> int:
    """``global_queue`` admission (`balancers.RankState`, FCFS): the waiting head goes to the
    rank with the fewest tokens left among those where it stays within the budget (or that
    hold none); the queue waits behind it when no rank has room. Returns the next head."""
    n = new.size
    left = np.array([sum(e[TODO] for e in q) for q in queues], dtype=np.float64)
    while True:
        ok = (left == 0) | (left + new[head] <= budget)
        if not ok.any():
            return head
        r = int(np.flatnonzero(ok)[left[ok].argmin()])
        queues[r].append([head, int(new[head]), 0, int(cached[head]), 0.0])
        left[r] += new[head]
        head = int(rng.integers(n))


def _fill(queues: list[list[list]], new: np.ndarray, cached: np.ndarray, budget: int,
          rng: np.random.Generator) -> None:
    """Append prompts drawn from the mix (``new``, ``cached: int64[n]``) to every rank's queue
    until it holds at least ``budget`` tokens not yet computed (rank by rank)."""
    n = new.size
    for q in queues:
        left = sum(e[TODO] for e in q)
        while left < budget:
            i = int(rng.integers(n))
            q.append([i, int(new[i]), 0, int(cached[i]), 0.0])
            left += int(new[i])


def decode_batches(
    mix: LengthMix, G: int, batch: int, steps: int, query_tokens: int, seed: int
) -> list[RankBatch]:
    """``steps`` independent decode batches of ``G`` ranks x ``batch`` requests from the mix
    (requests drawn in proportion to their output length, context = prompt + a uniform share
    of the output)."""
    rng = np.random.default_rng(seed)
    w = mix.output_tokens.astype(np.float64)
    if w.sum() <= 0:
        raise InputError("mix has no output tokens: decode needs requests with output_tokens > 0")
    p = w / w.sum()
    out = []
    rank = np.repeat(np.arange(G), batch)
    for _ in range(steps):
        i = rng.choice(p.size, size=G * batch, p=p)
        ctx = mix.input_tokens[i] + np.floor(rng.random(i.size) * mix.output_tokens[i]) + 1
        out.append(RankBatch.decode(ctx, rank, num_ranks=G, query_tokens=query_tokens))
    return out


def prefill_ttft(
    mix: LengthMix,
    step_s,
    G: int,
    budget: int,
    rate: float,
    prompts: int,
    seed: int,
    *,
    K: float = 0.0,
    chunking: str = "tokens",
) -> np.ndarray:
    """``float64[prompts]``: seconds from arrival to the end of prefill of ``prompts`` Poisson
    arrivals at ``rate`` req/s on one prefill unit of ``G`` ranks (``step_s``: a `RankBatch`'s
    step seconds on it, e.g. ``lambda b: step_time("prefill", b, config=cfg).total_s``), each sent
    on arrival to the rank with the fewest queued tokens, each step's chunks from
    `steptime.chunking.plan` (``chunking`` mode, ``K`` pairs per token: the simulator's rule;
    first come, first served). A step-level queue: no KV transfer, no decode admission,
    balanced expert routing."""
    rng = np.random.default_rng(seed)
    pick = rng.integers(mix.new_tokens.size, size=prompts)
    new, cached = mix.new_tokens[pick], mix.cached_tokens[pick]
    arrive = np.cumsum(rng.exponential(1.0 / rate, prompts))
    queues: list[list[list]] = [[] for _ in range(G)]  # steptime.chunking entries
    queued = np.zeros(G)
    ttft = np.full(prompts, np.nan)
    t, nxt = 0.0, 0
    while nxt < prompts or queued.any():
        while nxt < prompts and arrive[nxt] <= t:  # route what arrived before the step starts
            r = int(queued.argmin())
            queues[r].append([nxt, int(new[nxt]), 0, int(cached[nxt]), 0.0])
            queued[r] += new[nxt]
            nxt += 1
        if not queued.any():
            t = float(arrive[nxt])
            continue
        chunks, _ = plan(queues, t, budget, K, chunking)
        t += step_s(to_batch(chunks, G))
        _apply(chunks)
        for _r, owner, e, n, _c, last in chunks:
            queued[owner] -= n
            if last:
                ttft[e[0]] = t - arrive[e[0]]
        for r in range(G):
            queues[r] = [e for e in queues[r] if e[TODO] > 0]
    return ttft
