"""Atomic file writes: write to a temporary file beside the target, then rename over it.

A failed or interrupted write never leaves a partial file; the old file stays intact until the
new one replaces it. Errors are `InputError`s naming the target. Symlinks, permissions,
non-regular targets and stale temporary files: docs/core.md, section "Atomic writes".
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from eplb.errors import InputError

_FIXES = {  # what to do, per errno (the reason is the OS's own text)
    errno.ENOSPC: "free some space or write elsewhere",
    errno.EDQUOT: "free some space (quota) or write elsewhere",
    errno.EFBIG: "the file is too large for this file system; write elsewhere",
    errno.ENAMETOOLONG: "give a shorter path (a name is at most 255 bytes, a path 4096)",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.EACCES: "make it writable (chmod u+w) or write elsewhere",
    errno.EPERM: "write elsewhere",
    errno.ENOENT: "a folder on the path does not exist; create it first",
    errno.ENOTDIR: "a part of the path is a file, not a folder; fix the path",
    errno.EISDIR: "it is a folder; give a file name",
    errno.ELOOP: "fix the symbolic links on the path",
    errno.EIO: "check the disk or write elsewhere",
    errno.EBUSY: "the path is busy (a mount point or in use); write elsewhere",
    errno.EXDEV: "write within one file system",
}


def write_error(path: str | os.PathLike, exc: OSError, what: str = "") -> InputError:
    """An `InputError` for a failed write of ``path``: the path, the reason (errno) and the fix."""
    reason = exc.strerror or str(exc)
    fix = _FIXES.get(exc.errno, "check the path or write elsewhere")
    name = os.fsdecode(os.fspath(path)) if isinstance(path, (str, bytes, os.PathLike)) else path
    text = str(name)
    if len(text) > 120:
        text = text[:60] + "..." + text[-40:]
    label = f"{what} " if what else ""
    code = errno.errorcode.get(exc.errno or -1, "")
    return InputError(f"cannot write {label}{text}: {reason}; {fix}"
                      + (f" ({code})" if code else ""))


@contextlib.contextmanager
def os_errors(path: str | os.PathLike, what: str = "") -> Iterator[None]:
    """Turn an `OSError` raised while writing ``path`` into `write_error`'s `InputError`."""
    try:
        yield
    except OSError as exc:
        raise write_error(path, exc, what) from None


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM by `eplb.cli.main`, so cleanups run."""

    def __init__(self, signum: int = 15) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


_SIGNALLED: list[int] = []  # signals received while a verb runs (see `note_signal`)
NAME_MAX = 255  # bytes in one path component on Linux/macOS file systems


def note_signal(signum: int) -> None:
    """Record that ``signum`` arrived; `check_signalled` raises until `clear_signals`.

    A signal handler's exception can be swallowed (raised inside a weakref callback or a
    ``__del__``); the record makes every later atomic commit refuse anyway."""
    _SIGNALLED.append(int(signum))


def signalled() -> int | None:
    """The first signal recorded by `note_signal` (None: none)."""
    return _SIGNALLED[0] if _SIGNALLED else None


def clear_signals() -> None:
    _SIGNALLED.clear()


def check_signalled() -> None:
    """Raise `KeyboardInterrupt` (SIGINT) or `Terminated` if a signal has been recorded."""
    signum = signalled()
    if signum is None:
        return
    if signum == 2:
        raise KeyboardInterrupt
    raise Terminated(signum)


# ------------------------------------------------------------------ what this run read
_READ: dict[tuple[int, int], tuple[str, Path]] = {}  # (device, inode) -> (what, where)
_READ_PATHS: dict[Path, str] = {}  # resolved path -> what it is (folders: what lies inside)
_IMPORTED: dict[tuple[int, int], tuple[str, Path]] = {}  # plugin modules: for the process
_IMPORTED_PATHS: dict[Path, str] = {}
_GUARDS: list[bool] = []  # `guard_inputs` nesting


def note_input(path: str | os.PathLike, what: str = "input", st: os.stat_result | None = None,
               *, imported: bool = False) -> None:
    """Record that this command read ``path`` (``what`` names it in errors: "trace file",
    "plugin module mypol"); while `guard_inputs` is active no output may replace it
    (`check_not_input`). ``imported``: a module a plugin or entry point brought in, recorded
    for the whole process (modules are imported once). Outside a guard (the API), only
    imported modules are recorded."""
    if not (_GUARDS or imported):
        return
    try:
        st = os.stat(path) if st is None else st
        real = Path(os.path.realpath(os.fspath(path)))
    except (OSError, TypeError, ValueError):
        return
    label = f"{what} ({os.fspath(path)})"
    ids, paths = (_IMPORTED, _IMPORTED_PATHS) if imported else (_READ, _READ_PATHS)
    ids[(st.st_dev, st.st_ino)] = (label, real)
    paths.setdefault(real, label)


def read_by_this_run(path: str | os.PathLike) -> str | None:
    """What ``path`` is if this command read or imported it (`note_input`), else None."""
    if not _GUARDS:
        return None
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return None
    key = (st.st_dev, st.st_ino)
    for ids in (_READ, _IMPORTED):
        if key in ids:
            label, real = ids[key]
            try:  # the file recorded, not a new one that reuses its inode
                same = os.stat(real)[1:3] == (st.st_ino, st.st_dev)
            except OSError:
                same = False
            if same:
                return label
            del ids[key]
    return None


def inputs_inside(folder: str | os.PathLike) -> list[str]:
    """What this command read or imported that lies inside ``folder`` (replacing the folder
    would delete it); empty outside a guard."""
    if not _GUARDS:
        return []
    try:
        root = Path(os.path.realpath(os.fspath(folder)))
    except (OSError, TypeError, ValueError):
        return []
    return [label for paths in (_READ_PATHS, _IMPORTED_PATHS) for real, label in paths.items()
            if (root == real or root in real.parents) and real.exists()]


def check_not_input(path: str | os.PathLike, what: str = "output") -> None:
    """Refuse an output ``path`` that is a file this command read or imported: a trace, a
    config, a workload, ``--previous``, a plugin's module or an entry point's (symlinks and
    hard links included). The one check every writer makes (`check_output_path`)."""
    found = read_by_this_run(path)
    if found is not None:
        raise InputError(f"cannot write {what} {os.fspath(path)}: it is the {found}, which this "
                         "run read or imported; writing it would destroy that file. Choose "
                         "another output path")


@contextlib.contextmanager
def guard_inputs() -> Iterator[None]:
    """While inside (one CLI command), every file a reader opens (`eplb.safeload.
    check_regular`) and every module a plugin imports is recorded, and no output may replace
    one of them (`check_not_input`)."""
    if not _GUARDS:
        _READ.clear()
        _READ_PATHS.clear()
    _GUARDS.append(True)
    try:
        yield
    finally:
        _GUARDS.pop()
        if not _GUARDS:
            _READ.clear()
            _READ_PATHS.clear()


def _stem(name: str, extra: int = 40) -> str:
    """``name`` shortened so that ``.{stem}.`` plus ``extra`` bytes of suffix fit NAME_MAX."""
    room = NAME_MAX - extra - 2
    data = name.encode("utf-8", "surrogateescape")
    if len(data) <= room:
        return name
    return data[:room].decode("utf-8", "ignore")


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
    if len(target.name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise InputError(f"cannot write {what} {text[:40]}...: the file name is longer than "
                         f"{NAME_MAX} bytes (file names are at most {NAME_MAX}); give a shorter "
                         "name")
    if target.is_dir():
        raise InputError(
            f"cannot write {what} {text}: it is an existing directory; give a file name "
            f"inside it (e.g. {target / 'out'}...)"
        )
    final = _resolve_target(target)
    try:
        st = os.stat(final)
    except OSError:  # missing (or unreadable: the write itself names the reason)
        return target
    check_not_input(final, what)
    _refuse_read_only(final, st)  # before any work, as the write itself would
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
    prefix = f".{_stem(name)}."
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
        raise write_error(shown, exc) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError(f"cannot write {shown}: it is an existing directory; give a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        # /dev/null, a FIFO, a terminal: nothing to replace atomically; write it directly
        try:
            with open(target, mode, **open_kw) as fh:
                yield fh
        except OSError as exc:  # /dev/full: no space left on device
            raise write_error(shown, exc) from None
        return
    if st is not None:
        _refuse_read_only(target, st)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {shown}: directory {parent} does not exist")
    _clean_stale(parent, target.name)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{_stem(target.name)}.{os.getpid()}.", suffix=".tmp", dir=parent
        )
    except OSError as exc:
        if exc.errno == errno.EACCES:
            raise InputError(
                f"cannot write {shown}: permission denied (directory {parent} is not "
                "writable); make it writable or write elsewhere (EACCES)"
            ) from None
        raise write_error(shown, exc) from None
    try:
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        with os.fdopen(fd, mode, **open_kw) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        check_signalled()  # a signal whose exception was swallowed still stops the commit
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise write_error(shown, exc) from None
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        # disk full, quota, a name too long...: name the target, not the temporary file
        raise write_error(shown, exc) from None
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


def _is_cwd_or_above(path: Path) -> bool:
    try:
        here, there = Path.cwd().resolve(), path.resolve()
    except (OSError, RuntimeError):
        return False
    return there == here or there in here.parents


def check_output_dir(
    path: str | os.PathLike,
    *,
    force: bool = False,
    inputs: Mapping[str, str | os.PathLike | Sequence[str | os.PathLike] | None] | None = None,
    flag: str = "-o",
) -> Path:
    """Refuse, before any work, an output folder that cannot be claimed safely.

    Refused: an empty name, the current folder or one above it, an existing non-folder, a
    non-empty folder without ``force``, and any input (``{flag: path or paths}``) that is the
    folder or lies inside it (with or without ``force``: replacing the folder would delete it).
    Returns the folder as a `Path`.
    """
    if path is None or isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise InputError(f"{flag} must be a folder name, got {path!r}")
    text = os.fsdecode(os.fspath(path))
    if not text.strip():
        raise InputError(f"{flag} is empty; give a folder name (e.g. {flag} run1)")
    if "\0" in text:
        raise InputError(f"{flag} {text!r} contains a NUL byte")
    out = Path(text)
    if len(out.name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise InputError(f"{flag} {text[:40]}...: the name is longer than {NAME_MAX} bytes; "
                         "give a shorter name")
    if _is_cwd_or_above(out):
        raise InputError(f"{flag} {text} is the current folder (or one above it); give a new "
                         f"folder to write into (e.g. {flag} run1)")
    try:
        exists = out.exists()
    except OSError as exc:
        raise InputError(f"{flag} {text}: {exc.strerror or exc}") from None
    if exists and not out.is_dir():
        raise InputError(f"{flag} {text} exists and is not a folder; choose another path")
    for in_flag, value in (inputs or {}).items():
        if value is None:
            continue
        for in_path in [value] if isinstance(value, (str, os.PathLike)) else value:
            if exists and same_file(out, in_path):
                raise InputError(
                    f"{flag} {text} holds the input {in_flag} {in_path}; replacing the folder "
                    "would delete it. Write to another folder or move the input out"
                )
            if not exists and _resolved(in_path) == _resolved(out):
                raise InputError(f"{flag} {text} is the input {in_flag} {in_path}; choose "
                                 "another output folder")
    if exists and not force:
        try:
            busy = any(out.iterdir())
        except OSError as exc:
            raise InputError(f"{flag} {text}: {exc.strerror or exc}") from None
        if busy:
            raise InputError(f"{flag} {text} exists and is not empty; choose a new folder or "
                             "pass --force")
    if exists and force:
        _refuse_inputs_inside(out, text, flag)
        _refuse_foreign(out, text)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {text}: folder {parent} does not exist")
    return out


MANIFEST = ".eplb-output.json"  # written by `atomic_directory`: the files the command wrote


def _write_manifest(folder: Path) -> None:
    files = []
    for top, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(top, name), folder)
            if rel != MANIFEST:
                files.append(Path(rel).as_posix())
    (folder / MANIFEST).write_text(json.dumps({"written_by": "eplb", "files": files}) + "\n",
                                   encoding="utf-8")


def written_files(folder: str | os.PathLike) -> set[str] | None:
    """The files (relative POSIX paths) that the manifest in ``folder`` (`MANIFEST`) lists as
    written by eplb; None when the folder holds no valid manifest."""
    try:
        doc = json.loads((Path(os.fspath(folder)) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not (isinstance(doc, dict) and doc.get("written_by") == "eplb"):
        return None
    files = doc.get("files", [])
    return {f for f in files if isinstance(f, str)} if isinstance(files, list) else set()


def foreign_entries(folder: str | os.PathLike) -> list[str]:
    """Entries of ``folder`` (relative paths, sorted) that no eplb command wrote there: all of
    them unless the folder holds the manifest `atomic_directory` writes, else those it does not
    list. An empty list means ``--force`` may replace the folder."""
    root = Path(os.fspath(folder))
    written = written_files(root)
    listed, valid = (written, True) if written is not None else (set(), False)
    parents = {p.as_posix() for f in listed for p in Path(f).parents if str(p) != "."}
    extra = []
    for top, dirs, names in os.walk(root):
        for name in sorted(dirs) + sorted(names):
            rel = Path(os.path.relpath(os.path.join(top, name), root)).as_posix()
            if rel == MANIFEST and valid:
                continue
            if rel not in listed and rel not in parents:
                extra.append(rel)
    return sorted(extra, key=lambda rel: ((root / rel).is_dir(), rel))  # files first


def _refuse_foreign(out: Path, shown: str | os.PathLike, flag: str = "--force") -> None:
    extra = foreign_entries(out)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise InputError(
            f"{flag} replaces only a folder an eplb run wrote, but {os.fspath(shown)} holds "
            f"{extra[0]}{more}, which no eplb run wrote there; move it out, remove the folder "
            "yourself, or choose a new folder"
        )


def _refuse_inputs_inside(out: Path, shown: str | os.PathLike, flag: str = "-o") -> None:
    inside = inputs_inside(out)
    if inside:
        raise InputError(f"{flag} {os.fspath(shown)} holds the {inside[0]}, which this run "
                         "read or imported; replacing the folder would delete it. Write to "
                         "another folder or move the input out")


def _resolved(path) -> Path | None:
    try:
        return Path(os.fspath(path)).resolve()
    except (OSError, RuntimeError, TypeError, ValueError):
        return None


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, *, replace: bool = True) -> Iterator[Path]:
    """A temporary folder beside ``path`` to fill; on success it is renamed to ``path``, else
    it is removed. The folder gets the mode a new one would (``0o777`` less the umask).

    The folder gets a manifest (`MANIFEST`) listing the files written into it, so that a
    later ``--force`` can tell it from a folder holding files no eplb run wrote.
    ``replace=False`` claims ``path``: the rename fails (`InputError`, the temporary folder
    removed) if a non-empty folder or a file appeared there meanwhile. ``replace=True``: an
    existing folder is moved aside first and removed after, only if it is empty or every
    entry in it is listed in its manifest (`foreign_entries`); else `InputError`. A symlink
    to a folder is followed (the folder it names is replaced; the link stays). A signal recorded by
    `note_signal` stops the rename.
    """
    shown = Path(os.fspath(path))
    if not str(path).strip():
        raise InputError("output folder name is empty; give a folder name")
    out = Path(os.path.realpath(shown)) if shown.is_symlink() else shown
    parent = out.parent if str(out.parent) else Path(".")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{_stem(out.name)}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise write_error(shown, exc) from None
    try:
        yield tmp
        with os_errors(shown):
            _write_manifest(tmp)
        os.chmod(tmp, 0o777 & ~_umask())
        check_signalled()
        if replace:
            _swap_dir(tmp, out, shown)
        else:
            _claim_dir(tmp, out, shown)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _claim_dir(tmp: Path, out: Path, shown: Path) -> None:
    """Rename ``tmp`` to ``out``; refuse if ``out`` is (now) a file or a non-empty folder."""
    try:
        os.rename(tmp, out)
    except (FileExistsError, NotADirectoryError, IsADirectoryError):
        raise InputError(f"{shown} appeared while this run was writing (another run?); it "
                         "was left as it is. Choose a new folder or pass --force") from None
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise InputError(f"{shown} appeared while this run was writing (another run?); "
                             "it was left as it is. Choose a new folder or pass --force") from None
        raise write_error(shown, exc) from None


def _swap_dir(tmp: Path, out: Path, shown: Path | None = None) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and removed after."""
    shown = out if shown is None else shown
    old = None
    if out.is_dir():
        _refuse_inputs_inside(out, shown)  # files read since the command began
        _refuse_foreign(out, shown)  # re-checked at the swap: files may have appeared
    elif os.path.lexists(out):
        raise InputError(f"cannot write the folder {shown}: it exists and is not a folder; "
                         "choose a new folder name")
    try:
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{_stem(out.name)}.", suffix=".old",
                                        dir=out.parent))
            os.rmdir(old)
            os.replace(out, old)
        os.replace(tmp, out)
    except OSError as exc:
        if old is not None and old.exists():
            with contextlib.suppress(OSError):
                os.replace(old, out)
        raise write_error(shown, exc) from None
    except BaseException:
        if old is not None and old.exists():
            with contextlib.suppress(OSError):
                os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class Stage:
    """Outputs of one command staged in a hidden temporary folder (see `staged_outputs`)."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._moves: list[tuple[Path, Path, bool]] = []  # (staged, final, is_folder)

    def _tmp_root(self, near: Path) -> Path:
        if self._root is None:
            parent = near.parent if str(near.parent) else Path(".")
            try:
                self._root = Path(tempfile.mkdtemp(prefix=".eplb-stage.", suffix=".tmp",
                                                   dir=parent))
            except OSError as exc:
                raise write_error(near, exc) from None
        return self._root

    def file(self, path: str | os.PathLike | None) -> Path | None:
        """Where to write the file that will become ``path`` (None passes through)."""
        if path is None:
            return None
        final = check_output_path(path)
        staged = self._tmp_root(final) / f"f{len(self._moves)}{final.suffix}"
        self._moves.append((staged, final, False))
        return staged

    def folder(self, path: str | os.PathLike | None) -> Path | None:
        """A folder whose files will be moved into folder ``path`` (created if missing;
        files already there that the command does not write are kept)."""
        if path is None:
            return None
        final = Path(os.fspath(path))
        staged = self._tmp_root(final) / f"d{len(self._moves)}"
        staged.mkdir()
        self._moves.append((staged, final, True))
        return staged

    def _pairs(self) -> list[tuple[Path, Path, bool]]:
        """(staged file, final path, inside a folder output) of every file written."""
        pairs = []
        for staged, final, is_folder in self._moves:
            if not is_folder:
                if staged.exists():
                    pairs.append((staged, final, False))
                continue
            pairs += [(src, final / src.relative_to(staged), True)
                      for src in sorted(staged.rglob("*")) if not src.is_dir()]
        return pairs

    def commit(self) -> None:
        check_signalled()
        pairs = self._pairs()
        for _, dst, _ in pairs:  # every target checked before the first move: none or all
            target = _resolve_target(dst)
            try:
                st = os.stat(target)
            except OSError:
                continue
            check_not_input(dst, "output")
            if stat.S_ISDIR(st.st_mode):
                raise InputError(f"cannot write {dst}: it is an existing directory; move it "
                                 "or write elsewhere")
            _refuse_read_only(target, st)
        for src, dst, in_folder in pairs:
            if in_folder:
                try:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise write_error(dst.parent, exc) from None
            _move(src, dst)

    def discard(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)


def _move(src: Path, dst: Path) -> None:
    target = _resolve_target(dst)
    try:
        st = os.stat(target)
    except OSError:
        st = None
    if st is not None:
        _refuse_read_only(target, st)  # also at the swap: a file made read-only meanwhile
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        # /dev/null, /dev/full, a FIFO: never rename over a device node; write into it
        try:
            with open(src, "rb") as fh, open(target, "wb") as out:
                shutil.copyfileobj(fh, out)
        except OSError as exc:
            raise write_error(dst, exc) from None
        return
    try:
        os.replace(src, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise write_error(dst, exc) from None
        with open(src, "rb") as fh:  # another file system (a symlink elsewhere): copy
            atomic_write_bytes(target, fh.read())


@contextlib.contextmanager
def staged_outputs() -> Iterator[Stage]:
    """Write every output of a command into a hidden temporary folder, then move them into
    place at the end (a renamed file each: nothing is left half-written), or remove them all
    if the command fails or is interrupted. Usage::

        with staged_outputs() as stage:
            write_csv(frame, stage.file(args.output))
            plot_into(stage.folder(args.plot))
    """
    stage = Stage()
    try:
        yield stage
        stage.commit()
    finally:
        stage.discard()


JOURNAL = ".eplb-publish.journal"  # folder `publish_tree` keeps in its target while it moves


def _files_under(root: Path) -> list[str]:
    """Relative POSIX paths of every non-folder entry under ``root``, sorted."""
    out = []
    for top, dirs, names in os.walk(root):
        dirs.sort()
        out += [Path(os.path.relpath(os.path.join(top, n), root)).as_posix() for n in names]
    return sorted(out)


def _inside(rel: str) -> bool:
    """``rel`` is a plain relative path that stays inside its folder (no ``..``, not absolute)."""
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def _roll_back(out: Path, journal: Path) -> bool:
    """Undo the moves ``journal``'s plan lists (each step may be repeated); True if done (the
    journal is then removed)."""
    try:
        plan = json.loads((journal / "plan.json").read_text(encoding="utf-8"))
        entries, made = plan["files"], plan["dirs"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        entries, made = [], []  # no readable plan: nothing was moved
    ok = True
    for entry in reversed(entries):
        dst, bak = out / entry["rel"], journal / "old" / entry["rel"]
        try:
            if os.path.lexists(bak):
                os.replace(bak, dst)  # the old file back (over the new one, if placed)
            elif not entry["existed"] and entry["ino"] is not None:
                st = os.lstat(dst)
                if [st.st_dev, st.st_ino] == entry["ino"]:  # the file this publish placed
                    os.unlink(dst)
        except FileNotFoundError:
            pass
        except OSError:
            ok = False
    for rel in reversed(made):
        with contextlib.suppress(OSError):
            os.rmdir(out / rel)
    if ok:
        shutil.rmtree(journal, ignore_errors=True)
    return ok


def recover_publish(out: str | os.PathLike) -> None:
    """Undo a `publish_tree` into ``out`` that was killed midway (its journal is left), and
    remove the temporary folders of dead publishes. `InputError` if another live process is
    publishing into ``out``."""
    out = Path(os.fspath(out))
    journal = out / JOURNAL
    try:
        entries = list(os.scandir(out))
    except OSError:
        return
    for entry in entries:  # .eplb-publish.journal.<pid>.tmp / .done of killed publishes
        if entry.name.startswith(JOURNAL + "."):
            pid = entry.name[len(JOURNAL) + 1:].split(".", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)
    if not journal.is_dir():
        return
    try:
        pid = json.loads((journal / "plan.json").read_text(encoding="utf-8")).get("pid")
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        pid = None
    if pid != os.getpid() and _pid_alive(pid):
        raise InputError(f"another process (pid {pid}) is publishing into {out}; wait for it "
                         f"to finish (or, if it is not an eplb build, remove {journal})")
    if not _roll_back(out, journal):
        raise InputError(f"cannot undo the interrupted publish into {out} recorded in "
                         f"{journal}; check the folder's permissions, then run again")


def publish_tree(staging: str | os.PathLike, out: str | os.PathLike) -> list[str]:
    """Move every file under ``staging`` to the same relative path under ``out``, all or
    nothing; returns the files removed as stale.

    Files the previous publish wrote into ``out`` (listed in its manifest, `MANIFEST`) that
    this one does not write are removed; every other file in ``out`` is left alone, so a
    publish never deletes what it did not write. Each file replaced or removed is first moved
    into a journal folder (`JOURNAL`) in ``out``: on any failure or interrupt every move is
    undone, and a publish killed midway (SIGKILL, power loss) is undone by the next one
    (`recover_publish`). ``staging`` must be on ``out``'s file system (the moves are renames).
    The manifest written into ``out`` lists the files this publish wrote."""
    staging, out = Path(os.fspath(staging)), Path(os.fspath(out))
    with os_errors(out):
        out.mkdir(parents=True, exist_ok=True)
    recover_publish(out)
    with os_errors(staging):
        _write_manifest(staging)
    new = _files_under(staging)
    stale = sorted(rel for rel in (written_files(out) or set()) - set(new)
                   if rel != MANIFEST and _inside(rel) and os.path.lexists(out / rel)
                   and not (out / rel).is_dir())
    for rel in [*new, *stale]:  # never replace or remove a file this command read
        check_not_input(out / rel, "output")
    for rel in new:  # a folder where a file goes: refuse rather than move it
        if (out / rel).is_dir() and not (out / rel).is_symlink():
            raise InputError(f"cannot publish {out / rel}: it is a folder, where a file goes; "
                             "move it out of the way")
    made = sorted({p.as_posix() for rel in new for p in Path(rel).parents
                   if str(p) != "." and not os.path.lexists(out / p)}, key=len)
    files = []
    for rel in new:
        st = os.lstat(staging / rel)
        files.append({"rel": rel, "existed": os.path.lexists(out / rel),
                      "ino": [st.st_dev, st.st_ino]})
    files += [{"rel": rel, "existed": True, "ino": None} for rel in stale]
    journal = out / JOURNAL
    pending = out / f"{JOURNAL}.{os.getpid()}.tmp"
    done = out / f"{JOURNAL}.{os.getpid()}.done"
    with os_errors(out):
        shutil.rmtree(pending, ignore_errors=True)
        pending.mkdir()
        (pending / "plan.json").write_text(json.dumps({"pid": os.getpid(), "files": files,
                                                       "dirs": made}), encoding="utf-8")
        try:
            os.rename(pending, journal)  # the lock: fails if another publish holds it
        except OSError as exc:
            shutil.rmtree(pending, ignore_errors=True)
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise InputError(f"another process is publishing into {out} ({journal} "
                                 "appeared); wait for it to finish") from None
            raise
    rel = ""
    try:
        for rel in made:
            os.mkdir(out / rel)
        for entry in files:
            rel = entry["rel"]
            if entry["existed"]:
                bak = journal / "old" / rel
                bak.parent.mkdir(parents=True, exist_ok=True)
                os.replace(out / rel, bak)
            if entry["ino"] is not None:
                os.replace(staging / rel, out / rel)
        check_signalled()
        os.rename(journal, done)  # the commit point
    except BaseException as exc:
        _roll_back(out, journal)
        if isinstance(exc, OSError):
            raise write_error(out / rel, exc) from None
        raise
    shutil.rmtree(done, ignore_errors=True)
    return stale
