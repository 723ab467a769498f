"""Registry of placement policies and the one entry point, `solve`: checks the input, passes
each policy the common arguments it declares and its options, validates and relabels the
result, records ``meta["solver"]``. See docs/solvers.md, section "The registry and `solve`".
"""

from __future__ import annotations

import functools
import inspect
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from eplb.errors import EplbError, InfeasibleError, InputError
from eplb.moves import gpu_moves, replicas_moved
from eplb.placement import Placement
from eplb.registry import Registry
from eplb.solvers import plugins
from eplb.solvers.analysis.failures import (
    expand,
    keep_contract,
    real_group_nodes,
    solve_surviving,
    surviving,
    survivor_nodes,
)
from eplb.solvers.legacy import LEGACY, route
from eplb.solvers.primitives.layout import duplicates
from eplb.solvers.primitives.relabel import node_map, relabel_map
from eplb.solvers.primitives.validation import (
    check_layer_ids,
    check_num_groups,
    check_option,
    check_seed,
    check_size,
    check_solver_load,
    check_solver_windows,
    check_time_limit,
)
from eplb.topology import Topology
from eplb.traces.model import Trace

SolverFn = Callable[..., Placement]
COMMON = ("num_groups", "previous", "seed", "time_limit")
GUARANTEES = frozenset({"no_duplicates", "group_contract"})  # what `register` may declare


@dataclass(frozen=True)
class Spec:
    """What `solve` knows about a registered policy."""

    fn: SolverFn
    common: frozenset[str]  # common arguments the function takes
    options: dict[str, Any]  # option name -> default
    hints: dict[str, Any]  # option name -> annotation (for checking values)
    open_options: bool  # the function takes **kwargs: any option is passed through
    windows: bool = False  # the function takes float64[W, L, E] windows
    group_fallback: bool = False  # num_groups need not divide the experts (see register)
    needs_previous: bool = False  # the policy cannot run without previous= (see register)
    guarantees: Any = frozenset()  # names or fn(options, topology, num_groups) -> names
    needs_groups: Any = False  # bool or fn(options) -> bool: num_groups is required
    origin: str = ""  # a third-party policy's plugin module or package ("" for eplb's own)


_REGISTRY: Registry[Spec] = Registry("solver")


def _spec(
    fn: SolverFn, windows: bool = False, group_fallback: bool = False,
    needs_previous: bool = False, guarantees: Any = (), needs_groups: Any = False,
) -> Spec:
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:
        hints = {}
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        raise TypeError(f"a solver takes (load, topology, ...); {fn.__name__} takes {sig}")
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    named = {
        p.name: p
        for p in params[2:]
        if p.kind is not p.VAR_KEYWORD and p.kind is not p.VAR_POSITIONAL
    }
    common = frozenset(COMMON if var_kw else [c for c in COMMON if c in named])
    opts = {k: p.default for k, p in named.items() if k not in COMMON}
    missing = [k for k, v in opts.items() if v is inspect.Parameter.empty]
    if missing:
        raise TypeError(f"solver options need defaults: {fn.__name__} has {missing}")
    hinted = {k: hints[k] for k in opts if k in hints}
    if needs_previous and "previous" not in common:
        raise TypeError(f"{fn.__name__} needs previous= but does not take it")
    if not callable(guarantees):
        guarantees = frozenset(guarantees)
        if guarantees - GUARANTEES:
            raise InputError(
                f"unknown guarantees {sorted(guarantees - GUARANTEES)}; known: {sorted(GUARANTEES)}"
            )
    if not callable(needs_groups) and not isinstance(needs_groups, bool):
        raise InputError(f"needs_groups must be True, False or a function, got {needs_groups!r}")
    if needs_groups is not False and "num_groups" not in common:
        raise TypeError(f"{fn.__name__} needs num_groups but does not take it")
    return Spec(fn, common, opts, hinted, var_kw, windows, group_fallback, needs_previous,
                guarantees, needs_groups, plugins.origin_of(fn))


