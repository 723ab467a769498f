"""Reading files defensively: no unpickling, no decompression or alias bombs, no hangs.

``.npy`` / ``.npz`` headers (dtype, shape) are checked before any data is allocated, against
`max_bytes` (4 GiB, ``EPLB_MAX_BYTES``) and the bytes the file holds; `check_size` applies the
same limit to requested sizes. `check_regular` refuses FIFOs, devices and sockets (which would
block or never end) before a reader opens them; `read_text` adds the size limit and a UTF-8
check; `json_loads` refuses duplicated keys; `yaml_load` refuses aliases (a "billion laughs"
file) and every tag but the plain ones. Errors are `InputError`s. See docs/core.md, section
"Safe loading".
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import stat
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eplb.atomic import note_input
from eplb.errors import EplbError, InputError

# a damaged zip member: bad headers, a truncation, a corrupt deflate stream (a bit flip), an
# unknown compression method
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error,
              NotImplementedError)

DEFAULT_MAX_BYTES = 4 * 2**30
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"

ErrorFactory = Callable[[str], Exception]


_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def max_bytes() -> int:
    """Largest array eplb allocates from one input or request: ``$EPLB_MAX_BYTES`` or 4 GiB.

    Bytes, optionally with a unit: ``8e9``, ``10MB``, ``512 MiB``, ``4G`` (k, M, G, T are
    powers of 1000, Ki, Mi, Gi, Ti of 1024; a trailing ``B`` is optional). A value that is
    not a finite number of bytes >= 1 (``inf``, ``1e400``, ``-5``, ``abc``) is an
    `InputError` naming the variable."""
    text = os.environ.get("EPLB_MAX_BYTES", "")
    if not text.strip():
        return DEFAULT_MAX_BYTES
    unit = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([kKmMgGtT]i?)?[bB]?\s*", text)
    try:
        value = float(unit.group(1)) * _UNITS[(unit.group(2) or "").lower()] if unit \
            else math.nan
    except (ValueError, OverflowError):
        value = math.nan
    if not (math.isfinite(value) and 1 <= value <= 2**62):
        raise InputError(
            f"environment variable EPLB_MAX_BYTES={text.strip()[:30]!r} is not a number of "
            f"bytes in 1..2**62; set it to e.g. 8e9 or 8GB (8 GB), or unset it (default 4 GiB)"
        )
    return int(value)


def human(nbytes: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} bytes"


def check_size(
    what: str,
    shape: Sequence[int],
    itemsize: int = 8,
    *,
    fix: str = "",
    error: ErrorFactory = InputError,
) -> int:
    """Raise unless an array of ``shape`` x ``itemsize`` bytes is within `max_bytes`.

    Returns the byte count. ``what`` names the array or the option ("--windows 100000000"),
    ``fix`` says what to do instead.
    """
    nbytes = math.prod(int(s) for s in shape) * int(itemsize)
    limit = max_bytes()
    if nbytes > limit:
        dims = " x ".join(str(int(s)) for s in shape)
        raise error(
            f"{what} needs {human(nbytes)} ({dims} x {itemsize} bytes), over the limit "
            f"of {human(limit)} (environment variable EPLB_MAX_BYTES)" + (f"; {fix}" if fix else "")
        )
    return nbytes


MAX_NPY_HEADER = 10_000  # bytes of a .npy header numpy itself accepts (max_header_size)


def _header(fh, error: ErrorFactory, name: str):
    try:
        version = np.lib.format.read_magic(fh)
        if version not in ((1, 0), (2, 0)):
            raise error(f"{name}: unsupported .npy format version {version}")
        # the header's length, checked before it is read (a 4-byte length can claim 4 GiB)
        width = 2 if version == (1, 0) else 4
        raw = fh.read(width)
        if len(raw) != width:
            raise EOFError("the file ends inside the .npy header")
        length = int.from_bytes(raw, "little")
        if length > MAX_NPY_HEADER:
            raise error(f"{name}: the .npy header claims {length:,} bytes, over the "
                        f"{MAX_NPY_HEADER:,} a .npy header can have; the file is corrupt")
        head = io.BytesIO(raw + fh.read(length))
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read(head)
    except EplbError:
        raise
    except (ValueError, EOFError, OSError, SyntaxError) as exc:
        raise error(f"{name}: not a readable .npy array ({exc})") from None
    if dtype.hasobject:
        raise error(
            f"{name} holds pickled objects, which are refused (arrays load with "
            "allow_pickle=False); save a numeric array"
        )
    if dtype.names is not None or dtype.subdtype is not None:
        raise error(f"{name} has a structured dtype {dtype}; expected plain numbers")
    return shape, fortran, dtype


def _check_array(name: str, shape, dtype, available: int, error: ErrorFactory) -> None:
    if dtype.kind == "c":
        raise error(f"{name} holds complex numbers ({dtype}); counts must be real")
    if dtype.kind not in "biufSU":
        raise error(f"{name} holds {dtype}, expected numbers (or text)")
    nbytes = check_size(name, shape, dtype.itemsize, error=error)
    if nbytes > available:
        raise error(
            f"{name} claims {human(nbytes)} ({list(shape)} {dtype}) but the file holds "
            f"only {human(available)}; it is truncated or corrupt"
        )


def read_npy(path: str | os.PathLike, error: ErrorFactory = InputError) -> np.ndarray:
    """The array in ``.npy`` file ``path`` (header checked first, never unpickled)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            if fh.read(len(NPY_MAGIC)) != NPY_MAGIC:
                raise error("not a .npy file (no NUMPY magic bytes at the start)")
            fh.seek(0)
            shape, fortran, dtype = _header(fh, error, "the array")
            _check_array("the array", shape, dtype, size - fh.tell(), error)
            fh.seek(0)
            return np.load(fh, allow_pickle=False)
    except EplbError:
        raise
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise error(f"not a readable .npy ({exc})") from None


