"""`one_blas_thread`: run a block with the BLAS numpy loaded limited to one thread.

The reference executor multiplies many small matrices (one expert's tokens at a time); a
threaded OpenBLAS spends more time waking its threads than computing them, and on a busy
machine each call can wait ~100 ms for a descheduled thread (measured: 1.2 ms per expert FFN
with one thread against 100 ms with two on a 2-CPU machine under load 11). numpy offers no
thread control, so the OpenBLAS that numpy loaded is found in ``/proc/self/maps`` and its
``*_set_num_threads`` entry called through ctypes; elsewhere (another BLAS, no procfs) the
block runs unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator

# entry points of OpenBLAS builds: numpy's and scipy's wheels (scipy-openblas), plain builds
_NAMES = ("scipy_openblas_{}_num_threads64_", "scipy_openblas_{}_num_threads",
          "openblas_{}_num_threads64_", "openblas_{}_num_threads")


def _openblas():
    """(set, get) thread functions of the loaded OpenBLAS, or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            paths = sorted({line.split()[-1] for line in fh if "openblas" in line.lower()
                            and (".so" in line or ".dylib" in line)})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _NAMES:
            setter = getattr(lib, name.format("set"), None)
            getter = getattr(lib, name.format("get"), None)
            if setter is not None and getter is not None:
                return setter, getter
    return None


_FUNCS: list = []


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Limit the loaded OpenBLAS to one thread inside the block (restored after)."""
    if not _FUNCS:
        _FUNCS.append(_openblas())
    funcs = _FUNCS[0]
    if funcs is None:
        yield
        return
    setter, getter = funcs
    before = int(getter())
    setter(1)
    try:
        yield
    finally:
        setter(before)