def register(
    name: str,
    *,
    windows: bool = False,
    group_fallback: bool = False,
    needs_previous: bool = False,
    guarantees: Any = (),
    needs_groups: Any = False,
) -> Callable[[SolverFn], SolverFn]:
    """Decorator adding a policy to the registry under ``name`` (see module docstring).

    ``windows=True``: the policy takes the load history ``float64[W, L, E]``, not ``[L, E]``.
    ``group_fallback=True``: `solve` passes a ``num_groups`` that does not divide the experts
    (any integer ``>= 1``); the policy falls back where the groups do not apply (``deepseek``:
    the global policy whenever ``num_groups % num_nodes != 0``, as DeepSeek's).
    ``needs_previous=True``: the policy only runs against a live placement (``repair``);
    sweeps leave it out by default. ``needs_groups``: the policy refuses ``num_groups=None``
    (``True``, or a function ``options -> bool`` when an option decides: ``ilp`` with
    ``hierarchical=True``); `check_solver` then gives it problems with groups only.
    ``guarantees``: what every placement of the policy keeps beyond validity, checked by
    `eplb.testing.check_solver`: names from `GUARANTEES` (``"no_duplicates"``: no GPU holds two
    replicas of an expert; ``"group_contract"``: each of ``num_groups`` groups of consecutive
    experts on one node of the topology as given, failed GPUs included; the policy may then
    raise `InfeasibleError` exactly where no placement keeps it), or a function
    ``(options, topology, num_groups) -> names`` when they depend on the options or problem.
    """
    if not isinstance(name, str) or not name:
        raise InputError(f"a solver name must be a non-empty string, got {name!r}")
    if not isinstance(windows, bool):
        raise InputError(f"windows must be True or False, got {windows!r}")
    for flag, value in (("group_fallback", group_fallback), ("needs_previous", needs_previous)):
        if not isinstance(value, bool):
            raise InputError(f"{flag} must be True or False, got {value!r}")

    def deco(fn: SolverFn) -> SolverFn:
        spec = _spec(fn, windows, group_fallback, needs_previous, guarantees, needs_groups)
        _REGISTRY.add(name, spec, same=lambda old, new: old.fn is new.fn)
        return fn

    return deco


plugins.bind(_REGISTRY, register)  # loaders register here (plugins never imports us)


def takes_windows(name: str) -> bool:
    """Whether policy ``name`` takes the load history ``float64[W, L, E]`` (registered with
    ``windows=True``) rather than one load ``float64[L, E]``."""
    return _lookup(name).windows


def group_fallback(name: str) -> bool:
    """Whether policy ``name`` takes any ``num_groups >= 1`` and falls back to its global policy
    where the groups do not apply (registered ``group_fallback``: ``deepseek``)."""
    return _lookup(name).group_fallback


def takes_previous(name: str) -> bool:
    """Whether policy ``name`` takes ``previous=`` (places for few moves from a live one)."""
    return "previous" in _lookup(name).common


def needs_previous(name: str) -> bool:
    """Whether policy ``name`` only runs with ``previous=`` (registered ``needs_previous``)."""
    return _lookup(name).needs_previous


def needs_groups(name: str, options: dict[str, Any] | None = None) -> bool:
    """Whether policy ``name`` with ``options`` (defaults filled in) requires ``num_groups``
    (registered ``needs_groups``: ``hierarchical``, ``relaxed``, ``ilp`` /
    ``ilp_weighted`` with ``hierarchical=True``)."""
    spec = _lookup(name)
    need = spec.needs_groups
    return bool(need({**spec.options, **(options or {})}) if callable(need) else need)


def guarantees(
    name: str, options: dict[str, Any], topology: Topology, num_groups: int | None
) -> frozenset[str]:
    """What policy ``name`` declares (`register`'s ``guarantees``) for a solve with
    ``options`` (defaults filled in) on ``topology`` with ``num_groups``."""
    spec = _lookup(name)
    g = spec.guarantees
    if callable(g):
        g = g({**spec.options, **options}, topology, num_groups)
    return frozenset(g)


def unregister(name: str) -> None:
    """Remove policy ``name`` from the registry (e.g. a test's spy policy)."""
    _REGISTRY.remove(name)


