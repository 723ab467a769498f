"""Expert-load traces: the `Trace` model, readers, writers and synthetic generators."""

from traces.model import Trace
from traces.readers import read
from traces.writers import write_npz

__all__ = ["Trace", "read", "write_npz"]
