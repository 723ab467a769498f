"""Reading ``.npy`` / ``.npz`` files defensively: no unpickling, no decompression bombs.

Headers (dtype, shape) are checked before any data is allocated, against `max_bytes` (4 GiB,
``EPLB_MAX_BYTES``) and the bytes the file holds; `check_size` applies the same limit to
requested sizes. Errors are `InputError`s. See docs/core.md, section "Safe loading".
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Callable, Sequence

import numpy as np

from eplb.errors import EplbError, InputError

DEFAULT_MAX_BYTES = 4 * 2**30
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"

ErrorFactory = Callable[[str], Exception]


def max_bytes() -> int:
    """Largest array eplb allocates from one input or request: ``$EPLB_MAX_BYTES`` or 4 GiB."""
    text = os.environ.get("EPLB_MAX_BYTES", "")
    try:
        value = int(float(text)) if text.strip() else DEFAULT_MAX_BYTES
    except ValueError:
        value = DEFAULT_MAX_BYTES
    return value if value > 0 else DEFAULT_MAX_BYTES


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


def _header(fh, error: ErrorFactory, name: str):
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise error(f"{name}: unsupported .npy format version {version}")
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
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as exc:
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
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise error(f"truncated or not an npz file ({exc}); regenerate or re-copy it") from None
