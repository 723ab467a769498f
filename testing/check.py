"""`check_solver`: the invariant suite of the toolkit's solvers, for any policy.

Properties ``places``, ``valid``, ``deterministic``, ``lower_bound``, ``scale_invariant``,
``previous_relabels``, ``no_duplicates`` / ``group_contract`` (where declared), ``meta``,
``failed_gpus``, ``bad_input`` (and ``windows``), each a derandomised hypothesis test through
`solvers.solve` on problems of 1-5 layers (with and without groups, some with failed GPUs,
loads at extreme scales, a live placement with empty slots) and on hard cases. See
docs/solvers.md, section "The properties `check_solver` runs".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eplb import solvers
from eplb.errors import EplbError, InfeasibleError
from eplb.placement import Placement
from eplb.solvers.analysis.bounds import lower_bound
from eplb.solvers.registry import guarantees as declared_guarantees
from eplb.testing.asserts import assert_valid_placement
from eplb.testing.meta import assert_meta_truthful
from eplb.tolerance import REL_TOL
from eplb.topology import Topology

__all__ = ["PROPERTIES", "CheckReport", "Failure", "check_solver", "contract_feasible"]

PROPERTIES = (
    "places",
    "valid",
    "deterministic",
    "lower_bound",
    "scale_invariant",
    "previous_relabels",
    "no_duplicates",
    "group_contract",
    "meta",
    "failed_gpus",
    "bad_input",
    "windows",
)
_COUNTER = itertools.count()
# scale factors drawn on purpose (extreme ones first), besides powers of two 2**-40 .. 2**40
_FACTORS = (2.0**40, 2.0**-40, 1e12, 1e-9, 3.0, 1 / 7)
# smallest positive float: an even split of a subnormal load rounds each replica's share by up
# to half of it, so sums over P slots may differ by P of it (issue 33: [[5e-324]] on 2 slots)
_TINY = float(np.finfo(np.float64).smallest_subnormal)


@dataclass
class Failure:
    """One failed property: its name, the error and the shrunk counterexample."""

    prop: str
    error: str
    example: str

    def __str__(self) -> str:
        return f"{self.prop}: {self.error}\n  counterexample: {self.example}"


@dataclass
class CheckReport:
    """What `check_solver` found: ``passed``, ``skipped`` and ``failures`` by property;
    ``refusals``: problems the policy refused (``InfeasibleError``) out of ``examples`` in
    ``places``, ``declared`` of them where it declared it may refuse."""

    solver: str
    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failed(self) -> list[str]:
        """Names of the failed properties."""
        return [f.prop for f in self.failures]

    def __str__(self) -> str:
        head = (
            f"check_solver({self.solver!r}): {len(self.passed)} passed, "
            f"{len(self.failures)} failed, {len(self.skipped)} skipped"
        )
        if self.refusals.get("refused"):
            r = self.refusals
            head += (
                f"; refused {r['refused']} of {r['examples']} problems "
                f"({r['declared']} where declared)"
            )
        return "\n".join([head] + [f"- {f}" for f in self.failures])


def _topo_text(t: Topology) -> str:
    failed = f", failed_gpus={list(t.failed_gpus)}" if t.failed_gpus else ""
    return f"Topology({t.num_nodes}, {t.gpus_per_node}, {t.slots_per_gpu}{failed})"


def _describe(load, topology, groups, extra: str = "") -> str:
    arr = np.array2string(np.asarray(load), separator=", ", max_line_width=200)
    return f"load={arr}, topology={_topo_text(topology)}, num_groups={groups}{extra}"


def contract_feasible(topology: Topology, num_experts: int, num_groups: int) -> bool:
    """Whether some placement keeps every one of ``num_groups`` groups (consecutive experts)
    on one node of ``topology``: the surviving slots of the nodes hold whole groups of
    ``num_experts / num_groups`` experts (one slot each at least), and every node with a
    surviving slot holds at least one whole group (each slot holds a replica, so a node
    without a group would split one)."""
    size = num_experts // num_groups
    alive = topology.slot_alive.reshape(topology.num_nodes, -1).sum(1)
    live = alive[alive > 0]
    return bool(
        (live >= size).all() and int((live // size).sum()) >= num_groups
        and num_groups >= live.size
    )


def _assert_contract(p: Placement, load, topo: Topology, groups: int) -> None:
    """The group contract holds, or the placement declares a fallback
    (``meta["solver"]["fallback"]``) where no placement can keep it (`contract_feasible`)."""
    why = (p.meta.get("solver") or {}).get("fallback")
    if why:
        assert not contract_feasible(topo, load.shape[1], groups), (
            f"fell back to a global placement ({why!r}) where the group contract can hold"
        )
        return
    assert_valid_placement(p, load, group_contract=groups)


class _Solver:
    """`solvers.solve` for one policy and its options, with a cache of results (or errors)
    by input so the properties share solves; ``fresh=True`` solves again."""

    def __init__(self, name, seed, options, needs_previous):
        self.name, self.seed, self.options = name, seed, options
        self.needs_previous = needs_previous
        self.cache: dict[Any, Any] = {}

    def __call__(self, load, topo, groups, *, previous=None, fresh=False, **kw):
        if self.needs_previous and previous is None:
            previous = _live(load, topo)
        key = (
            np.asarray(load).tobytes(),
            np.shape(load),
            str(np.asarray(load).dtype),
            topo,
            groups,
            None if previous is None else (previous.phy2log.tobytes(), previous.topology),
            None if previous is None or previous.replica_share is None
            else previous.replica_share.tobytes(),
            tuple(sorted(kw.items())),
        )
        if not fresh and key in self.cache:
            out = self.cache[key]
        else:
            try:
                out = solvers.solve(
                    self.name,
                    load,
                    topo,
                    num_groups=groups,
                    seed=self.seed,
                    previous=previous,
                    **self.options,
                    **kw,
                )
            except Exception as exc:  # cached too: the same input fails the same way
                out = exc
            if not fresh:
                self.cache[key] = out
        if isinstance(out, Exception):
            raise out
        return out


def check_solver(
    name_or_fn: str | Callable[..., Any],
    *,
    max_examples: int = 25,
    seed: int = 0,
    needs_previous: bool = False,
    needs_groups: bool = False,
    raise_on_failure: bool = True,
    max_nodes: int = 2,
    max_gpus_per_node: int = 3,
    max_group_size: int = 3,
    max_layers: int = 5,
    windows: bool = False,
    guarantees: Iterable[str] = (),
    may_refuse: Callable[[np.ndarray, Topology, int | None], bool] | None = None,
    max_refusals: float = 0.05,
    **options: Any,
) -> CheckReport:
    """Run the invariant suite (docs/solvers.md) on solver ``name_or_fn``.

    ``name_or_fn``: a registered name or a function ``fn(load, topology, ...)`` returning a
    `Placement` or ``phy2log``. ``options``: passed to every solve (e.g. ``budget=100``).
    ``needs_previous``: the policy repairs a live placement (every call gets a
    ``previous=``). ``needs_groups``: a plain function that needs ``num_groups`` (a
    registered policy says so at registration); problems drawn without groups are then not
    given to it. Sizes: nodes, GPUs per node, experts per group and layers of the random
    problems. ``windows``: a plain function takes the history ``[W, L, E]`` (registered
    with ``windows=True``; a registered name says so itself). ``guarantees``: names from
    `solvers.registry.GUARANTEES` the policy keeps, besides those it declared at
    registration (a plain function declares them here). ``may_refuse(load, topology,
    num_groups)``: where an ``InfeasibleError`` is a declared refusal; otherwise a policy may
    refuse at most ``max_refusals`` of the feasible problems (``places``). Returns a
    `CheckReport`; with ``raise_on_failure`` (default) an ``AssertionError`` listing every
    failure instead when any property fails.

    Stages: the policy registered (`_registered`), a `_Checker` holding the solves and what
    the policy declares, each property run by `_run_property` on the random problems
    (`_strategy`) and the hard cases (`_hard_cases`), the refusals judged
    (`_judge_refusals`), then `_bad_input`.
    """
    name, temporary = _registered(name_or_fn, windows, frozenset(guarantees), needs_groups)
    try:
        policy, opts = solvers.resolve(name, dict(options))
        checker = _Checker(
            policy, opts, _Solver(name, seed, options, needs_previous),
            frozenset(guarantees), may_refuse,
        )
        report = CheckReport(name)
        conf, quick = _settings(max_examples)
        strategy = _strategy(max_nodes, max_gpus_per_node, max_group_size, max_layers)
        _run_property(report, "places", checker.places, checker, strategy, conf, quick)
        _judge_refusals(report, checker, max_refusals)
        for prop, body in checker.properties(solvers.takes_windows(name)):
            _run_property(report, prop, body, checker, strategy, conf, quick)
        _bad_input(checker.solve, report, checker.allowed)
    finally:
        if temporary:
            solvers.registry.unregister(name)
    if raise_on_failure and report.failures:
        raise AssertionError(str(report))
    return report


def _settings(max_examples: int):
    """``(conf, quick)``: the derandomised hypothesis settings of every property, and the same
    without shrinking (after the first failure, later properties report their first failing
    example unshrunk: one shrink per report keeps a broken policy's check fast)."""
    from hypothesis import HealthCheck, Phase, settings  # lazy: only when checks run

    conf = settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        # no explain phase: it re-runs the shrunk counterexample dozens of times to print
        # which parts of it do not matter, which this report never shows (it was 70% of
        # a broken policy's check)
        phases=[p for p in Phase if p.name != "explain"],
    )
    return conf, settings(conf, phases=[p for p in conf.phases if p is not Phase.shrink])


