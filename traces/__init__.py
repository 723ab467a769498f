"""Expert-load traces: the `Trace` model, readers, writers and synthetic generators.

``Trace.counts: float64[T, L, E]`` tokens per window, layer and expert; `read` and `write` move
traces between files, `synth` makes seeded ones, `summary` measures skew. See docs/data.md,
section "The traces package".
"""

from eplb.traces import synth
from eplb.traces.model import Trace
from eplb.traces.readers import FORMATS, read, sniff
from eplb.traces.stack import stack
from eplb.traces.tables import from_frame
from eplb.traces.windows import group_passes
from eplb.traces.writers import WRITE_FORMATS, dropped, write, write_csv, write_npz, write_parquet

__all__ = [
    "FORMATS",
    "WRITE_FORMATS",
    "Trace",
    "dropped",
    "from_frame",
    "group_passes",
    "read",
    "sniff",
    "stack",
    "synth",
    "write",
    "write_csv",
    "write_npz",
    "write_parquet",
]
