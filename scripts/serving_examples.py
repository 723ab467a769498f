"""Run every serving example of the README as written (workload, simulate, counterfactual,
--rates, --capacity, advise), check that each output's verdicts agree with its own figures,
and write the figures into the README's serving block and docs/serving.md ("The README
example"); ``--check`` compares instead of writing (exit 1 when a check fails or a doc is
stale).

Each command runs as a user types it (``python -m eplb.cli ...``) in a scratch folder that
holds the data (``$EPLB_REQUESTS/..``; the commands' ``$EPLB_DATA`` and ``$EPLB_REQUESTS`` point
into it) and the repository's ``traces/``.
What is checked, per output:

- ``simulate`` (one run): the verdict line agrees with the ``overloaded`` row; recomputed
  from the run's ``requests.parquet`` by code independent of the simulator's summary (the
  arrival window, the arrival and first-token rates, the backlog waiting for a first token
  and its least-squares trend, goodput over the decided requests), the printed figures and
  the verdict follow; "not overloaded" needs first tokens at >= 90% of the arrival rate,
  "OVERLOADED" below 95% of it; every lost request is a miss of some SLO
  (``1 - goodput <= ttft_miss + tpot_miss``); a run offered more than the capacity that
  ``--capacity`` finds on the same workload says so (overloaded, or goodput below target).
- ``--rates``: the ``overloaded`` and ``served_fraction`` columns exist, fractions lie in
  [0, 1], tok/s per node grows with the rate while not overloaded, rates above the capacity
  miss the target or say overloaded, rates at or below it meet the target.
- ``--capacity``: it concludes within its stated bound, one progress line per rate tried
  with that rate's goodput, the target holds at ``lo`` and fails at ``hi`` (or a one-line
  reason when no rate met it).
- counterfactual and every output: no interval of a fraction outside [0, 1], no byte count
  as a bare number (``825,181,077,504.0 bytes``) or an exponent (``8.769e+04 GB``).
- ``advise``: each row's gain equals its tok/s over the first row's; the per-rank figure in
  the operating-point line equal the table's (tokens per rank in prefill, running requests
  per rank in decode, after advise's KV-cache cap: issue 34 part 4).

Run: ``python scripts/serving_examples.py [--write-docs | --check] [--only NAME,...]
[--tiny]``; ``--tiny`` runs the same examples and checks on a one-node cluster and 160
requests (seconds; what tests/test_serving_examples.py runs) and writes no doc.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from docblock import update_doc

from eplb.data_dirs import requests_dir

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOC = ROOT / "docs" / "serving.md"
TARGET = 0.9  # the --goodput of the capacity example
GROWTH_SHARE = 0.05  # the verdict's rule (evaluation/serving/results/verdict.py), restated
GRID = 256

# the README's serving block: (name, command, comment above it); names key the checks
DUMP = "$EPLB_DATA/deepseek-v3-sglang/decode_in2000out100.json"
EXAMPLES = [
    ("info", "eplb workload info $EPLB_REQUESTS/mooncake_conversation.jsonl",
     "# request workloads: real traces (Mooncake JSONL, Azure CSV) or seeded generators"),
    ("synth", "eplb workload synth -n 1200 --rate 10 --hit-rate 0.56 --seed 1 -o day.parquet",
     ""),
    ("sim", "eplb simulate deepseek_day6 --workload day.parquet --duration 120 -o sim/",
     "{sim_comment}"),
    ("sim40",
     "eplb simulate deepseek_day6 --workload day.parquet --duration 120 --rate 40 -o sim40/",
     "{sim40_comment}"),
    ("counterfactual",
     "eplb simulate deepseek_day6 --workload day.parquet --duration 120 --seeds 0,1,2 \\\n"
     "    --mode counterfactual --variant 'trivial:eplb.solver=static,eplb.initial=trivial' \\\n"
     "    --variant 'bal:eplb.solver=balanced'",
     "# what a policy is worth: the placement effect alone over 3 paired seeds, with 95% CIs"),
    ("rates", "eplb simulate deepseek_day6 --workload day.parquet --rates 10,20,40 -o sweep/",
     "{rates_comment}"),
    ("capacity", "eplb simulate deepseek_day6 --workload day.parquet --capacity --goodput 0.9",
     "{capacity_comment}"),
    ("print-config", "eplb simulate --print-config deepseek_day6 > cluster.toml",
     "# a preset as TOML, to start a config from"),
    ("advise", f"eplb advise {DUMP} --topology 9x8 \\\n"
     "    --slots 288 --phase decode --tokens-per-rank 256 --hardware h100",
     "# is balancing worth it? each lever's step time and tokens/s/node on a runtime dump's "
     "loads"),
    ("advise-craft", f"eplb advise {DUMP} --topology 18x8 \\\n"
     "    --slots 288 --levers redundant,craft --redundant 8,16,32",
     "# per-layer replica budgets (craft) at 8 and 16 redundant per layer on average vs "
     "uniform"),
]
# --tiny: the same commands on a one-node cluster (tiny.toml, written first) and 160 requests
TINY_SUB = [
    ("deepseek_day6", "tiny.toml"),
    ("-n 1200 --rate 10 --hit-rate 0.56 --seed 1",
     "-n 160 --rate 8 --hit-rate 0.3 --input-mean 1500 --output-mean 12 --open-sessions 16 "
     "--seed 1"),
    ("--duration 120", "--duration 15"),
    ("--rate 40", "--rate 60"),
    ("--seeds 0,1,2", "--seeds 0,1"),
    ("--rates 10,20,40", "--rates 4,40"),
    ("--capacity --goodput 0.9", "--capacity --goodput 0.9 --rel-tol 0.3"),
]
TINY_SKIP = ("info", "print-config", "advise", "advise-craft")


@dataclass
class Outcome:
    """One example's run: its output and what the checks found."""

    name: str
    command: str
    code: int
    stdout: str
    stderr: str
    wall_s: float
    checks: list[tuple[bool, str]] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> None:
        self.checks.append((bool(ok), what))

    @property
    def failed(self) -> list[str]:
        return [w for ok, w in self.checks if not ok]