def _strategy(max_nodes: int, max_gpus_per_node: int, max_group_size: int, max_layers: int):
    """``((load, topology, num_groups), factor, live)``: a problem (1..max_layers layers; with
    and without groups; failed GPUs, a whole node or part of one; loads at extreme scales), a
    scale factor (extreme ones drawn on purpose) and a live placement with empty slots."""
    from hypothesis import strategies as st

    from eplb.testing.strategies import placements, problems

    factor = st.one_of(
        st.sampled_from(_FACTORS),
        st.integers(-40, 40).map(lambda k: 2.0**k),
    )
    return problems(
        max_nodes=max_nodes,
        max_gpus_per_node=max_gpus_per_node,
        max_group_size=max_group_size,
        max_layers=max_layers,
        failures=True,
        no_groups=True,
        scales=True,
    ).flatmap(
        lambda pr: st.tuples(st.just(pr), factor, placements(pr[0], pr[1], empty_slots=True))
    )


def _run_property(report, prop: str, body, checker: _Checker, strategy, conf, quick) -> None:
    """Run one property on the random problems (shrunk), then on the hard cases as given;
    record it as passed, failed (with the counterexample), skipped, or failed as never run
    when the policy refused every problem."""
    from hypothesis import given

    last: list[str] = []
    counts = {"ran": 0, "refused": 0, "skip": 0}

    def one(case):
        (load, topo, groups), c, live = case
        checker.note = ""
        last[:] = [_describe(load, topo, groups, f", factor={c!r}")]
        if groups is None and checker.needs_groups(topo):
            counts["skip"] += 1
            return
        out = body(load, topo, groups, c, live)
        counts["ran" if out is None else out] += 1

    test = (quick if report.failures else conf)(given(strategy)(one))
    try:
        test()
        for case in _hard_cases():
            one(case)
    except Exception as exc:
        err = exc.__class__.__name__ + (f": {exc}" if str(exc) else "")
        report.failures.append(Failure(prop, err, (last[0] if last else "?") + checker.note))
        return
    if prop == "places":
        return  # judged by _judge_refusals
    if counts["ran"]:
        report.passed.append(prop)
    elif counts["refused"]:
        report.failures.append(
            Failure(
                prop,
                f"never ran: the policy refused all {counts['refused']} problems it was given",
                "see places",
            )
        )
    else:
        report.skipped.append(prop)


