"""Third-party policies: ``--plugin`` modules and installed packages' ``eplb.solvers`` entry
points, loaded so that a broken one names itself and breaks nothing else, and run so that a
failure or an overrun is one `EplbError` naming the policy and where it came from.

`load_plugins` imports modules (a failure at import is one `InputError` naming the module,
the exception and its line); `load_entry_points` loads each entry point once per process and
records a broken one (`broken`) instead of raising, so other policies and verbs keep working;
`running` runs a third-party policy under its time limit (stopped `GRACE` past it) and turns
anything it raises into a `PolicyError`. Every module a plugin or entry point imports is
recorded (`eplb.atomic.note_input`): no command's output may replace it. Worker processes
load the same plugins (`eplb.runners.on_worker_start`). docs/solvers.md, "Your own policy".
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from eplb import runners
from eplb.atomic import note_input
from eplb.errors import EplbError, InputError, PolicyError, SolverTimeout

ENTRY_POINT_GROUP = "eplb.solvers"
RETURNED = "returned no valid placement"  # a third-party policy's bad result (compare: a failure)
GRACE = (1.5, 2.0)  # a policy past ``time_limit`` is stopped at 1.5 x the limit + 2 s
# wall seconds a third-party policy gets when no time limit is given: no verb that solves runs
# forever on a policy that never returns (eplb's own policies end by construction)
DEFAULT_LIMIT_S = 3600.0
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", re.ASCII)

_loaded: list[bool] = []  # entry points loaded in this process
_modules: list[str] = []  # --plugin modules loaded in this process (workers load them too)
_broken: dict[str, tuple[str, str]] = {}  # entry point -> (its package, why it is unusable)
_origin: list[str] = []  # where the policies being registered now come from
_bound: list = []  # [the solver registry, its register decorator]: set by `bind`


def bind(registry: Any, register: Callable) -> None:
    """Called once by `eplb.solvers.registry` (this module never imports the registry: no
    cycle); loaders register into what is bound here."""
    _bound[:] = [registry, register]


def origin_of(fn: Callable) -> str:
    """Where policy ``fn`` comes from, as errors name it: "" for eplb's own policies, else
    the plugin module or the package and entry point being loaded, or its module."""
    if _origin:
        return _origin[-1]
    module = getattr(fn, "__module__", None) or "?"
    return "" if module == "eplb" or module.startswith("eplb.") else f"module {module}"


def broken(name: str) -> str | None:
    """Why the entry point ``name`` cannot be used (it failed to load), else None."""
    return _broken[name][1] if name in _broken else None


def broken_note() -> str:
    """`` (entry points that failed to load: ...)`` for unknown-solver messages, or ``""``."""
    if not _broken:
        return ""
    return ("; entry points that failed to load (ask for one to see why): "
            + ", ".join(f"{name} ({pkg})" for name, (pkg, _) in sorted(_broken.items())))


def entry_points_loaded() -> bool:
    return bool(_loaded)


def _record_modules(names: set[str], label: str) -> None:
    """Record the files of modules ``names`` (what a plugin imported) as inputs of the run."""
    for name in sorted(names):
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str):
            note_input(path, f"module {name} of {label}", imported=True)


@contextlib.contextmanager
def _loading(label: str) -> Iterator[None]:
    """Register policies as coming from ``label``; record every module imported meanwhile."""
    before = set(sys.modules)
    _origin.append(label)
    try:
        yield
    finally:
        _origin.pop()
        _record_modules(set(sys.modules) - before, label)


def _text(exc: BaseException) -> str:
    """``exc``'s message on one line (a syntax error's without its position)."""
    text = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    return " ".join(text.split())[:300] or "no message"


def _where(exc: BaseException) -> str:
    """``file:line`` where ``exc`` was raised (a syntax error's own position)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if "importlib" not in f.filename]
    return f"{mine[-1].filename}:{mine[-1].lineno}" if mine else "?"


def _import(mod: str) -> None:
    try:
        importlib.import_module(mod)
    except ModuleNotFoundError as exc:
        if exc.name != mod.split(".")[0] or os.getcwd() in sys.path:
            raise
        sys.path.append(os.getcwd())  # `eplb` (a console script) lacks the cwd
        importlib.import_module(mod)


def load_plugins(modules: Sequence[str] = ()) -> list[str]:
    """Import ``modules`` (e.g. ``--plugin mypolicies``: a module that calls `register`) and,
    once per process, every entry point of the group ``eplb.solvers`` (`load_entry_points`).
    Returns the solver names added. A name that is not a module name, or a module that fails
    to import (missing, a syntax error, an exception), is one `InputError` naming it."""
    _REGISTRY = _bound[0]
    if isinstance(modules, (str, bytes)) or not isinstance(modules, Sequence):
        raise InputError(f"plugins must be a list of module names, got {modules!r}")
    before = set(_REGISTRY.names())
    for mod in modules:
        _load_module(mod)
    load_entry_points()
    return sorted(set(_REGISTRY.names()) - before)


def _load_module(mod: Any) -> None:
    if not isinstance(mod, str) or not _MODULE.fullmatch(mod):
        hint = ""
        if isinstance(mod, str) and mod.endswith(".py"):
            hint = f" (drop the .py: --plugin {os.path.basename(mod)[:-3]})"
        raise InputError(f"plugin {mod!r} is not a module name{hint}; give a module on "
                         "PYTHONPATH or in the current directory as dotted Python names, e.g. "
                         "mypolicies or mypkg.policies")
    label = f"plugin module {mod}"
    with _loading(label):
        try:
            _import(mod)
        except ModuleNotFoundError as exc:
            if exc.name is not None and mod.startswith(exc.name):
                fix = (f"drop the .py (--plugin {mod[:-3]})" if mod.endswith(".py") else
                       "put it on PYTHONPATH or in the current directory")
                raise InputError(f"plugin module {mod!r} cannot be imported ({exc}); "
                                 f"{fix}") from None
            raise InputError(f"plugin module {mod!r} fails to import: {exc} "
                             f"({_where(exc)}); install what it needs") from None
        except EplbError as exc:  # e.g. a policy registered twice, or with bad options
            raise InputError(f"plugin module {mod!r} fails to import: {exc} "
                             f"({_where(exc)})") from None
        except (Exception, SystemExit) as exc:
            raise InputError(f"plugin module {mod!r} fails to import: {type(exc).__name__}: "
                             f"{_text(exc)} ({_where(exc)}); fix the module") from None
    parts = mod.split(".")  # the module and its packages, also when imported before
    _record_modules({".".join(parts[:i]) for i in range(1, len(parts) + 1)}, label)
    if mod not in _modules:
        _modules.append(mod)
        runners.on_worker_start("eplb.solvers plugins", load_plugins, tuple(_modules))


def _label(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    pkg = f"package {dist.name} {dist.version}" if dist is not None else "an installed package"
    return f"{pkg}, entry point {ep.name} = {ep.value}"


def load_entry_points() -> None:
    """Load every entry point of the group ``eplb.solvers`` once per process: a module is
    imported for its `register` calls; a function is registered under the entry point's name.
    One that fails (an import error, a function `register` refuses, a name taken by another
    policy) is recorded in `broken` and named when that solver is asked for; the others load."""
    _REGISTRY, register = _bound
    if _loaded:
        return
    _loaded.append(True)
    try:
        found = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:
        _broken["(all)"] = ("installed packages", f"the installed packages' metadata cannot "
                                                    f"be read ({_text(exc)})")
        return
    for ep in found:
        label = _label(ep)
        with _loading(label):
            try:
                obj = ep.load()
                if not callable(obj) and not inspect.ismodule(obj):
                    raise InputError(f"it names a {type(obj).__name__} object, neither a policy "
                                     "function nor a module that registers policies")
                if callable(obj) and not inspect.ismodule(obj):
                    spec_fn = _REGISTRY.get(ep.name).fn if ep.name in _REGISTRY else None
                    if spec_fn is None:
                        register(ep.name)(obj)
                    elif spec_fn is not obj:
                        raise InputError(f"the name {ep.name!r} is taken by another policy")
            except (Exception, SystemExit) as exc:
                dist = getattr(ep, "dist", None)
                _broken.setdefault(ep.name, (
                    dist.name if dist is not None else ep.value,
                    f"{label} fails to load ({type(exc).__name__}: {_text(exc)}); fix or "
                    "uninstall that package"))


@contextlib.contextmanager
def running(name: str, origin: str, time_limit: float | None) -> Iterator[None]:
    """Run third-party policy ``name`` (from ``origin``): past ``time_limit`` (wall seconds,
    `DEFAULT_LIMIT_S` when None; stopped at `GRACE`) it raises `SolverTimeout`; anything else
    it raises but an `EplbError` becomes a `PolicyError` naming the policy and ``origin``.
    Built-in policies (``origin`` "") run as they are. The time limit needs the main thread
    (a signal timer)."""
    if not origin:
        yield
        return
    try:
        with _time_bound(name, origin, time_limit):
            yield
    except (EplbError, MemoryError):
        raise
    except Exception as exc:
        raise PolicyError(f"solver {name!r} ({origin}) failed: {type(exc).__name__}: "
                          f"{_text(exc)} "
                          f"({_where(exc)}); fix the policy or choose another solver") from None


class _Overran(BaseException):
    """Raised in the policy by the timer (a BaseException: `except Exception` in the policy
    does not swallow it)."""


@contextlib.contextmanager
def _time_bound(name: str, origin: str, time_limit: float | None) -> Iterator[None]:
    given = time_limit is not None
    time_limit = float(time_limit) if given else DEFAULT_LIMIT_S
    hard = GRACE[0] * time_limit + GRACE[1]
    if hard is None or hard > 1e8 or not hasattr(signal, "setitimer") \
            or threading.current_thread() is not threading.main_thread():
        yield
        return
    delay, interval = signal.getitimer(signal.ITIMER_REAL)
    if delay and delay <= hard:  # an outer timer ends the run first: leave it alone
        yield
        return

    def overran(signum, frame):
        raise _Overran

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, overran)
    signal.setitimer(signal.ITIMER_REAL, hard, 0.5)  # again every 0.5 s until it stops
    try:
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Overran:  # also one that fired while the policy was returning
        which = "" if given else (" (the default for third-party policies; --time-limit / "
                                  "time_limit= gives another)")
        raise SolverTimeout(f"solver {name!r} ({origin}) ran past its time limit of "
                            f"{time_limit:g} s{which} and was stopped after {hard:.3g} s; the "
                            "policy does not honour time_limit (fix it, give it more time or "
                            "choose another solver)") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
        if delay:  # an outer timer goes on with what it had left
            left = max(delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, interval)
