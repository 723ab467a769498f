"""Regenerate the sample traces bundled in ``traces/data/`` (deterministic: fixed seeds).

Run: ``python scripts/make_bundled_traces.py``.
"""

from __future__ import annotations

from pathlib import Path

from traces import synth, write_npz

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"


def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    trace = synth.zipf(58, 256, windows=1, tokens=16384, top_k=8, seed=2026)
    trace = type(trace)(trace.counts, layer_ids=range(3, 61),
                        meta={**trace.meta, "num_model_layers": 61, "num_groups": 8})
    write_npz(trace, DATA / "zipf-58x256.npz")
    print(f"wrote {DATA / 'zipf-58x256.npz'}: {trace}")


if __name__ == "__main__":
    main()
