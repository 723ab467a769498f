"""Atomic file writes: write to a temporary file beside the target, then rename over it.

A failed or interrupted write never leaves a partial file; the old file stays intact until the
new one replaces it. Errors are `InputError`s naming the target. Symlinks, permissions,
non-regular targets and stale temporary files: docs/core.md, section "Atomic writes".
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from eplb.errors import InputError

_WRITE_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EIO,
    errno.EROFS,
    errno.EFBIG,
    errno.EPERM,
    errno.EACCES,
}


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM by `eplb.cli.main`, so cleanups run."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output_path(path: str | os.PathLike, what: str = "output") -> Path:
    """``path`` as a `Path` after refusing an empty name or an existing directory."""
    if path is None or isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise InputError(f"{what} path must be a file name, got {path!r}")
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip():
        raise InputError(f"{what} path is empty; give a file name (e.g. -o placement.json)")
    if "\0" in text:
        raise InputError(f"{what} path {text!r} contains a NUL byte")
    target = Path(text)
    if target.is_dir():
        raise InputError(
            f"cannot write {what} {text}: it is an existing directory; give a file name "
            f"inside it (e.g. {target / 'out'}...)"
        )
    return target


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when paths ``a`` and ``b`` name the same file (symlinks, hard links and relative
    spellings included), or when ``b`` lies inside directory ``a``."""
    try:
        pa, pb = Path(os.fspath(a)), Path(os.fspath(b))
    except TypeError:
        return False
    try:
        if pa.exists() and pb.exists() and os.path.samefile(pa, pb):
            return True
    except OSError:
        pass
    try:
        ra, rb = pa.resolve(), pb.resolve()
    except (OSError, RuntimeError):
        return False
    if ra == rb:
        return True
    return pa.is_dir() and ra in rb.parents


def _resolve_target(target: Path) -> Path:
    """The file to replace: ``target``, or the final file a symlink chain points to."""
    if not target.is_symlink():
        return target
    try:
        return Path(os.path.realpath(target))
    except OSError as exc:  # pragma: no cover - realpath rarely raises
        raise InputError(f"cannot write {target}: cannot follow the symlink ({exc})") from None


def _refuse_read_only(target: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        return
    if not (st.st_mode & 0o222) or not os.access(target, os.W_OK):
        raise InputError(
            f"cannot write {target}: the file is read-only (permission denied); make it "
            "writable (chmod u+w) or write elsewhere"
        )


def _clean_stale(parent: Path, name: str) -> None:
    """Remove ``.<name>.<pid>.*.tmp`` files left by killed eplb processes."""
    prefix = f".{name}."
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
            continue
        pid_text = entry.name[len(prefix) :].split(".", 1)[0]
        if not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # still running: maybe writing right now
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError, OSError):
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", **open_kw: Any) -> Iterator[IO]:
    """Open a temporary file for writing; on success rename it over ``path``, else delete it.

    Symlinks, permissions and non-regular targets: docs/core.md, section "Atomic writes".
    """
    if mode not in ("w", "wb"):
        raise InputError(f"atomic_write mode must be 'w' or 'wb', not {mode!r}")
    if mode == "w":
        open_kw.setdefault("encoding", "utf-8")
        open_kw.setdefault("newline", "")
    shown = check_output_path(path)
    target = _resolve_target(shown)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InputError(f"cannot write {shown}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError(f"cannot write {shown}: it is an existing directory; give a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        # /dev/null, a FIFO, a terminal: nothing to replace atomically; write it directly
        try:
            with open(target, mode, **open_kw) as fh:
                yield fh
        except PermissionError:
            raise InputError(f"cannot write {shown}: permission denied") from None
        return
    if st is not None:
        _refuse_read_only(target, st)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {shown}: directory {parent} does not exist")
    _clean_stale(parent, target.name)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=parent
        )
    except PermissionError:
        raise InputError(
            f"cannot write {shown}: permission denied (directory {parent} is not writable)"
        ) from None
    except OSError as exc:
        raise InputError(f"cannot write {shown}: {exc.strerror or exc}") from None
    try:
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        with os.fdopen(fd, mode, **open_kw) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise InputError(f"cannot write {shown}: {exc.strerror or exc}") from None
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if exc.errno in _WRITE_ERRNOS:  # disk full, quota...: name the target, not the temp file
            raise InputError(f"cannot write {shown}: {exc.strerror or exc}") from None
        raise
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path, "wb") as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path, "w") as fh:
        fh.write(text)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder beside ``path`` to fill; on success it is renamed to ``path`` (an
    existing folder there is moved aside first and removed after), else it is removed. The
    folder gets the mode a new one would (``0o777`` less the umask)."""
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        _swap_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_dir(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and removed after."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.rmdir(old)
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old is not None:
            with contextlib.suppress(OSError):
                os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
