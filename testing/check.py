"""`check_solver`: the invariant suite of the toolkit's solvers, for any policy.

Properties ``valid``, ``deterministic``, ``lower_bound``, ``previous_relabels``, ``bad_input``
(and ``windows``), each a derandomised hypothesis test through `solvers.solve`. See
docs/solvers.md, section "The properties `check_solver` runs".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eplb import solvers
from eplb.errors import EplbError, InfeasibleError
from eplb.placement import Placement
from eplb.solvers.analysis.bounds import lower_bound
from eplb.testing.asserts import assert_valid_placement
from eplb.topology import Topology

_COUNTER = itertools.count()


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
    """What `check_solver` found: ``passed``, ``skipped`` and ``failures`` by property."""

    solver: str
    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        head = (
            f"check_solver({self.solver!r}): {len(self.passed)} passed, "
            f"{len(self.failures)} failed, {len(self.skipped)} skipped"
        )
        return "\n".join([head] + [f"- {f}" for f in self.failures])


def _describe(load, topology, groups, extra: str = "") -> str:
    arr = np.array2string(np.asarray(load), separator=", ", max_line_width=200)
    return (
        f"load={arr}, topology=Topology({topology.num_nodes}, {topology.gpus_per_node}, "
        f"{topology.slots_per_gpu}), num_groups={groups}{extra}"
    )


def check_solver(
    name_or_fn: str | Callable[..., Any],
    *,
    max_examples: int = 25,
    seed: int = 0,
    needs_previous: bool = False,
    raise_on_failure: bool = True,
    max_nodes: int = 2,
    max_gpus_per_node: int = 3,
    max_group_size: int = 3,
    windows: bool = False,
    **options: Any,
) -> CheckReport:
    """Run the invariant suite (docs/solvers.md) on solver ``name_or_fn``.

    ``name_or_fn``: a registered name or a function ``fn(load, topology, ...)`` returning a
    `Placement` or ``phy2log``. ``options``: passed to every solve (e.g. ``budget=100``).
    ``needs_previous``: the policy repairs a live placement (every call gets a
    ``previous=``). Sizes: nodes, GPUs per node and experts per group of the random
    problems. ``windows``: a plain function takes the history ``[W, L, E]`` (registered
    with ``windows=True``; a registered name says so itself). Returns a `CheckReport`; with
    ``raise_on_failure`` (default) an ``AssertionError`` listing every failure instead when
    any property fails.
    """
    # lazy: hypothesis is needed only when checks run
    from hypothesis import HealthCheck, given, settings

    from eplb.testing.strategies import problems

    name, temporary = _registered(name_or_fn, windows)
    try:
        report = CheckReport(name)
        conf = settings(
            max_examples=max_examples,
            deadline=None,
            derandomize=True,
            database=None,
            report_multiple_bugs=False,
            print_blob=False,
            suppress_health_check=list(HealthCheck),
        )
        strategy = problems(
            max_nodes=max_nodes, max_gpus_per_node=max_gpus_per_node, max_group_size=max_group_size
        )

        def solve(load, topo, groups, **kw):
            prev = kw.pop("previous", None)
            if needs_previous and prev is None:
                prev = _live(load, topo)
            return solvers.solve(
                name, load, topo, num_groups=groups, seed=seed, previous=prev, **options, **kw
            )

        def run(prop: str, body: Callable[..., str | None]) -> None:
            last: list[str] = []
            ran = [0]

            @conf
            @given(strategy)
            def test(problem):
                load, topo, groups = problem
                last[:] = [_describe(load, topo, groups)]
                if body(load, topo, groups) != "skip":
                    ran[0] += 1

            try:
                test()
            except Exception as exc:
                err = exc.__class__.__name__ + (f": {exc}" if str(exc) else "")
                report.failures.append(Failure(prop, err, last[0] if last else "?"))
                return
            (report.passed if ran[0] else report.skipped).append(prop)

        def valid(load, topo, groups):
            try:
                p = solve(load, topo, groups)
            except InfeasibleError:
                return None
            assert_valid_placement(p, load)
            return None

        def deterministic(load, topo, groups):
            try:
                a = solve(load, topo, groups)
            except InfeasibleError:
                return None
            b = solve(load.copy(), topo, groups)
            assert a.equals(b), "two solves of the same input and seed differ"
            return None

        def bound(load, topo, groups):
            try:
                p = solve(load, topo, groups)
            except InfeasibleError:
                return None
            lb = lower_bound(load, topo, weighted=p.replica_share is not None, lp=False)
            got = p.gpu_load(load).max(1)
            bad = got < lb * (1 - 1e-9) - 1e-9
            assert not bad.any(), (
                f"layer {int(np.argmax(bad))}: max GPU load {got[bad][0]!r} is "
                f"below the lower bound {lb[bad][0]!r}"
            )
            return None

        def relabels(load, topo, groups):
            if needs_previous:
                return "skip"
            try:
                old = solve(load * (1 + np.arange(load.shape[1]) % 3) / 2, topo, groups)
                plain = solve(load, topo, groups)
            except InfeasibleError:
                return None
            if plain.meta.get("solver", {}).get("relabeled"):
                return "skip"
            moved = solve(load, topo, groups, previous=old)
            if moved.meta["solver"].get("relabeled"):
                return "skip"
            a = np.sort(plain.gpu_load(load), 1)
            b = np.sort(moved.gpu_load(load), 1)
            assert np.allclose(a, b, rtol=1e-9, atol=1e-9), (
                f"previous= changed the GPU loads: {a.tolist()} without, {b.tolist()} with"
            )
            return None

        def windows(load, topo, groups):
            stack = np.stack([load, load * (1 + np.arange(load.shape[1]) % 3) / 2, load])
            try:
                a = solve(stack, topo, groups)
            except InfeasibleError:
                return None
            assert_valid_placement(a, stack.sum(0))
            again = solve(stack.copy(), topo, groups)
            assert a.equals(again), "two solves of the same windows differ"
            try:
                solve(stack[None], topo, groups)
            except EplbError:
                return None
            raise AssertionError("a 4-D load [1, W, L, E] was accepted")

        props = [
            ("valid", valid),
            ("deterministic", deterministic),
            ("lower_bound", bound),
            ("previous_relabels", relabels),
        ]
        if solvers.takes_windows(name):
            props.append(("windows", windows))
        for prop, body in props:
            run(prop, body)
        _bad_input(solve, report)
    finally:
        if temporary:
            solvers.registry.unregister(name)
    if raise_on_failure and report.failures:
        raise AssertionError(str(report))
    return report


def _registered(name_or_fn, windows: bool = False) -> tuple[str, bool]:
    if isinstance(name_or_fn, str):
        solvers.get(name_or_fn)  # InputError for an unknown name
        return name_or_fn, False
    if not callable(name_or_fn):
        raise TypeError(f"check_solver needs a solver name or function, got {name_or_fn!r}")
    name = f"_check_{getattr(name_or_fn, '__name__', 'fn')}_{next(_COUNTER)}"
    solvers.register(name, windows=windows)(name_or_fn)
    return name, True


def _live(load, topo) -> Placement | None:
    """A live placement for repair-like policies: round robin (valid, rarely balanced); None
    for a load that is not ``[L, E]`` or does not fit (the bad-input cases)."""
    if np.ndim(load) != 2 or np.shape(load)[1] > topo.num_slots:
        return None
    L, E = np.shape(load)
    row = np.arange(topo.num_slots) % E
    return Placement(np.broadcast_to(row, (L, topo.num_slots)).copy(), E, topo)


def _bad_input(solve, report: CheckReport) -> None:
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
    if failed:
        report.failures.append(Failure("bad_input", "; ".join(failed), "see the error"))
    else:
        report.passed.append("bad_input")
