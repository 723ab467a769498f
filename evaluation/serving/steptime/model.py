"""Step-time model: seconds of one forward step of a prefill or decode unit, and why.

A unit is one EP group of ``G`` GPUs (DP attention on every GPU, EP over all of them). One step
runs ``D`` dense layers, ``L`` MoE layers and the output head. Per MoE layer, vectorised over
layers (no Python loop over layers or ranks):

- **rank side** (per DP rank, from its `RankBatch`): MLA projections (FP8 GEMMs, DeepGEMM's
  dense table at the rank's tokens), core attention (prefill: FLOPs of the attended
  (query, key) pairs at a fitted BF16 throughput; decode: FlashMLA, the slower of its compute
  and its KV-cache reads), the shared expert (FP8 GEMMs) and a fixed small-kernel overhead;
- **GPU side** (per EP rank, from the tokens it *receives* under the placement): each slot's
  grouped GEMM at DeepGEMM's throughput for its tokens per expert, summed over the GPU's slots;
- **all-to-all** (dispatch, combine): prefill uses DeepEP's normal kernels, whose time on a GPU
  is its NVLink or RDMA bytes (the larger in time) over the effective bandwidth, with the traffic
  model's accounting (`evaluation.traffic`: a token is sent once per destination GPU, crosses to
  a remote node once, to the rail peer, then NVLink forwards); decode uses the low-latency
  kernels, one copy per (token, expert) pick, timed from DeepEP's per-call table scaled by the
  GPU's picks. The all-to-all is a barrier: every phase waits for the slowest GPU, and the
  rank-side stages for the slowest rank.

**Overlap** (two micro-batches X and Y, each half of every rank's batch and of the expert
load). Prefill as DeepSeek's DBO / SGLang's TBO: one micro-batch's dispatch hides behind the
other's expert GEMMs and its combine behind the other's attention stage ``A``:
``T = max(A, d) + max(M, d) + max(M, c) + max(A, c)`` per layer (``A`` = attention + shared
expert + overhead, ``M`` = routed experts, ``d``/``c`` = dispatch/combine of one micro-batch).
The normal kernels hold ``comm_sms`` of the GPU's SMs, so prefill compute in MoE layers runs at
``(sms - comm_sms) / sms`` speed. Decode as DeepSeek's 5-stage pipeline (attention split into
ATTN-0 = projections ``a1`` and ATTN-1 = core attention ``a2``; the low-latency kernels hold no
SMs in flight): X's dispatch overlaps Y's ``a1`` and its combine Y's ``a2``:
``T = 2 max(a1, d) + 2 max(a2, c) + 2 (s + o + M)``. With one micro-batch nothing overlaps:
``T = A + M + d + c`` with the whole batch.

**Breakdown** (sums to ``total_s``). Per MoE layer, ``T_act`` uses the slowest rank's
rank-side stages and the slowest GPU's ``M`` and all-to-all copies (sent and received, per
link class). ``T_dp`` equalises DP: rank-side stages at their mean over ranks, the expert GEMMs
and all-to-all recomputed with every rank sending the mean number of tokens. ``T_bal``
additionally equalises EP: ``M`` and every GPU's sent and received copies at their mean over
GPUs. Each equalisation is clamped so it never adds time.

- ``dp_wait`` = sum(``T_act - T_dp``) + the dense layers' and output head's slowest-rank excess
  (waiting caused by DP imbalance);
- ``ep_wait`` = sum(``T_dp - T_bal``) (waiting caused by EP imbalance: a hot GPU's experts or
  all-to-all traffic; exactly 0 under balanced routing);
- ``attention``, ``shared_expert``, ``moe``, ``overhead`` = the compute inside ``T_bal``
  (both micro-batches; ``overhead`` also holds ``step_overhead_s``);
  ``comm_exposed`` = ``T_bal`` minus that compute;
- ``dense_layers`` and ``lm_head`` at the mean rank.

Both waits are >= 0 because ``T`` only grows with each stage time. Counts-mode expectations:
GPU loads and bytes are expectations over tokens of the step's expert load (`evaluation.traffic`
counts mode, group-limited co-occurrence), computed here in ``O(L * P)`` per step for the
``even``/``random``/``weighted`` policies; ``local_first`` and per-source loads go through
`evaluation.traffic.simulate` (slower, exact for its model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from eplb.errors import InputError
from eplb.evaluation import traffic
from eplb.evaluation.serving.config.hardware import COMBINE_BYTES, DISPATCH_BYTES, Hardware, h800
from eplb.evaluation.serving.config.model import ModelSpec, deepseek_v3
from eplb.executor.routing import check_policy
from eplb.placement import Placement
from eplb.topology import Topology

PHASES = ("prefill", "decode")
BREAKDOWN = (
    "attention",
    "shared_expert",
    "moe",
    "comm_exposed",
    "dp_wait",
    "ep_wait",
    "dense_layers",
    "lm_head",
    "overhead",
)
MIN_GEMM_M = 64  # below this a GEMM is weight-read bound: its time stops shrinking


def check_phase(phase: str) -> str:
    if phase not in PHASES:
        raise InputError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    return phase


def _vector(name: str, value, n: int | None = None) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be numeric, got {value!r}") from None
    if arr.ndim != 1 or (n is not None and arr.shape != (n,)):
        want = f"[{n}]" if n is not None else "1-D"
        raise InputError(
            f"{name} must be a {want} array (one value per DP rank), got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise InputError(f"{name} must be finite and >= 0")
    return arr


# ------------------------------------------------------------------------------ batches
@dataclass(frozen=True, eq=False)
class RankBatch:
    """The work of one step on each DP rank (arrays ``float64[G]``, one entry per rank).

    - ``tokens``: query tokens (prefill: new tokens; decode: requests x query tokens each);
    - ``attention``: attended (query, key) pairs (prefill: ``sum n * c + n (n + 1) / 2`` over
      chunks of ``n`` new tokens after ``c`` cached ones; decode: ``sum q * kv``);
    - ``kv_tokens``: cached tokens read per layer (decode: ``sum kv``; prefill: 0);
    - ``logits``: rows of the output head (prefill: prompts whose last chunk runs;
      decode: query tokens).

    Build with `RankBatch.prefill`, `RankBatch.decode` (per-request lists) or `RankBatch.uniform`.
    """

    tokens: np.ndarray
    attention: np.ndarray
    kv_tokens: np.ndarray
    logits: np.ndarray

    def __post_init__(self) -> None:
        tokens = _vector("tokens", self.tokens)
        n = tokens.size
        if n < 1:
            raise InputError("a RankBatch needs at least one rank")
        for name in ("attention", "kv_tokens", "logits"):
            arr = _vector(name, getattr(self, name), n)
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        tokens.flags.writeable = False
        object.__setattr__(self, "tokens", tokens)

    @property
    def num_ranks(self) -> int:
        return self.tokens.size

    @classmethod
    def trusted(cls, tokens, attention, kv_tokens, logits) -> RankBatch:
        """From four ``float64[G]`` arrays the caller guarantees finite, >= 0 and of one
        length (no copies, no checks: the simulator's per-step constructor)."""
        b = object.__new__(cls)
        object.__setattr__(b, "tokens", tokens)
        object.__setattr__(b, "attention", attention)
        object.__setattr__(b, "kv_tokens", kv_tokens)
        object.__setattr__(b, "logits", logits)
        return b

    def mean(self) -> RankBatch:
        """Every rank at the mean of the ranks (the batch a perfect DP balancer would give)."""
        n = self.num_ranks
        return RankBatch(
            *(
                np.full(n, getattr(self, f).mean())
                for f in ("tokens", "attention", "kv_tokens", "logits")
            )
        )

    @classmethod
    def prefill(
        cls, new_tokens, cached_tokens=None, rank=None, *, num_ranks: int, last_chunk=None
    ) -> RankBatch:
        """From chunks: ``new_tokens: int[n]`` computed after ``cached_tokens: int[n]`` already
        in the KV cache (default 0), on DP rank ``rank: int[n]`` (default 0..n-1);
        ``last_chunk: bool[n]`` marks chunks that end their prompt (default all)."""
        new = _vector("new_tokens", new_tokens)
        n = new.size
        cached = (
            np.zeros(n) if cached_tokens is None else _vector("cached_tokens", cached_tokens, n)
        )
        ranks = _ranks(rank, n, num_ranks)
        last = np.ones(n) if last_chunk is None else np.asarray(last_chunk, dtype=np.float64)
        if last.shape != (n,):
            raise InputError(f"last_chunk must be bool[{n}], got shape {last.shape}")
        pairs = new * cached + new * (new + 1) / 2
        return cls(
            np.bincount(ranks, new, num_ranks),
            np.bincount(ranks, pairs, num_ranks),
            np.zeros(num_ranks),
            np.bincount(ranks, last, num_ranks),
        )

    @classmethod
    def decode(cls, kv_tokens, rank=None, *, num_ranks: int, query_tokens: int = 1) -> RankBatch:
        """From running requests: ``kv_tokens: int[n]`` context of each request on DP rank
        ``rank: int[n]``; ``query_tokens`` per request per step (1, or 1 + MTP drafts)."""
        kv = _vector("kv_tokens", kv_tokens)
        ranks = _ranks(rank, kv.size, num_ranks)
        q = float(query_tokens)
        if not q >= 1:
            raise InputError(f"query_tokens must be >= 1, got {query_tokens!r}")
        count = np.bincount(ranks, minlength=num_ranks).astype(np.float64) * q
        kv_sum = np.bincount(ranks, kv, num_ranks)
        return cls(count, kv_sum * q, kv_sum, count.copy())

    @classmethod
    def uniform(
        cls,
        phase: str,
        num_ranks: int,
        *,
        tokens: float,
        context: float,
        cached: float = 0.0,
        query_tokens: int = 1,
    ) -> RankBatch:
        """Every rank alike. Prefill: ``tokens`` new tokens per rank from prompts of
        ``context`` new tokens after ``cached`` cached ones (chunked prefill fills the budget,
        so on average a token attends to ``cached + (context + 1) / 2`` keys). Decode:
        ``tokens`` running requests per rank, each with ``context`` cached tokens."""
        check_phase(phase)
        ones = np.ones(num_ranks)
        if phase == "prefill":
            pairs = tokens * (cached + (context + 1) / 2)
            return cls(ones * tokens, ones * pairs, ones * 0.0, ones * tokens / max(context, 1))
        q = tokens * query_tokens
        return cls(ones * q, ones * q * context, ones * tokens * context, ones * q)


def _ranks(rank, n: int, num_ranks: int) -> np.ndarray:
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)) or num_ranks < 1:
        raise InputError(f"num_ranks must be a positive integer, got {num_ranks!r}")
    if rank is None:
        if n > num_ranks:
            raise InputError(
                f"{n} requests need rank= (which DP rank runs each); only {num_ranks} ranks"
            )
        return np.arange(n)
    r = np.asarray(rank)
    if r.shape != (n,) or (r.size and not np.issubdtype(r.dtype, np.integer)):
        raise InputError(f"rank must be int[{n}], got {r.dtype}{r.shape}")
    if r.size and (r.min() < 0 or r.max() >= num_ranks):
        raise InputError(f"rank must hold DP ranks in 0..{num_ranks - 1}")
    return r.astype(np.int64)


