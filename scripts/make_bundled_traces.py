"""Regenerate the sample traces bundled in ``traces/data/`` (deterministic: fixed seeds).

Run: ``python scripts/make_bundled_traces.py``. Writes:

- ``deepseek-v3-calibrated.npz``: `traces.synth.calibrated` DeepSeek-V3-like counts,
  16 windows x 58 MoE layers (model layers 3..60 of 61) x 256 experts, 32768 tokens per window.
- ``deepseek-v3-tokens.npz``: `traces.synth.token_level` routing of 1024 tokens (group-limited
  top-8 of 256 experts in 8 groups, top-4 groups) from 32 source ranks, matching the load of
  window 0 of the calibrated trace.
- ``zipf-58x256.npz``: one window of `traces.synth.zipf` counts with DeepSeek-V3's shape.

The calibration table ``calibration-deepseek-v3.json`` is written by
``scripts/fit_calibration.py`` instead (it needs the real dumps).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from eplb.traces import synth, write_npz  # noqa: E402

DATA = ROOT / "traces" / "data"
DEEPSEEK = {"num_model_layers": 61, "num_groups": 8, "topk_groups": 4}


def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    made = []

    calibrated = synth.calibrated("deepseek-v3", windows=16, tokens=32768, seed=2026)
    made.append(("deepseek-v3-calibrated.npz", calibrated))

    tokens = synth.token_level(calibrated.select(windows=0), num_tokens=1024, num_groups=8,
                               topk_groups=4, top_k=8, num_ranks=32, seed=2026)
    made.append(("deepseek-v3-tokens.npz", tokens))

    zipf = synth.zipf(58, 256, windows=1, tokens=16384, top_k=8, seed=2026,
                      layer_ids=range(3, 61), meta={**DEEPSEEK, "model": "synthetic zipf"})
    made.append(("zipf-58x256.npz", zipf))

    for name, trace in made:
        path = DATA / name
        write_npz(trace, path)
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size / 1024:.0f} KiB): {trace}")


if __name__ == "__main__":
    main()