def available() -> list[str]:
    """Names of the registered solvers (plugins' and installed packages' included; an entry
    point that failed to load is left out and named when asked for), sorted."""
    plugins.load_entry_points()
    return sorted(_REGISTRY)


ENTRY_POINT_GROUP = plugins.ENTRY_POINT_GROUP
load_plugins = plugins.load_plugins


def _lookup(name) -> Spec:
    if isinstance(name, str) and name not in _REGISTRY.names():
        plugins.load_entry_points()  # a name an installed package provides
        why = plugins.broken(name)
        if name not in _REGISTRY.names() and why is not None:
            raise InputError(f"solver {name!r} cannot be used: {why}")
    try:
        return _REGISTRY.get(name)
    except InputError as exc:
        raise InputError(f"{exc}{plugins.broken_note()}") from None


def get(name: str) -> SolverFn:
    """The policy registered as ``name``, callable as ``fn(load, topology, *, num_groups,
    previous, seed, time_limit, **options)`` whatever common arguments it declares (those it
    does not take are dropped). No checks, no relabeling: `solve` does those."""
    spec = _lookup(name)

    @functools.wraps(spec.fn)
    def call(load, topology, **kwargs):
        kw = {k: v for k, v in kwargs.items() if k not in COMMON or k in spec.common}
        return spec.fn(load, topology, **kw)

    return call


def options(name: str) -> dict[str, Any]:
    """Options of solver ``name`` with their defaults (besides ``num_groups``, ``previous``,
    ``seed``, ``time_limit``), e.g. ``{"budget": 10000}``; what ``--option KEY=VALUE``
    accepts on the command line."""
    return dict(_lookup(name).options)


def resolve(
    name: str, opts: dict[str, Any], *, previous: bool = False
) -> tuple[str, dict[str, Any]]:
    """``(policy, options)`` that `solve` would run for ``name`` and ``opts`` (old spellings
    mapped, `solvers.legacy`; ``previous``: whether a live placement is given), options
    checked; `InputError` for unknown solvers, unknown options or bad values."""
    name, opts = route(name, dict(opts), previous) if isinstance(name, str) else (name, opts)
    return name, check_options(name, opts)


def check_options(name: str, opts: dict[str, Any]) -> dict[str, Any]:
    """``opts`` checked for solver ``name``: unknown names and bad values raise `InputError`
    naming the solver's accepted options; returns the normalised values."""
    spec = _lookup(name)
    out = {}
    for key, value in opts.items():
        if key in spec.options:
            hint = spec.hints.get(key)
            out[key] = value if hint is None else check_option(name, key, value, hint)
        elif spec.open_options:
            out[key] = value
        else:
            accepted = ", ".join(spec.options) if spec.options else "none"
            old = ", ".join(LEGACY.get(name, ()))
            raise InputError(
                f"solver {name!r} has no option {key!r}; its options: {accepted} "
                f"(besides num_groups, previous, seed, time_limit)"
                + (f"; older spellings still accepted: {old}" if old else "")
            )
    return out


def check_problem(
    load, topology: Topology, num_groups: int | None = None, *, divides: bool = True
) -> np.ndarray:
    """Validate a solver's inputs; return ``load: float64[L, E]`` (read-only).
    ``divides=False``: ``num_groups`` need not divide the experts (`register`'s
    ``group_fallback``)."""
    load = check_solver_load(load)
    if not isinstance(topology, Topology):
        raise InputError(f"topology must be a Topology, got {type(topology).__name__}")
    E, P = load.shape[1], topology.num_slots
    if P < E:
        raise InfeasibleError(
            f"{P} slots cannot hold {E} experts; every expert needs a slot, use >= "
            f"{-(-E // topology.num_gpus) * topology.num_gpus} slots"
        )
    check_num_groups(num_groups, E, divides=divides)
    check_size(load.shape[0], E, topology)
    return load


