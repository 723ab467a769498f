"""Calibrate the serving step-time model on SGLang's 96 x H100 run; check it on what it did not fit.

Pinned (four constants of `evaluation.serving.config.hardware.KernelFit` and the prefill
attention table, read off aiconfigurator's measured H100 SGLang kernel tables by
`pin_kernels`, each with the interval its rows span): the dense and grouped GEMM efficiencies,
prefill attention, the small kernels' layer overhead. Fitted (one constant, the engine
efficiency: compute in the serving engine over the kernels' standalone speed; least squares on
four log residuals; SGLang blog, lm-sys/lm-sys.github.io @2db4e40,
blog/2025-05-05-large-scale-ep.md): the 4K prefill level with "simulated perfect EPLB" (59,337
tok/s/node, EP32, 16,384 tokens per GPU, the only balanced measurement), the 1K/4K and 2K/4K
throughput *ratios* of SGLang's real-routing prefill runs (57,674 / 54,543 / 50,302: their
common routing imbalance cancels to first order) and the EP72 decode run (22,282 tok/s/node, 256
requests at 2,000 input tokens, context 2,050 on average). The model runs all of them with
perfectly balanced routing. Every fitted point is reported in sample and leave-one-out (the
constant refitted without it, from every start in `STARTS`, the worst reported); the fitted
constant with the interval over which every point stays within `LOO_TOL`.

Not fitted: the prediction row (DeepSeek's profile decode, EP128 on H800, as SGLang derived
it), one row that is the fitted level itself (DeepSeek's profile prefill: on H800 the model's
prefill equals its H100 prefill, so it is no prediction) and out-of-sample before/after pairs
nobody fitted: SGLang's two-batch-overlap ablations and DeepSeek's Day-6 per-node throughputs
over every prompt-length spread that matches Day 6's published traffic figures. (SGLang's EPLB
speedups and TensorRT-LLM's imbalance are predicted by `advise`: scripts/advise_published.py.)

Run: ``python scripts/calibrate_serving.py [--fit] [--check] [--write-doc] [--skip-day6]``:
``--check`` re-pins and refits and exits 1 if a stored constant or the attention table differs
from them by more than 1%, a fitted point's in-sample or leave-one-out error exceeds
``LOO_TOL``, the prediction misses by more than ``PREDICTION_TOL``, or (a run with every check)
a table in docs/serving-calibration.md differs from this run; ``--write-doc`` rewrites them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from docblock import update_doc
from pin_kernels import pin_all

ROOT = Path(__file__).resolve().parent.parent

from eplb.evaluation.serving import ClusterConfig, steady_state  # noqa: E402
from eplb.evaluation.serving.config import hardware as hw_mod  # noqa: E402
from eplb.evaluation.serving.config.hardware import FITTED, KernelFit  # noqa: E402

LOO_TOL = 0.15  # bound on every fitted point's in-sample and leave-one-out error
PREDICTION_TOL = 0.25  # bound on the prediction rows (published figures nobody fitted)
FIT_DRIFT_TOL = 0.01  # stored constants vs a fresh fit
DOC = ROOT / "docs" / "serving-calibration.md"

SGLANG = "SGLang blog 2025-05-05 (lm-sys.github.io @2db4e40)"
DEEPSEEK = "DeepSeek profile-data, as derived in the SGLang blog"


@dataclass(frozen=True)
class Case:
    """One published throughput and how to run it."""

    kind: str  # calibration | prediction | same (the model's number is a fitted one)
    label: str
    config: str  # sglang | deepseek_profile
    phase: str
    published: float  # tok/s per node
    source: str
    kwargs: tuple = ()
    real_routing: bool = False  # published with SGLang's real (imbalanced) routing

    def run(self, fit: KernelFit) -> dict:
        cfg = _config(self.config, fit)
        return steady_state(cfg, self.phase, **dict(self.kwargs))


CASES = (
    Case(
        "calibration",
        "prefill EP32, 1K prompts",
        "sglang",
        "prefill",
        57674.0,
        SGLANG,
        (("input_tokens", 1024),),
        True,
    ),
    Case(
        "calibration",
        "prefill EP32, 2K prompts",
        "sglang",
        "prefill",
        54543.0,
        SGLANG,
        (("input_tokens", 2048),),
        True,
    ),
    Case(
        "calibration",
        "prefill EP32, 4K prompts",
        "sglang",
        "prefill",
        50302.0,
        SGLANG,
        (("input_tokens", 4096),),
        True,
    ),
    Case(
        "calibration",
        "prefill EP32, 4K, simulated perfect EPLB",
        "sglang",
        "prefill",
        59337.0,
        SGLANG,
        (("input_tokens", 4096),),
    ),
    Case(
        "calibration",
        "decode EP72, 256 req, 2K input",
        "sglang",
        "decode",
        22282.0,
        SGLANG,
        (("batch", 256), ("kv_tokens", 2050)),
    ),
    Case(
        "same",
        "prefill EP32, 16K tok/GPU, 4K prompts",
        "deepseek_profile",
        "prefill",
        62713.0,
        DEEPSEEK,
        (("input_tokens", 4096),),
    ),
    Case(
        "prediction",
        "decode EP128, 128 req, 4K context, MTP",
        "deepseek_profile",
        "decode",
        18598.0,
        DEEPSEEK,
        (("batch", 128), ("kv_tokens", 4096)),
    ),
)


def _config(name: str, fit: KernelFit) -> ClusterConfig:
    hw_mod.HARDWARE.update({k: v.with_fit(fit) for k, v in _BASE.items()})
    if name == "sglang":
        return ClusterConfig.sglang_96xh100()
    base = ClusterConfig.deepseek_day6()
    decode = replace(
        base.decode,
        nodes=16,
        slots_per_layer=256,
        mtp_draft_tokens=1,
        mtp_acceptance=0.6,
        max_running_requests=128,
    )
    return base.replace(decode=decode, name="deepseek_profile")


_BASE = dict(hw_mod.HARDWARE)


@dataclass(frozen=True)
class Point:
    """One fitted residual: a published quantity and the model's value of it."""

    name: str
    published: float
    unit: str
    cases: tuple[str, ...]  # labels of the CASES it needs

    def model(self, tput: dict[str, float]) -> float:
        """The model's value from balanced tok/s per node of the cases (``tput``)."""
        if len(self.cases) == 1:
            return tput[self.cases[0]]
        num, den = self.cases
        return tput[num] / tput[den]