# ------------------------------------------------------------------ running
def run(name: str, command: str, cwd: Path, runner=None) -> Outcome:
    """``command`` as written (``eplb`` is ``python -m eplb.cli``; ``> FILE`` redirects);
    ``runner(argv, cwd) -> (code, stdout, stderr)`` runs it another way (the test: in its
    own process, with no interpreter start)."""
    args = shlex.split(command.replace("\\\n", " "))
    # the README's data folders, as the scratch checkout lays them out (README, "Data")
    data = {"$EPLB_REQUESTS": str(cwd.parent / "shared" / "requests"),
            "$EPLB_DATA": str(cwd.parent / "shared" / "traces")}
    for var, path in data.items():
        args = [a.replace(var, path) for a in args]
    out_file = None
    if ">" in args:
        i = args.index(">")
        out_file, args = cwd / args[i + 1], args[:i]
    assert args[0] == "eplb", command
    t0 = time.perf_counter()
    if runner is not None:
        code, stdout, stderr = runner(args[1:], cwd)
    else:
        proc = subprocess.run([sys.executable, "-m", "eplb.cli", *args[1:]], cwd=cwd,
                              capture_output=True, text=True, env=os.environ.copy())
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    wall = time.perf_counter() - t0
    if out_file is not None:
        out_file.write_text(stdout, encoding="utf-8")
    res = Outcome(name, command, code, stdout, stderr, wall)
    res.check(code == 0, "exit 0" if code == 0 else
              f"exit 0 (got {code}: {stderr.strip().splitlines()[-1:]})")
    return res


def scratch(shared: Path) -> Path:
    """A folder laid out like a checkout: ``repo/`` (``traces`` linked) beside ``shared``."""
    top = Path(tempfile.mkdtemp(prefix="eplb-examples-"))
    (top / "repo").mkdir()
    (top / "shared").symlink_to(shared)
    (top / "repo" / "traces").symlink_to(ROOT / "traces")
    return top / "repo"


# ------------------------------------------------------------------ parsing
def number(text: str) -> float:
    """A printed figure as a float (``>= 1.4``, ``1,200``, ``yes`` -> 1, ``-`` -> NaN)."""
    t = text.strip().removeprefix(">= ").replace(",", "")
    if t in ("yes", "no"):
        return float(t == "yes")
    try:
        return float(t.split()[0])
    except (ValueError, IndexError):
        return math.nan


