"""Running independent tasks (e.g. ILP layers) in worker processes that never outlive us.

`run(fn, tasks, workers=W)` calls ``fn(task)`` for every task and returns the results in
task order: inline when ``W == 1``, else in ``W`` processes. They are forked on Linux when the
parent runs no other thread (cheap, and scripts without an ``if __name__ == "__main__"``
guard work), else spawned (forking a process with threads is unsafe; spawned workers
re-import the main module, which then needs that guard). Guarantees:

- workers die with their parent: on Linux each sets ``PR_SET_PDEATHSIG`` (SIGKILL when the
  parent dies, even by SIGKILL), and a watchdog thread exits when the parent process is gone
  (other platforms, or a parent that died before the signal was armed);
- workers ignore SIGINT (Ctrl-C goes to the parent, which stops them);
- inside a daemonic process (e.g. a ``multiprocessing.Pool`` worker), which may not start
  processes, the tasks run inline;
- on any exception in the parent (KeyboardInterrupt, SystemExit, an error in a task) every
  worker is killed at once and joined for at most `KILL_WAIT` seconds, and the queues are
  closed without waiting for data to flush, so a second Ctrl-C cannot hang at exit;
- a task that raises stops the run; its exception is re-raised in the parent (or a
  `SolverError`-like `EplbError` carrying the worker's traceback when it cannot be pickled);
  a worker that dies without a result (killed, out of memory) raises `EplbError`.

``context``: a picklable object (may hold ``multiprocessing.Value``\\ s of the spawn context,
`shared_value`) every worker can read with `context()` during its tasks, e.g. a deadline.
"""

from __future__ import annotations

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

from eplb.errors import EplbError

KILL_WAIT = 1.0  # seconds to join killed workers
POLL = 0.2  # seconds between checks of worker health while waiting for results
_CONTEXT: Any = None


def _mp():
    """The multiprocessing context for workers started now (module docstring)."""
    fork = sys.platform.startswith("linux") and threading.active_count() == 1
    return multiprocessing.get_context("fork" if fork else "spawn")


def context() -> Any:
    """The ``context`` object of the current `run` (in a worker or inline)."""
    return _CONTEXT


def shared_value(typecode: str, value):
    """A ``multiprocessing.Value`` usable in `run`'s ``context``."""
    return _mp().Value(typecode, value)


def run(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    *,
    workers: int = 1,
    context: Any = None,
    on_result: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """``[fn(t) for t in tasks]`` on ``workers`` processes (module docstring).

    ``on_result(index, result)`` is called in the parent as results arrive (progress).
    """
    global _CONTEXT
    tasks = list(tasks)
    workers = max(1, min(int(workers), len(tasks)))
    if multiprocessing.current_process().daemon:  # daemons may not start processes: inline
        workers = 1
    if workers == 1:
        previous, _CONTEXT = _CONTEXT, context
        try:
            out = []
            for i, t in enumerate(tasks):
                out.append(fn(t))
                if on_result is not None:
                    on_result(i, out[-1])
            return out
        finally:
            _CONTEXT = previous
    return _run_pool(fn, tasks, workers, context, on_result)


def _run_pool(fn, tasks, workers, context, on_result) -> list[Any]:
    mp = _mp()
    task_q = mp.Queue()
    result_q = mp.Queue()
    for q in (task_q, result_q):
        q.cancel_join_thread()  # never block at exit flushing data to dead workers
    procs = [
        mp.Process(
            target=_worker,
            args=(fn, task_q, result_q, os.getpid(), context),
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
                        f"a solver worker process died (exit code {dead[0].exitcode}) before "
                        "returning its result; out of memory or killed?"
                    ) from None
                continue
            if not ok:
                raise value
            results[i] = value
            pending.discard(i)
            if on_result is not None:
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


def _worker(fn, task_q, result_q, parent: int, ctx) -> None:
    global _CONTEXT
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _CONTEXT = ctx
    while True:
        item = task_q.get()
        if item is None:
            break
        i, task = item
        try:
            result_q.put((i, True, fn(task)))
        except BaseException as exc:
            result_q.put((i, False, _portable(exc)))
            break
    result_q.close()
    result_q.join_thread()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else an `EplbError` holding its traceback."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(exc))
        return EplbError(f"a solver worker failed:\n{text}")


def _die_with_parent(parent: int) -> None:
    """Arrange for this process to exit when ``parent`` does (module docstring)."""
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