_REAL = {c.label: c for c in CASES}
POINTS = (
    Point(
        "4K prefill level, simulated perfect EPLB",
        59337.0,
        "tok/s/node",
        ("prefill EP32, 4K, simulated perfect EPLB",),
    ),
    Point(
        "1K / 4K prefill ratio (real-routing runs)",
        57674.0 / 50302.0,
        "ratio",
        ("prefill EP32, 1K prompts", "prefill EP32, 4K prompts"),
    ),
    Point(
        "2K / 4K prefill ratio (real-routing runs)",
        54543.0 / 50302.0,
        "ratio",
        ("prefill EP32, 2K prompts", "prefill EP32, 4K prompts"),
    ),
    Point(
        "decode level, 256 req, 2K input",
        22282.0,
        "tok/s/node",
        ("decode EP72, 256 req, 2K input",),
    ),
)


def _throughputs(f: KernelFit, labels) -> dict[str, float]:
    try:
        return {lab: _REAL[lab].run(f)["tok_s_per_node"] for lab in labels}
    finally:
        hw_mod.HARDWARE.update(_BASE)


def point_values(f: KernelFit, points=POINTS) -> list[float]:
    """The model's value of each point under the constants ``f``."""
    labels = sorted({lab for p in points for lab in p.cases})
    tput = _throughputs(f, labels)
    return [p.model(tput) for p in points]


FITTED_NAME = "engine_efficiency"  # the one constant fitted end to end
STARTS = (0.3, 0.6, 0.9, 1.2)  # starting values of every fit (each fit is run from all)
BOUNDS = (0.1, 1.5)  # the fitted constant's search range


def pinned_fit() -> tuple[KernelFit, dict, tuple]:
    """The constants the kernel tables pin (`pin_kernels.pin_all`), ``engine_efficiency`` at
    1, with each `pin_kernels.Pinned` and the prefill attention table."""
    pins, table, _ = pin_all()
    f = KernelFit(
        gemm_efficiency=pins["gemm_efficiency"].value,
        prefill_attention_tflops=pins["prefill_attention_tflops"].value,
        layer_overhead_s=pins["layer_overhead_s"].value,
        grouped_gemm_efficiency=pins["grouped_gemm_efficiency"].value,
    )
    return f, pins, table


