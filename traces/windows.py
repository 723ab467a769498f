"""Window selections written as text: ``"3"``, ``"0,3,5"``, ``"a:b"`` or ``"a:b:step"``."""

from __future__ import annotations

from eplb.errors import InputError


def parse_windows(spec: str | None, name: str = "windows") -> int | list[int] | slice | None:
    """``spec`` as a selection for `Trace.window_index`: ``None`` (all windows), a list of
    indices (``"3"``, ``"0,3,5"``) or a slice (``"a:b"``, ``"a:b:step"``); ``name`` is what an
    `InputError` calls the value (e.g. a command-line flag)."""
    if spec is None:
        return None
    try:
        if ":" in spec:
            parts = [int(x) if x.strip() else None for x in spec.split(":")]
            if len(parts) > 3:
                raise ValueError
            return slice(*parts)
        if "," in spec:
            return [int(x) for x in spec.split(",") if x.strip()]
        return [int(spec)]
    except ValueError:
        raise InputError(f"{name} {spec!r} is not an index, a slice a:b or a list "
                         "0,3,5") from None