def _problem_ids(load, layer_ids, windows: bool = False) -> tuple[Any, np.ndarray | None]:
    """(array load, explicit model layer ids or None) from a `Trace` or an array; a trace
    gives its summed load, or its windows to a policy that takes windows."""
    if isinstance(load, Trace):
        ids = load.layer_ids
        if layer_ids is not None and not np.array_equal(np.asarray(layer_ids), ids):
            raise InputError(
                f"layer_ids {np.asarray(layer_ids).tolist()} differ from the trace's "
                f"{ids.tolist()}; pass layer_ids only with an array load"
            )
        return (load.counts if windows else load.load()), ids
    return load, layer_ids


def check_windows(
    load, topology: Topology, num_groups: int | None = None, *, divides: bool = True
) -> np.ndarray:
    """Validate a windowed policy's inputs; return ``load: float64[W, L, E]`` (read-only)."""
    windows = check_solver_windows(load)
    check_problem(windows[-1], topology, num_groups, divides=divides)
    return windows


def solve(
    name: str,
    load,
    topology: Topology,
    *,
    num_groups: int | None = None,
    previous: Placement | None = None,
    seed: int = 0,
    time_limit: float | None = None,
    layer_ids=None,
    **options: Any,
) -> Placement:
    """Place ``load`` on ``topology`` with solver ``name``; a validated `Placement`.

    ``load``: ``float[L, E]`` tokens per expert, or a `traces.Trace` (its summed
    ``trace.load()`` is placed and its model ``layer_ids`` are carried into the placement).
    A policy that takes windows (`takes_windows`) gets ``float[W, L, E]`` history windows
    (a trace's windows; an ``[L, E]`` load is one window).
    ``layer_ids``: ``int64[L]`` model layer ids of the rows for an array load (default: those
    of ``previous`` if given, else ``0..L-1``); exports need the model's ids.
    ``num_groups``: expert groups (must divide the experts, except for a policy registered
    with ``group_fallback``: ``deepseek``) for group-limited routing.
    ``previous``: the live placement (it may leave slots empty, ``-1``); the result's GPUs,
    nodes and slots are relabeled (`solvers.primitives.relabel`, loads unchanged; meta that
    names nodes, ``group_to_node``, follows) to keep its replicas where they were, unless
    the policy placed against ``previous`` itself (``meta["solver"]["relabeled"]``: ``repair``,
    ``ilp`` with migration terms); ``meta["solver"]["replicas_moved"]`` (per layer) and
    ``replicas_moved_total`` count the rest.
    ``seed``: every random choice is drawn from it. ``time_limit``: wall seconds for the whole
    solve (search solvers; finite, > 0). ``options``: the solver's own (`options`); old
    spellings such as ``solve("greedy", weighted=True)`` are mapped to today's policies
    (`solvers.legacy`; ``meta["solver"]["legacy"]`` records the call as made).
    ``topology.failed_gpus``: the policy places on the surviving GPUs and their slots stay
    empty (-1); ``previous`` may then be the live placement from before (more) GPUs failed,
    and ``replicas_moved`` counts moves onto surviving GPUs (`solvers.analysis.failures`).

    Stages: `_checked_call` (the boundary's checks), `_place` (the policy, on the survivors
    when GPUs failed), `_relabel`, `_contract_on_real_nodes`, `_count_moves`, `_finish`.
    """
    call = _checked_call(
        name, load, topology, num_groups, previous, seed, time_limit, layer_ids, options
    )
    out = _place(call)
    _relabel(call, out)
    _contract_on_real_nodes(call, out)
    _count_moves(call, out)
    return _finish(call, out)


@dataclass
class _Call:
    """One `solve` call as checked at the boundary: the policy that runs and its inputs."""

    name: str  # the policy that runs (old spellings mapped)
    spec: Spec
    load: np.ndarray  # float64[L, E], or float64[W, L, E] for a policy taking windows
    topology: Topology
    ids: np.ndarray | None  # int64[L] model layer ids, or None (0..L-1)
    opts: dict[str, Any]  # the policy's options, checked
    common: dict[str, Any]  # num_groups, previous, seed, time_limit as passed to the policy
    legacy: dict[str, Any] | None  # the call as made, when an old spelling was mapped

    @property
    def num_experts(self) -> int:
        return self.load.shape[-1]

    @property
    def previous(self) -> Placement | None:
        return self.common["previous"]

    def run(self, load: np.ndarray, topology: Topology, previous: Placement | None):
        """The policy on ``load`` and ``topology`` (the survivors' when GPUs failed)."""
        c = {**self.common, "previous": previous}
        fn = self.spec.fn
        return fn(load, topology, **{k: v for k, v in c.items() if k in self.spec.common},
                  **self.opts)


