"""Words printed beside a figure that would mislead alone: `few_tokens_note` (a decode max/mean
GPU load of 2 or more measured at under one running request per GPU)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eplb.errors import InputError
from eplb.evaluation.serving.config.model import get_model

FEW_REQUESTS_PER_GPU = 1.0  # running decode requests per GPU below which the note applies
HIGH_MAX_OVER_MEAN = 1.5


def few_tokens_note(summary: Mapping[str, Any], config: Mapping[str, Any] | None = None
                    ) -> str | None:
    """Why the decode max/mean GPU load of ``summary`` (`SimResult.summary`) is high when the
    decode units ran under one request per GPU: each step then routes a few picks per GPU per
    layer (requests x query tokens x top-k / GPUs), so the busiest GPU gets well above
    the mean by chance whatever the placement. ``config``: the run's config as a dict
    (`SimResult.meta["config"]`) for the picks per GPU; None when the figure needs no word."""
    ratio = summary.get("decode_gpu_load_max_over_mean")
    running = summary.get("decode_running_per_gpu")
    if not isinstance(ratio, float) or not isinstance(running, float) or not (
            ratio >= HIGH_MAX_OVER_MEAN and 0 < running < FEW_REQUESTS_PER_GPU):
        return None
    picks = ""
    decode = (config or {}).get("decode") or {}
    try:
        top_k = get_model((config or {}).get("model")).top_k
    except InputError:  # a model this build has no preset of: no count
        top_k = None
    if top_k is not None:
        per = running * (1 + int(decode.get("mtp_draft_tokens", 0))) * top_k
        picks = f", about {per:.1f} expert picks per GPU per layer and step"
    return (f"decode max/mean GPU load {ratio:.3g} at {running:.3g} running requests per GPU: "
            f"few tokens per GPU{picks}, so the busiest GPU gets well above the mean by "
            "chance whatever the placement; the figure falls toward the placement's balance as "
            "the decode batch grows")
