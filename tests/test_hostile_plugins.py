"""Issue 38, plugins and entry points: no output replaces a file the run read or a module a
plugin imported; a broken plugin or installed package is one `EplbError` naming it and
breaks nothing else; a third-party policy that raises or overruns its time limit is stopped
and named; workers load the parent's plugins. Cases from scripts/hostile_corpus.py's
"data loss" and "plugins and entry points" classes."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import sys
import textwrap
import time

import numpy as np
import pytest

from eplb import Topology, runners, solvers
from eplb.errors import EplbError, InputError, PolicyError, SolverTimeout
from eplb.solvers import plugins
from tests._cli import run_cli
from tests.test_hostile import one_error, small  # noqa: F401 - the fixture

SOLVE = ["solve", "t.npz", "--topology", "2x4", "--slots", "32"]
TOPO = Topology.parse("2x4", 32)
LOAD = np.arange(1.0, 33.0).reshape(2, 16)


@pytest.fixture()
def fresh(monkeypatch, tmp_path):
    """Plugin state as in a new process (entry points not loaded yet, none broken); the
    policies and modules a test loads are removed afterwards."""
    names, modules = set(solvers.available()), set(sys.modules)
    monkeypatch.setattr(plugins, "_loaded", [])
    monkeypatch.setattr(plugins, "_broken", {})
    monkeypatch.setattr(plugins, "_modules", [])
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in set(solvers.registry._REGISTRY.names()) - names:
        solvers.unregister(name)
    for mod in set(sys.modules) - modules:
        if getattr(sys.modules[mod], "__file__", "") and \
                str(tmp_path) in str(sys.modules[mod].__file__):
            del sys.modules[mod]
    runners._WORKER_START.pop("eplb.solvers plugins", None)
    importlib.invalidate_caches()


def _module(folder, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text("from eplb import solvers\n" + textwrap.dedent(body))
    importlib.invalidate_caches()


def _greedy_as(name: str) -> str:
    return f"""
        @solvers.register({name!r})
        def policy(load, topology):
            return solvers.solve("greedy", load, topology)
    """


def _dist(site, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """An installed distribution as importlib.metadata finds it: ``site`` on sys.path."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[eplb.solvers]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    for name, body in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(body))
    importlib.invalidate_caches()


# ------------------------------------------------------------------ 1. data loss
@pytest.mark.parametrize("target", ["h38_pol.py", "h38_helper.py", "h38_pkg/__init__.py"])
def test_no_output_replaces_a_module_the_plugin_imported(small, fresh, target):  # noqa: F811
    (small / "h38_pkg").mkdir()
    (small / "h38_pkg" / "__init__.py").write_text("")
    (small / "h38_helper.py").write_text("SOLVER = 'greedy'\n")
    _module(small, "h38_pol", "\n        import h38_helper, h38_pkg" + _greedy_as("h38_mine"))
    before = (small / target).read_bytes()
    for cmd in ([*SOLVE, "-o", target, "--format", "native"],
                ["compare", "t.npz", "--topologies", "2x4:32", "--quiet", "--solvers",
                 "h38_mine", "--markdown", target]):
        rc, _, err = run_cli(*cmd, "--plugin", "h38_pol",
                             *(["--solver", "h38_mine"] if cmd[0] == "solve" else []))
        one_error(rc, err, target.split("/")[-1], "which this run read or imported")
        assert (small / target).read_bytes() == before
    # through a symlink and a hard link as well
    (small / "link.py").symlink_to(target)
    os.link(small / target, small / "hard.py")
    for alias in ("link.py", "hard.py"):
        rc, _, err = run_cli(*SOLVE, "--plugin", "h38_pol", "--solver", "h38_mine", "-o", alias,
                             "--format", "native")
        one_error(rc, err, "which this run read or imported")
    assert (small / target).read_bytes() == before


def test_no_output_replaces_an_entry_points_module(small, fresh):  # noqa: F811
    _dist(small, "h38good", {"h38_ep": "h38good_mod:policy"}, {"h38good_mod": """
        from eplb import solvers
        def policy(load, topology):
            return solvers.solve("greedy", load, topology)
    """})
    before = (small / "h38good_mod.py").read_bytes()
    for solver in ("h38_ep", "greedy"):  # loaded once per run, used or not
        rc, _, err = run_cli(*SOLVE, "--solver", solver, "-o", "h38good_mod.py", "--format",
                             "native")
        one_error(rc, err, "package h38good 0.1", "which this run read or imported")
    assert (small / "h38good_mod.py").read_bytes() == before
    # the API is not a command: a program may rewrite what it imported
    assert run_cli(*SOLVE, "--solver", "h38_ep", "-o", "fine.json")[0] == 0