@dataclass
class _Out:
    """What the stages of `solve` pass on: the placement (on ``small``, the survivors'
    topology when GPUs failed), its ``meta["solver"]`` being built, the time taken, and for
    failed GPUs the surviving ``slots`` and the live placement's surviving slots ``live``
    (moves count from them) and ``previous`` restricted to the survivors."""

    placement: Placement
    info: dict[str, Any]
    seconds: float
    small: Topology
    previous: Placement | None
    slots: np.ndarray | None = None
    live: np.ndarray | None = None


def _checked_call(
    name, load, topology, num_groups, previous, seed, time_limit, layer_ids, options
) -> _Call:
    """`solve`'s arguments checked once: old spellings routed, the load (or windows), layer
    ids, seed, time limit, options and the live placement."""
    requested, given = name, dict(options)
    name, options = (
        route(name, options, previous is not None) if isinstance(name, str) else (name, options)
    )
    spec = _lookup(name)  # an InputError for anything that is not a solver name
    routed = name != requested or given != options
    legacy = {"name": requested, "options": given} if routed else None
    load, ids = _problem_ids(load, layer_ids, spec.windows)
    divides = not spec.group_fallback
    if spec.windows:
        load = check_windows(load, topology, num_groups, divides=divides)
    else:
        load = check_problem(load, topology, num_groups, divides=divides)
    L, E = load.shape[-2:]
    if ids is not None:
        ids = check_layer_ids(ids, L)
    common = {
        "num_groups": None if num_groups is None else int(num_groups),
        "previous": previous,
        "seed": check_seed(seed),
        "time_limit": check_time_limit(time_limit),
    }
    opts = check_options(name, options)
    if previous is not None:
        _check_previous(previous, topology, L, E)
        if ids is None:
            ids = previous.layer_ids
    return _Call(name, spec, load, topology, ids, opts, common, legacy)


def _check_previous(previous, topology: Topology, L: int, E: int) -> None:
    """The live placement is one of this problem (the same cluster, perhaps before some of
    its failed GPUs failed) and valid; empty slots (-1) are allowed."""
    if not isinstance(previous, Placement):
        raise InputError(f"previous must be a Placement, got {type(previous).__name__}")
    if (
        not _same_cluster(previous.topology, topology)
        or previous.phy2log.shape != (L, topology.num_slots)
        or previous.num_experts != E
    ):
        raise InputError(
            f"previous placement is [{previous.num_layers} layers, {previous.num_experts} "
            f"experts, {previous.num_slots} slots on {previous.topology}] but the problem is "
            f"[{L} layers, {E} experts, {topology.num_slots} slots on {topology}]"
        )
    if not topology.failed_gpus:  # with failures it may have lost an expert's replicas
        previous.validate()


