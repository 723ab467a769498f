"""`advise`: is expert balancing worth it here? What each lever buys, in step time and tokens
per second per node, on a runtime dump's own expert loads (docs/advise.md).

The loads are measured (the dump); every time is modelled (`results.steady.steady_state`, the
step-time model); balance figures are computed exactly from the loads and a placement. A lever is
one function in `LEVERS` (``name -> function(ctx) -> list[Option]``); `Option` says which
placement, slot count and dispatch policy a row runs and what it moves. Each row is scored at the
deployment's tokens per rank against today's placement, and its break-even tokens per rank (the
fewest at which it pays, searched over a geometric grid and refined by bisection) is reported.

`advise` runs as named stages, in order: `_presets`, `_load_of` (the dump fitted to the model),
`_settings` (every other argument checked once: `_Settings`), `_context`, `_run_levers`,
`_score` (`_Scored`), `_table`, `_assemble`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from eplb import solvers
from eplb.errors import InfeasibleError, InputError
from eplb.evaluation.serving.config import DuplicateConfig, UnitConfig, kv_capacity_tokens
from eplb.evaluation.serving.config.budget import freed_kv_tokens, placement_expert_slots
from eplb.evaluation.serving.config.hardware import LP_OVERHEAD_S, Hardware, get_hardware
from eplb.evaluation.serving.config.model import ModelSpec, get_model
from eplb.evaluation.serving.operating_point import from_run
from eplb.evaluation.serving.placements import (
    fit_placement,
    sglang_first_slot,
    sglang_static,
    trivial_placement,
)
from eplb.evaluation.serving.simulator.planner import gpu_balance
from eplb.evaluation.serving.steptime import RankBatch, StepModel, kernels
from eplb.moves import migration_bytes
from eplb.placement import Placement
from eplb.solvers.primitives.validation import check_time_limit
from eplb.topology import RDMA_GBPS, Topology

__all__ = ["COLUMNS", "LEVERS", "Advice", "Option", "advise", "balance_bound"]

# how the runtime splits an expert's picks over its replicas: "even" (every source splits
# evenly, the model's default) or "sglang" (SGLang: today's trivial layout serves expert e from
# slot e only, no dispatch algorithm being set; a given or solved placement by SGLang's static
# per-source map), `placements.sglang_first_slot` / `sglang_static`
REPLICAS = ("even", "sglang")
MAX_TOKENS = 1 << 24  # top of the break-even search, tokens per rank (bounded work)
COMPUTED = "computed exactly from the dump's loads and the row's placement"
MODELLED = "modelled (step-time model, steady_state)"
MEMORY = "modelled (the hardware preset's HBM and the model's weight bytes)"
COPY = "modelled (bytes moved over the migration bandwidth)"
INPUT = "input (a setting of this run)"

# column -> (unit, source, what it is); the CLI prints one line per column
COLUMNS: dict[str, tuple[str, str, str]] = {
    "lever": ("-", INPUT, "which lever the row applies (today = the placement running now)"),
    "option": ("-", INPUT, "the row's setting of that lever"),
    "slots": ("slots/layer", INPUT, "physical expert slots per MoE layer"),
    "dispatch": ("-", INPUT, "how tokens split among an expert's replicas (even; lp per batch; "
                 "duplicate: hot experts copied per micro-batch inside a node, UltraEP)"),
    "shared_expert": ("-", INPUT, "where the shared expert runs (local: each rank its own "
                      "tokens; waterfill: poured onto the less-loaded ranks, SGLang #19290)"),
    "balance": ("max/mean", COMPUTED,
                "GPU expert-load max over mean of the summed load, tokens split evenly among "
                "an expert's replicas, averaged over layers (1.0 = perfectly balanced)"),
    "balance_bound": ("max/mean", COMPUTED,
                      "lower bound on balance for any placement on these slots: per layer "
                      "max(1, heaviest expert / min(GPUs, slots - experts + 1) / mean GPU "
                      "load), averaged over layers (the bound row's balance 1 is perfect "
                      "balance at today's slots and KV, not reachable by placement; it "
                      "ignores KV freed by craft)"),
    "tokens_per_rank": ("tokens", INPUT,
                        "tokens per rank per step (decode: running requests per rank, after the "
                        "KV-cache cap)"),
    "step_ms": ("ms", MODELLED, "time of one forward step"),
    "tok_s_per_node": ("tokens/s/node", MODELLED,
                       "throughput per node (prefill: computed input tokens; decode: output "
                       "tokens), after any migration stall amortised over the rebalance interval"),
    "gain_pct": ("%", MODELLED, "tok_s_per_node over today's at the same deployment, minus 1"),
    "bytes_moved_gb": ("GB", COMPUTED,
                       "expert weights copied from today's placement, all GPUs (1e9 bytes)"),
    "copy_s": ("s", COPY,
               "copy time: the busiest GPU's bytes over the migration bandwidth"),
    "stall_s": ("s", COPY, "seconds the unit serves nothing while copying (0 when overlapped)"),
    "kv_tokens_per_gpu": ("tokens", MEMORY,
                          "KV-cache tokens one GPU holds after weights (HBM x memory fraction "
                          "minus weights, over KV bytes per token)"),
    "max_requests_per_gpu": ("requests", MEMORY,
                             "requests of the given context that fit one GPU's KV cache"),
    "break_even_tokens": ("tokens", MODELLED,
                          "fewest tokens per rank at which the row pays (gain > 0) at every "
                          "grid point up to the deployment's; NaN: it does not pay up to the "
                          "grid's top"),
}
# decode names: a decode rank's batch is running requests (one query token each), so its two
# per-rank columns are named and counted in requests
DECODE_COLUMNS: dict[str, tuple[str, tuple[str, str, str]]] = {
    "tokens_per_rank": ("requests_per_rank", (
        "requests/rank", INPUT, "running requests per rank per step, after the KV-cache cap "
        "(what the row's KV cache holds at the context given)")),
    "break_even_tokens": ("break_even_requests", (
        "requests/rank", MODELLED, "fewest running requests per rank at which the row pays "
        "(gain > 0) at every grid point up to the deployment's; NaN: it does not pay up to "
        "the grid's top")),
}


def columns_for(phase: str) -> dict[str, tuple[str, str, str]]:
    """`COLUMNS` as ``phase``'s table names them (decode: `DECODE_COLUMNS`' renames)."""
    if phase != "decode":
        return dict(COLUMNS)
    return {DECODE_COLUMNS[k][0] if k in DECODE_COLUMNS else k:
            DECODE_COLUMNS[k][1] if k in DECODE_COLUMNS else v for k, v in COLUMNS.items()}


@dataclass(frozen=True)
class Option:
    """One row: ``placement`` (None: perfectly balanced routing) on ``slots`` slots per layer
    with ``dispatch``; ``moved_from``: the placement it is copied from (None: nothing moves)."""

    lever: str
    option: str
    slots: int
    placement: Placement | None
    dispatch: str = "even"
    moved_from: Placement | None = None
    shared_expert: str = "local"


@dataclass
class Context:
    """What a lever needs: the deployment, the measured load and today's placement."""

    phase: str
    nodes: int
    gpus_per_node: int
    slots: int
    load: np.ndarray  # float[L, E], measured
    model: Any
    hardware: Any
    today: Placement
    solver: str
    redundant: tuple[int, ...]
    seed: int
    lp_overhead_s: float = LP_OVERHEAD_S
    time_limit: float | None = None  # wall seconds per solve (solvers.solve's time_limit)
    duplicate: DuplicateConfig = field(default_factory=DuplicateConfig)
    options: dict = field(default_factory=dict)
    replicas: str = "even"  # how the runtime splits an expert's picks over its replicas
    today_given: bool = False  # ``previous`` given (else today is the trivial placement)
    notes: list = field(default_factory=list)
    solved: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # what a lever reports beside its rows

    def topology(self, slots: int) -> Topology:
        G = self.nodes * self.gpus_per_node
        if slots % G or slots < self.model.num_experts:
            raise InputError(
                f"{slots} slots per layer do not fit {G} GPUs holding "
                f"{self.model.num_experts} experts; use a multiple of {G} that is at least "
                f"{self.model.num_experts}"
            )
        return Topology(self.nodes, self.gpus_per_node, slots // G)

    @property
    def solver_label(self) -> str:
        """``lplb`` or, with solver options, ``lplb(graph=torus)``: the solver as rows name it."""
        return _solver_label(self.solver, self.options)

    def solve(self, slots: int) -> Placement:
        """The solver's placement on ``slots`` slots (solved once per slot count)."""
        if slots not in self.solved:
            try:
                self.solved[slots] = solvers.solve(
                    self.solver, self.load, self.topology(slots),
                    num_groups=self.model.num_groups, seed=self.seed,
                    time_limit=self.time_limit, **self.options,
                )
            except InfeasibleError as exc:
                raise InfeasibleError(
                    f"solver {self.solver_label!r} on {self.nodes}x{self.gpus_per_node} GPUs with "
                    f"{slots} slots: {exc}; else choose another solver"
                ) from None
        return self.solved[slots]


# ---------------------------------------------------------------- levers (one function each)
def lever_today(ctx: Context) -> list[Option]:
    """The placement running now (trivial unless ``previous`` is given): the baseline."""
    return [Option("today", ctx.today.meta.get("solver", {}).get("name", "given"), ctx.slots,
                   ctx.today)]


def lever_rebalance(ctx: Context) -> list[Option]:
    """Re-place today's slots with the solver on the measured load, moving weights."""
    new = ctx.solve(ctx.slots)
    return [Option("rebalance", ctx.solver_label, ctx.slots, new, moved_from=ctx.today)]


def lever_redundant(ctx: Context) -> list[Option]:
    """``E + N`` slots for each N in ``redundant``, placed by the solver (costs KV cache)."""
    E, G = ctx.model.num_experts, ctx.nodes * ctx.gpus_per_node
    out = []
    for n in ctx.redundant:
        if (E + n) % G:
            ctx.notes.append(f"redundant N={n} skipped: {E + n} slots do not split over {G} GPUs")
            continue
        out.append(Option("redundant", f"N={n}", E + n, ctx.solve(E + n), moved_from=ctx.today))
    return out


def lever_craft(ctx: Context) -> list[Option]:
    """Per-layer replica budgets (``craft``) at each redundant option's memory: ``L * (E + N)``
    used slots (N redundant per layer on average) split over the layers, at most
    ``ceil(L * (E + N) / G)`` routed experts on a GPU over the layers (uniform N's expert
    memory), within today's slots; the slots left empty free KV cache. N above today's
    redundant slots is skipped with a note (no room to give a hot layer more)."""
    from eplb.solvers.policies.craft import replica_plan
    from eplb.solvers.primitives.layout import max_load
    from eplb.solvers.primitives.replica_budget import layer_curves

    L, E = ctx.load.shape
    topo = ctx.topology(ctx.slots)
    G, craft_curves, out = topo.num_gpus, None, []
    for n in ctx.redundant:
        if E + n > ctx.slots:
            ctx.notes.append(f"craft N={n} skipped: today's {ctx.slots} slots per layer hold at "
                             f"most {ctx.slots - E} redundant; give --slots {E + n} or more "
                             "(more leaves a hot layer room above the average) to try it")
            continue
        if craft_curves is None:  # one set of per-layer curves serves every budget
            craft_curves = layer_curves(ctx.load, G, topo.slots_per_gpu)
        cap = math.ceil(L * (E + n) / G)  # uniform N's routed experts per GPU (rounded up)
        try:
            plan = replica_plan(ctx.load, topo, total_slots=L * (E + n), max_gpu_slots=cap,
                                curves=craft_curves)
        except InputError:  # even one replica per expert needs more memory in craft's layout
            ctx.notes.append(f"craft N={n} skipped: craft's packing of {L * E:,} slots needs "
                             f"more than uniform N={n}'s {cap} routed experts on one GPU over "
                             f"{L} layers")
            continue
        s = min(topo.slots_per_gpu, cap // L)  # greedy in this memory: s slots per GPU
        g = craft_curves.greedy.get(s)
        g_sum = None if g is None else float(max_load(ctx.load, g, topo.slots_per_gpu).sum())
        info = {"N": n, "total_slots": plan["total_slots"],
                "objective_sum": plan["objective"],
                "uniform_objective_sum": plan["uniform_objective"],
                "greedy_objective_sum": g_sum, "greedy_slots_per_gpu": None if g_sum is None else s,
                "bound_sum": plan["bound"], "split_source": plan["source"],
                "expert_slots_per_gpu": plan["expert_slots_per_gpu"],
                "used_slots": plan["used_slots"].tolist()}
        ctx.meta.setdefault("craft", []).append(info)
        vs_greedy = (f"greedy on {s} slots per GPU (the most this memory holds) "
                     f"{g_sum:,.0f} ({g_sum / max(plan['objective'], 1e-300):.4f}x)"
                     if g_sum is not None else
                     f"greedy cannot place in this memory ({s} slots per GPU hold fewer than "
                     f"{E} experts)")
        ctx.notes.append(
            f"craft N={n}: summed per-layer max GPU load {plan['objective']:,.0f} tokens against "
            f"{vs_greedy} and {plan['uniform_objective']:,.0f} for N={n} in every layer with "
            f"craft's packer "
            f"({plan['uniform_objective'] / max(plan['objective'], 1e-300):.4f}x), bound "
            f"{plan['bound']:,.0f}; {plan['total_slots']:,} used slots, "
            f"{plan['expert_slots_per_gpu']} routed experts on the fullest GPU over {L} layers "
            f"({L * topo.slots_per_gpu} with every slot used)"
        )
        p = Placement(plan["phy2log"], E, topo, meta={"solver": {"name": "craft", **info}})
        out.append(Option("craft", f"N={n}", ctx.slots, p.validate(), moved_from=ctx.today))
    return out


def _on_today_and_rebalanced(ctx: Context, lever: str, suffix: str, **how: str) -> list[Option]:
    """Two rows of a per-batch lever (``how``: `Option` fields such as ``dispatch``): on
    today's placement and on the solver's, which moves weights from today's."""
    new = ctx.solve(ctx.slots)
    return [
        Option(lever, "today", ctx.slots, ctx.today, **how),
        Option(lever, f"{ctx.solver_label}+{suffix}", ctx.slots, new, moved_from=ctx.today, **how),
    ]


def lever_dispatch_lp(ctx: Context) -> list[Option]:
    """Per-batch dispatch balancing (``lp``) on today's placement and on the rebalanced one;
    its solve (``lp_overhead_s`` per layer and micro-batch) is on the critical path."""
    return _on_today_and_rebalanced(ctx, "dispatch_lp", "lp", dispatch="lp")


def lever_waterfill(ctx: Context) -> list[Option]:
    """The shared expert's tokens poured onto the less-loaded ranks (``shared_expert =
    "waterfill"``, SGLang #19290) on today's placement and on the rebalanced one; skipped
    (with a note) for a model without a shared expert."""
    if not getattr(ctx.model, "shared_experts", 0):
        ctx.notes.append(f"waterfill skipped: {ctx.model.name} has no shared expert")
        return []
    return _on_today_and_rebalanced(ctx, "waterfill", "waterfill", shared_expert="waterfill")


def lever_dispatch_duplicate(ctx: Context) -> list[Option]:
    """Per-micro-batch expert duplication (``dispatch="duplicate"``, after UltraEP) on today's
    placement and on the rebalanced one: its planner, copy transfer and spare HBM
    (``duplicate``, a `DuplicateConfig`) are charged; skipped (with a note) where the unit
    cannot duplicate (one GPU per node, no copies, a budget below one copy)."""
    try:
        ctx.duplicate.check_usable(ctx.gpus_per_node, float(ctx.model.expert_bytes))
    except InputError as exc:
        ctx.notes.append(f"dispatch_duplicate skipped: {exc}")
        return []
    return _on_today_and_rebalanced(ctx, "dispatch_duplicate", "duplicate", dispatch="duplicate")


BOUND_NOTE = (
    "bound: perfect balance (balance 1) at today's slots and KV cache: a reference, not "
    "reachable by any placement (balance_bound is the lower bound for a placement, above 1 "
    "where a hot expert cannot be split enough), and it ignores KV cache freed by craft's "
    "empty slots, so a craft row can beat its throughput."
)


def lever_balanced(ctx: Context) -> list[Option]:
    """Perfect balance (every GPU the mean load) at today's slots and KV cache: a reference,
    not reachable by placement (``balance_bound`` may be above 1), ignoring KV cache that
    ``craft`` frees (a craft row can beat it). Says so in a note."""
    ctx.notes.append(BOUND_NOTE)
    return [Option("bound", "perfect balance", ctx.slots, None)]


LEVERS: dict[str, Callable[[Context], list[Option]]] = {
    "today": lever_today,
    "rebalance": lever_rebalance,
    "redundant": lever_redundant,
    "craft": lever_craft,
    "dispatch_lp": lever_dispatch_lp,
    "waterfill": lever_waterfill,
    "dispatch_duplicate": lever_dispatch_duplicate,
    "bound": lever_balanced,
}


# ---------------------------------------------------------------- results
@dataclass
class Advice:
    """`advise`'s answer: ``table`` (one row per option, `COLUMNS`), ``columns`` (unit, source,
    meaning of each), ``meta`` (inputs and what was measured; ``meta["craft"]``: each craft
    row's split, its objective and uniform's at the same budget), ``placements`` (each row's
    placement, None for perfect balance)."""

    table: pd.DataFrame
    columns: dict[str, tuple[str, str, str]]
    meta: dict[str, Any]
    placements: list = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        rows = self.table.astype(object).where(self.table.notna(), None).to_dict("records")
        cols = {k: {"unit": u, "source": s, "meaning": m} for k, (u, s, m) in self.columns.items()}
        return {"meta": self.meta, "columns": cols, "rows": rows}

    def to_text(self) -> str:
        t = self.table.copy()
        t.columns = [f"{c} [{self.columns[c][0]}]" if self.columns[c][0] != "-" else c
                     for c in t.columns]
        m = self.meta
        head = [
            f"eplb advise: {m['phase']} on {m['topology']} x {m['slots']} slots, {m['hardware']}, "
            f"{m['model']}, solver "
            f"{_solver_label(m['solver'], m['solver_options'])}; {m['groups']['num_groups']} "
            f"expert groups from the model preset (see notes); loads measured from "
            f"{m['source']} ({m['windows']} window(s), {m['layers']} layers, expert max/mean "
            f"{m['expert_max_over_mean']:.2f}); times modelled",
            m["curves_note"],
            operating_line(m["operating_point"]),
            "",
            t.to_string(index=False, float_format=_cell),
            "",
            "columns:",
        ]
        head += [f"  {k} [{u}]: {text} -- {src}" for k, (u, src, text) in self.columns.items()]
        head += ["", *m["notes"]]
        return "\n".join(head)


# ---------------------------------------------------------------- evaluation
class _Scorer:
    """tokens/s per node of one option at a number of tokens per rank (memoised). The unit's
    `StepModel` (the one ``step_time(config=...)`` and so `steady_state` use) with the placement
    prepared once; ``time_routed`` on it equals `steady_state`'s step (tests check this)."""

    def __init__(self, ctx: Context, opt: Option, *, kv_tokens: int, input_tokens: int,
                 memory_fraction: float, stall_fraction: float) -> None:
        self.ctx, self.opt = ctx, opt
        self.kv_tokens, self.input_tokens = kv_tokens, input_tokens
        S = opt.slots // (ctx.nodes * ctx.gpus_per_node)
        try:
            self.kv_cap = kv_capacity_tokens(ctx.model, ctx.hardware, S,
                                             memory_fraction=memory_fraction)
        except InputError:  # the weights alone overflow the HBM: the row cannot run
            self.kv_cap = 0
        placement = opt.placement
        if self.kv_cap and placement is not None and (placement.phy2log < 0).any():
            # empty slots (a replica budget) free their expert weights, as in steady_state
            self.kv_cap += freed_kv_tokens(ctx.model, S, placement_expert_slots(placement),
                                           placement.num_layers)
        unit = UnitConfig(nodes=ctx.nodes, gpus_per_node=ctx.gpus_per_node,
                          slots_per_layer=opt.slots)  # the unit steady_state would build
        self.model = StepModel(ctx.phase, unit.topology(), model=ctx.model,
                               hardware=ctx.hardware, dispatch=opt.dispatch,
                               micro_batches=unit.micro_batches,
                               lp_overhead_s=ctx.lp_overhead_s,
                               shared_expert=opt.shared_expert,
                               duplicate=ctx.duplicate)
        spare = self.model.policy.reserved_bytes()  # e.g. duplication's copies' spare HBM
        if spare:  # comes out of the KV cache
            m = ctx.model
            self.kv_cap = max(0, self.kv_cap - int(spare // (m.kv_bytes_per_token
                                                             * m.num_layers)))
        self.fits = self.kv_cap > 0
        self.max_requests = self.kv_cap // kv_tokens
        self.keep = 1.0 - stall_fraction
        self.memo: dict[int, dict] = {}
        if placement is not None:  # on the unit's topology object
            placement = Placement(placement.phy2log, placement.num_experts, unit.topology(),
                                  placement.replica_share, placement.meta, placement.layer_ids)
        self.routed = self.model.prepare(placement, None if placement is None else ctx.load)

    def tokens(self, t: int) -> int:
        if not self.fits:
            return 0
        return t if self.ctx.phase == "prefill" else min(t, self.max_requests)

    def at(self, t: int) -> dict:
        if t not in self.memo:
            n = self.tokens(t)
            if n < 1:  # no request fits the KV cache
                self.memo[t] = {"step_s": math.nan, "tok_s_per_node": 0.0, "tokens": 0}
            else:
                ctx = self.ctx
                G = ctx.nodes * ctx.gpus_per_node
                if ctx.phase == "prefill":
                    rb = RankBatch.uniform("prefill", G, tokens=n, context=self.input_tokens,
                                           cached=0)
                else:
                    rb = RankBatch.uniform("decode", G, tokens=n, context=self.kv_tokens,
                                           query_tokens=1)
                step = self.model.time_routed(rb, self.routed).total_s
                tok_s = ctx.gpus_per_node * n / step  # as steady_state (no MTP drafts)
                self.memo[t] = {"step_s": step, "tok_s_per_node": tok_s * self.keep,
                                "tokens": n}
        return self.memo[t]


def _break_even(opt: _Scorer, base: _Scorer, tokens: int, top: int) -> float:
    """Fewest tokens per rank from which ``opt`` pays (gain > 0) at every grid point through
    ``tokens`` when it pays at ``tokens``; else the fewest above ``tokens`` from which it pays
    through ``top``, or NaN. Grid: powers of two and ``tokens``; the crossing is refined by
    bisection on integers."""
    def pays(t: int) -> bool:
        return opt.at(t)["tok_s_per_node"] > base.at(t)["tok_s_per_node"]

    grid = sorted({2 ** k for k in range(int(math.log2(top)) + 1)} | {tokens, top})
    i = grid.index(tokens)
    if pays(tokens):
        j = i
        while j > 0 and pays(grid[j - 1]):
            j -= 1
        if j == 0:
            return float(grid[0])
        lo, hi = grid[j - 1], grid[j]  # lo does not pay, hi does
    else:
        up = [t for t in grid[i + 1:]]
        ok = [pays(t) for t in up]
        first = next((k for k in range(len(up)) if all(ok[k:])), None)
        if first is None:
            return math.nan
        hi = up[first]
        lo = up[first - 1] if first > 0 else tokens
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pays(mid):
            hi = mid
        else:
            lo = mid
    return float(hi)


def balance_bound(load: np.ndarray, num_gpus: int, slots: int) -> float:
    """Lower bound on the layer-mean of max/mean GPU load of ``load: float[L, E]`` for any
    placement of ``slots`` slots on ``num_gpus`` GPUs and any split among replicas: an expert
    has at most ``slots - E + 1`` replicas, so its load lands on at most
    ``min(num_gpus, slots - E + 1)`` GPUs, one of which gets at least its share; and the
    largest GPU load is at least the mean. Non-increasing in ``slots``."""
    L, E = load.shape
    mean = load.sum(1) / num_gpus
    ok = mean > 0
    if not ok.any():
        return 1.0
    spread = min(num_gpus, slots - E + 1)
    per = np.maximum(1.0, load.max(1)[ok] / spread / mean[ok])
    return float(per.mean())


def _cell(x: float) -> str:
    """A table cell: 4 significant digits below 1,000, whole numbers with separators above
    (``32,280``, never ``3.228e+04``)."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:,.4g}"


def _groups_used(ctx: Context) -> tuple[dict, str]:
    """The expert groups every solved row was placed with, where they came from, and what the
    solver made of them: ``(meta, note)``. The groups are the model preset's (``num_groups``
    is passed to the solver); ``deepseek`` is DeepSeek's hierarchical policy when they are a
    multiple of the nodes and its global policy otherwise, so its rows differ by topology."""
    m = ctx.model
    policies = sorted({p.meta.get("solver", {}).get("policy") for p in ctx.solved.values()}
                      & {"hierarchical", "global"})  # deepseek's record of what it did
    meta = {"num_groups": int(m.num_groups), "topk_groups": int(m.topk_groups),
            "source": f"model preset {m.name}", "nodes": int(ctx.nodes),
            "solver_policy": policies[0] if len(policies) == 1 else policies or None}
    note = (f"expert groups: {m.num_groups} (a token picks experts from {m.topk_groups} of "
            f"them), from the model preset {m.name} (--model), passed as num_groups to solver "
            f"{ctx.solver_label} for every row it places")
    if ctx.solver == "deepseek" or policies:
        fits = m.num_groups % ctx.nodes == 0
        why = (f"{m.num_groups} groups are a multiple of the {ctx.nodes} nodes" if fits else
               f"{m.num_groups} groups are not a multiple of the {ctx.nodes} nodes")
        if policies:
            note += f"; its rows use the {'/'.join(policies)} policy"
            if ctx.solver == "deepseek":
                note += f" ({why}: DeepSeek's hierarchical policy needs that)"
        elif ctx.solver == "deepseek":  # no row solved here
            note += (f"; a {ctx.solver} row would use the "
                     f"{'hierarchical' if fits else 'global'} policy ({why})")
    return meta, note + "."


def _solver_label(solver: str, options: Mapping[str, Any]) -> str:
    """``solver`` with its options, ``lplb(graph=torus)``; the bare name without options."""
    if not options:
        return solver
    return f"{solver}({','.join(f'{k}={v}' for k, v in sorted(options.items()))})"


def _positive_int(name: str, value, *, zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (
        0 if zero else 1
    ):
        raise InputError(f"{name} must be an integer >= {0 if zero else 1}, got {value!r}")
    return int(value)


def advise(
    dump,
    topology: str,
    slots: int,
    *,
    phase: str = "decode",
    tokens_per_rank: int | None = None,
    hardware: str = "h800",
    model: str = "deepseek_v3",
    previous: Placement | str | None = None,
    redundant: Sequence[int] = (0, 32, 64),
    solver: str = "deepseek",
    solver_options: Mapping[str, Any] | None = None,
    levers: Sequence[str] | None = None,
    kv_tokens: int = 4096,
    input_tokens: int = 4096,
    migration: str = "stall",
    migration_gbps: float = RDMA_GBPS,
    rebalance_interval_s: float = 600.0,
    memory_fraction: float = 0.85,
    lp_overhead_s: float = LP_OVERHEAD_S,
    duplicate: DuplicateConfig | None = None,
    max_tokens: int | None = None,
    seed: int = 0,
    time_limit: float | None = None,
    replicas: str = "even",
    from_summary: str | os.PathLike | None = None,
) -> Advice:
    """What each lever (`LEVERS`) buys on ``dump``'s measured expert loads.

    ``dump``: a trace file (SGLang expert-distribution JSON/.pt, a native trace, a stacked
    windows file; windows are summed), a `Trace`, ``float[L, E]``, or a list of files or
    traces (stacked as windows, `traces.stack`, then summed). ``topology``: ``"NxG"``
    (nodes x GPUs per node, one EP/DP rank per GPU); ``slots``: physical slots per layer today.
    ``tokens_per_rank``: prefill tokens per rank per step (default 16,384) or decode running
    requests per rank (default 128) at ``kv_tokens`` context each; prefill prompts have
    ``input_tokens`` tokens. ``previous``: today's placement (a `Placement` or a placement
    file, its rows matched to the model's MoE layers by layer id: `placements.fit_placement`;
    default the trivial one, slot p holds expert p mod E). ``redundant``: the N of the
    ``E + N`` rows. ``solver`` places every row that solves (rebalance, redundant, and the
    rebalanced rows of the per-batch levers) with ``solver_options`` (its ``**options``, e.g.
    ``{"graph": "torus"}`` for ``lplb``; checked by `solvers.resolve`). Rebalancing copies
    weights at ``migration_gbps`` (GB/s per GPU); with ``migration="stall"`` the unit stops
    for the copy, amortised over ``rebalance_interval_s``.
    KV capacity per GPU: ``memory_fraction`` of the preset's HBM minus weights (and, for the
    ``dispatch_duplicate`` rows, minus ``duplicate.hbm_gb``; ``duplicate``: a `DuplicateConfig`,
    default its cited/assumed defaults). Break-even
    search runs up to ``max_tokens`` (default 4x the deployment's or 65,536 / 1,024).
    ``time_limit``: wall seconds per solve (`solvers.solve`; a third-party policy past it is
    stopped).
    ``replicas``: how the runtime splits an expert's picks over its replicas (`REPLICAS`):
    ``"even"`` (every source evenly) or ``"sglang"`` (SGLang's code paths: the trivial layout
    with no dispatch algorithm serves expert e from slot e only; a given or solved placement
    by SGLang's static per-source map).
    ``from_summary``: a simulation's output folder (or its ``summary.json``): the operating
    point it measured (`operating_point.from_run`: tokens or running requests per rank, the
    context) replaces ``tokens_per_rank`` and ``kv_tokens`` / ``input_tokens``.
    Returns an `Advice` (``table``: one row per option, `COLUMNS`; decode names its per-rank
    columns in requests, `columns_for`).
    """
    m, hw = _presets(phase, model, hardware)
    source = "as given"
    if from_summary is not None:  # the operating point a simulation measured
        tokens_per_rank, kv_tokens, input_tokens, source = _measured_point(from_summary, phase)
    load, measured = _load_of(dump, m)  # before the topology: a dump of another model first
    s = _settings(  # every other argument, checked once
        phase, m, hw, topology, slots, tokens_per_rank=tokens_per_rank, kv_tokens=kv_tokens,
        input_tokens=input_tokens, migration=migration, migration_gbps=migration_gbps,
        rebalance_interval_s=rebalance_interval_s, memory_fraction=memory_fraction,
        lp_overhead_s=lp_overhead_s, duplicate=duplicate, redundant=redundant, levers=levers,
        solver=solver, solver_options=solver_options, max_tokens=max_tokens, seed=seed,
        time_limit=time_limit,
        replicas=replicas, source=source,
    )
    ctx = _context(s, load, previous)  # today's placement and what every lever reads
    opts = _run_levers(ctx, s.levers)  # each lever's rows, today's first
    scored = _score(ctx, s, opts)  # each row's scorer and the weights it moves
    table = _table(ctx, s, scored)  # each row at the operating point, its break-even
    return _assemble(ctx, s, measured, scored, table)  # notes, meta, the Advice


# ---------------------------------------------------------------- advise's stages, in order
@dataclass(frozen=True)
class _Settings:
    """`advise`'s arguments besides the dump and ``previous``, each checked once and resolved
    (defaults filled in); what the stages after the check read."""

    phase: str  # "prefill" | "decode"
    model: ModelSpec
    hardware: Hardware
    topology_text: str  # as given, "NxG": the meta and messages quote it
    topology: Topology  # today's unit: nodes x GPUs, the slots per layer
    tokens_per_rank: int  # the operating point: prefill tokens, decode running requests
    kv_tokens: int  # decode context per request, tokens
    input_tokens: int  # prefill prompt, tokens
    migration: str  # "stall" | "overlap"
    migration_gbps: float  # GB/s per GPU
    rebalance_interval_s: float  # s between rebalances (a stall is amortised over it)
    memory_fraction: float  # of HBM, in (0, 1]
    lp_overhead_s: float  # s per MoE layer and micro-batch
    duplicate: DuplicateConfig
    redundant: tuple[int, ...]  # the N of the E + N rows
    levers: tuple[str, ...]  # names in `LEVERS`, "today" first
    solver: str
    solver_options: dict[str, Any]
    max_tokens: int  # top of the break-even search, tokens per rank
    seed: int
    time_limit: float | None = None  # wall seconds per solve
    replicas: str = "even"  # `REPLICAS`: how the runtime splits picks over replicas
    source: str = "as given"  # where the operating point came from (as given, a simulation)


def _measured_point(path, phase: str) -> tuple[int, int, int, str]:
    """``(tokens_per_rank, kv_tokens, input_tokens, source)`` from the operating point a
    simulation measured (`operating_point.from_run`) in ``phase``: its per-rank tokens or
    running requests (rounded, at least 1) and its context (decode) or prompt (prefill)."""
    ops = from_run(path)
    if phase not in ops:
        raise InputError(f"from_summary {path}: the run has no {phase} steps; give a run that "
                         f"served {phase} or another --phase")
    op = ops[phase]
    per_rank = max(1, int(round(op["per_rank"])))
    ctx = max(1, int(round(op["context_tokens"]))) if math.isfinite(op["context_tokens"]) \
        else 4096
    unit = "tokens" if phase == "prefill" else "running requests"
    source = (f"{op['source']}: {op['per_rank']:,.1f} {unit} per rank, context "
              f"{op['context_tokens']:,.0f} tokens")
    if phase == "decode":
        return per_rank, ctx, 4096, source
    return per_rank, 4096, ctx, source


def _presets(phase: str, model: str, hardware: str) -> tuple[ModelSpec, Hardware]:
    """The phase checked and the model and hardware presets looked up: the checks before the
    dump is read (a dump is then matched to the model)."""
    if phase not in ("prefill", "decode"):
        raise InputError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    return get_model(model), get_hardware(hardware)


def _load_of(dump, model: ModelSpec) -> tuple[np.ndarray, dict]:
    """``dump`` (see `advise`) read and fitted to ``model``: its windows summed into
    ``load: float[L, E]`` over the model's MoE layers (a dump of every model layer loses its
    dense rows), and what was measured (source, windows, layers, expert max/mean)."""
    from eplb import traces

    if isinstance(dump, traces.Trace):
        tr, source = dump, "a Trace"
    elif isinstance(dump, (list, tuple)):  # several dumps: stacked as windows (`traces.stack`)
        if len(dump) == 1:
            return _load_of(dump[0], model)
        tr = traces.stack(list(dump))
        source = ", ".join(str(d) if not isinstance(d, traces.Trace) else "a Trace"
                           for d in dump)
    elif isinstance(dump, np.ndarray):
        arr = np.asarray(dump, dtype=np.float64)
        if arr.ndim != 2 or not np.isfinite(arr).all() or (arr < 0).any():
            raise InputError("dump as an array must be finite counts >= 0, float[L, E]")
        tr, source = traces.Trace(arr[None]), "an array"
    else:
        tr, source = traces.read(dump), str(dump)
    counts = np.asarray(tr.counts, dtype=np.float64)
    L, E = counts.shape[1:]
    if L == model.num_layers and model.dense_layers:  # every model layer: drop the dense ones
        counts = counts[:, list(model.moe_layer_index)]
        L = counts.shape[1]
    if (L, E) != (model.moe_layers, model.num_experts):
        from eplb.evaluation.serving.config.model import MODELS

        presets = ", ".join(f"{k} ({v.moe_layers} MoE layers x {v.num_experts} experts)"
                            for k, v in MODELS.items())
        raise InputError(
            f"dump {source}: {L} layers x {E} experts, but model {model.name} has "
            f"{model.moe_layers} MoE layers x {model.num_experts} experts; give the dump's "
            f"own model with --model: a preset ({presets}) or the path of its Hugging Face "
            "config.json"
        )
    load = counts.sum(0)
    if not (load.sum(1) > 0).any():
        raise InputError(f"dump {source}: every layer's load is zero; nothing to balance")
    mean = load.mean(1)
    ok = mean > 0
    emax = float((load.max(1)[ok] / mean[ok]).mean())
    return load, {"source": source, "windows": int(counts.shape[0]), "layers": int(L),
                  "expert_max_over_mean": emax}


def _settings(phase: str, m: ModelSpec, hw: Hardware, topology: str, slots: int, *,
              tokens_per_rank: int | None, kv_tokens: int, input_tokens: int, migration: str,
              migration_gbps: float, rebalance_interval_s: float, memory_fraction: float,
              lp_overhead_s: float, duplicate: DuplicateConfig | None,
              redundant: Sequence[int], levers: Sequence[str] | None, solver: str,
              solver_options: Mapping[str, Any] | None, max_tokens: int | None,
              seed: int, time_limit: float | None = None, replicas: str = "even",
              source: str = "as given") -> _Settings:
    """The remaining arguments checked once, in the order their errors are reported
    (topology, token counts, migration, memory, lists, solver, search top), with defaults
    resolved: tokens per rank 16,384 (prefill) or 128 (decode); the break-even search to 4x
    that or 65,536 / 1,024; ``duplicate`` its `DuplicateConfig` defaults."""
    topo = Topology.parse(topology, slots=slots, min_slots=m.num_experts)
    hw.check_node(topo.gpus_per_node, f"topology {topology}: GPUs per node")
    if tokens_per_rank is None:
        tokens_per_rank = 16384 if phase == "prefill" else 128
    tokens_per_rank = _positive_int("tokens_per_rank", tokens_per_rank)
    kv_tokens = _positive_int("kv_tokens", kv_tokens)
    input_tokens = _positive_int("input_tokens", input_tokens)
    _check_migration(migration, migration_gbps, rebalance_interval_s)
    _check_memory(memory_fraction, lp_overhead_s)
    if duplicate is None:
        duplicate = DuplicateConfig()
    if not isinstance(duplicate, DuplicateConfig):
        raise InputError(f"duplicate must be a DuplicateConfig, got {type(duplicate).__name__}")
    red, names = _check_lists(redundant, levers)
    _check_redundant(red, m.num_experts, topo.num_gpus)
    options = _check_solver(solver, solver_options)
    top = max_tokens if max_tokens is not None else max(
        4 * tokens_per_rank, 65536 if phase == "prefill" else 1024)
    top = _positive_int("max_tokens", top)
    if top > MAX_TOKENS:
        raise InputError(f"max_tokens {top:,} is above {MAX_TOKENS:,} tokens per rank; use less")
    if top < tokens_per_rank:
        raise InputError(f"max_tokens {top} is below tokens_per_rank {tokens_per_rank}")
    if replicas not in REPLICAS:
        raise InputError(f"replicas must be one of {', '.join(REPLICAS)}, got {replicas!r}")
    return _Settings(phase, m, hw, topology, topo, tokens_per_rank, kv_tokens, input_tokens,
                     migration, float(migration_gbps), float(rebalance_interval_s),
                     float(memory_fraction), float(lp_overhead_s), duplicate, red, names,
                     solver, options, top, seed, check_time_limit(time_limit), replicas, source)


def _check_migration(migration: str, migration_gbps: float, rebalance_interval_s: float) -> None:
    """``migration`` is stall or overlap; the bandwidth (GB/s) and interval (s) finite > 0."""
    if migration not in ("stall", "overlap"):
        raise InputError(f"migration must be 'stall' or 'overlap', got {migration!r}")
    for name, v in (("migration_gbps", migration_gbps),
                    ("rebalance_interval_s", rebalance_interval_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise InputError(f"{name} must be a number > 0, got {v!r}")


def _check_memory(memory_fraction: float, lp_overhead_s: float) -> None:
    """``memory_fraction`` of HBM in (0, 1]; ``lp_overhead_s`` finite seconds >= 0."""
    if isinstance(memory_fraction, bool) or not isinstance(memory_fraction, (int, float)) \
            or not 0 < memory_fraction <= 1:
        raise InputError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
    if isinstance(lp_overhead_s, bool) or not isinstance(lp_overhead_s, (int, float)) \
            or not 0 <= lp_overhead_s < math.inf:
        raise InputError(f"lp_overhead_s must be seconds >= 0, got {lp_overhead_s!r}")


def _check_lists(redundant: Sequence[int],
                 levers: Sequence[str] | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``redundant`` as integers >= 0 and the lever names (all by default), each in `LEVERS`,
    ``today`` first (the baseline every gain is against)."""
    for name, seq in (("redundant", redundant), ("levers", levers)):
        if seq is not None and (isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence)):
            raise InputError(f"{name} must be a list, got {seq!r}")
    red = tuple(_positive_int("redundant", n, zero=True) for n in redundant)
    names = tuple(LEVERS) if levers is None else tuple(levers)
    bad = [n for n in names if n not in LEVERS]
    if bad:
        raise InputError(f"unknown lever {bad[0]!r}; use some of {', '.join(LEVERS)}")
    return red, ("today", *[n for n in names if n != "today"])