def _residuals(base: KernelFit, points) -> callable:
    def residuals(x):
        vals = point_values(replace(base, engine_efficiency=float(x[0])), points)
        return [np.log(v / p.published) for v, p in zip(vals, points, strict=True)]

    return residuals


def fit_from(start: float, exclude: str | None = None, base: KernelFit | None = None) -> KernelFit:
    """Least squares on the log residuals of the fitted points (all, or all but ``exclude``)
    for ``engine_efficiency`` from ``start``, the pinned constants fixed (``base``: the
    stored ones)."""
    from scipy.optimize import least_squares

    points = [p for p in POINTS if p.name != exclude]
    if len(points) == len(POINTS) and exclude is not None:
        raise ValueError(f"no fitted point named {exclude!r}")
    base = FITTED if base is None else base
    res = least_squares(_residuals(base, points), x0=[start], bounds=([BOUNDS[0]], [BOUNDS[1]]),
                        x_scale=[0.1])
    return replace(base, engine_efficiency=float(res.x[0]))


def fit(exclude: str | None = None, base: KernelFit | None = None) -> KernelFit:
    """`fit_from` every start in `STARTS`; the fit with the smallest residual (the fits agree
    to the solver's tolerance: one constant, a one-dimensional least squares)."""
    base = FITTED if base is None else base
    points = [p for p in POINTS if p.name != exclude]
    fits = [fit_from(x0, exclude, base) for x0 in STARTS]
    cost = [float(np.sum(np.square(_residuals(base, points)([f.engine_efficiency]))))
            for f in fits]
    return fits[int(np.argmin(cost))]


def leave_one_out(stored: KernelFit = FITTED) -> list[dict]:
    """Per fitted point: its in-sample error (stored constants) and its error when
    ``engine_efficiency`` is fitted without it, from every start in `STARTS`: the worst over
    the starts is the row's leave-one-out error (``loo_starts``: each start's error)."""
    inside = point_values(stored)
    rows = []
    for p, v in zip(POINTS, inside, strict=True):
        fits = [fit_from(x0, p.name, stored) for x0 in STARTS]
        outs = [point_values(f, [p])[0] for f in fits]
        errs = [o / p.published - 1 for o in outs]
        k = int(np.argmax(np.abs(errs)))
        rows.append(
            {
                "point": p.name,
                "unit": p.unit,
                "published": p.published,
                "in_sample": v,
                "in_sample_error": v / p.published - 1,
                "loo": outs[k],
                "loo_error": errs[k],
                "loo_fit": fits[k],
                "loo_starts": [(x0, f.engine_efficiency, e)
                               for x0, f, e in zip(STARTS, fits, errs, strict=True)],
            }
        )
    return rows


def fitted_interval(stored: KernelFit = FITTED, tol: float = LOO_TOL, step: float = 0.01
                    ) -> tuple[float, float]:
    """The range of ``engine_efficiency`` around the stored value over which every fitted
    point's in-sample error stays within ``tol`` (the pinned constants fixed): walked outward
    by ``step`` within `BOUNDS`, each edge refined by bisection to 1e-4. NaN when the stored
    value itself misses ``tol``."""
    def ok(x: float) -> bool:
        vals = point_values(replace(stored, engine_efficiency=x))
        return all(abs(v / p.published - 1) <= tol for v, p in zip(vals, POINTS, strict=True))

    x0 = stored.engine_efficiency
    if not ok(x0):
        return (float("nan"), float("nan"))
    edges = []
    for sign, bound in ((-1, BOUNDS[0]), (1, BOUNDS[1])):
        inside = x0
        while True:
            nxt = inside + sign * step
            if (nxt - bound) * sign > 0:
                edges.append(bound if ok(bound) else _bisect(ok, inside, bound))
                break
            if not ok(nxt):
                edges.append(_bisect(ok, inside, nxt))
                break
            inside = nxt
    return edges[0], edges[1]


def _bisect(ok, inside: float, outside: float) -> float:
    """The last point where ``ok`` holds between ``inside`` (it does) and ``outside`` (it does
    not), to 1e-4."""
    while abs(outside - inside) > 1e-4:
        mid = (inside + outside) / 2
        inside, outside = (mid, outside) if ok(mid) else (inside, mid)
    return inside