# ------------------------------------------------------------------------------ results
@dataclass(frozen=True, eq=False)
class StepTime:
    """One step: ``total_s`` and a ``breakdown`` (keys `BREAKDOWN`, seconds) summing to it.

    ``layer_s: float[L]`` seconds of each MoE layer; ``gpu_load_max`` / ``gpu_load_mean:
    float[L]`` routed picks on the busiest / mean GPU (expected, both micro-batches);
    ``tokens`` query tokens of the step over all ranks.
    """

    phase: str
    total_s: float
    breakdown: dict[str, float]
    layer_s: np.ndarray
    gpu_load_max: np.ndarray
    gpu_load_mean: np.ndarray
    tokens: float
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, float]:
        """``step_s`` plus the breakdown, as plain floats."""
        return {"step_s": self.total_s, **self.breakdown}


# ----------------------------------------------------------------------- GEMM throughput
class GemmCurve:
    """Seconds of a set of FP8 GEMMs ``(N, K)`` run on ``M`` tokens, from DeepGEMM's table.

    Throughput of each shape is interpolated in ``log2 M`` between the table's rows, flat
    beyond them; below ``MIN_GEMM_M`` tokens the time is the ``MIN_GEMM_M`` time (weight
    reads dominate); 0 tokens cost 0. ``scale`` multiplies every throughput (``0.5`` for BF16).
    """

    def __init__(
        self, rows, shapes, *, efficiency: float, scale: float = 1.0, substitute: dict | None = None
    ) -> None:
        table: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for m, n, k, tf in rows:
            table.setdefault((n, k), []).append((m, tf))
        self.parts = []
        for n, k in shapes:
            key = (substitute or {}).get((n, k), (n, k))
            pts = sorted(table[key])
            self.parts.append(
                (
                    2.0 * n * k,
                    np.log2([p[0] for p in pts]),
                    np.array([p[1] for p in pts]) * 1e12 * efficiency * scale,
                )
            )

    def seconds(self, m) -> np.ndarray:
        m = np.asarray(m, dtype=np.float64)
        if m.ndim == 1 and 0 < m.size <= _MEMO_MAX_SIZE:  # per-rank arrays: memoised halves
            h = m * 2.0
            j = h.astype(np.intp)
            if (j == h).all() and 0 <= j.min() and j.max() < _MEMO_HALVES:
                return self.memo().take(j)
        return self._compute(m)

    def memo(self) -> np.ndarray:
        """``float64[_MEMO_HALVES]``: seconds at ``j / 2`` tokens (built on first use)."""
        table = self.__dict__.get("_memo")
        if table is None:
            table = self.__dict__["_memo"] = self._compute(np.arange(_MEMO_HALVES) / 2.0)
        return table

    def _compute(self, m: np.ndarray) -> np.ndarray:
        eff = np.maximum(m, MIN_GEMM_M)
        lm = np.log2(eff)
        out = np.zeros_like(eff)
        for flops, xs, rates in self.parts:
            out += flops * eff / np.interp(lm, xs, rates)
        return np.where(m > 0, out, 0.0)