def _judge_refusals(report: CheckReport, checker: _Checker, max_refusals: float) -> None:
    """``places``: refusals the policy did not declare, at most ``max_refusals`` of the
    problems; counted in ``report.refusals``."""
    refused, examples = checker.refused, checker.examples
    report.refusals = {
        "examples": examples,
        "refused": len(refused),
        "declared": sum(d for *_, d in refused),
    }
    if "places" in report.failed:
        return
    undeclared = [x for x in refused if not x[2]]
    if len(undeclared) > max_refusals * max(1, examples):
        ex, err, _ = min(undeclared, key=lambda x: len(x[0]))
        report.failures.append(
            Failure(
                "places",
                f"refused {len(undeclared)} of {examples} problems it did not declare "
                f"it may refuse (at most {max_refusals:.0%} allowed): InfeasibleError: {err}",
                ex,
            )
        )
    else:
        report.passed.append("places")


class _Checker:
    """The property bodies of `check_solver` for one policy: each ``(load, topology,
    num_groups, factor, live) -> None`` (ran), ``"refused"`` or ``"skip"``, raising on a
    failure; ``note`` adds to the counterexample."""

    def __init__(self, policy: str, opts: dict, solve: _Solver, extra: frozenset[str],
                 may_refuse) -> None:
        self.policy, self.opts, self.solve = policy, opts, solve
        self.extra, self.may_refuse = extra, may_refuse
        self.note = ""
        self.refused: list[tuple[str, str, bool]] = []  # (example, error, declared)
        self.examples = 0

    def properties(self, windows: bool) -> list[tuple[str, Callable[..., str | None]]]:
        """The properties after ``places``, in the order they run."""
        props = [
            ("valid", self.valid),
            ("deterministic", self.deterministic),
            ("lower_bound", self.lower_bound),
            ("scale_invariant", self.scale_invariant),
            ("previous_relabels", self.previous_relabels),
            ("no_duplicates", self.no_duplicates),
            ("group_contract", self.group_contract),
            ("meta", self.meta),
            ("failed_gpus", self.failed_gpus),
        ]
        return props + ([("windows", self.windows)] if windows else [])

    def declared(self, topo: Topology, groups: int | None) -> frozenset[str]:
        return declared_guarantees(self.policy, self.opts, topo, groups) | self.extra

    def needs_groups(self, topo: Topology) -> bool:
        return solvers.registry.needs_groups(self.policy, self.opts)

    def allowed(self, load, topo: Topology, groups: int | None) -> bool:
        """Whether the policy declared it may refuse this problem."""
        if self.may_refuse is not None and self.may_refuse(load, topo, groups):
            return True
        return (
            groups is not None
            and "group_contract" in self.declared(topo, groups)
            and not contract_feasible(topo, load.shape[1], groups)
        )

    def base(self, load, topo, groups) -> Placement | None:
        """The plain solve, or None when refused (``places`` counts refusals)."""
        try:
            return self.solve(load, topo, groups)
        except InfeasibleError:
            return None

    def places(self, load, topo, groups, c, live):
        self.examples += 1
        try:
            self.solve(load, topo, groups)
        except InfeasibleError as exc:
            ok = self.allowed(load, topo, groups)
            self.refused.append((_describe(load, topo, groups), str(exc), ok))
        except Exception:  # not a refusal: `valid` reports it
            pass
        return None

    def valid(self, load, topo, groups, c, live):
        p = self.base(load, topo, groups)
        if p is None:
            return "refused"
        assert_valid_placement(p, load)
        return None

    def deterministic(self, load, topo, groups, c, live):
        a = self.base(load, topo, groups)
        if a is None:
            return "refused"
        b = self.solve(load.copy(), topo, groups, fresh=True)
        assert a.equals(b), "two solves of the same input and seed differ"
        return None

    def lower_bound(self, load, topo, groups, c, live):
        p = self.base(load, topo, groups)
        if p is None:
            return "refused"
        _assert_bound(p, load, topo)
        return None

    def scale_invariant(self, load, topo, groups, c, live):
        a = self.base(load, topo, groups)
        if a is None:
            return "refused"
        top = float(load.sum(1).max()) * c
        if top > 2.0**52:  # solve() refuses layer totals above 2**53: scale down by powers of 2
            c /= 2.0 ** np.ceil(np.log2(top / 2.0**52))
        scaled = load * c
        try:
            b = self.solve(scaled, topo, groups)
        except InfeasibleError:
            if self.allowed(scaled, topo, groups):
                return "skip"  # a declared refusal (may_refuse)
            raise AssertionError(f"the load times {c!r} was refused") from None
        _assert_scaled(a, b, load, scaled, c)
        return None

    def _reweighted(self, load, topo, groups) -> Placement | None:
        """A live placement for another load (the plain solve of a reweighted copy)."""
        try:
            return self.solve(load * (1 + np.arange(load.shape[1]) % 3) / 2, topo, groups)
        except InfeasibleError:
            return None

    def previous_relabels(self, load, topo, groups, c, live):
        """``previous=`` (a placement of another load, and a live placement with empty slots)
        only relabels, or, placed against, is no worse than keeping it or ignoring it."""
        plain = self.base(load, topo, groups)
        if plain is None:
            return "refused"
        old = self._reweighted(load, topo, groups)
        if old is None:
            return "refused"
        _assert_previous(plain, old, self.solve(load, topo, groups, previous=old), load)
        self.note = " (previous: a live placement with empty slots)"
        try:
            moved = self.solve(load, topo, groups, previous=live)
        except InfeasibleError:
            return None if self.allowed(load, topo, groups) else "refused"
        _assert_previous(plain, live, moved, load)
        self.note = ""
        return None

    def no_duplicates(self, load, topo, groups, c, live):
        if "no_duplicates" not in self.declared(topo, groups):
            return "skip"
        p = self.base(load, topo, groups)
        if p is None:
            return "refused"
        assert_valid_placement(p, load, no_duplicates=True)
        return None

    def group_contract(self, load, topo, groups, c, live):
        """The contract holds on the plain solve and on a solve against a live placement
        (with empty slots, usually breaking the contract: a policy that keeps the live layer
        to save moves must not keep it then)."""
        if groups is None or "group_contract" not in self.declared(topo, groups):
            return "skip"
        p = self.base(load, topo, groups)
        if p is None:
            return "skip" if self.allowed(load, topo, groups) else "refused"
        _assert_contract(p, load, topo, groups)
        if live is None:
            return None
        self.note = " (previous: a live placement with empty slots)"
        try:
            q = self.solve(load, topo, groups, previous=live)
        except InfeasibleError:  # e.g. a move budget no contract-keeping placement meets
            q = None
        if q is not None:
            _assert_contract(q, load, topo, groups)
        self.note = ""
        return None

    def meta(self, load, topo, groups, c, live):
        """Every ``meta["solver"]`` field read off the placement (`assert_meta_truthful`):
        plain, relabeled against a placement of another load, and against a live one with
        empty slots."""
        p = self.base(load, topo, groups)
        if p is None:
            return "refused"
        assert_meta_truthful(p, load)
        old = self._reweighted(load, topo, groups)
        for prev, note in ((old, " (previous: another load's placement)"),
                           (live, " (previous: a live placement with empty slots)")):
            if prev is None:
                continue
            self.note = note
            try:
                q = self.solve(load, topo, groups, previous=prev)
            except InfeasibleError:
                continue
            assert_meta_truthful(q, load, previous=prev)
        self.note = ""
        return None

    def failed_gpus(self, load, topo, groups, c, live):
        """A GPU fails under a live placement: solve with ``previous=`` the placement from
        before (the path of `eplb replay` and the serving fault model)."""
        healthy = Topology(topo.num_nodes, topo.gpus_per_node, topo.slots_per_gpu)
        if topo.failed_gpus:
            broken = topo
        elif healthy.num_gpus > 1 and (healthy.num_gpus - 1) * healthy.slots_per_gpu >= (
            load.shape[1]
        ):
            broken = healthy.with_failed([healthy.num_gpus - 1])
        else:
            return "skip"
        if broken is not topo:  # the failure this property made: in the counterexample
            self.note = f" (then GPU {healthy.num_gpus - 1} failed)"
        try:
            before = self.solve(load, healthy, groups)
        except InfeasibleError:
            before = _live(load, healthy)
        try:
            p = self.solve(load, broken, groups, previous=before)
        except InfeasibleError:
            return "skip" if self.allowed(load, broken, groups) else "refused"
        assert_valid_placement(p, load)
        _assert_bound(p, load, broken)
        if groups is not None and "group_contract" in self.declared(broken, groups):
            _assert_contract(p, load, broken, groups)
        assert_meta_truthful(p, load, previous=before)
        return None

    def windows(self, load, topo, groups, c, live):
        stack = np.stack([load, load * (1 + np.arange(load.shape[1]) % 3) / 2, load])
        try:
            a = self.solve(stack, topo, groups)
        except InfeasibleError:
            return "refused"
        assert_valid_placement(a, stack.sum(0))
        again = self.solve(stack.copy(), topo, groups, fresh=True)
        assert a.equals(again), "two solves of the same windows differ"
        try:
            self.solve(stack[None], topo, groups)
        except EplbError:
            return None
        raise AssertionError("a 4-D load [1, W, L, E] was accepted")


