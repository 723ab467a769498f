"""Cases whose outputs the speed work (issue 36) must keep bit for bit: a few short simulations,
Day-6-like workloads and `greedy` placements, each reduced to a SHA-256 digest.

``python tests/speed_cases.py`` writes ``tests/data/speed_digests.json`` from the checkout it
runs in; the file in the repository was written by the code before the speed-up (commit
09e648d), and `tests/test_speed_identical.py` checks the current code against it."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

DIGESTS = Path(__file__).resolve().parent / "data" / "speed_digests.json"
GREEDY_CONFIGS = {"4x8:288": (4, 8, 9), "18x8:288": (18, 8, 2), "8x8:320": (8, 8, 5)}
BUNDLED_TRACES = ("deepseek-v3-calibrated.npz", "zipf-58x256.npz")


def digest_array(h, a: np.ndarray) -> None:
    a = np.asarray(a)
    if a.dtype == object:
        for v in a:
            h.update(np.asarray(v).tobytes() if isinstance(v, np.ndarray) else repr(v).encode())
            h.update(b"|")
    else:
        h.update(str(a.dtype).encode())
        h.update(np.ascontiguousarray(a).tobytes())


def digest_frame(frame: pd.DataFrame) -> str:
    """SHA-256 of a frame's column names, dtypes and values (bit for bit)."""
    h = hashlib.sha256()
    for col in frame.columns:
        h.update(str(col).encode())
        digest_array(h, frame[col].to_numpy())
    return h.hexdigest()


def sim_cases() -> dict:
    """name -> (config, workload, duration_s): short runs that reach every per-step path."""
    from eplb.evaluation import serving
    from eplb.evaluation.serving.config import UnitConfig
    from eplb.evaluation.serving.workload import day6

    base = serving.ClusterConfig.deepseek_day6()

    def units(cfg, p, d):
        pu, du = dict(cfg.prefill.__dict__), dict(cfg.decode.__dict__)
        pu["count"], du["count"] = p, d
        return cfg.replace(prefill=UnitConfig(**pu), decode=UnitConfig(**du))

    bal = day6.day6_workload(1600, 108.0, mix="balanced_units", seed=0)
    pub = day6.day6_workload(2400, 160.0, mix="published", seed=1)
    return {
        "day6_1p1d_even": (base, bal, 12.0),
        "day6_1p1d_lp": (base.replace(dispatch="lp"), bal, 8.0),
        "day6_2p1d_published": (units(base, 2, 1), pub, 10.0),
    }


def sim_digest(result) -> dict:
    return {name: digest_frame(getattr(result, name))
            for name in ("requests", "steps", "rebalances", "faults")}


def workload_cases() -> dict:
    from eplb.evaluation.serving.workload import day6, synthesize

    return {
        "day6_published": lambda: day6.day6_workload(30_000, 1900.0, mix="published", seed=3),
        "day6_balanced": lambda: day6.day6_workload(20_000, 500.0, mix="balanced_units"),
        "hit_rate_search": lambda: synthesize(
            6000, rate=50.0, hit_rate=0.5, system_prompts=4, system_prompt_tokens=700,
            open_sessions=300, max_input_tokens=20_000, seed=2),
    }


def greedy_digest(load: np.ndarray, cfg: str) -> str:
    from eplb import Topology, solvers

    topo = Topology(*GREEDY_CONFIGS[cfg])
    p = solvers.solve("greedy", load, topo, num_groups=8)
    return hashlib.sha256(np.ascontiguousarray(p.phy2log, dtype=np.int64).tobytes()).hexdigest()


def greedy_loads(shared: Path | None) -> dict:
    """name -> load: the bundled traces, and the six SGLang dumps when ``shared`` has them."""
    from eplb import traces

    root = Path(__file__).resolve().parents[1] / "traces" / "data"
    out = {n: traces.read(root / n).load() for n in BUNDLED_TRACES}
    if shared is not None:
        from tests.conftest import DEEPSEEK_JSONS

        for n in DEEPSEEK_JSONS:
            out[n] = traces.read(shared / "deepseek-v3-sglang" / n).load()
    return out


def main() -> None:
    from eplb.evaluation import serving

    shared = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    out: dict = {"sim": {}, "workload": {}, "greedy": {}}
    for name, (cfg, wl, secs) in sim_cases().items():
        res = serving.simulate(cfg, wl, seed=0, duration_s=secs, progress=False)
        out["sim"][name] = sim_digest(res)
        print(name, res.meta["events"], flush=True)
    for name, make in workload_cases().items():
        out["workload"][name] = digest_frame(make().requests)
    for name, load in greedy_loads(shared).items():
        out["greedy"][name] = {cfg: greedy_digest(load, cfg) for cfg in GREEDY_CONFIGS}
    DIGESTS.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {DIGESTS}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