def test_force_never_deletes_an_input_read_during_the_run(small):  # noqa: F811
    """``eplb.initial`` names a placement inside the -o folder --force replaces: refused (the
    file was listed in the folder's manifest, as if an eplb run had written it)."""
    from eplb.atomic import MANIFEST

    sim = ["simulate", "deepseek_day6", "--workload", "w.jsonl", "--no-plots", "--no-progress",
           "--set", "decode.nodes=4", "--set", "decode.slots_per_layer=288"]
    assert run_cli(*sim, "-o", "out")[0] == 0
    manifest = json.loads((small / "out" / MANIFEST).read_text())
    assert run_cli("solve", _bundled(), "--topology", "4x8", "--slots", "288", "--format",
                   "sglang", "-o", "out/init.json")[0] == 0
    (small / "out" / MANIFEST).write_text(json.dumps({**manifest, "files": [
        *manifest["files"], "init.json"]}))
    before = (small / "out" / "init.json").read_bytes()
    rc, _, err = run_cli(*sim, "-o", "out", "--force", "--set", "eplb.initial='out/init.json'")
    one_error(rc, err, "init.json", "which this run read or imported")
    assert (small / "out" / "init.json").read_bytes() == before


def _bundled():
    from tests.conftest import BUNDLED

    return BUNDLED / "deepseek-v3-calibrated.npz"


# ------------------------------------------------------------------ 4. plugins
@pytest.mark.parametrize("name, body, fragments", [
    ("h38_boom", "raise ZeroDivisionError('at import')\n",
     ["'h38_boom' fails to import", "ZeroDivisionError: at import", "h38_boom.py:2"]),
    ("h38_syntax", "def f(:\n    pass\n", ["SyntaxError", "h38_syntax.py:2"]),
    ("h38_exit", "import sys\nsys.exit(3)\n", ["SystemExit: 3"]),
    ("h38_badsig", "@solvers.register('h38_badsig')\ndef f(load):\n    return load\n",
     ["a solver takes (load, topology, ...)"]),
    ("h38_missing", "import h38_no_such_dependency\n", ["No module named 'h38_no_such"]),
])
def test_a_plugin_that_fails_at_import_is_one_error(small, fresh, name, body, fragments):  # noqa: F811
    _module(small, name, body)
    rc, _, err = run_cli(*SOLVE, "--plugin", name, "--solver", "greedy")
    one_error(rc, err, *fragments)


@pytest.mark.parametrize("plugin, fragment", [
    (".mod", "is not a module name"), ("a..b", "is not a module name"),
    ("os.path:join", "is not a module name"), (" ", "is not a module name"),
    ("h38_pol.py", "drop the .py (--plugin h38_pol)"), ("h38_nope", "cannot be imported"),
])
def test_plugin_names_that_are_not_modules(small, fresh, plugin, fragment):  # noqa: F811
    _module(small, "h38_pol", _greedy_as("h38_mine"))
    one_error(*run_cli(*SOLVE, "--plugin", plugin, "--solver", "greedy")[::2], fragment)
    with pytest.raises(InputError, match="plugins must be a list"):
        solvers.load_plugins("h38_pol")  # a string is not a list of modules


def _raises(load, topology):
    raise KeyError("this policy always fails")


def _spins(load, topology):
    while True:  # honours no time limit, and swallows what it can
        try:
            time.sleep(0.01)
        except Exception:
            pass


def _meta_sets(load, topology):
    p = solvers.solve("greedy", load, topology)
    from eplb import Placement

    return Placement(p.phy2log, p.num_experts, p.topology,
                     meta={"tags": {"b", "a"}, "score": float("nan"), "top": float("inf")})


@pytest.fixture()
def policies():
    """Third-party policies (defined outside eplb: origin "module tests...")."""
    for name, fn in (("h38_raises", _raises), ("h38_spins", _spins),
                     ("h38_meta", _meta_sets)):
        solvers.register(name)(fn)
    yield
    for name in ("h38_raises", "h38_spins", "h38_meta"):
        solvers.unregister(name)


def _raises_inside_eplb(load, topology):
    raise KeyError("a bug in eplb")


_raises_inside_eplb.__module__ = "eplb.solvers.policies.h38"  # as eplb's own policies are


def test_a_policy_that_raises_is_named_with_its_module(policies):
    with pytest.raises(PolicyError, match=r"solver 'h38_raises' \(module tests.test_hostile_"
                       r"plugins\) failed: KeyError: 'this policy always fails'"):
        solvers.solve("h38_raises", LOAD, TOPO)
    solvers.register("h38_own")(_raises_inside_eplb)
    try:  # eplb's own policies are not wrapped: a bug stays a traceback
        with pytest.raises(KeyError, match="a bug in eplb"):
            solvers.solve("h38_own", LOAD, TOPO)
    finally:
        solvers.unregister("h38_own")


