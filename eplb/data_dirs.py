"""Where the data kept outside the repository lives (docs/data.md): expert-load traces in
``$EPLB_DATA`` and request traces in ``$EPLB_REQUESTS`` when set, else ``../shared/traces``
and ``../shared/requests`` beside the checkout. Tests, scripts, benchmarks and the paper read
the folders here; a folder may be absent (callers skip or say so)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["REPO", "requests_dir", "traces_dir"]

REPO = Path(__file__).resolve().parents[1]  # the checkout (eplb/ is its core folder)


def _folder(variable: str, default: str) -> Path:
    value = os.environ.get(variable)
    return Path(value).expanduser() if value else REPO.parent / "shared" / default


def traces_dir() -> Path:
    """Expert-load traces: ``$EPLB_DATA``, else ``../shared/traces``."""
    return _folder("EPLB_DATA", "traces")


def requests_dir() -> Path:
    """Request traces (Mooncake, Azure): ``$EPLB_REQUESTS``, else ``../shared/requests``."""
    return _folder("EPLB_REQUESTS", "requests")
