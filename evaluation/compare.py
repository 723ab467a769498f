"""Comparison sweeps: solvers x traces x topologies (x redundancy) -> tidy DataFrames.

Each task solves one trace on one topology with one solver and scores balance and traffic;
tasks run inline, on a process pool or on a Dask cluster, with the same results. Topology specs
(``4x8:288``, ``4x8x9``, ``4x8+32``, ``4x8``) and ``holdout``: docs/evaluation.md, section
"`compare` in Python".
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pandas as pd

from eplb import runners, solvers
from eplb import solvers as registry
from eplb import traces as trace_io
from eplb.args import (
    check_bool,
    check_int,
    check_mapping,
    check_number,
    check_opt_int,
    check_opt_number,
    check_seed,
)
from eplb.atomic import atomic_write_text, os_errors
from eplb.dispatch import check_policy, get
from eplb.errors import EplbError, InputError, TopologyError
from eplb.evaluation import plots
from eplb.evaluation.align import check_trace, with_layers
from eplb.evaluation.metrics import group_layer_bound, layer_bound, rescore, score, summarize
from eplb.evaluation.tables import markdown, slug, write_csv
from eplb.evaluation.traffic import check_traffic_options, simulate
from eplb.solvers.primitives.replica_graph import Graph, graph_misfit
from eplb.topology import NVLINK_GBPS, RDMA_GBPS, Topology

_SPEC = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*(?:(?P<sep>[:xX+])\s*(?P<num>\d+))?\s*$")


@dataclass(frozen=True)
class TopologySpec:
    """A topology to sweep, possibly relative to the trace's expert count: ``slots`` in all,
    ``slots_per_gpu``, ``redundant`` slots over the experts, or none of them (docs/evaluation.md,
    section "`compare` in Python")."""

    text: str
    nodes: int
    gpus_per_node: int
    slots: int | None = None
    slots_per_gpu: int | None = None
    redundant: int | None = None

    @classmethod
    def parse(cls, text: str) -> TopologySpec:
        m = _SPEC.match(str(text))
        if not m:
            raise TopologyError(
                f"topology {text!r} is not NxG:SLOTS (e.g. 4x8:288), NxGxSLOTS_PER_GPU, "
                "NxG+REDUNDANT or NxG"
            )
        nodes, gpus = int(m.group(1)), int(m.group(2))
        if nodes < 1 or gpus < 1:
            raise TopologyError(f"topology {text!r} needs at least one node and one GPU per node")
        sep, num = m.group("sep"), m.group("num")
        kw: dict[str, int] = {}
        if sep == ":":
            kw["slots"] = int(num)
            G = nodes * gpus
            if kw["slots"] < 1 or kw["slots"] % G:
                fix = max(kw["slots"] // G + (kw["slots"] % G > 0), 1) * G
                raise TopologyError(
                    f"topology {text!r}: {kw['slots']} slots is not a multiple of {G} GPUs; "
                    f"use {fix}"
                )
        elif sep in ("x", "X"):
            kw["slots_per_gpu"] = int(num)
        elif sep == "+":
            kw["redundant"] = int(num)
        return cls(str(text).strip(), nodes, gpus, **kw)

    def resolve(self, num_experts: int, *, nvlink_gbps: float = NVLINK_GBPS,
                rdma_gbps: float = RDMA_GBPS) -> Topology:
        """The `Topology` for a trace with ``num_experts`` experts."""
        G = self.nodes * self.gpus_per_node
        if self.slots_per_gpu is not None:
            per = self.slots_per_gpu
        elif self.slots is not None:
            if self.slots % G:
                fix = (self.slots // G + 1) * G
                raise TopologyError(
                    f"topology {self.text!r}: {self.slots} slots is not a multiple of {G} GPUs; "
                    f"use {fix}"
                )
            per = self.slots // G
        else:
            per = -(-(num_experts + (self.redundant or 0)) // G)
        return Topology(self.nodes, self.gpus_per_node, per, nvlink_gbps=nvlink_gbps,
                        rdma_gbps=rdma_gbps)


def parse_topologies(text: str | Sequence[str]) -> list[TopologySpec]:
    """``"4x8:288,18x8:288"`` (or a list of specs) -> `TopologySpec` list."""
    if isinstance(text, str):
        items = text.split(",")
    elif isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text):
        items = list(text)
    else:
        raise TopologyError(f"topologies must be a string like '4x8:288,18x8:288' or a list of "
                            f"such strings, got {str(text)[:40]}")
    specs = [TopologySpec.parse(t) for t in items if t.strip()]
    if not specs:
        raise TopologyError("no topology given; e.g. --topologies 4x8:288,18x8:288")
    return specs


# what each summary column means (compare --help, docs/evaluation.md); per-layer figures are
# over the layers of the scored windows, traffic from `evaluation.traffic` (counts mode)
SUMMARY_COLUMNS = {
    "max_over_bound_mean": "max GPU load / closed-form lower bound (any placement), mean over "
                           "layers (1 = provably optimal; solvers.analysis.bounds.lower_bound, "
                           "lp=False)",
    "max_over_bound_worst": "max GPU load / lower bound, worst layer",
    "max_over_group_bound_mean": "max GPU load / group bound (the bound for placements keeping "
                                 "each expert group on one node; where that contract can hold)",
    "balance_dispatch": "dispatch policy the balance columns are measured under (picks per "
                        "GPU as it routes them; even = the placement's even split)",
    "step_max_over_mean": "step max/mean GPU load: sum over layers of the max GPU load / sum of "
                          "the mean (layers run one after another, so the slowest GPU of each "
                          "layer adds up; 1 = perfect balance, not always reachable)",
    "balancedness_mean": "mean/max GPU load, mean over layers (as vLLM and SGLang log it)",
    "balancedness_min": "mean/max GPU load, worst layer",
    "max_over_mean_mean": "max/mean GPU load, mean over layers",
    "max_over_mean_worst": "max/mean GPU load, worst layer",
    "imbalance_mean": "(max - mean)/mean GPU load, mean over layers (TensorRT-LLM's)",
    "node_max_over_mean_mean": "max/mean node load, mean over layers",
    "tokens_per_layer": "tokens through each layer in the scored windows (picks / top-k)",
    "rdma_bytes_per_token_layer": "RDMA bytes per token per layer, dispatch + combine",
    "nvlink_bytes_per_token_layer": "NVLink bytes per token per layer, dispatch + combine",
    "rdma_bytes_per_token": "RDMA bytes per token summed over all layers, dispatch + combine",
    "alltoall_us_per_1k_tokens_layer": "modelled all-to-all microseconds per 1,000 tokens per "
                                       "layer (bandwidth bound, slowest GPU)",
    "rdma_bytes": "RDMA bytes in all: every scored token, all layers, dispatch + combine",
    "nvlink_bytes": "NVLink bytes in all: every scored token, all layers, dispatch + combine",
    "alltoall_seconds": "modelled all-to-all seconds in all (every scored token, all layers)",
    "solve_seconds": "solver wall seconds",
    "fallback": "why a contract policy placed globally instead (its group-to-node contract "
                "cannot hold here: DeepSeek's rule; empty when it kept the contract)",
}
# the printed tables, in order
TABLES = {
    "max_over_bound_mean": "max GPU load / closed-form lower bound, mean over layers "
                           "(1 = optimal)",
    "max_over_group_bound_mean": "max GPU load / group bound (each expert group on one node), "
                                 "mean over layers",
    "step_max_over_mean": "step max/mean GPU load (sum of layer maxima / sum of layer means)",
    "rdma_bytes_per_token_layer": "RDMA bytes per token per layer (dispatch + combine)",
    "solve_seconds": "solve wall seconds",
}


_BALANCE = {"max_over_bound_mean", "max_over_group_bound_mean", "step_max_over_mean"}


# --------------------------------------------------------------------------- spec
@dataclass(frozen=True)
class CompareSpec:
    """What one comparison runs, checked once when built (each field's check names it).

    - ``solvers: tuple[str, ...] | None``: solver names; ``None`` = every registered solver
      that runs on a load alone (all but those needing ``previous=``), resolved in `compare`.
    - ``topologies: str | Sequence[str]``: topology specs (`parse_topologies`; several slot
      counts = a redundancy sweep); ``specs`` holds them parsed (`TopologySpec`).
    - ``num_groups`` (default: each trace's ``meta["num_groups"]``; dropped for traces whose
      expert count it does not divide), ``topk_groups`` (default: each trace's
      ``meta["topk_groups"]``; with ``num_groups`` the group-limited co-occurrence model of
      `evaluation.traffic`).
    - ``policy``: dispatch policy of the traffic model; ``holdout``: fraction of the windows,
      last ones, scored out of sample (0: in sample); ``seed``; ``time_limit``: seconds per
      solve; ``solver_options: {solver: {key: value}}``; ``nvlink_gbps``, ``rdma_gbps``: GB/s
      per GPU; ``traffic``: extra `simulate` keywords (``hidden``, ``dispatch_bytes``...).
    """

    solvers: tuple[str, ...] | None = None
    topologies: str | Sequence[str] = "4x8:288"
    num_groups: int | None = None
    topk_groups: int | None = None
    policy: str = "even"
    holdout: float = 0.0
    seed: int = 0
    time_limit: float | None = None
    solver_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    nvlink_gbps: float = NVLINK_GBPS
    rdma_gbps: float = RDMA_GBPS
    traffic: Mapping[str, Any] = field(default_factory=dict)
    specs: tuple[TopologySpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        check_policy(self.policy)
        for name in ("nvlink_gbps", "rdma_gbps"):
            Topology(1, 1, 1, **{name: getattr(self, name)})  # TopologyError on a bad one
        put("holdout", check_number("holdout", self.holdout, 0, 1, hi_open=True))
        put("seed", check_seed("seed", self.seed))
        put("time_limit", check_opt_number("time_limit", self.time_limit, 0, 86400,
                                           lo_open=True))
        put("num_groups", check_opt_int("num_groups", self.num_groups, 1))
        put("topk_groups", check_opt_int("topk_groups", self.topk_groups, 1))
        put("traffic", dict(check_traffic_options(check_mapping("traffic", self.traffic))))
        options = check_mapping("solver_options", self.solver_options)
        put("solver_options", {key: dict(check_mapping(f"solver_options[{key!r}]", opts))
                               for key, opts in options.items()})
        names = self.solvers
        if names is not None:
            if isinstance(names, (str, bytes)) or not isinstance(names, (list, tuple)) or not all(
                    isinstance(n, str) for n in names):
                raise InputError(f"solvers must be a list of solver names, got {str(names)[:40]}")
            put("solvers", tuple(names) or None)
        put("specs", tuple(parse_topologies(self.topologies)))

    def solver_names(self) -> list[str]:
        """The solvers to run (``solvers``, or the default set); unknown names fail here."""
        names = list(self.solvers) if self.solvers else [
            n for n in registry.available() if not registry.needs_previous(n)]
        for name in names:
            registry.get(name)
        return names


KEYWORDS = tuple(f.name for f in fields(CompareSpec) if f.init)


# -------------------------------------------------------------------------- tasks
def _fit_eval(trace, holdout: float) -> tuple[slice, slice, bool]:
    T = trace.num_windows
    if holdout <= 0 or T < 2:
        return slice(0, T), slice(0, T), True
    cut = min(max(1, int(round(T * (1 - holdout)))), T - 1)
    return slice(0, cut), slice(cut, T), False


GROUPS_FIX = ("give expert groups (CLI: --groups G, DeepSeek-V3: 8, or --model PRESET; API: "
              "num_groups=)")


def default_fit(name: str, options: Mapping[str, Any], topology: Topology | None,
                num_experts: int, groups: int | None) -> tuple[dict[str, Any] | None, str]:
    """How default-list policy ``name`` runs on one (trace, topology): ``(options, "")``, with
    a replica ``graph`` that fits chosen when the policy takes one and none is given; or
    ``(None, why)`` when it cannot run there (it needs expert groups and there are none, or no
    replica graph fits the topology's slots per GPU), so the default list leaves it out."""
    if registry.needs_groups(name, dict(options)) and groups is None:
        return None, f"needs expert groups and the trace records none; {GROUPS_FIX}"
    if "graph" in registry.options(name) and "graph" not in options and topology is not None:
        misfits = {g: graph_misfit(num_experts, topology, g) for g in get_args(Graph)}
        fits = [g for g, why in misfits.items() if why is None]
        if not fits:
            default = registry.options(name)["graph"]
            return None, (f"no replica graph ({', '.join(misfits)}) fits {topology.num_gpus} "
                          f"GPUs x {topology.slots_per_gpu} slots: {misfits[default]}")
        return {**options, "graph": fits[0]}, ""
    return dict(options), ""


def make_tasks(traces: Mapping[str, Any], solver_names: Sequence[str],
               spec: CompareSpec, skipped: list[dict[str, Any]] | None = None
               ) -> list[dict[str, Any]]:
    """One picklable task dict per (trace, topology, solver) of ``spec``; loads are sliced
    here, the settings every task shares travel as ``task["settings"]`` (the spec). With the
    default solver list (``spec.solvers`` None) a policy that cannot run on a (trace,
    topology) is left out (`default_fit`) and appended to ``skipped`` (trace, topology,
    solver, why) instead."""
    tasks = []
    for tname, trace in traces.items():
        fit, ev, in_sample = _fit_eval(trace, spec.holdout)
        groups = spec.num_groups if spec.num_groups is not None else trace.meta.get("num_groups")
        if groups is not None and trace.num_experts % int(groups):
            groups = None
        tgroups = (spec.topk_groups if spec.topk_groups is not None
                   else trace.meta.get("topk_groups"))
        src = None
        if trace.source_counts is not None:
            src = trace.source_counts[ev].sum(0)
        data = {"fit_load": trace.load(fit), "eval_load": trace.load(ev), "source_counts": src,
                "layer_ids": np.asarray(trace.layer_ids), "top_k": trace.meta.get("top_k")}
        for topo in spec.specs:
            try:
                resolved = topo.resolve(trace.num_experts)
            except EplbError:
                resolved = None  # the task itself reports it
            for solver in solver_names:
                options = dict(spec.solver_options.get(solver, {}))
                if spec.solvers is None:
                    options, why = default_fit(solver, options, resolved, trace.num_experts,
                                               groups)
                    if options is None:
                        if skipped is not None:
                            skipped.append({"trace": tname, "topology": topo.text,
                                            "solver": solver, "why": why})
                        continue
                tasks.append({
                    "trace": tname, "spec": topo, "solver": solver, "num_groups": groups,
                    "topk_groups": tgroups if groups is not None else None,
                    "in_sample": in_sample, "settings": spec, "options": options, **data,
                })
    return tasks


def run_task(task: Mapping[str, Any]) -> dict[str, Any]:
    """Solve and score one task; errors become a row with ``status`` = the message."""

    spec: TopologySpec = task["spec"]
    settings: CompareSpec = task["settings"]
    E = task["fit_load"].shape[1]
    row: dict[str, Any] = {"trace": task["trace"], "topology": spec.text, "solver": task["solver"],
                           "num_groups": task["num_groups"], "topk_groups": task["topk_groups"],
                           "policy": settings.policy,
                           "in_sample": task["in_sample"], "experts": E}
    try:
        topo = spec.resolve(E, nvlink_gbps=settings.nvlink_gbps, rdma_gbps=settings.rdma_gbps)
        row.update(nodes=topo.num_nodes, gpus=topo.num_gpus, slots=topo.num_slots,
                   redundant=topo.num_slots - E)
        start = time.perf_counter()
        placement = solvers.solve(task["solver"], task["fit_load"], topo,
                                  num_groups=task["num_groups"], seed=settings.seed,
                                  time_limit=settings.time_limit, **task["options"])
        wall = time.perf_counter() - start
        placement = with_layers(placement, task["layer_ids"])
        info = placement.meta.get("solver", {})
        row.update(variant=info.get("policy", ""), solve_seconds=float(info.get("seconds", wall)),
                   fallback=info.get("fallback", ""))
        layers = score(placement, task["eval_load"], num_groups=task["num_groups"],
                       bound=task.get("bound", True), group_bound=task.get("group_bound"))
        src = task["source_counts"]
        kw = dict(policy=settings.policy, num_groups=task["num_groups"],
                  topk_groups=task["topk_groups"], **settings.traffic)
        if task["top_k"] is not None:
            kw.setdefault("top_k", int(task["top_k"]))
        if src is not None and topo.num_gpus % src.shape[1] == 0:
            rep, row["traffic_source"] = simulate(placement, source_counts=src, **kw), "per-rank"
        else:
            rep, row["traffic_source"] = simulate(placement, load=task["eval_load"], **kw), "even"
        split_as_placed = get(settings.policy).placement_split
        if not split_as_placed:  # balance as the asked-for dispatch routes the picks
            layers = rescore(layers, rep.gpu_tokens, topo)
        row["balance_dispatch"] = settings.policy
        row.update(summarize(layers).drop("layers").to_dict())
        row.update(rep.summary())
        L = len(task["layer_ids"])
        tokens = max(float(task["eval_load"].sum() / L) / rep.meta["top_k"], 1e-12)  # per layer
        row["tokens_per_layer"] = tokens
        row["rdma_bytes_per_token"] = row["rdma_bytes"] / tokens
        row["rdma_bytes_per_token_layer"] = row["rdma_bytes"] / tokens / L
        row["nvlink_bytes_per_token_layer"] = row["nvlink_bytes"] / tokens / L
        row["alltoall_us_per_1k_tokens_layer"] = row["alltoall_seconds"] / tokens / L * 1e9
        row["status"] = "ok"
        gpu = (placement.gpu_load(task["eval_load"]) if split_as_placed
               else np.asarray(rep.gpu_tokens))
    except EplbError as exc:
        row["status"] = f"{type(exc).__name__}: {exc}"
        return {"row": row, "layers": None, "gpu_load": None}
    layers.insert(0, "trace", task["trace"])
    layers.insert(1, "topology", spec.text)
    layers.insert(2, "solver", task["solver"])
    return {"row": row, "layers": layers, "gpu_load": gpu}


# ------------------------------------------------------------------------ runners
def run_bound_task(task: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """``(bound: float64[L], group_bound: float64[L] | None)`` of one (trace, topology), shared
    by all its solver tasks: `metrics.BOUND_NAME` and, where the group-to-node contract can
    hold, the bound for placements keeping each group on one node."""

    spec: TopologySpec = task["spec"]
    E = task["eval_load"].shape[1]
    try:
        topo = spec.resolve(E)
        return (layer_bound(task["eval_load"], topo, task["num_groups"]),
                group_layer_bound(task["eval_load"], topo, task["num_groups"]))
    except EplbError:
        return np.full(task["eval_load"].shape[0], np.nan), None


# ------------------------------------------------------------------------ results
@dataclass
class CompareResult:
    """``summary``: one row per task; ``layers``: one row per (task, layer) (`score` columns);
    ``gpu_loads``: ``{(trace, topology, solver): float64[L, G]}`` on the scored windows;
    ``skipped``: the default-list policies left out where they cannot run (trace, topology,
    solver, why)."""

    summary: pd.DataFrame
    layers: pd.DataFrame
    gpu_loads: dict[tuple[str, str, str], np.ndarray] = field(default_factory=dict)
    skipped: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=["trace", "topology", "solver", "why"]))

    def skipped_lines(self) -> list[str]:
        """One line per default-list policy left out (`default_fit`), naming where and why."""
        out = []
        for solver, rows in self.skipped.groupby("solver", sort=False):
            whys = []
            for why, part in rows.groupby("why", sort=False):
                whys.append(f"on {', '.join(dict.fromkeys(part['topology']))} "
                            f"({', '.join(dict.fromkeys(part['trace']))}): {why}")
            out.append(f"{solver} left out of the default list {'; '.join(whys)}; name it in "
                       "--solvers to run it anyway")
        return out

    def tables(self, values: Sequence[str] | str | None = None) -> str:
        """Markdown: one pivot table (trace x solver) per topology for each of ``values``
        (default `TABLES`: ratio to the lower bound first, then step max/mean, RDMA bytes per
        token per layer, solve seconds); each table's heading says what its cells are."""

        if values is None:
            values = list(TABLES)
        elif isinstance(values, str):
            values = [values]
        ok = self.summary[self.summary["status"] == "ok"]
        parts = []
        for topo, part in ok.groupby("topology", sort=False):
            for col in values:
                if col not in part or part[col].isna().all():
                    continue
                label = TABLES.get(col, SUMMARY_COLUMNS.get(col, col))
                policies = set(part.get("balance_dispatch", pd.Series(["even"])))
                if col in _BALANCE and not all(get(p).placement_split for p in policies):
                    label += f"; picks as {', '.join(sorted(policies))} dispatch routes them"
                pivot = part.pivot_table(index="trace", columns="solver", values=col,
                                         aggfunc="mean")
                parts.append(f"### {topo}: `{col}`, {label}\n\n{markdown(pivot)}")
        failed = self.summary[self.summary["status"] != "ok"]
        if len(failed):
            cols = ["trace", "topology", "solver", "status"]
            parts.append(f"### failed tasks\n\n{markdown(failed[cols], index=False)}")
        return "\n".join(parts)

    def write(self, csv_path: str | os.PathLike, markdown_path: str | os.PathLike | None = None,
              layers_path: str | os.PathLike | None = None) -> None:
        """Summary CSV (and the Markdown tables / the per-layer CSV), written atomically."""

        write_csv(self.summary, csv_path)
        if markdown_path is not None:
            atomic_write_text(markdown_path, self.tables())
        if layers_path is not None:
            write_csv(self.layers, layers_path)

    def plot(self, directory: str | os.PathLike) -> list[Path]:
        """Per-layer balance and GPU-load heatmaps per (trace, topology), summary bars and a
        balance-vs-RDMA scatter per topology. Returns the files written."""

        out_dir = Path(directory)
        if out_dir.exists() and not out_dir.is_dir():
            raise InputError(f"--plot {out_dir} exists and is not a directory")
        with os_errors(out_dir, "--plot"):
            out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        ok = self.summary[self.summary["status"] == "ok"]
        if not len(self.layers):
            return written
        for (tname, topo), part in self.layers.groupby(["trace", "topology"], sort=False):
            stem = slug(f"{tname}_{topo}")
            frames = {s: f for s, f in part.groupby("solver", sort=False)}
            written.append(plots.layer_balance(frames, out_dir / f"balance_{stem}.png",
                                               title=f"{tname} on {topo}"))
            loads = {s: self.gpu_loads[(tname, topo, s)] for s in frames
                     if (tname, topo, s) in self.gpu_loads}
            if loads:
                ids = next(iter(frames.values()))["layer"].to_numpy()
                written.append(plots.gpu_heatmap(loads, out_dir / f"heatmap_{stem}.png",
                                                 layer_ids=ids, title=f"{tname} on {topo}"))
        for topo, part in ok.groupby("topology", sort=False):
            stem = slug(topo)
            written.append(plots.summary_bars(part, out_dir / f"summary_{stem}.png",
                                              title=f"max GPU load / lower bound on {topo}",
                                              value="max_over_bound_mean"))
            pts = part.assign(label=part["solver"])  # colour per solver, marker per trace
            written.append(plots.pareto_front(pts, out_dir / f"balance_vs_rdma_{stem}.png",
                                              title=f"each trace and solver on {topo}",
                                              x="rdma_bytes_per_token_layer"))
        return written


def compare(
    traces: Mapping[str, Any] | Sequence[str | os.PathLike],
    spec: CompareSpec | None = None,
    *,
    workers: int = 1,
    scheduler: Any = None,
    progress: bool = True,
    **keywords: Any,
) -> CompareResult:
    """Sweep the solvers x ``traces`` (``{name: Trace}`` or paths) x topologies of ``spec``
    (a `CompareSpec`), or of the spec its fields given as keywords build (``solvers=``,
    ``topologies=``, ``num_groups=``... as before specs; not both).

    ``workers > 1``: local process pool; ``scheduler``: Dask address or Client (wins);
    ``progress``: progress bars (and solvers' own, such as ilp's layers).
    """

    if spec is None:
        unknown = sorted(set(keywords) - set(KEYWORDS))
        if unknown:
            raise InputError(f"compare() has no keyword {unknown[0]!r}; use one of "
                             f"{', '.join(KEYWORDS)}")
        spec = CompareSpec(**keywords)
    elif not isinstance(spec, CompareSpec):
        raise InputError(f"spec must be a CompareSpec, got {type(spec).__name__}")
    elif keywords:
        raise InputError(f"compare() takes a spec or its keywords, not both "
                         f"(got spec and {', '.join(sorted(keywords))})")
    workers = check_int("workers", workers, 1, 1024)
    progress = check_bool("progress", progress)
    if isinstance(traces, Mapping):
        for name, trace in traces.items():
            check_trace(trace, f"traces[{name!r}]")
    elif isinstance(traces, (str, bytes, os.PathLike)) or not isinstance(traces, (list, tuple)):
        raise InputError(f"traces must be a {{name: Trace}} mapping or a list of paths, got "
                         f"{str(traces)[:40]}")
    else:
        named: dict[str, Any] = {}
        for path in traces:
            if not isinstance(path, (str, os.PathLike)):
                raise InputError(f"traces must be paths (str), got {str(path)[:40]}")
            stem = Path(path).stem or Path(path).name
            name = stem if stem not in named else str(path)
            named[name] = trace_io.read(path)
        traces = named
    if not traces:
        raise InputError("no traces given; pass at least one trace file")
    num_groups = spec.num_groups
    for name, trace in traces.items():
        if trace.num_windows < 1:
            raise InputError(f"trace {name!r} has no windows")
        if num_groups is not None and trace.num_experts % num_groups:
            raise InputError(f"num_groups {num_groups} does not divide trace {name!r}'s "
                             f"{trace.num_experts} experts")
    names = spec.solver_names()  # unknown names fail before any work
    solver_options = dict(spec.solver_options)
    if not progress:  # quiet: no solver prints its own progress either (ilp's layers)
        for name in names:
            if "progress" in registry.options(name):
                solver_options[name] = {"progress": False, **solver_options.get(name, {})}
    if "ilp" in names and (workers > 1 or scheduler is not None):
        # the sweep already runs tasks in parallel: one ilp layer at a time per task
        solver_options["ilp"] = {"workers": 1, **solver_options.get("ilp", {})}
    skipped: list[dict[str, Any]] = []
    tasks = make_tasks(traces, names, replace(spec, solver_options=solver_options), skipped)
    if not tasks:
        why = "; ".join(dict.fromkeys(f"{s['solver']}: {s['why']}" for s in skipped))
        raise InputError(f"no solver of the default list can run here ({why})")

    def run(items, fn, desc):
        return runners.run(fn, items, workers=workers, scheduler=scheduler, progress=progress,
                           desc=desc)

    # lower bounds once per (trace, topology), shared by its solver tasks
    keys = list(dict.fromkeys((t["trace"], t["spec"].text) for t in tasks))
    first = {}
    for t in tasks:
        first.setdefault((t["trace"], t["spec"].text), t)
    bounds = dict(zip(keys, run([first[k] for k in keys], run_bound_task, "lower bounds"),
                      strict=True))
    for t in tasks:
        t["bound"], gb = bounds[(t["trace"], t["spec"].text)]
        t["group_bound"] = False if gb is None else gb
    # slow solvers first so a pool is not left waiting on one long task at the end
    order = sorted(range(len(tasks)), key=lambda i: tasks[i]["solver"] != "ilp")
    ordered = [tasks[i] for i in order]
    results = run(ordered, run_task, "compare")
    back: list[Any] = [None] * len(tasks)
    for i, res in zip(order, results, strict=True):
        back[i] = res
    summary = pd.DataFrame([r["row"] for r in back])
    frames = [r["layers"] for r in back if r["layers"] is not None]
    layers = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    loads = {(r["row"]["trace"], r["row"]["topology"], r["row"]["solver"]): r["gpu_load"]
             for r in back if r["gpu_load"] is not None}
    return CompareResult(summary, layers, loads, pd.DataFrame(
        skipped, columns=["trace", "topology", "solver", "why"]))