def test_a_policy_past_its_time_limit_is_stopped(policies, monkeypatch):
    monkeypatch.setattr(plugins, "GRACE", (1.0, 0.2))  # stopped at the limit + 0.2 s
    signal.setitimer(signal.ITIMER_REAL, 100.0)  # an outer timer (a harness's) goes on
    try:
        start = time.monotonic()
        with pytest.raises(SolverTimeout, match="'h38_spins' .* ran past its time limit of "
                           "0.1 s and was stopped"):
            solvers.solve("h38_spins", LOAD, TOPO, time_limit=0.1)
        assert time.monotonic() - start < 5
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 90 < left < 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_a_policy_without_a_time_limit_gets_the_default(policies, monkeypatch):
    """No verb that solves runs forever: with no time limit given a third-party policy gets
    `plugins.DEFAULT_LIMIT_S` and the message says it was the default."""
    monkeypatch.setattr(plugins, "GRACE", (1.0, 0.2))
    monkeypatch.setattr(plugins, "DEFAULT_LIMIT_S", 0.1)
    start = time.monotonic()
    with pytest.raises(SolverTimeout, match=r"time limit of 0.1 s \(the default for third-party"):
        solvers.solve("h38_spins", LOAD, TOPO)
    assert time.monotonic() - start < 5
    assert solvers.solve("greedy", LOAD, TOPO).phy2log.shape == (2, 32)  # built-ins unbounded


def test_advise_takes_a_time_limit(policies, monkeypatch):
    from eplb.evaluation.serving.advise import advise

    monkeypatch.setattr(plugins, "GRACE", (1.0, 0.2))
    with pytest.raises(SolverTimeout, match="h38_spins"):
        advise(str(_bundled()), "4x8", 288, solver="h38_spins", levers=["rebalance"],
               time_limit=0.1)
    with pytest.raises(InputError, match="time_limit"):
        advise(str(_bundled()), "4x8", 288, levers=["rebalance"], time_limit=-1)


