"""One runner for independent tasks: inline, a local process pool, or a Dask cluster.

`run(fn, tasks, workers=W, scheduler=None)` returns ``[fn(t) for t in tasks]`` in task order.
Pool workers die with their parent, ignore SIGINT, and are killed at once on any error or
signal in the parent; a task's exception is re-raised in the parent. Details in
docs/evaluation.md ("Runners").
"""

from __future__ import annotations

import ast
import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from eplb.errors import EplbError, InputError
from eplb.progress import Progress

KILL_WAIT = 1.0  # seconds to join killed workers
POLL = 0.2  # seconds between checks of worker health while waiting for results
_CONTEXT: Any = None


def _mp():
    """The multiprocessing context for workers started now: fork on Linux when this process
    runs no other thread, else spawn (docs/evaluation.md, section "Runners")."""
    fork = sys.platform.startswith("linux") and threading.active_count() == 1
    return multiprocessing.get_context("fork" if fork else "spawn")


_WORKER_START: dict[str, tuple[Callable[..., Any], tuple]] = {}


def on_worker_start(key: str, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` in every pool worker before its first task (the entry under ``key``
    replaces an earlier one): e.g. `eplb.solvers.load_plugins` of the ``--plugin`` modules
    the parent loaded, which a spawned worker would not know. ``fn`` and ``args`` must
    pickle (a module-level function and plain values)."""
    _WORKER_START[key] = (fn, args)


def context() -> Any:
    """The ``context`` object of the current `run` (in a worker or inline)."""
    return _CONTEXT


def shared_value(typecode: str, value: Any) -> Any:
    """A ``multiprocessing.Value`` usable in `run`'s ``context``."""
    return _mp().Value(typecode, value)


def run(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    *,
    workers: int = 1,
    scheduler: Any = None,
    context: Any = None,
    on_result: Callable[[int, Any], None] | None = None,
    progress: bool | None = False,
    desc: str = "tasks",
    unit: str = "task",
) -> list[Any]:
    """``[fn(t) for t in tasks]``, in task order, inline or on ``workers`` processes.

    ``scheduler``: a Dask scheduler address or ``distributed.Client`` (wins over ``workers``;
    needs the ``dask`` extra). ``context``: a picklable object every task reads with
    `context()` (pool and inline only). ``on_result(index, result)`` runs in the parent as
    results arrive; ``progress`` shows a bar (`eplb.progress.Progress`; None: on a terminal).
    """
    tasks = list(tasks)
    bar = Progress(len(tasks), desc, progress, unit=unit)

    def arrived(i: int, value: Any) -> None:
        bar.update()
        if on_result is not None:
            on_result(i, value)

    with bar:
        if scheduler is not None:
            if context is not None:
                raise InputError("context= is not available on a Dask scheduler; "
                                 "run on local workers")
            return _run_dask(fn, tasks, scheduler, arrived)
        return _run_local(fn, tasks, workers, context, arrived)


def _run_local(fn, tasks, workers, context, on_result) -> list[Any]:
    global _CONTEXT
    workers = max(1, min(int(workers), len(tasks)))
    if multiprocessing.current_process().daemon:  # daemons may not start processes: inline
        workers = 1
    if workers == 1:
        previous, _CONTEXT = _CONTEXT, context
        try:
            out = []
            for i, t in enumerate(tasks):
                out.append(fn(t))
                on_result(i, out[-1])
            return out
        finally:
            _CONTEXT = previous
    return _run_pool(fn, tasks, workers, context, on_result)


def _run_pool(fn, tasks, workers, context, on_result) -> list[Any]:
    mp = _mp()
    if mp.get_start_method() == "spawn":
        _check_main_guard()
    task_q = mp.Queue()
    result_q = mp.Queue()
    for q in (task_q, result_q):
        q.cancel_join_thread()  # never block at exit flushing data to dead workers
    procs = [
        mp.Process(
            target=_worker,
            args=(fn, task_q, result_q, os.getpid(), context, list(_WORKER_START.values())),
            daemon=True,
            name=f"eplb-worker-{k}",
        )
        for k in range(workers)
    ]
    results: list[Any] = [None] * len(tasks)
    pending = set(range(len(tasks)))
    try:
        for p in procs:
            p.start()
        for i, t in enumerate(tasks):
            task_q.put((i, t))
        for _ in procs:
            task_q.put(None)
        while pending:
            try:
                i, ok, value = result_q.get(timeout=POLL)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise EplbError(
                        f"a worker process died (exit code {dead[0].exitcode}) before "
                        "returning its result; out of memory or killed?"
                    ) from None
                continue
            if not ok:
                raise value
            results[i] = value
            pending.discard(i)
            on_result(i, value)
        for p in procs:
            p.join(timeout=KILL_WAIT)
        return results
    finally:  # kill first (never blocks), then close and reap
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
        for q in (task_q, result_q):
            q.close()
        for p in procs:
            if p.pid is not None:
                p.join(timeout=KILL_WAIT)


def _check_main_guard() -> None:
    """Spawned workers import the main script again: refuse (one `EplbError` saying what to
    add) when this run was started from the script's top level outside an
    ``if __name__ == "__main__":`` block, where every worker would start the run again."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:  # interactive: nothing is re-run
        return
    frame = sys._getframe()
    while frame is not None and not (
        frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None:  # not under the script's top-level code
        return
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            if node.body[0].lineno <= line <= (node.body[-1].end_lineno or line):
                return
    why = "not Linux" if not sys.platform.startswith("linux") else (
        f"this process runs {threading.active_count()} threads, so it cannot fork safely"
    )
    raise EplbError(
        f"{path}, line {line}: worker processes start with 'spawn' here ({why}), and a spawned "
        "worker imports the main script again, so this top-level call would run again in every "
        "worker. Put the script's code under `if __name__ == \"__main__\":` (the "
        "multiprocessing docs' \"safe importing of the main module\"), or use workers=1."
    )


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either order)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = (test.left, test.comparators[0])
    return any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) and any(
        isinstance(x, ast.Constant) and x.value == "__main__" for x in sides
    )