def _place(call: _Call) -> _Out:
    """Run the policy, timed; with failed GPUs on the survivors (`solve_surviving`), an
    `InfeasibleError` there saying so. Returns the validated placement of the problem's
    shape (on the survivors' topology)."""
    topology, previous = call.topology, call.previous
    start = time.perf_counter()
    origin = call.spec.origin  # a third-party policy: its failures and overruns named
    with plugins.running(call.name, origin, call.common["time_limit"]):
        if topology.failed_gpus:  # place on the survivors, expand in _finish

            def run(load, small, prev):
                try:
                    return call.run(load, small, prev)
                except InfeasibleError as err:
                    raise InfeasibleError(_on_survivors(call.name, topology, small, err)
                                          ) from None

            live = None if previous is None else previous.phy2log[:, surviving(topology)[1]]
            out, prev, small, slots = solve_surviving(run, call.load, topology,
                                                      previous=previous)
        else:
            out = call.run(call.load, topology, previous)
            prev, small, slots, live = previous, topology, None, None
    seconds = time.perf_counter() - start
    try:
        placement = _as_placement(out, call.name, call.num_experts, small)
    except EplbError as exc:  # the same error, naming where the policy comes from
        if not origin:
            raise
        raise type(exc)(f"solver {call.name!r} ({origin}) {plugins.RETURNED}: {exc}") from None
    L = call.load.shape[-2]
    if placement.num_layers != L:
        raise InputError(
            f"solver {call.name!r} returned {placement.num_layers} layers for a {L}-layer problem"
        )
    info = dict(placement.meta.get("solver") or {})
    return _Out(placement, info, seconds, small, prev, slots, live)


def _on_survivors(name: str, topology: Topology, small: Topology, err: Exception) -> str:
    """A policy's refusal on the survivors' topology, said in the user's terms."""
    return (
        f"solver {name!r} cannot place on the {small.num_gpus} GPUs that survive failed GPUs "
        f"{list(topology.failed_gpus)} of the {topology.num_nodes}x{topology.gpus_per_node}x"
        f"{topology.slots_per_gpu} cluster: solve places on the survivors as "
        f"Topology({small.num_nodes}, {small.gpus_per_node}, {small.slots_per_gpu}) (whole "
        f"failed nodes drop out; a partly failed node makes the survivors one node): {err}"
    )


def _relabel(call: _Call, out: _Out) -> None:
    """Relabel against the live placement (timed with the solve) unless the policy placed
    against it itself; ``group_to_node`` follows the nodes."""
    if out.previous is None or out.info.get("relabeled"):
        return
    start = time.perf_counter()
    placement, target = relabel_map(out.placement, out.previous)
    out.placement = placement.validate()
    out.seconds += time.perf_counter() - start
    if "group_to_node" in out.info:
        nodes = node_map(target, out.small.gpus_per_node)
        g2n = np.asarray(out.info["group_to_node"], dtype=np.int64)
        out.info["group_to_node"] = np.take_along_axis(nodes, g2n, 1).tolist()


def _declared(call: _Call) -> frozenset[str]:
    g = call.spec.guarantees
    if callable(g):
        g = g({**call.spec.options, **call.opts}, call.topology, call.common["num_groups"])
    return frozenset(g)


def _contract_on_real_nodes(call: _Call, out: _Out) -> None:
    """Meta and placement on the real nodes after GPUs failed: where whole nodes failed the
    survivors' nodes are renumbered (``group_to_node`` follows); on a partly failed node the
    survivors form one node: a contract policy's layers that split a group over two real
    nodes are re-placed (`keep_contract`, ``duplicates`` recounted), or the placement says it
    is a global one."""
    topology, info = call.topology, out.info
    if not topology.failed_gpus:
        return
    real = survivor_nodes(topology, out.slots)  # [G'] the real node of each surviving GPU
    if out.small.num_nodes == len(set(real.tolist())):  # whole nodes failed: renumber nodes
        _renumber_nodes(info, real[:: out.small.gpus_per_node])
        return
    groups, E = call.common["num_groups"], call.num_experts
    if groups is None or not (
        info.get("policy") == "hierarchical" or "group_contract" in _declared(call)
    ):  # no groups, no contract to keep
        return
    rows = call.load if call.load.ndim == 2 else call.load.mean(0)
    out.placement, fixed, dropped = keep_contract(out.placement, rows, topology, out.slots, groups)
    if dropped:  # honest fallback: the placement is a global one
        info.update(policy="global", contract_dropped=dropped, fallback=dropped)
        return
    if fixed:
        _uncertify(info, out.placement, rows, fixed)
        if "duplicates" in info:
            dup = duplicates(out.placement.phy2log, topology.slots_per_gpu)
            info["duplicates"] = int(dup.sum())
    if "group_to_node" in info:  # the survivors' one node -> the real nodes
        info["group_to_node"] = real_group_nodes(
            out.placement.phy2log, E, topology, out.slots, groups
        ).tolist()