# GemmCurve memoises whole and half token counts below this many halves (per-rank tokens per
# micro-batch of decode and prefill steps are such counts), for arrays of at most this size
_MEMO_HALVES = 1 << 16
_MEMO_MAX_SIZE = 4096


class ExpertCurve:
    """Seconds of one routed expert's grouped GEMMs (gate+up, then down) at ``m`` tokens per
    expert, from DeepGEMM's grouped tables; same interpolation rules as `GemmCurve`."""

    def __init__(self, rows, model: ModelSpec, *, efficiency: float) -> None:
        rows = sorted(rows)
        self.xs = np.log2([r[0] for r in rows])
        self.gu = np.array([r[1] for r in rows]) * 1e12 * efficiency
        self.dn = np.array([r[2] for r in rows]) * 1e12 * efficiency
        self.f_gu = 2.0 * 2 * model.moe_intermediate * model.hidden
        self.f_dn = 2.0 * model.hidden * model.moe_intermediate
        self.floor = float(2 ** self.xs[0])

    def seconds(self, m) -> np.ndarray:
        m = np.asarray(m, dtype=np.float64)
        eff = np.maximum(m, self.floor)
        lm = np.log2(eff)
        t = eff * (
            self.f_gu / np.interp(lm, self.xs, self.gu)
            + self.f_dn / np.interp(lm, self.xs, self.dn)
        )
        return np.where(m > 0, t, 0.0)


class TabulatedCurve:
    """`ExpertCurve.seconds` from a table, for the simulator's per-step hot path.

    Seconds are tabulated at every ``step`` tokens from 0 to the curve's last table row (beyond
    it the throughput is flat, so the time is linear in the tokens and the last interval
    extrapolates exactly) and linearly interpolated: no logarithm per call (``np.log2``
    dominates `ExpertCurve.seconds`). Below the curve's floor the time is the floor's, 0 tokens
    cost 0. Relative error against the curve < `TABLE_TOL` (tested over 1e-6..1e6 tokens;
    largest just above the floor).
    """

    def __init__(self, curve: ExpertCurve, step: float = 0.25) -> None:
        top = float(2.0 ** curve.xs[-1])
        self.inv = 1.0 / step
        grid = np.arange(int(np.ceil(top / step)) + 2) * step
        t = curve.seconds(np.maximum(grid, curve.floor))
        self.t = t
        self.dt = np.append(np.diff(t), t[-1] - t[-2])
        self.last = len(grid) - 2

    def seconds(self, m: np.ndarray) -> np.ndarray:
        pos = m * self.inv
        row = np.trunc(pos)  # the table row (pos >= 0); float ops are cheaper than int ones
        if row.size and row.max() > self.last:
            np.minimum(row, self.last, out=row)
        pos -= row
        i = row.astype(np.intp)
        out = self.dt.take(i, mode="clip")  # (rows are in range: no bounds checks)
        out *= pos
        out += self.t.take(i, mode="clip")
        out *= m > 0
        return out


TABLE_TOL = 1e-5  # relative error of TabulatedCurve against ExpertCurve


# ------------------------------------------------------------ a placement prepared for steps
@dataclass(frozen=True, eq=False)
class RoutedPlacement:
    """A placement and an expected step load prepared by `StepModel.prepare` (``placement``
    None: perfectly balanced routing, every other field None)."""

    placement: Placement | None
    dist: np.ndarray | None  # float64[L, E] expected share of a layer's picks per expert
    gather: np.ndarray | None  # int64[L * P] flat index ``layer * E + expert`` of each slot
    share: np.ndarray | None  # float64[L, P] share of its expert's picks a slot receives
    v: np.ndarray | None  # float64[L, G] visit probability of each GPU (prefill)
    vn: np.ndarray | None  # float64[L, N] ... of each node (prefill)

    @property
    def load(self) -> np.ndarray | None:
        """The prepared distribution (``dist``), as a load `StepModel.time` accepts."""
        return self.dist