def summary_rows(text: str) -> dict[str, str]:
    """The ``metric  value  unit`` rows of a simulate summary table, by metric."""
    rows = {}
    lines = text.splitlines()
    head = next((k for k, line in enumerate(lines) if line.startswith("metric ")), 0)
    for line in lines[head + 2:]:
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) < 2 or not re.fullmatch(r"[a-z0-9_]+", parts[0]):
            break
        rows[parts[0]] = parts[1]
    return rows


def table(text: str, first: str) -> pd.DataFrame:
    """The aligned text table whose header starts with ``first`` (cells split on 2+
    spaces), as text cells."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(first))
    header = re.split(r"\s{2,}", lines[i].strip())
    rows = []
    for line in lines[i + 2:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(header):
            break
        rows.append(cells)
    return pd.DataFrame(rows, columns=header)


# ------------------------------------------------------------------ checks
BAD_BYTES = re.compile(r"\d\.\d+e[+-]\d+ ?(GB|TB|MB|bytes|B)\b|\d{1,3}(,\d{3}){3,}(\.\d+)? ?bytes")
INTERVAL = re.compile(r"(-?\d[\d.,]*) \[(-?\d[\d.,]*), (-?\d[\d.,]*)\]")


def check_text(res: Outcome) -> None:
    """Every output: bytes with units, never a bare count or an exponent."""
    bad = BAD_BYTES.search(res.stdout)
    res.check(bad is None, f"byte counts in GB/TB ({bad.group(0) if bad else 'ok'})")


def recompute(req: pd.DataFrame, window_end: float, slo_ttft: float, slo_tpot: float,
              end: float) -> dict:
    """The verdict's figures from a run's requests, by code independent of the summary."""
    arr = req["arrival_s"].to_numpy()
    first = req["first_token_s"].to_numpy()
    fin = req["finish_s"].to_numpy()
    sel = arr < window_end
    grid = np.linspace(0.0, window_end, GRID)
    waiting = np.array([int(((arr <= t) & ~(first <= t)).sum()) for t in grid], dtype=float)
    tc = grid - grid.mean()
    growth = float((tc * (waiting - waiting.mean())).sum() / (tc * tc).sum())
    n = int(sel.sum())
    w0, w1 = waiting[0], int(((arr <= window_end) & ~(first <= window_end)).sum())
    lam = n / window_end
    out_tok = req["output_tokens"].to_numpy()
    ttft = np.where(np.isnan(first), end - arr, first - arr)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_tok > 1, (np.where(np.isnan(fin), end, fin) - first)
                        / (out_tok - 1), np.nan)
    miss = (ttft > slo_ttft) | (~np.isnan(first) & (tpot > slo_tpot))
    met = ~np.isnan(fin) & ~miss
    decided = ~np.isnan(fin) | miss
    return {
        "arrivals_per_s": lam,
        "first_tokens_per_s": float(((first >= 0) & (first < window_end)).sum()) / window_end,
        "backlog_growth_per_s": growth,
        "waiting_at_end": w1,
        "overloaded": growth > GROWTH_SHARE * lam and w1 - w0 > GROWTH_SHARE * n,
        "goodput": float(met[sel].sum() / decided[sel].sum()) if decided[sel].any() else math.nan,
        "requests": n,
    }


def close(a: float, b: float, rel: float = 0.01, abs_: float = 0.0) -> bool:
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_)


def check_simulate(res: Outcome, folder: Path, cap: dict | None) -> dict:
    """A single run's verdict against its figures (module docstring)."""
    check_text(res)
    rows = summary_rows(res.stdout)
    s = {k: number(v) for k, v in rows.items()}
    line = next((x for x in res.stdout.splitlines() if x.startswith("verdict: ")), "")
    over = rows.get("overloaded") == "yes"
    res.check(line.startswith("verdict: OVERLOADED") == over,
              f"verdict line agrees with overloaded = {rows.get('overloaded')}")
    req = pd.read_parquet(folder / "requests.parquet")
    meta = json.loads((folder / "summary.json").read_text())["meta"]
    window_end = meta["arrivals_end_s"]  # exact (the table prints 4 digits)
    r = recompute(req, window_end, s["slo_ttft_s"], s["slo_tpot_s"], meta["end_s"])
    for key in ("arrivals_per_s", "first_tokens_per_s"):
        res.check(close(r[key], s[key]), f"{key} {s[key]:g} recomputed {r[key]:.4g}")
    res.check(close(r["backlog_growth_per_s"], s["backlog_growth_per_s"], 0.02, 0.01),
              f"backlog trend {s['backlog_growth_per_s']:g} recomputed "
              f"{r['backlog_growth_per_s']:.4g}")
    res.check(r["overloaded"] == over, f"overloaded recomputed {r['overloaded']}")
    res.check(close(r["goodput"], s["goodput"], 0.002, 1e-4),
              f"goodput {s['goodput']:g} recomputed over the decided {r['goodput']:.4g}")
    ratio = s["first_tokens_per_s"] / s["arrivals_per_s"]
    if over:
        res.check(ratio < 0.95, f"OVERLOADED with first tokens at {ratio:.0%} of arrivals")
    else:
        res.check(ratio >= 0.9, f"not overloaded with first tokens at {ratio:.0%} of arrivals")
    lost = 1 - s["goodput"]
    res.check(lost <= s["ttft_miss_fraction"] + s["tpot_miss_fraction"] + 1e-3,
              f"goodput lost {lost:.4f} <= TTFT {s['ttft_miss_fraction']:g} + TPOT "
              f"{s['tpot_miss_fraction']:g} misses")
    if s["ttft_p50_s"] > s["slo_ttft_s"] and s["goodput"] < 0.5:  # the contradiction
        res.check(over or s["ttft_miss_fraction"] >= 0.5,
                  "TTFT p50 above the SLO and goodput below 0.5: overloaded or TTFT misses")
    if cap is not None and math.isfinite(cap["hi"]):
        if s["arrivals_per_s"] > cap["hi"]:
            res.check(over or s["goodput"] < TARGET,
                      f"offered {s['arrivals_per_s']:.3g} req/s above the capacity "
                      f"{cap['rate']:.3g}: says so")
    return {**s, "verdict": line.removeprefix("verdict: "), "bottleneck": rows["bottleneck"]}