def _assert_bound(p: Placement, load: np.ndarray, topo: Topology) -> None:
    lb = lower_bound(load, topo, weighted=p.replica_share is not None, lp=False)
    got = p.gpu_load(load).max(1)
    bad = got < lb * (1 - 1e-9) - topo.num_slots * _TINY
    assert not bad.any(), (
        f"layer {int(np.argmax(bad))}: max GPU load {got[bad][0]!r} is "
        f"below the lower bound {lb[bad][0]!r}"
    )


def _assert_scaled(a: Placement, b: Placement, load, scaled, c: float) -> None:
    """``b`` (for ``load * c``) is ``a`` (for ``load``): the same table when scaling is exact
    in floating point (powers of two), else the same max GPU load per layer, scaled."""
    exact = np.array_equal(scaled / c, load) and np.array_equal(load * c, scaled)
    if exact and float(np.log2(c)).is_integer():
        assert np.array_equal(a.phy2log, b.phy2log), (
            f"the load times {c!r} (exact in floating point) gives another placement: "
            f"{a.phy2log.tolist()} vs {b.phy2log.tolist()}"
        )
        if a.replica_share is not None or b.replica_share is not None:
            sa = a.replica_share if a.replica_share is not None else 1 / a.logcnt[
                np.arange(a.num_layers)[:, None], np.maximum(a.phy2log, 0)]
            sb = b.replica_share if b.replica_share is not None else 1 / b.logcnt[
                np.arange(b.num_layers)[:, None], np.maximum(b.phy2log, 0)]
            assert np.allclose(sa, sb, rtol=1e-9, atol=1e-12), (
                f"the load times {c!r} gives other replica shares"
            )
        return
    got = b.gpu_load(scaled).max(1) / c
    want = a.gpu_load(load).max(1)
    # absolute: the split of a subnormal load rounds (in either problem's units)
    tiny = a.topology.num_slots * _TINY * max(1.0, 1 / c)
    bad = ~np.isclose(got, want, rtol=1e-6, atol=tiny)
    assert not bad.any(), (
        f"layer {int(np.argmax(bad))}: the load times {c!r} gives max GPU load "
        f"{got[bad][0] * c!r}, {got[bad][0] / want[bad][0]:.6g} times the scaled "
        f"{want[bad][0] * c!r} of the unscaled load"
    )


