"""Request workloads: the `Workload` frame, file readers/writers, generators and `rescale`.

- `Workload(requests, block_size=512, meta=None)`: see `evaluation.serving.workload_model`.
- `read(path, format=None)` / `write(workload, path, format=None)`: Mooncake JSON lines, the
  Azure LLM inference CSV, plain CSV/Parquet (see `evaluation.serving.workload_readers`).
- `synthesize(...)`, `poisson_arrivals`, `gamma_arrivals`, `lognormal_lengths`, `rescale`
  (see `evaluation.serving.workload_synth`).
"""

from eplb.evaluation.serving.workload.model import COLUMNS, MAX_TOKENS, Workload
from eplb.evaluation.serving.workload.readers import (
    READ_FORMATS,
    WRITE_FORMATS,
    dropped,
    read,
    sniff,
    write,
    write_format,
)
from eplb.evaluation.serving.workload.synth import (
    ARRIVALS,
    gamma_arrivals,
    lognormal_lengths,
    poisson_arrivals,
    rescale,
    synthesize,
)

__all__ = [
    "ARRIVALS",
    "COLUMNS",
    "MAX_TOKENS",
    "READ_FORMATS",
    "WRITE_FORMATS",
    "Workload",
    "dropped",
    "gamma_arrivals",
    "lognormal_lengths",
    "poisson_arrivals",
    "read",
    "rescale",
    "sniff",
    "synthesize",
    "write",
    "write_format",
]