def drift(stored: KernelFit, fresh: KernelFit) -> dict[str, float]:
    """Relative difference of each constant (overhead in units of 1 us when tiny)."""
    out = {}
    for name in ("gemm_efficiency", "grouped_gemm_efficiency", "prefill_attention_tflops",
                 "layer_overhead_s", "engine_efficiency"):
        a, b = getattr(stored, name), getattr(fresh, name)
        scale = max(abs(b), 1e-6 if name == "layer_overhead_s" else 1e-12)
        out[name] = abs(a - b) / scale
    return out


def table_drift(table: tuple) -> float:
    """Largest relative difference between the stored prefill attention table
    (`hardware.SGLANG_MLA_PREFILL_H100`) and ``table`` (a fresh derivation); 1 when their
    lengths differ."""
    stored = hw_mod.SGLANG_MLA_PREFILL_H100
    if [r[0] for r in stored] != [r[0] for r in table]:
        return 1.0
    return max(abs(a[1] - b[1]) / b[1] for a, b in zip(stored, table, strict=True))


def constants_table() -> str:
    """The effective all-to-all constants each preset derives from its published tables."""
    lines = [
        "| GPU | kernel | EP | dispatch | combine | derived from |",
        "|---|---|---|---|---|---|",
    ]
    for hw in _BASE.values():
        for ep, dnv, cnv, drd, crd in hw.normal_a2a:
            if np.isnan(drd):
                lines.append(
                    f"| {hw.name} | normal, NVLink | {ep} | {dnv:.1f} GB/s | "
                    f"{cnv:.1f} GB/s | {_origin(hw, 'normal', ep)} |"
                )
            else:
                lines.append(
                    f"| {hw.name} | normal, RDMA | {ep} | {drd:.1f} GB/s | "
                    f"{crd:.1f} GB/s | {_origin(hw, 'normal', ep)} |"
                )
        for ep, d, c in hw.ll_a2a:
            lines.append(
                f"| {hw.name} | low-latency, {hw.ll_tokens} tokens | {ep} | "
                f"{d * 1e6:.0f} us | {c * 1e6:.0f} us | {_origin(hw, 'll', ep)} |"
            )
    return "\n".join(lines)