def _run_dask(fn, tasks, scheduler, on_result) -> list[Any]:
    try:  # lazy: dask is an optional extra
        from distributed import Client, as_completed
    except ModuleNotFoundError:
        raise InputError(
            "running on a Dask cluster needs the dask extra: pip install 'eplb[dask]'"
        ) from None
    own = not isinstance(scheduler, Client)
    if own:
        _check_address(scheduler)  # before Client(): a failed one hangs at exit closing itself
    try:
        client = Client(scheduler, set_as_default=False, timeout="20s") if own else scheduler
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError(f"cannot connect to the Dask scheduler {scheduler!r}: {exc}") from None
    try:
        futures = client.map(fn, tasks, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * len(tasks)
        with client.as_current():
            for fut in as_completed(futures):
                i = index[fut.key]
                results[i] = fut.result()
                on_result(i, results[i])
        return results
    finally:
        if own:
            client.close()


def _check_address(scheduler: Any) -> None:
    """A Dask scheduler address ``[scheme://]host:port`` (`InputError` otherwise)."""
    from distributed.comm.addressing import parse_address, parse_host_port

    fix = "give the scheduler's address, e.g. tcp://10.0.0.5:8786, or a distributed.Client"
    if not isinstance(scheduler, str):
        raise InputError(f"scheduler {scheduler!r} is not an address; {fix}")
    try:
        scheme, where = parse_address(scheduler)
        if scheme == "inproc":  # a scheduler in this process (a LocalCluster's)
            return
        host, port = parse_host_port(where)
    except (ValueError, TypeError) as exc:
        raise InputError(f"scheduler {scheduler!r} is not an address ({exc}); {fix}") from None
    if not host or not 1 <= int(port) <= 65535:
        raise InputError(f"scheduler {scheduler!r} needs a host and a port in 1..65535; {fix}")


def _worker(fn, task_q, result_q, parent: int, ctx, start=()) -> None:
    global _CONTEXT
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker drops the parent's handler
    _CONTEXT = ctx
    failed = None
    try:
        for setup, args in start:  # what the parent loaded (plugins), before any task
            setup(*args)
    except BaseException as exc:
        failed = exc
    while True:
        item = task_q.get()
        if item is None:
            break
        i, task = item
        try:
            if failed is not None:
                raise failed
            result_q.put((i, True, fn(task)))
        except BaseException as exc:
            result_q.put((i, False, _portable(exc)))
            break
    result_q.close()
    result_q.join_thread()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else an `EplbError` holding its traceback."""
    import pickle  # lazy: only to test an exception for pickling

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(exc))
        return EplbError(f"a worker failed:\n{text}")


def _die_with_parent(parent: int) -> None:
    """Arrange for this process to exit when ``parent`` does: ``PR_SET_PDEATHSIG`` on Linux
    and a watchdog thread (docs/evaluation.md, section "Runners")."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            threading.Event().wait(1.0)

    threading.Thread(target=watch, daemon=True, name="eplb-parent-watch").start()