def _assert_previous(plain: Placement, old: Placement, moved: Placement, load) -> None:
    """``previous=old`` only relabels ``plain`` (GPU loads per layer as a multiset), or, where
    the policy placed against ``old`` itself (``meta["solver"]["relabeled"]``), its max GPU
    load per layer is no worse than both keeping ``old`` and the placement without it."""
    new = moved.gpu_load(load)
    if moved.meta.get("solver", {}).get("relabeled"):
        cap = np.maximum(old.gpu_load(load).max(1), plain.gpu_load(load).max(1))
        got = new.max(1)
        bad = got > cap * (1 + REL_TOL) + moved.topology.num_slots * _TINY
        assert not bad.any(), (
            f"layer {int(np.argmax(bad))}: placed against previous= (relabeled), max GPU load "
            f"{got[bad][0]!r} is worse than both keeping previous and solving without it "
            f"({cap[bad][0]!r})"
        )
        return
    a = np.sort(plain.gpu_load(load), 1)
    b = np.sort(new, 1)
    assert np.allclose(a, b, rtol=1e-9, atol=moved.topology.num_slots * _TINY), (
        f"previous= changed the GPU loads: {a.tolist()} without, {b.tolist()} with"
    )


def _registered(
    name_or_fn, windows: bool = False, guarantees=frozenset(), needs_groups: bool = False
) -> tuple[str, bool]:
    if isinstance(name_or_fn, str):
        solvers.get(name_or_fn)  # InputError for an unknown name
        return name_or_fn, False
    if not callable(name_or_fn):
        raise TypeError(f"check_solver needs a solver name or function, got {name_or_fn!r}")
    name = f"_check_{getattr(name_or_fn, '__name__', 'fn')}_{next(_COUNTER)}"
    solvers.register(name, windows=windows, guarantees=guarantees,
                     needs_groups=needs_groups)(name_or_fn)
    return name, True