# ----------------------------------------------------------------------------- the model
class StepModel:
    """The step-time model of one unit (phase, shape, model, hardware, dispatch policy).

    Build once per unit and call `time` per step (the simulator's hot path); `step_time` is
    the one-call form. ``topology`` gives the unit's nodes, GPUs per node and slots per GPU
    (one DP rank per GPU).
    """

    def __init__(
        self,
        phase: str,
        topology: Topology,
        *,
        model: ModelSpec = deepseek_v3,
        hardware: Hardware = h800,
        dispatch: str = "even",
        micro_batches: int = 2,
    ) -> None:
        self.phase = check_phase(phase)
        if not isinstance(topology, Topology):
            raise InputError(f"topology must be a Topology, got {type(topology).__name__}")
        if not isinstance(model, ModelSpec):
            raise InputError(f"model must be a ModelSpec, got {type(model).__name__}")
        if not isinstance(hardware, Hardware):
            raise InputError(f"hardware must be a Hardware, got {type(hardware).__name__}")
        if micro_batches not in (1, 2):
            raise InputError(f"micro_batches must be 1 or 2, got {micro_batches!r}")
        if topology.num_slots < model.num_experts:
            raise InputError(
                f"{topology.num_slots} slots cannot hold the model's {model.num_experts} experts"
            )
        self.topology, self.model, self.hardware = topology, model, hardware
        self.dispatch = check_policy(dispatch)
        if self.dispatch == "lp":
            raise InputError(
                "the step-time model does not model lp dispatch (a min-max split per batch); "
                "use even, random, local_first or weighted, or evaluate lp with "
                "evaluation.traffic / eplb evaluate --dispatch lp"
            )
        self.micro_batches = micro_batches
        fit = hardware.fit
        eff = fit.gemm_efficiency
        h, i = model.hidden, model.moe_intermediate
        self.mla = GemmCurve(hardware.dense_gemm, model.mla_shapes, efficiency=eff)
        self.ffn = GemmCurve(
            hardware.dense_gemm,
            ((2 * i, h), (h, i)),
            efficiency=eff,
            substitute={(2 * i, h): (4096, 7168), (h, i): (7168, 2048)},
        )
        di = model.dense_intermediate
        self.dense_ffn = GemmCurve(
            hardware.dense_gemm,
            ((2 * di, h), (h, di)),
            efficiency=eff,
            substitute={(2 * di, h): (4096, 7168), (h, di): (7168, 16384)},
        )
        self.head = GemmCurve(
            hardware.dense_gemm,
            ((model.vocab, h),),
            efficiency=eff,
            scale=hardware.bf16_tflops / hardware.fp8_tflops,
            substitute={(model.vocab, h): (4096, 7168)},
        )
        self.expert = ExpertCurve(hardware.grouped_gemm, model, efficiency=eff)
        G, N = topology.num_gpus, topology.num_nodes
        self.sm_factor = (
            hardware.sms / (hardware.sms - hardware.comm_sms)
            if phase == "prefill" and micro_batches == 2
            else 1.0
        )
        ep = np.log2(G)
        if phase == "prefill":
            rows = hardware.normal_a2a
            self.bw_nv = (rows[0][1] * 1e9, rows[0][2] * 1e9)
            multi = [r for r in rows if r[0] > rows[0][0]]
            xm = np.log2([r[0] for r in multi])
            self.bw_rd = (
                float(np.interp(ep, xm, [r[3] for r in multi])) * 1e9,
                float(np.interp(ep, xm, [r[4] for r in multi])) * 1e9,
            )
        else:
            rows = hardware.ll_a2a
            x = np.log2([r[0] for r in rows])
            per_pick = hardware.ll_tokens * model.top_k
            self.ll = (
                float(np.interp(ep, x, [r[1] for r in rows])) / per_pick,
                float(np.interp(ep, x, [r[2] for r in rows])) / per_pick,
            )
        # balanced routing: per-token visit probabilities of a GPU and of a node
        kw = dict(
            num_experts=model.num_experts,
            top_k=model.top_k,
            num_groups=model.num_groups,
            topk_groups=model.topk_groups,
        )
        self.v_bal = float(traffic.visit_probability(model.num_experts / G, **kw))
        self.vn_bal = float(traffic.visit_probability(model.num_experts / N, **kw))

    # ------------------------------------------------------------------ stages
    def _rank_stages(self, batch: RankBatch):
        """Rank-side seconds of one micro-batch: (a1, a2, shared) ``[G]``."""
        mb, m, hw = self.micro_batches, self.model, self.hardware
        t = batch.tokens / mb
        a1 = self.mla.seconds(t)
        if self.phase == "prefill":
            a2 = (
                batch.attention
                / mb
                * m.prefill_flops_per_pair
                / (hw.fit.prefill_attention_tflops * 1e12)
            )
        else:
            a2 = np.maximum(
                batch.attention / mb * m.decode_flops_per_pair / (hw.mla_decode_tflops * 1e12),
                batch.kv_tokens / mb * m.kv_bytes_per_token / (hw.mla_decode_gbps * 1e9),
            )
        shared = m.shared_experts * self.ffn.seconds(t)
        return a1, a2, shared

    def _gpu_side(self, batch: RankBatch, placement: Placement | None, load):
        """GPU side of one micro-batch, as it is and with every rank's tokens at their mean.

        Returns ``(moe, recv, links, moe_eq, links_eq)``: expert-GEMM seconds per GPU
        ``[L, G]``, routed picks per GPU ``[L, G]`` (both micro-batches) and the all-to-all
        ``links``: ``(out [L, G], in [L, G], seconds per copy in dispatch, in combine)`` per
        link class, ``out`` what a GPU sends in dispatch (its rank's tokens), ``in`` what it
        receives (its experts' share).
        """
        m, topo, mb = self.model, self.topology, self.micro_batches
        L, G, S, K = m.moe_layers, topo.num_gpus, topo.slots_per_gpu, m.top_k
        src = batch.tokens / mb  # tokens each rank sends per micro-batch
        uniform = bool(np.all(src == src[0]))
        src_eq = src if uniform else np.full(G, src.mean())
        if placement is None:
            if load is not None:
                raise InputError(
                    "load needs a placement to route through; give placement= "
                    "or leave load out for perfectly balanced routing"
                )
            recv = np.full((L, G), K * src.sum() / G)
            moe = np.full((L, G), S * float(self.expert.seconds(K * src.sum() / G / S)))
            v = np.full((L, G), self.v_bal)
            vn = np.full((L, topo.num_nodes), self.vn_bal)
            links = self._links(src, recv, v, vn)
            links_eq = links if uniform else self._links(src_eq, recv, v, vn)
            return moe, recv * mb, links, moe, links_eq
        self._check_placement(placement)
        slot, recv, v, vn, report = self._routed(placement, load, src)
        moe = self.expert.seconds(slot).reshape(L, G, S).sum(-1)
        links = self._links(src, recv, v, vn, report)
        if uniform:
            return moe, recv * mb, links, moe, links
        if report is None:
            return moe, recv * mb, links, moe, self._links(src_eq, recv, v, vn)
        slot_eq, recv_eq, _, _, report_eq = self._routed(placement, load, src_eq)
        moe_eq = self.expert.seconds(slot_eq).reshape(L, G, S).sum(-1)
        return moe, recv * mb, links, moe_eq, self._links(src_eq, recv_eq, v, vn, report_eq)

    def _links(self, src, recv, v, vn, report=None) -> list:
        """All-to-all links of one micro-batch (see `_gpu_side`)."""
        m = self.model
        if self.phase == "decode":  # low-latency kernels: one copy per pick, no dedup
            out = np.broadcast_to(m.top_k * src, recv.shape)
            return [(out, recv, self.ll[0], self.ll[1])]
        if report is not None:  # bytes -> token copies
            per = m.hidden * DISPATCH_BYTES
            nv_out, nv_in = report.nvlink_out / per, report.nvlink_in / per
            rd_out, rd_in = report.rdma_out / per, report.rdma_in / per
        else:
            nv_out, nv_in, rd_out, rd_in = traffic.expected_copies(src, v, vn, self.topology)
        hd = m.hidden
        links = [
            (nv_out, nv_in, hd * DISPATCH_BYTES / self.bw_nv[0], hd * COMBINE_BYTES / self.bw_nv[1])
        ]
        if self.topology.num_nodes > 1:
            links.append(
                (
                    rd_out,
                    rd_in,
                    hd * DISPATCH_BYTES / self.bw_rd[0],
                    hd * COMBINE_BYTES / self.bw_rd[1],
                )
            )
        return links

    @staticmethod
    def _comm(links, reduce_out, reduce_in) -> tuple[np.ndarray, np.ndarray]:
        """Dispatch and combine seconds ``[L]`` of one micro-batch: the slowest link class,
        each at ``max(reduce_out(out), reduce_in(in))`` copies (reductions over GPUs)."""
        d = c = 0.0
        for out, inn, sd, sc in links:
            copies = np.maximum(reduce_out(out, axis=-1), reduce_in(inn, axis=-1))
            d = np.maximum(d, copies * sd)
            c = np.maximum(c, copies * sc)
        return d, c

    def _check_placement(self, placement: Placement) -> None:
        if not isinstance(placement, Placement):
            raise InputError(
                f"placement must be a Placement or None, got {type(placement).__name__}"
            )
        m, topo = self.model, self.topology
        pt = placement.topology
        if (pt.num_nodes, pt.gpus_per_node, pt.slots_per_gpu) != (
            topo.num_nodes,
            topo.gpus_per_node,
            topo.slots_per_gpu,
        ):
            raise InputError(
                f"placement is for {placement.topology} but the unit is {topo}; "
                "solve the placement on the unit's topology"
            )
        if (placement.num_layers, placement.num_experts) != (m.moe_layers, m.num_experts):
            raise InputError(
                f"placement has {placement.num_layers} layers x {placement.num_experts} experts "
                f"but {m.name} has {m.moe_layers} MoE layers x {m.num_experts} experts"
            )

    def _routed(self, placement: Placement, load, src: np.ndarray):
        """Per-slot picks ``[L, P]``, per-GPU picks ``[L, G]``, visit probabilities and (slow
        path) a `TrafficReport`, all for one micro-batch."""
        m, topo = self.model, self.topology
        L, E, G, K = m.moe_layers, m.num_experts, topo.num_gpus, m.top_k
        total = src.sum()
        arr = _check_step_load(load, L, G, E)
        if arr.ndim == 2 and self.dispatch != "local_first":
            dist = _normalise(arr)
            picks = dist * (K * total)  # [L, E]
            rt = traffic.slot_routing(placement, self.dispatch, m.num_groups, m.topk_groups)
            slot = np.take_along_axis(picks, rt.expert, 1) * rt.share
            recv = slot.reshape(L, G, -1).sum(-1)
            if self.phase == "decode":  # low-latency kernels: picks only
                return slot, recv, None, None, None
            v, vn = self._visits(rt, dist)
            return slot, recv, v, vn, None
        # slow path: per-source distributions or local_first, via evaluation.traffic
        if arr.ndim == 2:
            per_src = _normalise(arr)[:, None, :] * (K * src)[None, :, None]
        else:
            per_src = _normalise(arr.reshape(L * G, E)).reshape(L, G, E) * (K * src)[None, :, None]
        report = traffic.simulate(
            placement,
            source_counts=per_src,
            policy=self.dispatch,
            hidden=m.hidden,
            dispatch_bytes=DISPATCH_BYTES,
            combine_bytes=COMBINE_BYTES,
            top_k=K,
            num_groups=m.num_groups,
            topk_groups=m.topk_groups,
            keep_slots=False,
        )
        slot = traffic.expected_slot_picks(
            placement,
            per_src,
            self.dispatch,
            num_groups=m.num_groups,
            topk_groups=m.topk_groups,
        )
        return slot, report.gpu_tokens, None, None, report

    def _visits(self, rt: traffic.SlotRouting, dist: np.ndarray):
        """Visit probabilities ``(float[L, G], float[L, N])`` of a step whose picks follow
        ``dist: float[L, E]`` (the traffic model's fast path)."""
        m = self.model
        return traffic.visit_probabilities(
            rt,
            np.minimum(dist * m.top_k, 1.0),
            self.topology,
            top_k=m.top_k,
            num_groups=m.num_groups,
            topk_groups=m.topk_groups,
        )

    # ------------------------------------------------------------------ combine
    def _layer(self, a1, a2, sh, o, moe, d, c):
        """Seconds of one MoE layer from per-micro-batch stage times (arrays broadcast)."""
        f = self.sm_factor
        if self.micro_batches == 1:
            return a1 + a2 + sh + o + moe + d + c
        if self.phase == "prefill":
            A = f * (a1 + a2 + sh + o)
            M = f * moe
            return np.maximum(A, d) + np.maximum(M, d) + np.maximum(M, c) + np.maximum(A, c)
        return 2 * np.maximum(a1, d) + 2 * np.maximum(a2, c) + 2 * (sh + o + moe)

    def time(self, batch: RankBatch, placement: Placement | None = None, load=None) -> StepTime:
        """Seconds of one step of ``batch`` (`RankBatch` with one entry per GPU) under
        ``placement`` (None: perfectly balanced routing) with the step's expert ``load``
        (``float[L, E]`` picks per expert, or ``float[L, G, E]`` per source rank; only its
        shape matters, it is scaled to ``top_k`` x the batch's tokens)."""
        if not isinstance(batch, RankBatch):
            raise InputError(f"batch must be a RankBatch, got {type(batch).__name__}")
        G = self.topology.num_gpus
        if batch.num_ranks != G:
            raise InputError(
                f"batch has {batch.num_ranks} ranks but the unit has {G} GPUs (one DP rank per GPU)"
            )
        a1, a2, sh = self._rank_stages(batch)
        gpu = self._gpu_side(batch, placement, load)
        return self._assemble(batch, a1, a2, sh, *gpu, balanced=placement is None)

    def prepare(self, placement: Placement | None, load=None) -> RoutedPlacement:
        """``placement`` with an expected step load ``float[L, E]`` prepared for many steps
        (`time_routed`): the routing tables, each slot's share of a layer's picks and (prefill)
        the per-GPU / per-node visit probabilities, computed once. ``placement=None``:
        perfectly balanced routing (``load`` must be None). Not for ``local_first`` dispatch or
        per-source loads (use `time`)."""
        m, topo = self.model, self.topology
        if placement is None:
            if load is not None:
                raise InputError(
                    "load needs a placement to route through; give placement= "
                    "or leave load out for perfectly balanced routing"
                )
            return RoutedPlacement(None, None, None, None, None, None)
        self._check_placement(placement)
        if self.dispatch == "local_first":
            raise InputError(
                "prepare() covers the even/random/weighted dispatch policies; local_first "
                "routes per source rank: call time(batch, placement, load) instead"
            )
        L, E = m.moe_layers, m.num_experts
        arr = np.ones((L, E)) if load is None else _check_step_load(load, L, topo.num_gpus, E)
        if arr.ndim != 2:
            raise InputError("prepare() takes a load float[L, E]; per-source loads need time()")
        dist = _normalise(arr)
        rt = traffic.slot_routing(placement, self.dispatch, m.num_groups, m.topk_groups)
        gather = (np.arange(L)[:, None] * E + rt.expert).ravel()
        v = vn = None
        if self.phase == "prefill":
            v, vn = self._visits(rt, dist)
        return RoutedPlacement(placement, dist, gather, rt.share, v, vn)

    def time_routed(
        self,
        batch: RankBatch,
        routed: RoutedPlacement,
        load=None,
        *,
        check: bool = True,
        tabulated: bool = False,
        picks: bool = False,
    ) -> StepTime:
        """`time` on a prepared placement (`prepare`): the simulator's hot path.

        ``load``: this step's expert load ``float[L, E]`` (only each row's shape matters; it is
        scaled to ``top_k`` x the batch's tokens); None uses the prepared one, and then the
        result equals ``time(batch, routed.placement, routed.load)``. Expert picks per slot come
        from the step's load; the all-to-all visit probabilities (prefill) from the prepared
        load (an expectation over tokens either way). ``check=False`` skips validating
        ``load`` (the caller guarantees finite counts >= 0 of the right shape).
        ``tabulated``: routed-expert GEMM seconds from `TabulatedCurve` (relative error <
        `TABLE_TOL`, ~4x faster). ``picks``: ``load`` holds the step's absolute expert picks
        (both micro-batches; e.g. drawn counts whose total is ``top_k`` x tokens up to
        sampling noise), used as they are instead of rescaled to ``top_k`` x tokens.
        """
        if check:
            if not isinstance(batch, RankBatch):
                raise InputError(f"batch must be a RankBatch, got {type(batch).__name__}")
            if batch.num_ranks != self.topology.num_gpus:
                raise InputError(
                    f"batch has {batch.num_ranks} ranks but the unit has "
                    f"{self.topology.num_gpus} GPUs (one DP rank per GPU)"
                )
            if not isinstance(routed, RoutedPlacement):
                raise InputError(f"routed must come from prepare(), got {type(routed).__name__}")
        if routed.placement is None:
            if load is not None:
                raise InputError("balanced routing (placement None) takes no load")
            a1, a2, sh = self._rank_stages(batch)
            gpu = self._gpu_side(batch, None, None)
        else:
            m = self.model
            if load is None:
                dist = routed.dist
            elif picks:
                if check:
                    load = _check_step_load(
                        load, m.moe_layers, self.topology.num_gpus, m.num_experts
                    )
                dist = load
            else:
                if check:
                    load = _check_step_load(
                        load, m.moe_layers, self.topology.num_gpus, m.num_experts
                    )
                    if load.ndim != 2:
                        raise InputError("time_routed takes a load float[L, E]; use time()")
                dist = _normalise(load)
            if self.phase == "decode":
                return self._decode_routed(
                    batch,
                    self._decode_rank_side(batch),
                    routed,
                    dist,
                    tabulated,
                    picks and load is not None,
                )
            a1, a2, sh = self._rank_stages(batch)
            gpu = self._gpu_side_routed(batch, routed, dist, tabulated, picks and load is not None)
        return self._assemble(batch, a1, a2, sh, *gpu, balanced=routed.placement is None)

    def _decode_rank_side(self, batch: RankBatch):
        """Decode rank-side seconds per rank as rows ``(a1, a2, shared, dense FFN, output
        head)`` of a ``float64[5, G]`` array, read from the memoised GEMM tables when every
        rank's tokens are whole or half tokens in range (decode batches are: requests x query
        tokens), else computed."""
        m, hw, mb = self.model, self.hardware, self.micro_batches
        out = np.empty((5, batch.tokens.size))
        a2 = np.divide(batch.attention, mb, out=out[1])
        a2 *= m.decode_flops_per_pair
        a2 /= hw.mla_decode_tflops * 1e12
        kv = batch.kv_tokens / mb
        kv *= m.kv_bytes_per_token
        kv /= hw.mla_decode_gbps * 1e9
        np.maximum(a2, kv, out=a2)
        h = batch.tokens * (2.0 / mb)
        j = h.astype(np.intp)
        h2 = batch.logits * 2.0
        j2 = h2.astype(np.intp)
        # tokens are >= 0 (RankBatch), so whole values equal to their index are >= 0 too
        every = np.logical_and.reduce
        if (
            every(j == h)
            and every(j2 == h2)
            and max(np.maximum.reduce(j), np.maximum.reduce(j2)) < _MEMO_HALVES
        ):
            tables = self.__dict__.get("_decode_memo")
            if tables is None:
                head = self._head(np.arange(_MEMO_HALVES) / 2.0)
                tables = self.__dict__["_decode_memo"] = (
                    self.mla.memo(),
                    m.shared_experts * self.ffn.memo(),
                    self.dense_ffn.memo(),
                    head,
                )
            mla, shared, dense, head = tables
            mla.take(j, out=out[0], mode="clip")  # (indices checked above)
            shared.take(j, out=out[2], mode="clip")
            dense.take(j, out=out[3], mode="clip")
            head.take(j2, out=out[4], mode="clip")
            return out
        a1, _, sh = self._rank_stages(batch)
        out[0], out[2] = a1, sh
        out[3] = self.dense_ffn.seconds(batch.tokens / mb)
        out[4] = self._head(batch.logits)
        return out

    def _decode_routed(self, batch, rank, routed, dist, tabulated, picks) -> StepTime:
        """`_gpu_side_routed` + `_assemble` for decode, with only the reductions decode needs:
        the low-latency kernels move one copy per pick, so a layer's dispatch and combine
        copies are ``max(top_k x tokens sent, picks received)`` on the worst GPU (as-is), with
        DP equalised (mean sender) and with EP equalised too (mean receiver); the expert GEMMs
        depend on the received picks only, so their DP-equalised value is the actual one.
        ``rank``: `_decode_rank_side`. The three cases (as-is, DP-equalised, balanced) are the
        rows of ``[3, L]`` arrays, timed by one `_layer` call."""
        m, hw, topo, mb = self.model, self.hardware, self.topology, self.micro_batches
        L, G, S, K = m.moe_layers, topo.num_gpus, topo.slots_per_gpu, m.top_k
        o = hw.fit.layer_overhead_s
        src = batch.tokens / mb
        slot = dist.ravel().take(routed.gather, mode="clip").reshape(L, -1)
        slot *= routed.share
        slot *= (1.0 / mb) if picks else K * np.add.reduce(src)
        recv = _per_gpu(slot, S)
        curve = self.expert_table if tabulated else self.expert
        moe = _per_gpu(curve.seconds(slot), S)
        inv_g = 1.0 / G
        recv_max = np.maximum.reduce(recv, -1)
        recv_mean = np.add.reduce(recv, -1)
        recv_mean *= inv_g
        moe3 = np.empty((3, L))  # expert GEMMs: as-is, DP-equalised (the same), balanced
        np.maximum.reduce(moe, -1, out=moe3[0])
        moe3[1] = moe3[0]
        moe_mean = np.add.reduce(moe, -1)
        moe_mean *= inv_g
        np.minimum(moe3[0], moe_mean, out=moe3[2])
        ks = K * src
        out_max = float(np.maximum.reduce(ks))
        out_mean = float(np.add.reduce(ks) * inv_g)
        ll_d, ll_c = self.ll
        copies = np.empty((3, L))
        np.maximum(out_max, recv_max, out=copies[0])
        np.minimum(copies[0], np.maximum(out_mean, recv_max), out=copies[1])
        np.minimum(copies[1], np.maximum(out_mean, recv_mean), out=copies[2])
        # rank side: rows a1, a2, shared, dense FFN, head; dense layers replace row 3
        rank[3] += rank[0] + rank[1]
        rank[3] += o
        rank[3] *= m.dense_layers * mb
        total, top = np.add.reduce(rank, 1), np.maximum.reduce(rank, 1)
        a1m, a2m, shm, dense_m, head_m = total * inv_g
        col = np.empty((3, 3, 1))  # [stage a1 / a2 / shared, case, 1]
        col[:, 0, 0] = top[:3]
        col[:, 1, 0] = col[:, 2, 0] = (a1m, a2m, shm)
        t3 = self._layer(col[0], col[1], col[2], o, moe3, copies * ll_d, copies * ll_c)
        t_act_sum, t_dp_sum, t_bal_sum = np.add.reduce(t3, 1)
        per = mb * self.sm_factor
        attention = per * L * (a1m + a2m)
        shared = per * L * shm
        overhead_l = per * L * o
        moe_c = per * np.add.reduce(moe3[2])
        comm = t_bal_sum - attention - shared - overhead_l - moe_c
        dense_x, head_x = top[3], top[4]
        breakdown = {
            "attention": float(attention),
            "shared_expert": float(shared),
            "moe": float(moe_c),
            "comm_exposed": float(comm),
            "dp_wait": float(t_act_sum - t_dp_sum + (dense_x - dense_m) + (head_x - head_m)),
            "ep_wait": float(t_dp_sum - t_bal_sum),
            "dense_layers": float(dense_m),
            "lm_head": float(head_m),
            "overhead": float(overhead_l + hw.fit.step_overhead_s),
        }
        recv_max *= mb
        recv_mean *= mb
        return StepTime(
            self.phase,
            float(t_act_sum + dense_x + head_x + hw.fit.step_overhead_s),
            breakdown,
            t3[0],
            recv_max,
            recv_mean,
            float(np.add.reduce(batch.tokens)),
            meta={"micro_batches": mb, "dispatch": self.dispatch, "balanced": False},
        )

    @property
    def expert_table(self) -> TabulatedCurve:
        """The routed-expert curve as a `TabulatedCurve` (built on first use)."""
        table = self.__dict__.get("_expert_table")
        if table is None:
            table = self.__dict__["_expert_table"] = TabulatedCurve(self.expert)
        return table

    def _gpu_side_routed(
        self,
        batch: RankBatch,
        routed: RoutedPlacement,
        dist: np.ndarray,
        tabulated: bool,
        picks: bool = False,
    ):
        """`_gpu_side` for a prepared placement and a step distribution ``dist: float[L, E]``
        (``picks``: absolute picks of the whole step instead)."""
        m, topo, mb = self.model, self.topology, self.micro_batches
        L, G, S, K = m.moe_layers, topo.num_gpus, topo.slots_per_gpu, m.top_k
        src = batch.tokens / mb
        uniform = bool(np.all(src == src[0]))
        slot = dist.ravel().take(routed.gather, mode="clip").reshape(L, -1)
        slot *= routed.share
        slot *= (1.0 / mb) if picks else K * src.sum()
        recv = _per_gpu(slot, S)
        curve = self.expert_table if tabulated else self.expert
        moe = _per_gpu(curve.seconds(slot), S)
        links = self._links(src, recv, routed.v, routed.vn)
        if uniform:
            return moe, recv * mb, links, moe, links
        links_eq = self._links(np.full(G, src.mean()), recv, routed.v, routed.vn)
        return moe, recv * mb, links, moe, links_eq

    def _assemble(
        self, batch, a1, a2, sh, moe, recv, links, moe_eq, links_eq, *, balanced: bool
    ) -> StepTime:
        """The step's time and breakdown from its rank-side and GPU-side stage times."""
        m, hw, mb = self.model, self.hardware, self.micro_batches
        o = hw.fit.layer_overhead_s
        # actual, DP-equalised and balanced stage values per layer; each equalisation is
        # clamped so it never adds time (T grows with every stage)
        moe_act = np.maximum.reduce(moe, -1)
        moe_dp = moe_act if moe_eq is moe else np.minimum(moe_act, np.maximum.reduce(moe_eq, -1))
        moe_bal = np.minimum(moe_dp, _mean(moe_eq, -1))
        d_act, c_act = self._comm(links, np.maximum.reduce, np.maximum.reduce)
        if links_eq is links:
            d_dp, c_dp = d_act, c_act
        else:
            d_dp, c_dp = self._comm(links_eq, np.maximum.reduce, np.maximum.reduce)
            d_dp, c_dp = np.minimum(d_act, d_dp), np.minimum(c_act, c_dp)
        d_bal, c_bal = self._comm(links_eq, _mean, _mean)
        d_bal, c_bal = np.minimum(d_dp, d_bal), np.minimum(c_dp, c_bal)
        a1m, a2m, shm = _mean(a1, 0), _mean(a2, 0), _mean(sh, 0)
        t_act = self._layer(a1.max(), a2.max(), sh.max(), o, moe_act, d_act, c_act)
        t_dp = self._layer(a1m, a2m, shm, o, moe_dp, d_dp, c_dp)
        t_bal = self._layer(a1m, a2m, shm, o, moe_bal, d_bal, c_bal)
        L = m.moe_layers
        per = mb * self.sm_factor  # sm_factor is 1 unless prefill with two micro-batches
        attention = per * L * (a1m + a2m)
        shared = per * L * shm
        overhead_l = per * L * o
        moe_c = per * moe_bal.sum()
        comm = t_bal.sum() - attention - shared - overhead_l - moe_c
        # dense layers and output head: rank-local, the slowest rank decides
        dense_r = m.dense_layers * mb * (a1 + a2 + self.dense_ffn.seconds(batch.tokens / mb) + o)
        head_r = self._head(batch.logits)
        dense_m, head_m = _mean(dense_r, 0), _mean(head_r, 0)
        dense_x, head_x = np.maximum.reduce(dense_r), np.maximum.reduce(head_r)
        dp_wait = (t_act - t_dp).sum() + (dense_x - dense_m) + (head_x - head_m)
        breakdown = {
            "attention": float(attention),
            "shared_expert": float(shared),
            "moe": float(moe_c),
            "comm_exposed": float(comm),
            "dp_wait": float(dp_wait),
            "ep_wait": float((t_dp - t_bal).sum()),
            "dense_layers": float(dense_m),
            "lm_head": float(head_m),
            "overhead": float(overhead_l + hw.fit.step_overhead_s),
        }
        total = float(t_act.sum() + dense_x + head_x + hw.fit.step_overhead_s)
        return StepTime(
            self.phase,
            total,
            breakdown,
            t_act,
            np.maximum.reduce(recv, -1),
            _mean(recv, -1),
            float(batch.tokens.sum()),
            meta={"micro_batches": mb, "dispatch": self.dispatch, "balanced": balanced},
        )

    def _head(self, rows: np.ndarray) -> np.ndarray:
        """Output-head seconds per rank: BF16 GEMM on ``rows`` tokens, at least the time to
        read its weights."""
        m, hw = self.model, self.hardware
        t = self.head.seconds(rows)
        floor = m.vocab * m.hidden * 2 / (hw.hbm_gbps * 1e9)
        return np.where(rows > 0, np.maximum(t, floor), 0.0)


