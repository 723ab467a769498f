"""Writing traces: native ``.npz`` (lossless: arrays as arrays, ``meta`` as a JSON string)."""

from __future__ import annotations

import io
import json
import os

import numpy as np

from eplb.atomic import atomic_write_bytes
from traces.model import Trace


def write_npz(trace: Trace, path: str | os.PathLike, *, compress: bool = True) -> None:
    """Write ``trace`` to ``path`` atomically in the native npz format."""
    arrays = {"counts": trace.counts, "layer_ids": trace.layer_ids}
    for name in ("source_counts", "topk_ids", "token_rank"):
        value = getattr(trace, name)
        if value is not None:
            arrays[name] = value
    arrays["meta"] = np.array(json.dumps(dict(trace.meta), default=_default))
    buf = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def _default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"meta value {obj!r} is not JSON serialisable")