def _live(load, topo) -> Placement | None:
    """A live placement for repair-like policies: round robin on the surviving slots (valid,
    rarely balanced); None for a load that is not ``[L, E]`` or does not fit (the bad-input
    cases)."""
    if np.ndim(load) != 2 or np.shape(load)[1] > int(topo.slot_alive.sum()):
        return None
    L, E = np.shape(load)
    alive = topo.slot_alive
    row = np.full(topo.num_slots, -1, dtype=np.int64)
    row[alive] = np.arange(int(alive.sum())) % E
    return Placement(np.broadcast_to(row, (L, topo.num_slots)).copy(), E, topo)


def _sparse_live(load, topo) -> Placement:
    """A live placement leaving slots empty: expert ``e`` in the ``e``-th live slot, the other
    slots -1 (as ``craft`` leaves them), every layer the same."""
    L, E = np.shape(load)
    row = np.full(topo.num_slots, -1, dtype=np.int64)
    row[np.flatnonzero(topo.slot_alive)[:E]] = np.arange(E)
    return Placement(np.broadcast_to(row, (L, topo.num_slots)).copy(), E, topo)


def _hard_cases() -> list[tuple[tuple[np.ndarray, Topology, int | None], float, Placement]]:
    """Every property also runs on these cases after the random ones: all-equal tiny loads
    (issue 18's scale counterexample), all-equal layers, one expert, huge loads on a partly
    failed cluster, contracts that cannot hold, no groups, the survivors of a partly failed
    2 x 3 cluster (one node of 5 GPUs), a subnormal load (issue 33), a factor crossing every
    absolute threshold; each ``((load, topology, num_groups), scale factor, live placement
    with empty slots)``."""
    counts = np.array([[3.0, 1.0, 4.0, 1.0], [5.0, 9.0, 2.0, 6.0]])
    cases = [
        ((np.full((1, 3), 1e-9), Topology(1, 2, 3), 1), 2.0**30),
        ((np.full((3, 4), 7.0), Topology(2, 1, 3), 2), 2.0**-30),
        ((np.array([[5.0], [0.0]]), Topology(1, 2, 2), 1), 1e-9),
        ((counts * 1e12, Topology(2, 2, 2, failed_gpus=[3]), 2), 1 / 7),
        # contracts that cannot hold (a contract policy falls back, saying so): fewer
        # groups than nodes; 3 groups of 2 on 2 nodes of 3 slots
        ((counts[:1], Topology(4, 1, 2), 2), 3.0),
        ((np.ones((1, 6)), Topology(2, 1, 3), 3), 2.0),
        ((counts, Topology(2, 2, 2), None), 2.0**40),
        ((counts, Topology(2, 3, 2, failed_gpus=[4]), 2), 2.0**20),
        ((np.array([[5e-324]]), Topology(1, 1, 2), 1), 2.0**30),
    ]
    return [(prob, c, _sparse_live(prob[0], prob[1])) for prob, c in cases]