def _check_redundant(redundant: Sequence[int], num_experts: int, num_gpus: int) -> None:
    """Each N of ``redundant`` at most ``E x (G - 1)``: beyond that every expert already has
    a replica on every GPU (another copy on a GPU balances nothing), and the tables of
    ``E + N`` slots grow without bound."""
    top = num_experts * (num_gpus - 1)
    for n in redundant:
        if n > top:
            raise InputError(f"redundant {n:,} is more than {num_experts} experts x "
                             f"({num_gpus} GPUs - 1) = {top:,}, where every expert already has "
                             "a replica on every GPU; use fewer")


def _check_solver(solver: str, solver_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``solver`` registered and ``solver_options`` its options (`solvers.resolve` names an
    unknown option or a bad value), as a new dict."""
    if solver not in solvers.available():
        raise InputError(f"unknown solver {solver!r}; use one of {', '.join(solvers.available())}")
    if solver_options is None:
        solver_options = {}
    if not isinstance(solver_options, Mapping):
        raise InputError(f"solver_options must be a mapping of option names to values, got "
                         f"{type(solver_options).__name__}")
    solver_options = dict(solver_options)
    solvers.resolve(solver, solver_options)  # unknown options and bad values, named
    return solver_options


def _context(s: _Settings, load: np.ndarray, previous: Placement | str | None) -> Context:
    """What every lever reads: today's placement (``previous`` fitted to the model's MoE
    layers by layer id, `placements.fit_placement`; else the trivial one), ``load: float[L,
    E]``, the solver and the deployment."""
    if previous is None:
        today = trivial_placement(s.model, s.topology)
    else:
        today = fit_placement(previous, s.model, s.topology, what="previous placement")
    topo = s.topology
    return Context(s.phase, topo.num_nodes, topo.gpus_per_node, topo.num_slots, load, s.model,
                   s.hardware, today, s.solver, s.redundant, s.seed, s.lp_overhead_s,
                   s.time_limit, s.duplicate, s.solver_options, replicas=s.replicas,
                   today_given=previous is not None)


def _run_levers(ctx: Context, names: Sequence[str]) -> list[Option]:
    """Every named lever's rows, in order (``today`` first); levers add notes and meta to
    ``ctx``."""
    opts: list[Option] = []
    for n in names:
        opts += LEVERS[n](ctx)
    if ctx.replicas == "sglang":
        routed: dict[int, Placement] = {}
        opts = [_sglang_routed(ctx, o, routed) for o in opts]
    return opts


def _sglang_routed(ctx: Context, o: Option, cache: dict[int, Placement]) -> Option:
    """``o`` as SGLang routes its replicas (``replicas="sglang"``): today's trivial placement
    serves expert e from slot e only (`placements.sglang_first_slot`), any other placement by
    SGLang's static per-source map (`placements.sglang_static`); both as ``replica_share``
    under the ``weighted`` dispatch. Rows with another dispatch policy, or none, are kept."""
    p = o.placement
    if p is None or o.dispatch != "even":
        return o
    if id(p) not in cache:
        first = p is ctx.today and not ctx.today_given
        cache[id(p)] = sglang_first_slot(p) if first else sglang_static(p, seed=ctx.seed)
    return replace(o, placement=cache[id(p)], dispatch="weighted")


@dataclass(frozen=True)
class _Scored:
    """One option ready to score: its `_Scorer` and the weights it copies from today's
    placement (``bytes_moved``: all GPUs, bytes; ``copy_s``: the busiest GPU's bytes over the
    migration bandwidth, s; ``stall_s``: ``copy_s`` under ``migration="stall"``, else 0)."""

    option: Option
    scorer: _Scorer
    bytes_moved: float
    copy_s: float
    stall_s: float


def _score(ctx: Context, s: _Settings, opts: Sequence[Option]) -> list[_Scored]:
    """Each option's scorer (its stall amortised over the rebalance interval) and bytes moved
    (`moves.migration_bytes`, one byte per FP8 parameter). `InputError` when today's
    deployment (the first option) cannot hold one request; a note per row whose weights do not
    fit the HBM."""
    expert_bytes = float(s.model.expert_bytes)  # at the experts' data type (FP8: 1 B each)
    gbps = s.migration_gbps * 1e9
    scored = []
    for o in opts:
        per_gpu = (np.zeros(1) if o.moved_from is None
                   else migration_bytes(o.moved_from, o.placement, expert_bytes)
                   if o.placement is not None else np.zeros(1))
        copy_s = float(per_gpu.max(initial=0.0) / gbps)
        stall_s = copy_s if s.migration == "stall" else 0.0
        sc = _Scorer(ctx, o, kv_tokens=s.kv_tokens, input_tokens=s.input_tokens,
                     memory_fraction=s.memory_fraction,
                     stall_fraction=stall_s / (s.rebalance_interval_s + stall_s))
        scored.append(_Scored(o, sc, float(per_gpu.sum()), copy_s, stall_s))
    base = scored[0].scorer
    if not base.fits or base.tokens(s.tokens_per_rank) < 1:
        raise InputError(
            f"today's deployment cannot run: {s.model.name} on {s.topology_text} "
            f"{s.hardware.name} GPUs with {s.topology.num_slots} slots leaves {base.kv_cap:,} "
            f"KV tokens per GPU, fewer than one request of kv_tokens={s.kv_tokens:,}; use more "
            "GPUs, a larger-memory --hardware or a shorter context"
        )
    for r in scored:
        if not r.scorer.fits:
            ctx.notes.append(f"{r.option.lever} {r.option.option}: the weights of "
                             f"{r.option.slots} slots do not fit {s.hardware.name}'s HBM; the "
                             "row cannot run (0 tokens/s)")
    return scored


def _table(ctx: Context, s: _Settings, scored: Sequence[_Scored]) -> pd.DataFrame:
    """One row per option (`COLUMNS`) at the deployment's tokens per rank, against today's
    (the first), with its break-even tokens per rank (`_break_even`)."""
    base, t, G = scored[0].scorer, s.tokens_per_rank, s.topology.num_gpus
    rows = []
    for r in scored:
        o, sc = r.option, r.scorer
        now, b = sc.at(t), base.at(t)
        gain = (now["tok_s_per_node"] / b["tok_s_per_node"] - 1.0) if b["tok_s_per_node"] \
            else math.nan
        rows.append({
            "lever": o.lever,
            "option": o.option,
            "slots": o.slots,
            "dispatch": o.dispatch,
            "shared_expert": o.shared_expert,
            "balance": gpu_balance(o.placement, ctx.load),
            "balance_bound": balance_bound(ctx.load, G, o.slots),
            "tokens_per_rank": now["tokens"],
            "step_ms": now["step_s"] * 1e3,
            "tok_s_per_node": now["tok_s_per_node"],
            "gain_pct": 100.0 * gain,
            "bytes_moved_gb": r.bytes_moved / 1e9,
            "copy_s": r.copy_s,
            "stall_s": r.stall_s,
            "kv_tokens_per_gpu": sc.kv_cap,
            "max_requests_per_gpu": sc.max_requests,
            "break_even_tokens": math.nan if o.lever == "today"
            else _break_even(sc, base, t, s.max_tokens),
        })
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    if s.phase == "decode":
        frame = frame.rename(columns={k: v[0] for k, v in DECODE_COLUMNS.items()})
    return frame


def _assemble(ctx: Context, s: _Settings, measured: dict, scored: Sequence[_Scored],
              table: pd.DataFrame) -> Advice:
    """The `Advice`: the table, `COLUMNS`, the meta (inputs, what was measured, the expert
    groups, the levers' meta) with the notes (what is measured or modelled, the groups, the
    levers' notes), and each row's placement."""
    notes = [
        "measured: the expert loads (summed over the dump's windows); modelled: every time and "
        "throughput (step-time model, hardware preset " f"{s.hardware.name}); computed exactly: "
        "balance, bytes moved.",
        "in-sample: placements are solved and scored on the same loads (an upper bound on what "
        "a rebalance from a past window gets).",
        f"migration: {s.migration} at {s.migration_gbps:g} GB/s per GPU, amortised over "
        f"{s.rebalance_interval_s:g} s between rebalances; redundant rows assume the slot count "
        "can change by copying (a runtime may need a restart).",
        f"break-even: searched on powers of two up to {s.max_tokens:,} tokens per rank, refined "
        "by bisection; NaN = does not pay up to there.",
    ]
    groups, groups_note = _groups_used(ctx)
    notes.append(groups_note)
    if s.replicas == "sglang":
        notes.append(
            "replicas: as SGLang routes them (--replicas sglang): "
            + ("today's given placement" if ctx.today_given else
               "today's trivial placement serves expert e from slot e only (no dispatch "
               "algorithm without --enable-eplb / --init-expert-location: the redundant slots "
               "get nothing)")
            + "; solved placements by SGLang's static map (each source GPU sends an expert's "
            "picks to one replica: its own, else a random one); balance counts these shares.")
    op = operating_point(s, scored[0].scorer)
    if op["kv_limited"]:
        notes.append(
            f"operating point: asked {op['asked']:,} requests per rank, ran {op['ran']:,}: "
            f"today's KV cache holds {op['kv_tokens_per_gpu']:,} tokens per GPU, "
            f"{op['kv_capacity_requests']:,} requests of {op['context_tokens']:,} tokens; "
            "every row runs what its own KV cache holds (requests_per_rank).")
    notes.append(f"model {s.model.name}: " + "; ".join(s.model.assumptions()) + ".")
    notes += ctx.notes
    if s.phase == "prefill":
        notes.append("prefill: KV capacity is shown but does not cap the batch.")
    meta = {**measured, "phase": s.phase, "topology": s.topology_text,
            "slots": s.topology.num_slots, "hardware": s.hardware.name, "model": s.model.name,
            "tokens_per_rank": s.tokens_per_rank, "operating_point": op,
            "kv_tokens": s.kv_tokens,
            "curves": kernels.labels(s.hardware, s.model),
            "curves_note": kernels.describe(s.hardware, s.model),
            "input_tokens": s.input_tokens, "solver": s.solver,
            "solver_options": s.solver_options, "groups": groups,
            "replicas": s.replicas,
            "migration": s.migration, "migration_gbps": s.migration_gbps,
            "rebalance_interval_s": s.rebalance_interval_s, "max_tokens": s.max_tokens,
            **ctx.meta, "notes": notes}
    return Advice(table, columns_for(s.phase), meta, [r.option.placement for r in scored])


def operating_point(s: _Settings, today: _Scorer) -> dict[str, Any]:
    """Where today's row runs: ``asked`` per rank (prefill tokens, decode running requests)
    and ``ran`` (decode: capped at what today's KV cache holds), the unit (``tokens`` /
    ``requests``), the context per request (decode) or prompt (prefill) in tokens, the KV
    capacity, ``kv_limited`` (decode and ``ran < asked``) and ``source`` (where the asked
    point came from)."""
    ran = today.tokens(s.tokens_per_rank)
    decode = s.phase == "decode"
    return {
        "phase": s.phase,
        "unit": "requests" if decode else "tokens",
        "asked": int(s.tokens_per_rank),
        "ran": int(ran),
        "context_tokens": int(s.kv_tokens if decode else s.input_tokens),
        "kv_tokens_per_gpu": int(today.kv_cap),
        "kv_capacity_requests": int(today.max_requests),
        "kv_limited": bool(decode and ran < s.tokens_per_rank),
        "source": s.source,
    }


def operating_line(op: Mapping[str, Any]) -> str:
    """One line: where today's row runs (`operating_point`), as the header prints it."""
    if op["phase"] == "prefill":
        text = (f"operating point: prefill, {op['ran']:,} tokens per rank per step, prompts of "
                f"{op['context_tokens']:,} tokens")
    else:
        text = (f"operating point: decode, {op['ran']:,} running requests per rank at "
                f"{op['context_tokens']:,} tokens of context; ")
        text += (f"KV-limited: asked {op['asked']:,}, the KV cache holds "
                 f"{op['kv_capacity_requests']:,}" if op["kv_limited"] else
                 f"not KV-limited (the KV cache holds {op['kv_capacity_requests']:,})")
    return text + f" [{op['source']}]"