def check_rates(res: Outcome, cap: dict | None) -> pd.DataFrame:
    check_text(res)
    t = table(res.stdout, "config")
    cols = {c.split(" (")[0]: c for c in t.columns}
    res.check("overloaded" in cols and "served_fraction" in cols,
              "sweep table has overloaded and served_fraction")
    f = pd.DataFrame({
        "rate": t[cols["offered"]].map(number),
        "goodput": t[cols["goodput"]].map(number),
        "served_fraction": t[cols["served_fraction"]].map(number),
        "overloaded": t[cols["overloaded"]].map(lambda x: x.split()[0] not in ("no", "0/1")),
        "overloaded_text": t[cols["overloaded"]],
        "tok": t[cols["output_tok_s_per_node"]].map(number),
        "ttft_p50": t[cols["ttft_p50_s"]].map(number),
    })
    res.check(f[["goodput", "served_fraction"]].stack().between(0, 1).all(),
              "goodput and served_fraction within [0, 1]")
    calm = f[~f["overloaded"]].sort_values("rate")
    res.check(calm["tok"].is_monotonic_increasing and (len(calm) < 2 or calm["tok"].nunique()
                                                       == len(calm)),
              f"tok/s per node grows with the rate while not overloaded ({list(calm['tok'])})")
    if cap is not None and math.isfinite(cap["hi"]):
        for rec in f.itertuples():
            if rec.rate > cap["hi"]:
                res.check(rec.overloaded or rec.goodput < TARGET,
                          f"{rec.rate:g} req/s above the capacity {cap['rate']:.3g}: says so")
            if math.isfinite(cap["rate"]) and rec.rate <= cap["rate"]:
                res.check(rec.goodput >= TARGET,
                          f"{rec.rate:g} req/s at or below the capacity {cap['rate']:.3g} "
                          f"meets {TARGET:g} (goodput {rec.goodput:g})")
    return f