def _origin(hw, kernel: str, ep: int) -> str:
    if hw.name == "h800":
        if kernel == "ll":
            return "DeepEP README, as published"
        d, c = hw_mod.DEEPEP_NORMAL_H800[ep]
        f = "7/8" if ep == 8 else f"{ep // 8 - 1}/{ep // 8}"
        return f"DeepEP README {d:g} / {c:g} GB/s x {f}"
    if kernel == "ll":
        return "aiconfigurator, as published"
    d, c = hw_mod.AIC_NORMAL_H100[ep // 8]
    return f"aiconfigurator {d * 1e3:g} / {c * 1e3:g} ms at 4,096 tokens"


# ------------------------------------------------------------------ rows that are not fits
def other_rows(f: KernelFit = FITTED) -> list[dict]:
    """The DeepSeek profile rows: the decode prediction and the prefill row that is the
    fitted 4K level itself (same number on both GPUs)."""
    rows = []
    for case in CASES:
        if case.config != "deepseek_profile":
            continue
        try:
            model = case.run(f)["tok_s_per_node"]
        finally:
            hw_mod.HARDWARE.update(_BASE)
        rows.append(
            {
                "kind": case.kind,
                "case": case.label,
                "published": case.published,
                "model": model,
                "error": model / case.published - 1,
                "source": case.source,
            }
        )
    return rows


# ---------------------------------------------------------- out-of-sample before/after pairs
def _ratio_error(model: float, lo: float, hi: float) -> float:
    """Relative error of ``model`` against a published value or range ``[lo, hi]``."""
    if lo <= model <= hi:
        return 0.0
    ref = lo if model < lo else hi
    return model / ref - 1


def tbo_checks(f: KernelFit = FITTED) -> list[dict]:
    """SGLang's two-batch-overlap ablations: throughput with TBO over without."""
    cases = (
        (
            "prefill TBO, EP32, 16K tok/GPU, 4K prompts",
            "prefill",
            {"input_tokens": 4096},
            None,
            (1.27, 1.35),
            "+27% to +35%",
        ),
        (
            "decode TBO, EP72, 256 req, 2K",
            "decode",
            {"batch": 256, "kv_tokens": 2050},
            None,
            (1.255, 1.255),
            "22,310 vs 17,777 (+25.5%)",
        ),
        (
            "decode TBO, EP72, 32 req, 2K",
            "decode",
            {"batch": 32, "kv_tokens": 2050},
            None,
            (0.73, 0.73),
            "-27%",
        ),
        (
            "decode TBO, EP72, 128 req, 4K, simulated MTP",
            "decode",
            {"batch": 128, "kv_tokens": 4096},
            (1, 0.6),
            (17552 / 12929,) * 2,
            "17,552 vs 12,929",
        ),
    )
    rows = []
    try:
        for label, phase, kw, mtp, (lo, hi), pub in cases:
            cfg = _config("sglang", f)
            unit = cfg.unit(phase)
            if mtp is not None:
                unit = replace(unit, mtp_draft_tokens=mtp[0], mtp_acceptance=mtp[1])
            two = steady_state(cfg.replace(**{phase: unit}), phase, **kw)["tok_s_per_node"]
            one_unit = replace(unit, micro_batches=1)
            one = steady_state(cfg.replace(**{phase: one_unit}), phase, **kw)["tok_s_per_node"]
            ratio = two / one
            rows.append(
                {
                    "case": label,
                    "published": pub,
                    "model": f"{two:,.0f} vs {one:,.0f} ({ratio - 1:+.1%})",
                    "error": _ratio_error(ratio, lo, hi),
                    "on": "TBO / no TBO",
                }
            )
    finally:
        hw_mod.HARDWARE.update(_BASE)
    return rows


DAY6_SIGMAS = (1.0, 1.25, 1.5)  # prompt-length spreads (lognormal sigma) Day 6 did not publish


def day6_checks(f: KernelFit = FITTED, sigmas=DAY6_SIGMAS, requests: int = 4000) -> list[dict]:
    """DeepSeek's Day-6 per-node throughputs against the Day-6 preset on a length mix refitted
    for each prompt-length spread to Day 6's hit rate, input/output ratio and KV length per
    output token (`workload.day6.fit_mix`); the result is a range over the spreads."""
    from eplb.evaluation.serving.workload import day6

    got = {"prefill": [], "decode": []}
    fits = []
    try:
        cfg = ClusterConfig.deepseek_day6()
        hw_mod.HARDWARE.update({k: v.with_fit(f) for k, v in _BASE.items()})
        for sigma in sigmas:
            saved = dict(day6.FIXED)
            day6.FIXED["input_sigma"] = sigma  # fit_mix reads the module's fixed parameters
            try:
                params = day6.fit_mix(
                    day6.DAY6["io_ratio"], num_requests=requests, iterations=6, seed=0
                )
            finally:
                day6.FIXED.clear()
                day6.FIXED.update(saved)
            wl = day6.day6_workload(
                requests, 10.0, seed=0, input_sigma=sigma, **{k: v for k, v in params.items()}
            )
            stats = day6.mix_stats(wl)
            fits.append((sigma, stats))
            got["prefill"].append(steady_state(cfg, "prefill", mix=wl)["input_tok_s_per_node"])
            got["decode"].append(steady_state(cfg, "decode", mix=wl)["tok_s_per_node"])
    finally:
        hw_mod.HARDWARE.update(_BASE)
    rows = []
    for phase, pub, unit in (
        ("prefill", day6.DAY6["prefill_input_tok_s_per_node"], "input tok/s/node (hits included)"),
        ("decode", day6.DAY6["decode_output_tok_s_per_node"], "output tok/s/node"),
    ):
        vals = got[phase]
        errs = [v / pub - 1 for v in vals]
        rows.append(
            {
                "case": f"Day-6 {phase}, Day-6 preset, sigma "
                + " / ".join(f"{s:g}" for s in sigmas),
                "published": f"{pub:,.0f}",
                "model": " / ".join(f"{v:,.0f}" for v in vals),
                "error": max(errs, key=abs),
                "error_range": (min(errs), max(errs)),
                "on": unit,
            }
        )
    rows[0]["fits"] = fits
    return rows


# ------------------------------------------------------------------------------ tables
def fitted_table(loo: list[dict], f: KernelFit) -> str:
    lines = [
        "| fitted point | published | model, in sample | in-sample error | "
        "model, leave-one-out (worst start) | leave-one-out error, worst start | "
        "engine_efficiency refitted without it (over the starts) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in loo:
        fmt = "{:,.0f}" if r["unit"] != "ratio" else "{:.4f}"
        engines = [e for _, e, _ in r["loo_starts"]]
        lines.append(
            f"| {r['point']} ({r['unit']}) | {fmt.format(r['published'])} | "
            f"{fmt.format(r['in_sample'])} | {r['in_sample_error']:+.1%} | "
            f"{fmt.format(r['loo'])} | {r['loo_error']:+.1%} | "
            f"{min(engines):.4f} to {max(engines):.4f} |"
        )
    worst = max(loo, key=lambda r: abs(r["loo_error"]))
    lines += [
        "",
        f"One constant is fitted: engine_efficiency = {f.engine_efficiency:.3f}; the four others "
        "are pinned by kernel tables (the constants table under \"Calibration constants\"). "
        "Leave-one-out: engine_efficiency refitted on "
        f"the other three points from each of the starts {', '.join(f'{x:g}' for x in STARTS)}"
        ", then the left-out point computed; the worst start is shown. Worst leave-one-out "
        f"error over every point and start: {worst['loo_error']:+.1%} ({worst['point']}). "
        f"Bound checked by `--check`: {LOO_TOL:.0%} on every error in this table.",
    ]
    return "\n".join(lines)


def kernel_constants_table(f: KernelFit, pins: dict, interval: tuple[float, float],
                           spread: dict) -> str:
    """Every constant of `KernelFit` with its interval and source (pinned: the spread of the
    kernel rows it is read from; fitted: the values within the residual tolerance)."""
    def num(name: str, v: float) -> str:
        return f"{v * 1e6:.1f} us" if name == "layer_overhead_s" else f"{v:.3f}" \
            if v < 10 else f"{v:,.0f}"

    lines = [
        "| constant | value | interval | how it is set | source |",
        "|---|---|---|---|---|",
    ]
    for name, p in pins.items():
        lo, hi = p.interval
        lines.append(f"| `{name}` | {num(name, getattr(f, name))} | {num(name, lo)} to "
                     f"{num(name, hi)} (the rows' spread) | pinned: {p.how} | {p.source} |")
    lo, hi = interval
    lines.append(
        f"| `engine_efficiency` | {f.engine_efficiency:.3f} | {lo:.3f} to {hi:.3f} (every "
        f"fitted point within {LOO_TOL:.0%}) | fitted end to end: least squares on the four "
        "points' log errors, the other constants fixed; no table measures it | SGLang blog "
        "2025-05-05 (lm-sys.github.io @2db4e40) |")
    lines.append(
        "| `step_overhead_s` | 0 | - | not fitted (CUDA graphs and overlapped scheduling hide "
        "it) | - |")
    rows = ", ".join(f"{k:,}: {v:.0f}" for k, v in hw_mod.SGLANG_MLA_PREFILL_H100)
    spreads = ", ".join(f"{k:,}: {a:.0f}-{b:.0f}" for k, (a, b) in spread.items())
    lines += [
        "",
        f"Prefill attention by prompt length (`Hardware.prefill_attention`, TFLOPS before "
        f"engine_efficiency): {rows}; spread over the 1-32 prompts measured per length: "
        f"{spreads}.",
    ]
    return "\n".join(lines)


def other_table(rows: list[dict]) -> str:
    lines = [
        "| row | what it is | published tok/s/node | model | error |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        what = (
            "prediction: nothing fitted on it, no fitted number reused"
            if r["kind"] == "prediction"
            else "not a prediction: the model's number is the fitted 4K level (above)"
        )
        lines.append(
            f"| {r['case']} (H800) | {what} | {r['published']:,.0f} | {r['model']:,.0f} | "
            f"{r['error']:+.1%} |"
        )
    return "\n".join(lines)


def check_table(rows: list[dict]) -> str:
    lines = [
        "| out-of-sample check (nobody fitted it) | compared | published | model | error |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "error_range" in r:
            lo, hi = r["error_range"]
            err = f"{lo:+.1%} to {hi:+.1%}"
        else:
            err = f"{r['error']:+.1%}"
        lines.append(f"| {r['case']} | {r['on']} | {r['published']} | {r['model']} | {err} |")
    lines += [
        "",
        "Errors are model / published - 1 (TBO: on the with / without throughput ratio, 0 "
        "inside a published range; Day 6: the range over the prompt-length spreads).",
    ]
    for r in rows:
        if r.get("fits"):
            lines.append("")
        for sigma, st in r.get("fits", ()):
            lines.append(
                f"- Day-6 mix at prompt sigma {sigma:g}: prefix-hit rate {st['hit_rate']:.3f} "
                f"(Day 6: {342 / 608:.3f}), input / output {st['io_ratio']:.2f} "
                f"({608 / 168:.2f}), KV length per output token {st['kv_per_output']:,.0f} "
                f"(4,989), mean prompt {st['input_mean']:,.0f}, mean output "
                f"{st['output_mean']:,.0f} tokens."
            )
    return "\n".join(lines)


# table -> its block in DOC (`<!-- KEY:begin -->` ... `<!-- KEY:end -->`)
BLOCKS = {
    "fitted": "fitted-table",
    "kernel": "kernel-constants-table",
    "other": "other-table",
    "checks": "checks-table",
    "constants": "constants-table",
}


def write_doc(bodies: dict[str, str]) -> None:
    """Put each table of ``bodies`` (keys of `BLOCKS`) into its block of `DOC`."""
    update_doc(DOC, {BLOCKS[k]: body for k, body in bodies.items()}, check=False,
               script="calibrate_serving.py --write-doc")


def failures(fresh: KernelFit | None, loo: list[dict], other: list[dict],
             table: tuple | None = None) -> list[str]:
    """What `--check` fails on: drift of the stored constants from the kernel tables' pins
    and the fit, of the stored prefill attention table from ``table`` (a fresh derivation), a
    fitted point's in-sample or leave-one-out error over ``LOO_TOL``, the prediction over
    ``PREDICTION_TOL``."""
    bad = []
    if fresh is not None:
        for name, d in drift(FITTED, fresh).items():
            if d > FIT_DRIFT_TOL:
                bad.append(f"stored {name} differs from the pin/fit by {d:.1%}")
    if table is not None and table_drift(table) > FIT_DRIFT_TOL:
        bad.append("stored SGLANG_MLA_PREFILL_H100 differs from the kernel table's derivation")
    for r in loo:
        for key in ("in_sample_error", "loo_error"):
            if abs(r[key]) > LOO_TOL:
                bad.append(
                    f"'{r['point']}' {key.replace('_', ' ')} {r[key]:+.1%} exceeds {LOO_TOL:.0%}"
                )
    for r in other:
        if r["kind"] == "prediction" and abs(r["error"]) > PREDICTION_TOL:
            bad.append(f"prediction '{r['case']}' misses by {r['error']:+.1%}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true", help="fit the constants and print them")
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the stored fit drifted or a stated bound is missed",
    )
    ap.add_argument("--skip-day6", action="store_true", help="leave out the Day-6 range (~1 min)")
    ap.add_argument(
        "--write-doc", action="store_true", help="rewrite the tables in docs/serving-calibration.md"
    )
    args = ap.parse_args(argv)
    base, pins, table = pinned_fit()
    _, _, spread = pin_all()
    fresh = fit(base=base) if (args.fit or args.check) else None
    for p in pins.values():
        lo, hi = p.interval
        print(f"pinned {p.name} = {p.value:.4g} (rows {lo:.4g} to {hi:.4g}): {p.source}")
    if fresh is not None:
        print(f"fit: engine_efficiency={fresh.engine_efficiency:.4f}")
    loo = leave_one_out(FITTED)
    interval = fitted_interval(FITTED)
    other = other_rows(FITTED)
    checks = tbo_checks(FITTED)
    complete = not args.skip_day6
    if not args.skip_day6:
        checks += day6_checks(FITTED)
    bodies = {
        "fitted": fitted_table(loo, FITTED),
        "kernel": kernel_constants_table(FITTED, pins, interval, spread),
        "other": other_table(other),
        "checks": check_table(checks),
        "constants": constants_table(),
    }
    for key in ("kernel", "fitted", "other", "checks"):
        print(bodies[key], end="\n\n")
    if args.write_doc:
        if not complete:
            raise SystemExit("--write-doc needs every check: drop --skip-day6")
        write_doc(bodies)
        print(f"wrote {DOC.relative_to(ROOT)}")
    if args.check:
        bad = failures(fresh, loo, other, table)
        if complete and not args.write_doc:
            stale = update_doc(DOC, {BLOCKS[k]: v for k, v in bodies.items()}, check=True,
                               script="calibrate_serving.py --write-doc")
            if stale:
                bad.append(f"{DOC.name}'s tables differ from this run")
        elif not complete:
            print("note: the doc's tables are compared only by a complete run (every check)",
                  file=sys.stderr)
        for msg in bad:
            print(f"FAIL: {msg}", file=sys.stderr)
        if bad:
            return 1
        print("check passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