def test_meta_with_sets_and_nan_is_written_as_strict_json(small, policies):  # noqa: F811
    from eplb.io import read_placement, write_placement

    p = solvers.solve("h38_meta", LOAD, TOPO)
    for name in ("m.json", "m.npz"):
        write_placement(p, small / name)
        assert read_placement(small / name).meta["tags"] == ["a", "b"]
    doc = json.loads((small / "m.json").read_text(),
                     parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert doc["meta"]["score"] is None and doc["meta"]["top"] is None


def test_compare_fails_when_a_policy_fails(small, fresh):  # noqa: F811
    # a plugin module, so the policy exists in the workers whether they fork or spawn (this
    # process may run other threads, and then workers spawn: runners._mp)
    _module(fresh, "h38_raising", """
        @solvers.register("h38_raising")
        def policy(load, topology):
            raise KeyError("this policy always fails")
    """)
    cmd = ["compare", "t.npz", "--topologies", "2x4:32", "--quiet", "--workers", "2",
           "--plugin", "h38_raising", "-o", "c.csv"]
    rc, _, err = run_cli(*cmd, "--solvers", "h38_raising,greedy")
    one_error(rc, err, "1 of 2 runs failed, nothing written", "h38_raising", "KeyError")
    assert not (small / "c.csv").exists()
    assert run_cli(*cmd, "--solvers", "greedy")[0] == 0  # a refusal-free sweep exits 0


def _mark_worker(value: str) -> None:
    os.environ["H38_WORKER_SETUP"] = value


def _read_mark(_task) -> str | None:
    return os.environ.get("H38_WORKER_SETUP")


def test_workers_run_the_parents_setup_before_their_tasks(monkeypatch):
    """`load_plugins` registers itself here, so spawned workers load the same plugins."""
    monkeypatch.delenv("H38_WORKER_SETUP", raising=False)
    monkeypatch.setitem(runners._WORKER_START, "h38", (_mark_worker, ("yes",)))
    assert runners.run(_read_mark, range(4), workers=2) == ["yes"] * 4
    assert "H38_WORKER_SETUP" not in os.environ  # it ran in the workers, not here


def _solve_mine(seed: int) -> list:
    return solvers.solve("h38_mine", LOAD, TOPO, seed=seed).phy2log.tolist()


def test_spawned_workers_load_the_parents_plugins(small, fresh, monkeypatch):  # noqa: F811
    """A spawned worker starts with a fresh registry (the parent's may run threads, so no
    fork): `load_plugins` registered itself to run there first."""
    import multiprocessing

    _module(small, "h38_pol", _greedy_as("h38_mine"))
    solvers.load_plugins(["h38_pol"])
    assert runners._WORKER_START["eplb.solvers plugins"] == (plugins.load_plugins,
                                                             (("h38_pol",),))
    monkeypatch.setattr(runners, "_mp", lambda: multiprocessing.get_context("spawn"))
    assert runners.run(_solve_mine, [0, 1], workers=2) == [_solve_mine(0), _solve_mine(1)]


# ------------------------------------------------------------------ entry points
def _broken_site(site) -> None:
    _dist(site, "h38good", {"h38_good": "h38good_mod:policy"}, {"h38good_mod": """
        from eplb import solvers
        def policy(load, topology):
            return solvers.solve("greedy", load, topology)
    """})
    _dist(site, "h38attr", {"h38_attr": "h38attr_mod:nope"}, {"h38attr_mod": "X = 1\n"})
    _dist(site, "h38sig", {"h38_sig": "h38sig_mod:f"}, {"h38sig_mod": "def f(x):\n    pass\n"})
    _dist(site, "h38boom", {"h38_boom_ep": "h38boom_mod"},
          {"h38boom_mod": "raise RuntimeError('boom at import')\n"})
    _dist(site, "h38exit", {"h38_exit_ep": "h38exit_mod"},
          {"h38exit_mod": "import sys\nsys.exit(4)\n"})
    _dist(site, "h38dup", {"h38_dup": "h38dup_mod"}, {"h38dup_mod": """
        from eplb import solvers
        @solvers.register("greedy")
        def impostor(load, topology):
            raise ValueError("not greedy")
    """})


def test_broken_entry_points_break_nothing_else(fresh):
    _broken_site(fresh)
    names = solvers.available()
    assert "h38_good" in names and "greedy" in names
    assert not {"h38_attr", "h38_sig", "h38_boom_ep", "h38_exit_ep"} & set(names)
    solvers.solve("greedy", LOAD, TOPO)  # the built-in, not the impostor
    solvers.solve("h38_good", LOAD, TOPO)
    for name, pkg, why in (("h38_attr", "h38attr", "AttributeError"),
                           ("h38_sig", "h38sig", "a solver takes (load, topology"),
                           ("h38_boom_ep", "h38boom", "RuntimeError: boom at import"),
                           ("h38_exit_ep", "h38exit", "SystemExit: 4"),
                           ("h38_dup", "h38dup", "'greedy' is already registered")):
        with pytest.raises(InputError, match=f"solver '{name}' cannot be used: package {pkg} "
                           f"0.1, entry point {name} = .*{re.escape(why)}.*fix or uninstall"):
            solvers.solve(name, LOAD, TOPO)
    with pytest.raises(InputError, match=r"unknown solver 'nope'.*failed to load .*h38_attr "
                       r"\(h38attr\)"):
        solvers.get("nope")


def test_broken_entry_points_in_the_cli(small, fresh):  # noqa: F811
    _broken_site(small)
    assert run_cli(*SOLVE, "--solver", "greedy")[0] == 0
    assert run_cli(*SOLVE, "--solver", "h38_good")[0] == 0
    rc, out, _ = run_cli("solve", "--help")
    assert rc == 0 and "h38_good" in out
    one_error(*run_cli(*SOLVE, "--solver", "h38_attr")[::2], "package h38attr 0.1")


def test_an_entry_points_policy_that_raises_names_its_package(fresh):
    _dist(fresh, "h38raise", {"h38_raise": "h38raise_mod:policy"}, {"h38raise_mod": """
        def policy(load, topology):
            raise IndexError("out of range")
    """})
    with pytest.raises(PolicyError, match=r"'h38_raise' \(package h38raise 0.1, entry point "
                       r"h38_raise = h38raise_mod:policy\) failed: IndexError: out of range"):
        solvers.solve("h38_raise", LOAD, TOPO)
    assert isinstance(PolicyError("x"), EplbError)


def test_an_entry_point_naming_no_function_is_named_with_its_package(fresh):
    """An entry point that resolves to a constant (``pkg:NAME`` with ``NAME = 3``) was dropped
    silently: asking for it said "unknown solver" without naming the package."""
    _dist(fresh, "h38const", {"h38_const": "h38const_mod:NOT_A_POLICY"},
          {"h38const_mod": "NOT_A_POLICY = 3\n"})
    assert "h38_const" not in solvers.available()
    with pytest.raises(InputError, match=r"solver 'h38_const' cannot be used: package h38const "
                       r"0.1, entry point h38_const = h38const_mod:NOT_A_POLICY fails to load "
                       r"\(InputError: it names a int object, neither a policy function"):
        solvers.solve("h38_const", LOAD, TOPO)
