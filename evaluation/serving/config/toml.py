"""TOML files of cluster configs: `read` (a file to a table) and `dumps` (a table to text
that `read` gives back unchanged)."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eplb.errors import InputError
from eplb.safeload import read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def read(path: str | os.PathLike) -> dict[str, Any]:
    """The table in the TOML file ``path`` (`InputError` naming the file when it cannot be
    read or parsed)."""
    if path is None or isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise InputError(f"a cluster config is a TOML file name, got {path!r}")
    p = Path(path)
    text = read_text(p, "cluster config")  # regular UTF-8 files only (a FIFO would block)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{p} is not valid TOML: {exc}") from None
    except RecursionError:
        raise InputError(f"{p}: TOML nested too deeply (thousands of levels); a cluster "
                         "config has a few tables") from None


def dumps(data: Mapping) -> str:
    """``data`` (nested tables, lists of tables, scalars; ``None`` values dropped) as TOML."""
    return _toml(data)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):  # TOML basic string: JSON escapes minus \uD800 pairs, plus DEL
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007F")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return (
            "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items() if x is not None) + "}"
        )
    raise InputError(f"cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else _value(str(k))


def _toml(data: Mapping, prefix: str = "") -> str:
    lines, tables = [], []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            tables.append((k, v))
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, Mapping) for x in v):
            tables.append((k, list(v)))
        else:
            lines.append(f"{_key(k)} = {_value(v)}")
    out = "\n".join(lines)
    for k, v in tables:
        name = f"{prefix}{_key(k)}"
        if isinstance(v, list):
            for item in v:
                body = _toml(item, f"{name}.")
                out += f"\n\n[[{name}]]\n{body}".rstrip() if body else f"\n\n[[{name}]]"
        else:
            body = _toml(v, f"{name}.")
            out += f"\n\n[{name}]\n{body}".rstrip()
    return out.strip() + "\n" if not prefix else out.strip()