def _renumber_nodes(info: dict[str, Any], real: np.ndarray) -> None:
    """``group_to_node`` of a placement on the nodes left after whole nodes failed, in the
    real nodes' numbers (``real: int64[N']``, the real node of each node left)."""
    if "group_to_node" in info:
        info["group_to_node"] = real[np.asarray(info["group_to_node"], dtype=np.int64)].tolist()


def _count_moves(call: _Call, out: _Out) -> None:
    """``replicas_moved`` (per layer) and ``replicas_moved_total`` against the live placement
    (`eplb.moves`: the executor's meaning, a copy already on that GPU is not a move)."""
    if out.previous is None:
        return
    if out.live is None:
        moved = replicas_moved(out.previous, out.placement)
    else:  # orphans re-homed in `previous` still count as moves
        moved = gpu_moves(out.live, out.placement.phy2log, out.small.num_gpus).sum(1)
    out.info.update(replicas_moved=moved.tolist(), replicas_moved_total=int(moved.sum()))


def _finish(call: _Call, out: _Out) -> Placement:
    """Expand to the real topology (failed GPUs' slots -1) and record ``meta["solver"]``:
    ``name``, ``params``, ``seconds``, ``legacy``; the model layer ids."""
    placement, info = out.placement, out.info
    if call.legacy is not None:
        info["legacy"] = call.legacy
    if call.topology.failed_gpus:
        placement = expand(placement, call.topology, out.slots).validate()
    c = call.common
    info.update(
        name=call.name,
        params={"num_groups": c["num_groups"], "seed": c["seed"], "time_limit": c["time_limit"],
                **call.opts},
        seconds=out.seconds,
    )
    return Placement(
        placement.phy2log,
        call.num_experts,
        call.topology,
        placement.replica_share,
        {**placement.meta, "solver": info},
        call.ids,
    )  # the tables were validated above; only meta and layer ids are new


def _uncertify(info: dict, placement: Placement, load: np.ndarray, layers: list[int]) -> None:
    """Record in ``info`` (``meta["solver"]``) that ``layers`` were re-placed to keep the group
    contract on a partly failed node: an exact solver's objective becomes the layer's max GPU
    load and its status ``feasible`` (the bound stays valid: it bounds every placement)."""
    info["contract_replaced_layers"] = list(layers)
    if "status" not in info:
        return
    gpu = placement.gpu_load(load).max(1)
    for key in ("objective", "status", "gap"):
        info[key] = list(info[key])
    for layer in layers:
        info["objective"][layer] = float(gpu[layer])
        info["status"][layer] = "feasible"
        b = info["bound"][layer]
        info["gap"][layer] = 0.0 if gpu[layer] <= 0 else max(0.0, 1 - b / gpu[layer])
    info["objective_max"] = float(max(info["objective"]))
    info["gap_max"] = float(max(info["gap"]))
    info["gap_mean"] = float(np.mean(info["gap"]))
    info["optimal_layers"] = sum(s == "optimal" for s in info["status"])


def _same_cluster(old: Topology, new: Topology) -> bool:
    """``old`` is ``new``, or ``new`` before some of its failed GPUs failed."""
    return set(old.failed_gpus) <= set(new.failed_gpus) and (
        replace(old, failed_gpus=new.failed_gpus) == new
    )


def _as_placement(out, name: str, num_experts: int, topology: Topology) -> Placement:
    """A policy's return value as a validated `Placement` of the problem's shape."""
    if isinstance(out, Placement):
        p = out
    else:
        if not isinstance(out, np.ndarray):
            raise InputError(
                f"solver {name!r} returned {type(out).__name__}; a solver returns a Placement "
                "or an int64[L, P] phy2log array"
            )
        p = Placement(out, num_experts, topology)
    if p.topology != topology or p.num_experts != num_experts:
        raise InputError(
            f"solver {name!r} returned a placement for {p.num_experts} experts on "
            f"{p.topology}, not {num_experts} experts on {topology}"
        )
    return p.validate()
