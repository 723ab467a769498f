"""A workload named on a command line: a file path, or ``synth[:KEY=VALUE,...]`` (a generator)."""

from __future__ import annotations

import json

from eplb.errors import InputError
from eplb.evaluation.serving.workload.model import Workload
from eplb.evaluation.serving.workload.readers import read
from eplb.evaluation.serving.workload.synth import synthesize

# `synthesize` keywords a ``synth:`` spec may set (``n`` = ``num_requests``)
SYNTH_KEYS = (
    "rate",
    "arrival",
    "cv",
    "input_mean",
    "input_sigma",
    "output_mean",
    "output_sigma",
    "hit_rate",
    "session_prob",
    "system_prompts",
    "system_prompt_tokens",
    "open_sessions",
    "max_input_tokens",
    "block_size",
    "seed",
)


def _value(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_synth(spec: str) -> dict:
    """``"synth:n=5000,rate=8"`` -> keyword arguments of `synthesize` (1,000 requests unless
    ``n`` is given)."""
    body = spec.split(":", 1)[1] if ":" in spec else ""
    kw: dict = {}
    for item in filter(None, (x.strip() for x in body.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InputError(f"--workload {spec!r}: {item!r} is not KEY=VALUE (e.g. rate=8)")
        if key in ("n", "requests", "num_requests"):
            key = "num_requests"
        elif key not in SYNTH_KEYS:
            raise InputError(
                f"--workload {spec!r}: unknown key {key!r}; use n and " + ", ".join(SYNTH_KEYS)
            )
        kw[key] = _value(raw.strip())
    kw.setdefault("num_requests", 1000)
    return kw


def from_spec(spec: str, *, block_size: int) -> Workload:
    """The workload ``spec`` names: ``synth[:KEY=VALUE,...]`` generates one (`parse_synth`),
    anything else is a file `read` with ``block_size`` tokens per prefix block."""
    if spec == "synth" or spec.startswith("synth:"):
        kw = parse_synth(spec)
        kw.setdefault("block_size", block_size)
        return synthesize(**kw)
    return read(spec, block_size=block_size)
