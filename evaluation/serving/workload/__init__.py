"""Request workloads: the `Workload` frame (`model`), file readers and writers (`readers`:
Mooncake JSON lines, the Azure CSV, CSV / Parquet), seeded generators and `rescale` (`synth`),
the Day-6-like mixes (`day6`), workloads named
on a command line (`spec`); docs/serving.md, "Workloads"."""

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
from eplb.evaluation.serving.workload.spec import SYNTH_KEYS, from_spec, parse_synth
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
    "SYNTH_KEYS",
    "WRITE_FORMATS",
    "Workload",
    "dropped",
    "from_spec",
    "gamma_arrivals",
    "lognormal_lengths",
    "parse_synth",
    "poisson_arrivals",
    "read",
    "rescale",
    "sniff",
    "synthesize",
    "write",
    "write_format",
]