def check_capacity(res: Outcome) -> dict:
    check_text(res)
    lines = [x for x in res.stderr.splitlines() if x.startswith("capacity ") and "goodput" in x]
    t = table(res.stdout, "config")
    row = {c.split(" (")[0]: number(v) for c, v in t.iloc[0].items() if c != "config"}
    res.check(len(lines) == row["runs"] and len(lines) > 0,
              f"one progress line with its goodput per rate tried ({len(lines)} lines, "
              f"{row['runs']:g} rates)")
    bound = re.search(r"of at most (\d+)", lines[-1]) if lines else None
    res.check(bound is not None and len(lines) <= int(bound.group(1)),
              f"within the stated bound ({bound.group(1) if bound else '?'} rates)")
    reasons = [x for x in res.stdout.splitlines() if ": no rate meets" in x]
    if math.isfinite(row["rate"]):
        res.check(row["goodput"] >= row["target"] > row["goodput_hi"],
                  f"target holds at lo ({row['goodput']:g}) and fails at hi "
                  f"({row['goodput_hi']:g})")
    else:
        res.check(len(reasons) == 1, "no rate met the target: one line says why")
    return {**row, "lines": lines, "reason": reasons[0] if reasons else ""}


def check_intervals(res: Outcome) -> None:
    """Comparison tables: every fraction's interval within [0, 1] (a row with unit fraction)."""
    check_text(res)
    bad = []
    for line in res.stdout.splitlines():
        if " fraction " in f" {line} ":
            for m in INTERVAL.finditer(line):
                lo, hi = number(m.group(2)), number(m.group(3))
                if not (0 <= lo <= hi <= 1):
                    bad.append(line)
    res.check(not bad, f"fraction intervals within [0, 1] ({bad[:1]})")


