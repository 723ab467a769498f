"""Fit the calibrated skew model (`traces.calibration`) to real DeepSeek-V3 expert counts.

Reads the SGLang ``logical_count`` dumps in ``../shared/traces/deepseek-v3-sglang`` (never
copied into the repository) and writes only fitted numbers to
``traces/data/calibration-deepseek-v3.json``:

1. per workload file and MoE layer: group shares ``P`` (8 groups of 32 experts) and
   within-group shares ``q``; ``sigma_group`` = std of ``log(8 P)``, ``sigma_within`` = pooled
   std of ``log(32 q)`` centred per group;
2. the pooled standardised shapes of both as quantile tables (the tails are heavier than
   Gaussian, so the model samples from these shapes);
3. a moment-matching refinement (`refine`): sigmas are rescaled until the model's median CV and
   group CV (over 101 common-random-number draws) equal measured ones;
4. per phase (``all``, ``prefill``, ``decode``) and layer: ``targets``, the median over the
   phase's workloads of each measured statistic; ``center``, the sigmas refined to the target
   CV and group CV; ``std``, the spread across the phase's workloads of the sigmas refined to
   each workload's own statistics. Tests compare generated traces with ``targets``.

Run: ``python scripts/fit_calibration.py [--data DIR] [--check]`` (``--check`` compares the
committed table with a fresh fit and exits 1 if they differ).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from eplb.data_dirs import traces_dir  # noqa: E402
from eplb.traces import calibration, summary  # noqa: E402
from eplb.traces.readers import read  # noqa: E402

DEFAULT_DATA = traces_dir() / "deepseek-v3-sglang"
LEVELS = [0.0, 0.001, 0.005, 0.01, 0.02, 0.05, *np.round(np.arange(0.1, 0.91, 0.05), 2).tolist(),
          0.95, 0.98, 0.99, 0.995, 0.999, 1.0]
G, E, K, TOPK_GROUPS = 8, 256, 8, 4
DRAWS, ROUNDS, SEED = 101, 25, 20260101


def raw_sigmas(load: np.ndarray):
    """``sigma_group, sigma_within: [..., L]`` and standardised shapes from ``load[..., L, E]``."""
    p = load / load.sum(-1, keepdims=True)
    P = p.reshape(*p.shape[:-1], G, E // G).sum(-1)
    q = p.reshape(*p.shape[:-1], G, E // G) / P[..., None]
    gx = np.log(G * P)
    gx = gx - gx.mean(-1, keepdims=True)
    sg = np.sqrt((gx**2).mean(-1))
    rx = np.log((E // G) * q)
    rx = rx - rx.mean(-1, keepdims=True)
    sw = np.sqrt((rx**2).mean((-2, -1)))
    return sg, sw, gx / sg[..., None], rx / sw[..., None, None]


def refine(sg, sw, target_cv, target_gcv, table, rng):
    """Rescale ``sg, sw: [n]`` so the model's median CV / group CV match the targets."""
    u, z = calibration.standard_draws((sg.size, DRAWS), table, rng)
    sg, sw = sg.copy(), sw.copy()
    for _ in range(ROUNDS):
        s = calibration.shares(np.repeat(sg[:, None], DRAWS, 1), np.repeat(sw[:, None], DRAWS, 1),
                               table, rng, draws=(u, z))
        cv = np.median(summary.cv(s), axis=1)
        gcv = np.median(summary.group_cv(s, G), axis=1)
        sg *= (target_gcv / gcv) ** 1.0
        sw *= (target_cv / cv) ** 1.0
    s = calibration.shares(np.repeat(sg[:, None], DRAWS, 1), np.repeat(sw[:, None], DRAWS, 1),
                           table, rng, draws=(u, z))
    err = max(np.abs(np.median(summary.cv(s), axis=1) / target_cv - 1).max(),
              np.abs(np.median(summary.group_cv(s, G), axis=1) / target_gcv - 1).max())
    return sg, sw, float(err)


def _r(a, nd=5):
    return np.round(np.asarray(a, dtype=np.float64), nd).tolist()


