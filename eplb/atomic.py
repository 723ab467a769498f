"""Atomic file writes: write to a temporary file beside the target, then rename over it.

A failed or interrupted write never leaves a half-written or partial file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from eplb.errors import InputError


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", **open_kw) -> Iterator[IO]:
    """Open a temporary file for writing; on success rename it to ``path``, else delete it."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', not {mode!r}")
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {target}: directory {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        if mode == "w":
            open_kw.setdefault("encoding", "utf-8")
            open_kw.setdefault("newline", "")
        with os.fdopen(fd, mode, **open_kw) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path, "wb") as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path, "w") as fh:
        fh.write(text)
