"""``KEY=VALUE`` overrides of a `ClusterConfig` (``eplb.solver=greedy``,
``decode.count=2``, ``slo.ttft_s=1.5``): `apply` one set, `parse_variant` a named set
(``NAME:KEY=VALUE,KEY=VALUE``). Values are read as TOML (``2``, ``1.5``, ``true``,
``"text"``), a bare word as a string."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from eplb.errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["apply", "parse_value", "parse_variant"]


def parse_value(text: str) -> Any:
    """``text`` as a TOML value (a bare word that is not TOML is a string)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _split(item: str) -> tuple[list[str], Any]:
    if not isinstance(item, str):
        raise InputError(f"an override is a KEY=VALUE string (e.g. decode.count=2), got "
                         f"{item!r}")
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise InputError(
            f"override {item!r} is not KEY=VALUE (e.g. eplb.solver=greedy, decode.count=2)"
        )
    return key.split("."), parse_value(value.strip())


def apply(config, overrides: Sequence[str]):
    """``config`` with every ``KEY=VALUE`` of ``overrides`` set (dotted keys into its tables;
    the result is validated; an unknown key is one `InputError` naming it)."""
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, (Sequence, type(None))):
        raise InputError(f"overrides must be a list of KEY=VALUE strings, got {overrides!r}")
    if not overrides:
        return config
    data = config.to_dict()
    for item in overrides:
        path, value = _split(item)
        node = data
        for part in path[:-1]:
            nxt = node.get(part) if isinstance(node, dict) else None
            if nxt is None and isinstance(node, dict) and part not in node:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise InputError(f"override {item!r}: {'.'.join(path[:-1])} is not a table")
            node = nxt
        node[path[-1]] = value
    try:
        return type(config).from_dict(data)
    except InputError as exc:
        raise InputError(f"override {', '.join(overrides)}: {exc}") from None


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` as ``(NAME, [KEY=VALUE, ...])`` (commas inside brackets
    or quotes do not split)."""
    if not isinstance(text, str):
        raise InputError(f"a variant is a NAME:KEY=VALUE[,KEY=VALUE...] string, got {text!r}")
    name, sep, rest = text.partition(":")
    if not sep or not name.strip() or not rest.strip():
        raise InputError(
            f"variant {text!r} is not NAME:KEY=VALUE[,KEY=VALUE...] "
            "(e.g. greedy:eplb.solver=greedy)"
        )
    items, depth, quote, cur = [], 0, "", ""
    for ch in rest:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        cur += ch
    items.append(cur)
    return name.strip(), [i.strip() for i in items if i.strip()]