def fit(data: Path) -> dict:
    files = sorted(data.glob("*.json"))
    if not files:
        raise SystemExit(f"no *.json under {data}")
    traces = [read(f) for f in files]
    ids = traces[0].layer_ids
    for f, t in zip(files, traces, strict=True):
        if not np.array_equal(t.layer_ids, ids) or t.num_experts != E:
            raise SystemExit(f"{f}: layers/experts differ from {files[0]}")
    load = np.stack([t.load() for t in traces])  # [W, L, E]
    phases_of = ["prefill" if f.name.startswith("prefill") else "decode" for f in files]
    sg, sw, gz, wz = raw_sigmas(load)
    table = {
        "model": "deepseek-v3",
        "num_experts": E,
        "num_groups": G,
        "top_k": K,
        "topk_groups": TOPK_GROUPS,
        "layer_ids": ids.tolist(),
        "num_model_layers": int(traces[0].meta["num_model_layers"]),
        "levels": LEVELS,
        "group_quantiles": _r(np.quantile(gz.ravel(), LEVELS)),
        "within_quantiles": _r(np.quantile(wz.ravel(), LEVELS)),
    }
    stats = calibration.target_stats(load, G)  # each [W, L]
    rng = np.random.default_rng(SEED)
    W, L = sg.shape
    # per workload: sigmas matched to that workload's CV / group CV (their spread is kept)
    sg_w, sw_w, err = refine(sg.ravel(), sw.ravel(), stats["cv"].ravel(),
                             stats["group_cv"].ravel(), table, rng)
    sg_w, sw_w = sg_w.reshape(W, L), sw_w.reshape(W, L)
    phases = {}
    for name in ("all", "prefill", "decode"):
        sel = np.array([name in ("all", ph) for ph in phases_of])
        targets = {k: np.median(v[sel], axis=0) for k, v in stats.items()}
        # centre: sigmas matched to the phase's per-layer median CV / group CV
        sg_c, sw_c, err_c = refine(np.median(sg[sel], 0), np.median(sw[sel], 0), targets["cv"],
                                   targets["group_cv"], table, rng)
        err = max(err, err_c)
        phases[name] = {
            "workloads": [f.name for f, s in zip(files, sel, strict=True) if s],
            "sigma_group": {"center": _r(sg_c), "std": _r(sg_w[sel].std(0))},
            "sigma_within": {"center": _r(sw_c), "std": _r(sw_w[sel].std(0))},
            "targets": {k: _r(v) for k, v in targets.items()},
        }
    table["phases"] = phases
    table["source"] = {
        "description": "SGLang DeepSeek-V3/R1 logical_count dumps (GeneratedRandomly/"
                       "SGLang-reproduce, attachment_ep_statistics/, commit c79682c8)",
        "files": [{"name": f.name, "sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
                   "phase": ph} for f, ph in zip(files, phases_of, strict=True)],
        "script": "scripts/fit_calibration.py",
        "seed": SEED,
        "refinement_max_rel_error": round(err, 6),
    }
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, default=calibration.table_path("deepseek-v3"))
    ap.add_argument("--check", action="store_true", help="compare with the committed table")
    args = ap.parse_args(argv)
    table = fit(args.data)
    text = json.dumps(table, indent=1) + "\n"
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out}: {'matches a fresh fit' if same else 'DIFFERS from a fresh fit'}")
        return 0 if same else 1
    from eplb.atomic import atomic_write_text

    atomic_write_text(args.out, text)
    ph = table["phases"]["all"]
    print(f"wrote {args.out} ({len(text)} bytes) from {len(table['source']['files'])} files; "
          f"refinement max rel. error {table['source']['refinement_max_rel_error']:.2e}")
    for k in ("sigma_group", "sigma_within"):
        m = np.array(ph[k]["center"])
        print(f"  {k}: layer median {np.median(m):.3f}, range {m.min():.3f}..{m.max():.3f}")
    for k, v in ph["targets"].items():
        print(f"  target {k}: layer median {np.median(v):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