def right_aligned(text: str, first: str) -> pd.DataFrame:
    """The right-aligned table (pandas' ``to_string``) whose header starts with ``first``:
    each cell ends where its column's header ends."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith(first))
    head = lines[i]
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+(?: \[[^\]]*\])?", head)]
    names = [head[a:b] for a, b in spans]
    rows = []
    for line in lines[i + 1:]:
        if not line.strip():
            break
        ends = [b for _, b in spans]
        starts = [0, *ends[:-1]]
        rows.append([line[a:b].strip() for a, b in zip(starts, ends, strict=True)])
    return pd.DataFrame(rows, columns=names)


def check_advise(res: Outcome) -> None:
    check_text(res)
    t = right_aligned(res.stdout, "lever")
    cols = {c.split(" [")[0]: c for c in t.columns}
    tok = t[cols["tok_s_per_node"]].map(number)
    gain = t[cols["gain_pct"]].map(number)
    want = 100 * (tok / tok.iloc[0] - 1)
    res.check(np.allclose(gain, want, atol=0.05 + 0.002 * want.abs().max()),
              "each row's gain is its tok/s over the first row's")
    # the operating-point line: prefill tokens per rank, decode running requests per rank
    # (`advise.operating_line`; the table's column is named for the same unit)
    head = re.search(r"^operating point: \w+, ([\d,]+) (?:tokens|running requests) per rank",
                     res.stdout, re.M)
    col = cols.get("tokens_per_rank") or cols.get("requests_per_rank")
    rank = number(t[col].iloc[0]) if col else math.nan
    res.check(head is not None and number(head.group(1)) == rank,
              f"header per rank ({head.group(1) if head else '?'}) = the table's "
              f"{col or 'tokens/requests_per_rank (missing)'} ({rank:g})")


# ------------------------------------------------------------------ docs
def fmt_s(x: float) -> str:
    return f"{x:.3g} s" if x < 100 else f"{x:,.0f} s"


def comments(got: dict) -> dict[str, str]:
    """The figures the README block and the docs paragraph carry, from the runs."""
    sim, s40, cap, rates = got["sim"], got["sim40"], got["capacity"], got["rates"]

    def state(s: dict) -> str:
        return (f"OVERLOADED (bottleneck {s['bottleneck']})" if s["overloaded"]
                else "not overloaded")

    cap_rate = (f"{cap['rate']:.3g} req/s" if math.isfinite(cap["rate"])
                else "no rate (see its reason line)")
    over = rates[rates["overloaded"]]
    return {
        "sim_comment": (
            "# simulate a PD-disaggregated cluster (a preset or a TOML ClusterConfig): requests "
            "arrive for\n# 2 minutes, then the run finishes what was admitted (--drain, "
            "default max(--duration, 600 s));\n"
            f"# these ~5k-token multi-turn prompts at their 10 req/s: {state(sim)}, TTFT p50 "
            f"{fmt_s(sim['ttft_p50_s'])},\n# goodput {sim['goodput']:.3f}"),
        "sim40_comment": (
            f"# the same prompts at 40 req/s: {state(s40)}, TTFT p50 "
            f"{fmt_s(s40['ttft_p50_s'])}, goodput {s40['goodput']:.3f}\n"
            "# (the verdict line says why: arrival and completion rates, the growing queue)"),
        "rates_comment": (
            "# a rate sweep (table + plot; overloaded and served_fraction per rate): "
            + (f"overloaded from {over['rate'].min():g} req/s" if len(over)
               else "no rate overloaded")),
        "capacity_comment": (
            f"# the largest rate within the SLO at 90% goodput: {cap_rate} on one Day-6 "
            "prefill + decode unit\n# (each rate's goodput printed as it runs)"),
        "cap_rate": cap_rate,
    }


def readme_block(got: dict) -> str:
    c = comments(got)
    lines = ["<!-- readme: long -->", "```bash"]  # long: tests/test_readme.py leaves it out
    for name, cmd, comment in EXAMPLES:
        text = comment.format(**c)
        if name in ("sim", "counterfactual", "advise") and lines[-1] != "```bash":
            lines.append("")
        if text:
            lines.append(text)
        lines.append(cmd)
    lines.append("```")
    return "\n".join(lines)


def doc_paragraph(got: dict) -> str:
    sim, s40, cap = got["sim"], got["sim40"], got["capacity"]
    c = comments(got)
    wl = got["synth_stats"]
    load = "OVERLOADED" if sim["overloaded"] else "without overload"
    verdict40 = (f"OVERLOADED, bottleneck {s40['bottleneck']}" if s40["overloaded"]
                 else "not overloaded")
    return textwrap.fill(
        f"**The README example.** `eplb workload synth -n 1200 --rate 10 --hit-rate 0.56 "
        f"--seed 1` makes multi-turn prompts of {wl['mean']:,.0f} tokens on average (p99 "
        f"{wl['p99']:,.0f}). At their own rate (`--duration 120`: requests arrive for 120 s, "
        f"then the run drains what was admitted, here {fmt_s(sim['drain_s'])}) one Day-6 "
        f"prefill and decode unit serve them {load}: "
        f"TTFT p50 {fmt_s(sim['ttft_p50_s'])}, goodput {sim['goodput']:.3f}, KV hit rate "
        f"{sim['kv_hit_rate']:.2f}, {sim['censored']:.0f} requests censored. `--capacity` on the "
        f"same file finds {c['cap_rate']} at 90% goodput (bracket "
        f"[{cap['lo']:.3g}, {cap['hi']:.3g}] req/s, {cap['runs']:.0f} rates simulated). At "
        f"`--rate 40` (the {s40['requests']:,.0f} requests arrive in "
        f"{s40['arrival_window_s']:.3g} s) the verdict is "
        f"{verdict40}: {s40['arrivals_per_s']:.3g} req/s arrive while first tokens come at "
        f"{s40['first_tokens_per_s']:.3g} req/s, the requests waiting for a first token grow "
        f"by {s40['backlog_growth_per_s']:.3g} req/s to {s40['waiting_at_end']:,.0f} when "
        f"arrivals stop; TTFT p50 {fmt_s(s40['ttft_p50_s'])}, goodput {s40['goodput']:.3f}. "
        "Before this verdict (issue 34) the same run printed `overloaded no`: it compared the "
        "queue at the start and the end of the whole run, after the burst had drained. (All "
        "figures from `python scripts/serving_examples.py --write-docs`, which runs the "
        "README's commands as written and checks every verdict against its figures.)",
        width=95, break_on_hyphens=False, break_long_words=False)


# ------------------------------------------------------------------ main
def examples(tiny: bool) -> list[tuple[str, str, str]]:
    if not tiny:
        return EXAMPLES
    out = []
    for name, cmd, comment in EXAMPLES:
        if name in TINY_SKIP:
            continue
        for a, b in TINY_SUB:
            cmd = cmd.replace(a, b)
        out.append((name, cmd, comment))
    return out


def write_tiny_config(cwd: Path) -> None:
    """The one-node cluster the --tiny examples run on (tests/test_serving_capacity.tiny)."""
    from eplb.evaluation.serving import ClusterConfig
    from eplb.evaluation.serving.config import EplbConfig, SLOConfig, UnitConfig

    base = ClusterConfig.deepseek_day6()
    base.replace(
        prefill=UnitConfig(nodes=1, slots_per_layer=256, token_budget=2048,
                           balancer="round_robin"),
        decode=UnitConfig(nodes=1, slots_per_layer=256, max_running_requests=64,
                          kv_capacity_tokens=base.decode.kv_capacity_tokens,
                          balancer="round_robin"),
        eplb=EplbConfig(solver="balanced"), slo=SLOConfig(ttft_s=2.0, tpot_s=1.0),
        name="tiny",
    ).write_toml(cwd / "tiny.toml")


def run_all(tiny: bool = False, only: set[str] | None = None, shared: Path | None = None,
            runner=None) -> tuple[list[Outcome], dict]:
    """Run the examples in order, check each; returns the outcomes and the parsed figures."""
    shared = shared or requests_dir().resolve().parent
    cwd = scratch(shared)
    try:
        if tiny:
            write_tiny_config(cwd)
        todo = examples(tiny)
        order = ["synth", "capacity"] + [n for n, _, _ in todo if n not in ("synth", "capacity")]
        cmds = {n: c for n, c, _ in todo}
        outcomes: dict[str, Outcome] = {}
        got: dict = {}
        for name in order:
            if name not in cmds or (only and name not in only and name not in ("synth",)):
                continue
            res = outcomes[name] = run(name, cmds[name], cwd, runner)
            print(f"{name}: {res.wall_s:.1f} s wall, exit {res.code}", file=sys.stderr)
            if res.code != 0:
                continue
            cap = got.get("capacity")
            if name == "synth":
                from eplb.evaluation.serving import workload

                x = workload.read(cwd / "day.parquet").requests["input_tokens"]
                got["synth_stats"] = {"mean": float(x.mean()), "p99": float(x.quantile(0.99))}
            elif name == "capacity":
                got[name] = check_capacity(res)
            elif name in ("sim", "sim40"):
                folder = cwd / cmds[name].split(" -o ")[1].split()[0]
                got[name] = check_simulate(res, folder, cap)
            elif name == "rates":
                got[name] = check_rates(res, cap)
            elif name == "counterfactual":
                check_intervals(res)
            elif name.startswith("advise"):
                check_advise(res)
            else:
                check_text(res)
        return [outcomes[n] for n in order if n in outcomes], got
    finally:
        shutil.rmtree(cwd.parent, ignore_errors=True)


def report(outcomes: list[Outcome]) -> int:
    bad = 0
    for res in outcomes:
        print(f"\n$ {res.command}   ({res.wall_s:.1f} s)")
        for ok, what in res.checks:
            print(f"  [{'ok' if ok else 'FAIL'}] {what}")
            bad += not ok
    passed = sum(len(r.checks) for r in outcomes) - bad
    print(f"\n{passed} checks passed, {bad} failed")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write-docs", action="store_true", help="write README and docs blocks")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 when a check fails or a doc block is stale")
    ap.add_argument("--tiny", action="store_true", help="a one-node cluster, 160 requests")
    ap.add_argument("--only", help="comma-separated example names (synth always runs)")
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    start = time.perf_counter()
    outcomes, got = run_all(args.tiny, only)
    bad = report(outcomes)
    print(f"wall {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if args.tiny or only or not (args.write_docs or args.check):
        return 1 if bad else 0
    if any(k not in got for k in ("sim", "sim40", "capacity", "rates")):
        return 1
    stale = update_doc(README, {"serving-examples": readme_block(got)}, check=args.check,
                       script="serving_examples.py --write-docs")
    stale |= update_doc(DOC, {"readme-example": doc_paragraph(got)}, check=args.check,
                        script="serving_examples.py --write-docs")
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main())