def _mean(x: np.ndarray, axis: int) -> np.ndarray:
    """Mean over ``axis`` without `np.mean`'s per-call overhead."""
    return np.add.reduce(x, axis) * (1.0 / x.shape[axis])


def _per_gpu(slot: np.ndarray, S: int) -> np.ndarray:
    """``float[L, G]``: sums of ``slot: float[L, G * S]`` over each GPU's ``S`` slots (strided
    adds: faster than a reduction over a short last axis)."""
    if S == 1:
        return slot.copy()
    L = slot.shape[0]
    flat = slot.reshape(-1)  # (1-D strided views are faster than 2-D ones)
    out = flat[0::S] + flat[1::S]
    for s in range(2, S):
        out += flat[s::S]
    return out.reshape(L, -1)


def _check_step_load(load, L: int, G: int, E: int) -> np.ndarray:
    try:
        arr = np.asarray(load, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"load must be a numeric array, got {type(load).__name__}") from None
    if arr.shape not in ((L, E), (L, G, E)):
        raise InputError(
            f"load must be float[{L}, {E}] (picks per expert per MoE layer) or "
            f"float[{L}, {G}, {E}] (per source rank), got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise InputError("load must hold finite counts >= 0")
    return arr


def _normalise(rows: np.ndarray) -> np.ndarray:
    """Each row as a distribution over experts (an all-zero row becomes uniform)."""
    s = rows.sum(-1, keepdims=True)
    return np.where(s > 0, rows / np.where(s > 0, s, 1.0), 1.0 / rows.shape[-1])


@lru_cache(maxsize=64)
def _model_for(phase, topology, model, hardware, dispatch, micro_batches) -> StepModel:
    return StepModel(
        phase,
        topology,
        model=model,
        hardware=hardware,
        dispatch=dispatch,
        micro_batches=micro_batches,
    )


def step_time(
    phase: str,
    batch: RankBatch,
    placement: Placement | None = None,
    load=None,
    *,
    config=None,
    topology: Topology | None = None,
    model: ModelSpec | None = None,
    hardware: Hardware | None = None,
    dispatch: str | None = None,
    micro_batches: int | None = None,
) -> StepTime:
    """Seconds of one forward step of a unit, with a breakdown that sums to it.

    ``batch``: `RankBatch` (one entry per DP rank = GPU). ``placement``: the unit's expert
    placement, or None for perfectly balanced routing. ``load``: the step's expert load
    ``float[L, E]`` (or ``float[L, G, E]`` per source rank) routed through ``placement``;
    its shape is used, its total is set by the batch. The unit comes from ``config`` (a
    `ClusterConfig`: model, hardware, the phase's unit, dispatch policy), else from
    ``topology`` (or the placement's) and the keyword presets (DeepSeek-V3 on H800, ``even``
    dispatch, two micro-batches). `StepModel` is the reusable form for many steps.
    """
    check_phase(phase)
    if config is not None:
        unit = config.unit(phase)
        topology = topology or unit.topology()
        model = model or config.model_spec
        hardware = hardware or config.hardware_spec
        dispatch = dispatch or config.dispatch
        micro_batches = micro_batches or unit.micro_batches
    if topology is None:
        if placement is None:
            raise InputError(
                "give config=, topology= or a placement: the unit's shape is "
                "needed for balanced routing"
            )
        topology = placement.topology
    return _model_for(
        phase,
        topology,
        model or deepseek_v3,
        hardware or h800,
        dispatch or "even",
        micro_batches or 2,
    ).time(batch, placement, load)
