"""Chunked prefill, one rule for the simulator (`simulator.prefill`) and `steady_state`
(`results.mix`): which tokens of which queued prompts each DP rank computes in the next step.

A queue entry is a list ``[id, todo, done, cached, ready_s]`` (tokens left to compute, computed,
served from the cache; the time its cached prefix is loaded). A chunk of ``n`` tokens at context
``c`` (tokens before it in its prompt) costs ``n (1 + (c + n / 2) / K)`` linear-token units
(`chunk_work`; ``K`` the core-attention token pairs that cost one token's linear work,
`pairs_per_token`). Modes (``scheduler.prefill_chunking``):

- ``tokens``: each rank takes chunks from the head of its own queue up to ``budget`` tokens
  (SGLang's chunked prefill, ``--chunked-prefill-size``: a prompt lives on the DP rank it was
  dispatched to and is computed chunk after chunk over steps).
- ``attention``: as ``tokens``, and a rank's work is capped at what the budget costs at
  DeepSeek's 4,096-token profile prompts; ranks above the mean work of the working ranks are
  cut to it (at least a quarter of the cap, a first chunk at least 512 tokens), so a chunk deep
  in a long prompt is shorter (DeepSeek Day-6's prefill balancer: balance core-attention
  compute across GPUs). A prompt's chunks stay on its rank.
- ``context_parallel``: as ``attention``, then ranks with spare work (below the step's target)
  take the next pieces of prompts their own rank cannot finish this step, each piece sized to
  the spare work at its context: context parallelism with pass-KV ring attention (Yang et al.,
  "Context Parallelism for Scalable Million-Token Inference", arXiv:2411.01783, MLSys 2025,
  full and persistent-KV prefill). A helper piece reads the KV of every earlier token of its
  prompt from other ranks and its own KV goes back to the prompt's rank: ``remote_kv`` tokens
  per rank (`to_batch`: ``RankBatch.kv_tokens``, which `rank_side` times at the RDMA bandwidth,
  overlapped with the attention as pass-KV does).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.config.schema import PREFILL_CHUNKING as CHUNKING
from eplb.evaluation.serving.steptime.batch import RankBatch

__all__ = [
    "CHUNKING",
    "Chunk",
    "chunk_work",
    "pairs_per_token",
    "plan",
    "to_batch",
    "work_cap",
]

PROFILE_PROMPT = 4096  # DeepSeek's profile prompt length: the budget's reference work
MIN_CHUNK = 512  # a rank's first chunk of a step is at least this long (progress)
BALANCE_FLOOR = 0.25  # a rank's work is never cut below this share of the cap
TODO, DONE, CACHED, READY = 1, 2, 3, 4  # queue entry fields

# (rank that runs it, rank whose queue holds the prompt, entry, tokens, context, last chunk)
Chunk = tuple[int, int, list, int, float, bool]


def pairs_per_token(step_s: Callable[[RankBatch], float], G: int) -> float:
    """``K``: core-attention token pairs that cost as much as one token's linear work (GEMMs,
    MoE, communication), from ``step_s`` (a balanced `RankBatch`'s step seconds on a unit of
    ``G`` ranks) at 4,096 tokens per rank, context 0 and 32,768: ``K = T0 * 32768 / (T1 - T0)``."""
    ranks = np.arange(G)

    def step(ctx: float) -> float:
        b = RankBatch.prefill(np.full(G, 4096.0), np.full(G, ctx), ranks, num_ranks=G,
                              last_chunk=np.ones(G))
        return step_s(b)

    t0, t1 = step(0.0), step(32768.0)
    return t0 * 32768.0 / (t1 - t0) if t1 > t0 else 0.0


def work_cap(budget: float, K: float) -> float:
    """A rank's step work cap (linear-token units): ``budget`` tokens at the profile prompt's
    mean context; inf when ``K`` is 0 (tokens only)."""
    return budget * (1.0 + (PROFILE_PROMPT + 1) / 2 / K) if K else math.inf


def chunk_work(n: float, ctx: float, K: float) -> float:
    """Linear-token units of a chunk of ``n`` tokens after ``ctx`` earlier ones (``n`` if K=0)."""
    return n * (1.0 + (ctx + n / 2.0) / K) if K else float(n)


def _fit(ctx: float, cost: float, K: float) -> int:
    """The largest ``n`` with ``chunk_work(n, ctx, K) <= cost``."""
    a = 1.0 + ctx / K
    return int(K * (math.sqrt(a * a + 2.0 * cost / K) - a))


def _take(q: list, t: float, budget0: int, cap: float, K: float):
    """Rank queue ``q``'s chunks at ``t`` under a work cap ``cap``: ``([(entry, n)], work,
    min_ready)``."""
    out = []
    min_ready = math.inf
    budget, cost = budget0, cap
    for e in q:
        if e[READY] > t:
            if e[READY] < min_ready:
                min_ready = e[READY]
            continue
        n = e[TODO] if e[TODO] < budget else budget
        if K:
            a = 1.0 + (e[CACHED] + e[DONE]) / K
            fit = int(K * (math.sqrt(a * a + 2.0 * cost / K) - a)) if cost < math.inf else n
            if fit < n:
                n = fit if fit >= MIN_CHUNK or budget < budget0 else min(e[TODO], MIN_CHUNK)
            if n <= 0:
                break
            cost -= n * (a + n / (2.0 * K))
        else:
            cost -= n
        out.append((e, n))
        budget -= n
        if budget <= 0 or cost <= 0:
            break
    return out, cap - cost, min_ready


def plan(
    queues: list[list[list]],
    t: float,
    budget: int,
    K: float,
    mode: str = "attention",
) -> tuple[list[Chunk], float]:
    """The next step's chunks of a unit whose rank ``r`` has queue ``queues[r]`` (entries
    ``[id, todo, done, cached, ready_s]``, FIFO), at time ``t``: ``(chunks, min_ready)``;
    ``chunks`` are `Chunk` tuples ``(rank, owner, entry, tokens, context, last)``: the ranks'
    own chunks in rank order, then context-parallel pieces (several of one prompt in prompt
    order); ``min_ready`` is the earliest ready time of
    an entry skipped (inf if none). Entries are not changed. ``K`` is ignored (0) for
    ``tokens``; tokens per rank never exceed ``budget``."""
    if mode not in CHUNKING:
        raise InputError(f"prefill chunking must be one of {', '.join(CHUNKING)}, got {mode!r}")
    if mode == "tokens":
        K = 0.0
    cap0 = work_cap(budget, K)
    picks: dict[int, tuple[list, float]] = {}
    min_ready = math.inf
    for r, q in enumerate(queues):
        if not q:
            continue
        got, work, mr = _take(q, t, budget, cap0, K)
        if mr < min_ready:
            min_ready = mr
        if got:
            picks[r] = (got, work)
    target = cap0
    if K and picks:
        works = [w for _, w in picks.values()]
        target = max(sum(works) / len(works), BALANCE_FLOOR * cap0)
        for r, (_got, work) in list(picks.items()):
            if work > target * (1 + 1e-9):
                picks[r] = (_take(queues[r], t, budget, target, K)[0], target)
    chunks: list[Chunk] = []
    for r in sorted(picks):
        for e, n in picks[r][0]:
            chunks.append((r, r, e, n, float(e[CACHED] + e[DONE]), n == e[TODO]))
    if mode == "context_parallel" and K and chunks:
        chunks = _spread(chunks, picks, len(queues), budget, K, target)
    return chunks, min_ready


def _spread(chunks, picks, G, budget, K, target) -> list[Chunk]:
    """Context parallelism: ranks with spare work take pieces of the prompts that do not
    finish this step on their own rank, the prompt with the most work left first."""
    spare = {r: target - (picks[r][1] if r in picks else 0.0) for r in range(G)}
    room = {r: budget - sum(n for _, n in picks[r][0]) if r in picks else budget for r in range(G)}
    # prompts left unfinished: the last chunk of each entry that is not its last
    left = [(c[2][TODO] - c[3], c) for c in chunks if not c[5]]
    left.sort(key=lambda x: -chunk_work(x[0], x[1][4] + x[1][3], K))
    helpers = sorted((r for r in range(G) if spare[r] > 0 and room[r] > 0),
                     key=lambda r: -spare[r])
    extra: list[Chunk] = []
    hi = 0
    for todo, c in left:
        owner, e, ctx = c[1], c[2], c[4] + c[3]
        while todo > 0 and hi < len(helpers):
            h = helpers[hi]
            n = min(todo, room[h], _fit(ctx, spare[h], K))
            if n < MIN_CHUNK and n < todo:
                hi += 1
                continue
            todo -= n
            extra.append((h, owner, e, n, ctx, todo == 0))
            ctx += n
            spare[h] -= chunk_work(n, ctx - n, K)
            room[h] -= n
            if spare[h] <= 0 or room[h] <= 0:
                hi += 1
        if hi >= len(helpers):
            break
    if not extra:
        return chunks
    # the owner's chunk is no longer the prompt's last when a helper piece follows it
    ends = {id(c[2]) for c in extra}
    out = [c[:5] + (False,) if (not c[5] and id(c[2]) in ends) else c for c in chunks]
    return out + extra


def to_batch(chunks: list[Chunk], G: int) -> RankBatch:
    """The `RankBatch` of a step's chunks on ``G`` ranks; ``kv_tokens`` counts the KV a rank
    exchanges for context-parallel pieces (a helper reads its piece's context and sends its
    piece back; the prompt's rank receives the pieces)."""
    n = len(chunks)
    new = np.empty(n)
    ctx = np.empty(n)
    rank = np.empty(n, dtype=np.int64)
    last = np.empty(n)
    remote = np.zeros(G)
    for i, (r, owner, _e, k, c, end) in enumerate(chunks):
        new[i], ctx[i], rank[i], last[i] = k, c, r, end
        if r != owner:
            remote[r] += c + k
            remote[owner] += k
    b = RankBatch.prefill(new, ctx, rank, num_ranks=G, last_chunk=last)
    if remote.any():
        b = RankBatch.trusted(b.tokens, b.attention, remote, b.logits)
    return b