def _hard_inputs() -> dict[str, tuple[np.ndarray, Topology, int]]:
    """Inputs `solve` accepts that are hard for a policy: ``(load, topology, num_groups)``."""
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 1000, size=(2, 8)).astype(np.float64)
    two = Topology(2, 2, 3)
    return {
        "one expert": (np.array([[5.0], [0.0]]), Topology(1, 2, 2), 1),
        "all-equal loads": (np.full((3, 8), 7.0), two, 2),
        "all-zero load": (np.zeros((2, 8)), two, 2),
        "a layer of zeros": (np.vstack([np.zeros(8), counts[0]]), two, 2),
        "huge loads (1e12 scale)": (counts * 1e12, two, 2),
        "tiny loads (1e-9 scale)": (counts * 1e-9, two, 2),
        "one hot expert": (np.array([[1e6, 1, 1, 1, 1, 1, 1, 1]]), two, 2),
    }


def _bad_input(solve, report: CheckReport, allowed) -> None:
    topo = Topology(1, 2, 2)
    good = np.ones((1, 4))
    cases = {
        "NaN load": (np.array([[1.0, np.nan, 1.0, 1.0]]), topo, {}),
        "negative load": (np.array([[1.0, -1.0, 1.0, 1.0]]), topo, {}),
        "1-D load": (np.ones(4), topo, {}),
        "fewer slots than experts": (np.ones((1, 9)), topo, {}),
        "unknown option": (good, topo, {"no_such_option_": 1}),
    }
    failed = []
    for what, (load, t, kw) in cases.items():
        try:
            solve(load, t, None, **kw)
        except EplbError:
            continue
        except Exception as exc:
            failed.append(f"{what}: raised {exc.__class__.__name__}: {exc}")
            continue
        failed.append(f"{what}: accepted")
    for what, (load, t, groups) in _hard_inputs().items():
        try:
            p = solve(load, t, groups)
            assert_valid_placement(p, load)
            _assert_bound(p, load, t)
        except InfeasibleError as exc:
            if not allowed(load, t, groups):
                failed.append(f"{what} (valid input) refused: {exc}")
        except Exception as exc:
            failed.append(f"{what} (valid input): {exc.__class__.__name__}: {exc}")
    if failed:
        report.failures.append(Failure("bad_input", "; ".join(failed), "see the error"))
    else:
        report.passed.append("bad_input")