def read_npz(
    path: str | os.PathLike, error: ErrorFactory = InputError, names: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """``{name: array}`` of the ``.npz`` file ``path`` (only ``names`` if given).

    Each member's declared size and ``.npy`` header are checked before it is decompressed.
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror or exc}") from None
    if head != ZIP_MAGIC:
        kind = (
            "a .npy array"
            if head == NPY_MAGIC[:4]
            else "text"
            if head[:1] in b"{[" or head.isascii()
            else "something else"
        )
        raise error(f"not an .npz file (not a zip archive; it looks like {kind})")
    out: dict[str, np.ndarray] = {}
    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            members = {
                i.filename[:-4] if i.filename.endswith(".npy") else i.filename: i
                for i in zf.infolist()
            }
            wanted = list(members) if names is None else [n for n in names if n in members]
            for name in wanted:
                info = members[name]
                total += check_size(
                    f"array {name!r} (uncompressed)", (info.file_size,), 1, error=error
                )
                check_size("the arrays together (uncompressed)", (total,), 1, error=error)
                with zf.open(info) as fh:
                    shape, fortran, dtype = _header(fh, error, f"array {name!r}")
                    _check_array(f"array {name!r}", shape, dtype, info.file_size, error)
                with zf.open(info) as fh:
                    out[name] = np.lib.format.read_array(fh, allow_pickle=False)
    except EplbError:
        raise
    except ZIP_ERRORS as exc:
        raise error(f"truncated or not an npz file ({exc}); regenerate or re-copy it") from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise error(f"not a readable npz ({exc})") from None
    return out


def npz_names(path: str | os.PathLike, error: ErrorFactory = InputError) -> list[str]:
    """Array names in the ``.npz`` file ``path`` (no data read)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return [n[:-4] if n.endswith(".npy") else n for n in zf.namelist()]
    except (*ZIP_ERRORS, OSError) as exc:
        raise error(f"truncated or not an npz file ({exc}); regenerate or re-copy it") from None


# ------------------------------------------------------------------ any file
def check_regular(path: str | os.PathLike, what: str = "input", error: ErrorFactory = InputError
                  ) -> Path:
    """``path`` as a `Path` after refusing a missing file, a directory and a FIFO, device or
    socket (reading one would block or never end). Errors name ``what`` and the path."""
    if path is None or isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise error(f"{what} must be a file name, got {repr(path)[:60]}")
    p = Path(os.fspath(path))
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(f"cannot read {what} {str(p)!r}: it does not exist") from None
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, a loop of links...
        raise error(f"cannot read {what} {str(p)[:80]!r}: "
                    f"{getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {str(p)!r} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
        raise error(f"{what} {str(p)!r} is {kind}, not a regular file; eplb reads regular "
                    "files only (save the stream to a file first)")
    note_input(p, what, st)  # no output of this command may replace it (eplb.atomic)
    return p


def read_bytes(path: str | os.PathLike, what: str = "input", error: ErrorFactory = InputError
               ) -> bytes:
    """The bytes of regular file ``path`` (`check_regular`; at most `max_bytes`)."""
    p = check_regular(path, what, error)
    try:
        size = p.stat().st_size
        check_size(f"{what} {p}", (size,), 1, error=error)
        return p.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from None


def read_text(path: str | os.PathLike, what: str = "input", error: ErrorFactory = InputError,
              encoding: str = "utf-8") -> str:
    """The UTF-8 text of regular file ``path`` (`read_bytes`; bad UTF-8 or NUL bytes refused)."""
    data = read_bytes(path, what, error)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text (byte {exc.start}: "
                    f"{data[exc.start:exc.start + 1]!r}); is it a binary file?") from None
    if "\0" in text:
        raise error(f"{what} {path} holds NUL bytes; it is a binary file, not text")
    return text


MAX_JSON_INT = 2**53  # larger integers do not survive a float64 round trip


def json_loads(text: str, what: str = "JSON", error: ErrorFactory = InputError, *,
               exact_ints: bool = False) -> Any:
    """``json.loads(text)`` refusing duplicated keys (the last would win silently), nesting
    too deep to parse and, with ``exact_ints``, integers beyond 2**53 (precision lost)."""

    def pairs(items):
        out = {}
        for key, value in items:
            if key in out:
                raise error(f"{what}: key {key!r} appears twice in one object; keep one")
            out[key] = value
        return out

    def parse_int(digits: str):
        value = int(digits)
        if exact_ints and abs(value) > MAX_JSON_INT:
            raise error(f"{what}: integer {digits[:24]} is beyond 2**53; such counts lose "
                        "precision (an overflow upstream?)")
        return value

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_int=parse_int)
    except EplbError:
        raise
    except json.JSONDecodeError as exc:
        raise error(f"{what}: not valid JSON ({exc}); the file may be truncated") from None
    except RecursionError:
        raise error(f"{what}: JSON is nested too deeply (thousands of levels)") from None
    except ValueError as exc:  # an integer literal with more than 4300 digits
        raise error(f"{what}: not valid JSON ({exc})") from None


def yaml_load(text: str, what: str = "YAML", error: ErrorFactory = InputError) -> Any:
    """``yaml.safe_load(text)`` refusing aliases (``*name``: a few KB can expand to GBs, the
    "billion laughs") and nesting too deep to parse."""
    import yaml  # lazy: PyYAML is needed only for YAML files

    class _NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise error(f"{what}: YAML alias *{event.anchor} (line "
                            f"{event.start_mark.line + 1}) refused: aliases can expand a "
                            "small file into gigabytes; write the values out")
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader subclass
    except EplbError:
        raise
    except yaml.YAMLError as exc:
        raise error(f"{what}: not readable YAML ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise error(f"{what}: YAML is nested too deeply") from None


# ------------------------------------------------------------------ torch.save files
_STORAGE_BYTES = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4,
                  "Short": 2, "Char": 1, "Byte": 1, "Bool": 1, "ComplexDouble": 16,
                  "ComplexFloat": 8, "Untyped": 1, "QInt8": 1, "QUInt8": 1, "QInt32": 4}
_INT_OPS = {"INT", "LONG", "BININT", "BININT1", "BININT2", "LONG1", "LONG4"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}


def _storage_itemsize(name: object) -> int:
    text = str(name).rsplit(" ", 1)[-1].rsplit(".", 1)[-1]
    base = text[: -len("Storage")] if text.endswith("Storage") else text
    if base.startswith("Float8"):
        return 1
    return _STORAGE_BYTES.get(base, 16)  # unknown: the widest, so a bound errs high


def pickle_storage_bytes(stream, error: ErrorFactory = InputError, name: str = "pickle",
                         pickles: int = 1) -> int:
    """Bytes of the tensor storages a torch pickle names in its persistent ids
    (``('storage', <type>, key, location, numel, ...)``), read with `pickletools.genops`
    (opcodes parsed, nothing executed) from the next ``pickles`` pickles of ``stream``.
    A stream that ends early or is not a pickle stops the count (the loader reports it)."""
    import pickletools

    total = 0
    memo: dict[int, object] = {}
    last: object = None
    capture: list | None = None
    itemsize = 16
    try:
        for _ in range(pickles):
            for op, arg, _pos in pickletools.genops(stream):
                value: object = None
                if op.name in _GET_OPS:
                    value = memo.get(arg)
                elif op.name in _PUT_OPS:
                    memo[arg] = last
                    continue
                elif op.name == "MEMOIZE":
                    memo[len(memo)] = last
                    continue
                elif isinstance(arg, (str, bytes)) or op.name in ("GLOBAL", "INST"):
                    value = arg
                elif op.name in _INT_OPS:
                    value = int(arg)
                if op.name in ("BINPERSID", "PERSID"):
                    if capture:
                        total += max(capture) * itemsize
                    capture = None
                    continue
                if value == "storage":
                    capture, itemsize = [], 16
                elif capture is not None and isinstance(value, str) and "Storage" in value:
                    itemsize = _storage_itemsize(value)
                elif capture is not None and isinstance(value, int) and value >= 0:
                    capture.append(value)
                if value is not None:
                    last = value
    except Exception:  # a malformed pickle: torch.load then reports it by name
        pass
    return total


def check_torch_file(path: str | os.PathLike, error: ErrorFactory = InputError) -> int:
    """Refuse a ``torch.save`` file whose tensors need more than `max_bytes`, before it is
    loaded: the storage sizes its pickle names (`pickle_storage_bytes`) and, in the zip
    format, the sizes its ``data/`` records claim. Returns the larger of the two in bytes."""
    p = check_regular(path, "torch file", error)
    implied = records = 0
    limit_fix = "load a smaller dump, or raise EPLB_MAX_BYTES if the machine has the memory"
    try:
        if zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as zf:
                infos = zf.infolist()
                pkl = next((i for i in infos if i.filename == "data.pkl"
                            or i.filename.endswith("/data.pkl")), None)
                records = sum(i.file_size for i in infos if "/data/" in i.filename
                              or i.filename.startswith("data/"))
                if pkl is not None:
                    check_size(f"{p}: data.pkl", (pkl.file_size,), 1, fix=limit_fix,
                               error=error)
                    with zf.open(pkl) as fh:
                        implied = pickle_storage_bytes(fh, error, str(p))
        else:
            check_size(f"{p}", (p.stat().st_size,), 1, fix=limit_fix, error=error)
            with open(p, "rb") as fh:  # legacy: magic, protocol, sys info, then the object
                implied = pickle_storage_bytes(fh, error, str(p), pickles=4)
    except (*ZIP_ERRORS, OSError, ValueError) as exc:
        raise error(f"{p}: truncated or not a torch.save file ({exc}); re-copy or re-dump it"
                    ) from None
    nbytes = max(implied, records)
    limit = max_bytes()
    if nbytes > limit:
        raise error(f"{p}: its tensors need {human(nbytes)}, over the limit of {human(limit)} "
                    f"(environment variable EPLB_MAX_BYTES); {limit_fix}")
    return nbytes
