"""Expert-load traces: the `Trace` model, readers, writers and synthetic generators.

- `Trace`: ``counts: float64[T, L, E]`` per window, model ``layer_ids``, optional
  ``source_counts``, token-level ``topk_ids``/``token_rank`` and ``meta``.
- `read(path, format=None)`: native npz, SGLang JSON/.pt dumps, long CSV/Parquet, per-rank
  CSV directories (see `traces.readers`).
- `write(trace, path, format=None)`: npz, Parquet, CSV, SGLang JSON (see `traces.writers`).
- `traces.synth`: seeded generators (zipf, lognormal, uniform, drift, bursty, calibrated,
  token-level group-limited routing).
- `traces.summary`: per-layer skew statistics.
"""

from eplb.traces import synth
from eplb.traces.model import Trace
from eplb.traces.readers import FORMATS, read, sniff
from eplb.traces.tables import from_frame
from eplb.traces.writers import WRITE_FORMATS, dropped, write, write_csv, write_npz, write_parquet

__all__ = [
    "FORMATS",
    "WRITE_FORMATS",
    "Trace",
    "dropped",
    "from_frame",
    "read",
    "sniff",
    "synth",
    "write",
    "write_csv",
    "write_npz",
    "write_parquet",
]
