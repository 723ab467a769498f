"""Check `eplb advise` against published before/after pairs; writes the table in docs/advise.md.

Each pair is predicted by `eplb.evaluation.serving.advise` (or the step-time model `advise`
scores with, `StepModel`, where a pair needs a variant advise has no flag for) on the SGLang
team's own DeepSeek-V3 expert-distribution dumps (../shared/traces/deepseek-v3-sglang), with the
cited preset of the pair's deployment; nothing here is fitted to a pair. A model with no public
load dump (DeepSeek-V4, Qwen3.5) runs on those dumps reshaped to its layers, experts and top-k
(`nearest_load`), as a range over the dumps. Models come from the config.json fixtures of
tests/hf_configs.py (each citing its source), GPUs from the datasheet presets (roofline curves).
It also writes the craft lever's table (Day-6 decode; CRAFT's own 1.14x is on other models and
hardware, so it is no matching pair).
Run: ``python scripts/advise_published.py`` (``--check``: fail when docs/advise.md differs from
what this run writes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from docblock import update_doc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/hf_configs.py: the config.json fixtures

from eplb import solvers  # noqa: E402
from eplb.data_dirs import traces_dir  # noqa: E402
from eplb.evaluation.serving.advise import _load_of, advise  # noqa: E402
from eplb.evaluation.serving.config import kv_capacity_tokens  # noqa: E402
from eplb.evaluation.serving.config.hardware import (  # noqa: E402
    LP_OVERHEAD_S,
    get_hardware,
)
from eplb.evaluation.serving.config.model import ModelSpec, get_model  # noqa: E402
from eplb.evaluation.serving.placements import trivial_placement  # noqa: E402
from eplb.evaluation.serving.steptime import RankBatch, StepModel  # noqa: E402
from eplb.topology import Topology  # noqa: E402
from tests import hf_configs as H  # noqa: E402

# the SGLang dumps: $EPLB_DATA (as the tests read it) or ../shared/traces (`eplb.data_dirs`)
DUMPS = traces_dir() / "deepseek-v3-sglang"
DOC = ROOT / "docs" / "advise.md"
E_SLOTS = 256  # deepseek_v3's routed experts

# dump -> (input tokens, output tokens), from the file names (SGLang's bench settings)
PREFILL = {"prefill_in512.json": 512, "prefill_in1024.json": 1024, "prefill_in2048.json": 2048,
           "prefill_in1000out1000.json": 1000}
DECODE = {"decode_in2000out100.json": (2000, 100), "decode_in1000out1000.json": (1000, 1000)}


def _gains(a, lever: str = "rebalance") -> tuple[float, float]:
    t = a.table.set_index("lever")
    return float(t.loc[lever, "gain_pct"]) / 100, float(t.loc["bound", "gain_pct"]) / 100


def sglang_prefill(replicas: str = "sglang") -> list[tuple[float, float]]:
    """SGLang 96 x H100 preset, prefill unit: 4 x 8 H100, 16,384 tokens per rank. Before: the
    trivial placement on 256 slots (the EPLB PR's baseline launches without
    --ep-num-redundant-experts, sgl-project/sglang#5295); after: 32 redundant experts placed
    by `deepseek` (288 slots, the `redundant` lever at N = 32). ``replicas``: `advise`'s
    replica routing (``"sglang"``: SGLang's static map after; ``"even"``: an even split)."""
    out = []
    for name, n in PREFILL.items():
        a = advise(DUMPS / name, "4x8", 256, phase="prefill", hardware="h100",
                   tokens_per_rank=16384, input_tokens=n, redundant=(32,),
                   levers=["today", "redundant", "bound"], replicas=replicas)
        out.append(_gains(a, "redundant"))
    return out


def sglang_decode(replicas: str = "sglang") -> list[tuple[float, float]]:
    """SGLang preset, decode unit: 9 x 8 H100, 288 slots (256 do not split over 72 GPUs), 256
    requests per rank (KV capacity at --mem-fraction-static 0.846), context = input + output /
    2 of the dump's workload. Before: the trivial placement; after: `deepseek` on the same
    slots. ``replicas="sglang"``: before, SGLang with no dispatch algorithm serves expert e
    from slot e only (the redundant slots idle); after, SGLang's static map."""
    out = []
    for name, (i, o) in DECODE.items():
        a = advise(DUMPS / name, "9x8", 288, phase="decode", hardware="h100",
                   tokens_per_rank=256, kv_tokens=i + o // 2, memory_fraction=0.846,
                   levers=["today", "rebalance", "bound"], replicas=replicas)
        out.append(_gains(a))
    return out


def trtllm_imbalance(solver: str = "deepseek") -> tuple[list[float], list[float]]:
    """TensorRT-LLM's (max - mean) / mean by rank, EP32: 256 slots as loaded (trivial) before,
    288 slots (deepseek) after; a balance figure, so the hardware (GB200) does not enter."""
    before, after = [], []
    for name in [*PREFILL, *DECODE]:
        a = advise(DUMPS / name, "4x8", 256, phase="prefill", hardware="h800",
                   redundant=(32,), levers=["today", "redundant"],
                   solver=solver).table.set_index("lever")
        before.append(float(a.loc["today", "balance"]) - 1)
        after.append(float(a.loc["redundant", "balance"]) - 1)
    return before, after


def _err(pred: float, pub: float) -> str:
    return f"{100 * (pred - pub) / pub:+.0f}%"


def _pair(label: str, deployment: str, published: float, both: list, even: list) -> str:
    g = [x for x, _ in both]
    bound = float(np.mean([b for _, b in both]))
    ge = float(np.mean([x for x, _ in even]))
    return (f"| {label} | {deployment} | {100 * published:+.0f}% ({1 + published:.2f}x) | "
            f"{100 * np.mean(g):+.1f}% (dumps: {', '.join(f'{100 * x:+.0f}%' for x in g)}; "
            f"perfect balance {100 * bound:+.0f}%) | {_err(float(np.mean(g)), published)} | "
            f"{100 * ge:+.1f}% ({_err(ge, published)}) |")


# ---------------------------------------------------------------- issue 35's pairs
V3 = get_model("deepseek_v3")
V4 = ModelSpec.from_hf_config(H.DEEPSEEK_V4_PRO)  # the V4-Pro config.json fixture
# nvidia/Qwen3.5-397B-A17B-NVFP4: the Qwen3.5 fixture with 4-bit (NVFP4) routed experts; the
# fixture is the BF16 checkpoint's config, so the quantisation is stated here, not read
QWEN35_NVFP4 = ModelSpec.from_hf_config(
    {**H.QWEN35_397B, "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}})
PUB_LPLB = (0.0084, 0.0734)  # LMSYS blog 2026-06-26 / sgl-project/sglang#24515, red16 / red32
PUB_WATERFILL = (0.0148, 0.0466)  # same blog, DeepSeek-V3/R1, MMLU / GPQA / GSM8K
PUB_WATERFILL_V4 = 51677 / 49253 - 1  # same blog, DeepSeek-V4 (Flash), best measured point
PUB_ATOM = {"rearrange": 7.56 / 6.48 - 1, "N=64": 8.06 / 6.48 - 1, "biased": 8.68 / 6.48 - 1}
PUB_VLLM = (0.034, 0.038, 0.035)  # vllm-project/vllm#41141: Magicoder, OpenMath, ChemData
H20_REQUESTS = 128  # 2,048 concurrent requests (the PR's --max-concurrency) over 16 DP ranks
H20_CONTEXT = 1000  # tokens of context per request: assumed (the PR does not give lengths)
VLLM_DECODE, VLLM_PREFILL = (64, 2000), (8192, 2048)  # assumed: (requests, context) / (tokens,
# prompt) per rank; the PR gives neither (total tok/s only)
_CACHE: dict = {}


def dump_loads() -> dict[str, np.ndarray]:
    """Each SGLang dump's ``load: float[58, 256]`` (DeepSeek-V3's MoE layers), read once."""
    if "loads" not in _CACHE:
        _CACHE["loads"] = {n: _load_of(DUMPS / n, V3)[0] for n in [*PREFILL, *DECODE]}
    return _CACHE["loads"]


def nearest_load(load: np.ndarray, model: ModelSpec, seed: int = 0) -> np.ndarray:
    """``load: float[L, E]`` (a DeepSeek-V3 dump) reshaped to ``model``'s ``float[L', E']``:
    MoE layer l' takes the dump's layer at the same relative depth, its expert popularity curve
    (shares sorted, cumulated) resampled at E' points and dealt to the experts by a seeded
    permutation, scaled to the dump's tokens x ``model.top_k``. Keeps each layer's skew;
    loses which experts are hot together (so the trivial layout's clustering) and any routing
    of the model's own (V4's hash-routed layers)."""
    L, E = load.shape
    L2, E2 = model.moe_layers, model.num_experts
    rng = np.random.default_rng(seed)
    grid = np.linspace(0.0, 1.0, E + 1)
    out = np.empty((L2, E2))
    for l2 in range(L2):
        row = np.sort(load[round(l2 * (L - 1) / max(L2 - 1, 1))])[::-1]
        cum = np.concatenate([[0.0], np.cumsum(row)]) / row.sum()
        out[l2] = rng.permutation(np.diff(np.interp(np.linspace(0.0, 1.0, E2 + 1), grid, cum)))
    return out * load[0].sum() / V3.top_k * model.top_k


def _step_s(phase: str, model: ModelSpec, hw: str, topo: Topology, placement, load, batch: int,
            context: int, **how) -> float:
    """Seconds of one step of ``placement`` serving ``load: float[L, E]`` (its expected
    picks) on the unit ``topo``: ``batch`` prefill tokens (prompts of ``context``) or decode
    requests (``context`` each) per rank; ``how``: `StepModel`'s dispatch, shared_expert,
    lp_overhead_s."""
    sm = StepModel(phase, topo, model=model, hardware=get_hardware(hw), **how)
    if phase == "decode":
        rb = RankBatch.uniform("decode", topo.num_gpus, tokens=batch, context=context,
                               query_tokens=1)
    else:
        rb = RankBatch.uniform("prefill", topo.num_gpus, tokens=batch, context=context)
    return sm.time_routed(rb, sm.prepare(placement, load)).total_s


def _fitted_requests(model: ModelSpec, hw: str, topo: Topology, requests: int,
                     context: int) -> int:
    """``requests`` per rank capped by what one GPU's KV cache holds at ``context``."""
    cap = kv_capacity_tokens(model, get_hardware(hw), topo.slots_per_gpu)
    return max(1, min(requests, cap // context))


def _placed(model: ModelSpec, load: np.ndarray, topo: Topology):
    """`deepseek`'s placement of ``load: float[L, E]`` on ``topo`` (the model's groups)."""
    return solvers.solve("deepseek", load, topo, num_groups=model.num_groups, seed=0)


def _calibrations(serve: str, calib: str) -> list[str]:
    """The dumps a placement is solved on: ``"same"`` (the served dump: in-sample) or
    ``"other"`` (each other dump: live traffic drifted from the calibration)."""
    return [serve] if calib == "same" else [n for n in dump_loads() if n != serve]


def sglang_lplb(n: int, calib: str = "other", requests: int = H20_REQUESTS) -> list[dict]:
    """SGLang LPLB (sgl-project/sglang#24515) on 2 x 8 H20, DeepSeek-V3, decode: 256 + ``n``
    slots placed by `deepseek` on a calibration dump (`_calibrations`), served on each decode
    dump; before: SGLang's ``dynamic`` dispatch (a random replica per token: an even split in
    expectation), after: ``lp`` (the per-layer min-max split) with 0 and DeepSeek LPLB's
    `LP_OVERHEAD_S` per MoE layer and micro-batch. Per (served, calibration) pair: the gains
    at both overheads and the overhead per layer and micro-batch at which the gain is 0 (the
    step is linear in it: from the two points). ``requests``: decode requests per rank (capped
    by the KV cache)."""
    topo = Topology(2, 8, (E_SLOTS + n) // 16)
    out = []
    for serve in DECODE:
        load = dump_loads()[serve]
        req = _fitted_requests(V3, "h20", topo, requests, H20_CONTEXT)
        for c in _calibrations(serve, calib):
            p = _placed(V3, dump_loads()[c], topo)
            t0 = _step_s("decode", V3, "h20", topo, p, load, req, H20_CONTEXT)
            t1, t2 = (_step_s("decode", V3, "h20", topo, p, load, req, H20_CONTEXT,
                              dispatch="lp", lp_overhead_s=ov) for ov in (0.0, LP_OVERHEAD_S))
            per_s = (t2 - t1) / LP_OVERHEAD_S  # step seconds per second of overhead
            out.append({"serve": serve, "calib": c, "gain0": t0 / t1 - 1, "gain": t0 / t2 - 1,
                        "break_even_us": 1e6 * (t0 - t1) / per_s})
    return out


def sglang_waterfill(model: ModelSpec = V3, layout: str = "other",
                     requests: int = H20_REQUESTS) -> list[float]:
    """SGLang Waterfill (LMSYS blog 2026-06-26; sgl-project/sglang#19290) on 2 x 8 H20, decode
    at `H20_REQUESTS` per rank: the shared expert run locally (before) or poured onto the
    less-loaded ranks (after), on ``layout``: ``"trivial"``, or `deepseek` placed on the served
    dump (``"same"``) or on each other dump (``"other"``). ``model``: DeepSeek-V3 on its dumps,
    another (V4) on them reshaped by `nearest_load`. Gains, one per (served, calibration).
    ``requests``: decode requests per rank (capped by the KV cache)."""
    topo = Topology(2, 8, model.num_experts // 16)
    req = _fitted_requests(model, "h20", topo, requests, H20_CONTEXT)
    shaped = {k: v if model is V3 else nearest_load(v, model) for k, v in dump_loads().items()}
    out = []
    for serve in DECODE:
        cals = [None] if layout == "trivial" else _calibrations(serve, layout)
        for c in cals:
            p = (trivial_placement(model, topo) if c is None
                 else _placed(model, shaped[c], topo))
            t0, t1 = (_step_s("decode", model, "h20", topo, p, shaped[serve], req, H20_CONTEXT,
                              shared_expert=se) for se in ("local", "waterfill"))
            out.append(t0 / t1 - 1)
    return out


def atom_prefill() -> list[dict]:
    """ROCm ATOM #1210: DeepSeek-V4-Pro on 1 x 8 MI355X (EP8, DP attention), prefill of
    8,192-token prompts at 8,192 tokens per rank (`--max-num-batched-tokens 8192`), on each
    prefill dump reshaped to V4 (`nearest_load`): before the trivial layout on 384 slots; after
    `deepseek` on 384 (rearrange) and on 448 slots (64 redundant), `biased` on 448 (ATOM's
    policy of the same name, `solvers.policies.biased`); perfect balance beside."""
    out = []
    for name in PREFILL:
        t = advise(nearest_load(dump_loads()[name], V4), "1x8", V4.num_experts,
                   phase="prefill", hardware="mi355x", model=V4, tokens_per_rank=8192,
                   input_tokens=8192, redundant=(64,),
                   levers=["today", "rebalance", "redundant", "bound"]).table.set_index("lever")
        b = advise(nearest_load(dump_loads()[name], V4), "1x8", V4.num_experts,
                   phase="prefill", hardware="mi355x", model=V4, tokens_per_rank=8192,
                   input_tokens=8192, redundant=(64,), solver="biased",
                   levers=["today", "redundant"]).table.set_index("lever")
        out.append({"rearrange": float(t.loc["rebalance", "gain_pct"]) / 100,
                    "N=64": float(t.loc["redundant", "gain_pct"]) / 100,
                    "biased": float(b.loc["redundant", "gain_pct"]) / 100,
                    "bound": float(t.loc["bound", "gain_pct"]) / 100,
                    "balance": float(t.loc["today", "balance"])})
    return out


def _gpu_balance(load: np.ndarray, placement) -> float:
    """Layer-mean GPU max / mean of ``load: float[L, E]`` split evenly over ``placement``'s
    replicas (`advise`'s ``balance``; here every expert has one replica)."""
    gpus = placement.topology.num_gpus
    per = np.take_along_axis(load, placement.phy2log, 1).reshape(load.shape[0], gpus, -1)
    per = per.sum(2)
    return float((per.max(1) / per.mean(1)).mean())


def atom_needed_balance(gain: float, iters: int = 10) -> list[float]:
    """The trivial layout's GPU max/mean at which perfect balance would gain ``gain`` on ATOM's
    unit (`atom_prefill`), per prefill dump reshaped to V4: each layer's expert popularity
    sharpened (shares to a power a >= 1, renormalised) until the perfect-balance gain reaches
    ``gain`` (bisection on a; the gain rises with a). A bound on the skew the published gain
    needs, not a fit: no placement gains more than perfect balance."""
    topo = Topology(1, 8, V4.num_experts // 8)
    triv = trivial_placement(V4, topo)
    balanced = _step_s("prefill", V4, "mi355x", topo, None, None, 8192, 8192)
    out = []
    for name in PREFILL:
        base = nearest_load(dump_loads()[name], V4)

        def sharpened(a: float, base=base) -> np.ndarray:
            x = base ** a
            return x / x.sum(1, keepdims=True) * base.sum(1, keepdims=True)

        lo, hi = 1.0, 8.0
        for _ in range(iters):
            mid = (lo + hi) / 2
            t = _step_s("prefill", V4, "mi355x", topo, triv, sharpened(mid), 8192, 8192)
            lo, hi = (mid, hi) if t / balanced - 1 < gain else (lo, mid)
        out.append(_gpu_balance(sharpened(hi), triv))
    return out


def vllm_offline() -> dict[str, list[float]]:
    """vLLM offline EPLB (vllm-project/vllm#41141): Qwen3.5-397B-A17B NVFP4 on 1 x 8 B200,
    DP8 + EP, 512 slots (no redundant experts: assumed), on the dumps reshaped to Qwen3.5
    (`nearest_load`): before the trivial layout, after `deepseek` (vLLM's default policy is
    DeepSeek's) placed on another dump (the PR records on one half of a dataset and measures
    on the other). Gains per phase (decode dumps in decode, prefill dumps in prefill), one per
    (served, calibration) pair."""
    m, topo = QWEN35_NVFP4, Topology(1, 8, 64)
    shaped = {k: nearest_load(v, m) for k, v in dump_loads().items()}
    out: dict[str, list[float]] = {"decode": [], "prefill": []}
    for serve in [*PREFILL, *DECODE]:
        phase = "decode" if serve in DECODE else "prefill"
        batch, ctx = VLLM_DECODE if phase == "decode" else VLLM_PREFILL
        if phase == "decode":
            batch = _fitted_requests(m, "b200", topo, batch, ctx)
        t0 = _step_s(phase, m, "b200", topo, trivial_placement(m, topo), shaped[serve], batch,
                     ctx)
        for c in _calibrations(serve, "other"):
            t1 = _step_s(phase, m, "b200", topo, _placed(m, shaped[c], topo), shaped[serve],
                         batch, ctx)
            out[phase].append(t0 / t1 - 1)
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def _span(xs) -> str:
    return f"{_pct(min(xs))} to {_pct(max(xs))}"


def _span_x(xs) -> str:
    return f"{min(xs):.2f} to {max(xs):.2f}"


def _vs(pred, pub) -> str:
    """The predicted range against the published one (a range or one value): the error of
    each end, (predicted - published) / published, and whether both are within 25%."""
    lo, hi = min(pred), max(pred)
    plo, phi = (min(pub), max(pub)) if isinstance(pub, tuple) else (pub, pub)
    e1, e2 = (lo - plo) / plo, (hi - phi) / phi
    ok = "yes" if abs(e1) <= 0.25 and abs(e2) <= 0.25 else "no"
    if plo == phi:  # one published value: inside the range, or the nearest end's error
        inside = lo <= plo <= hi
        e = 0.0 if inside else min((abs(e1), e1), (abs(e2), e2))[1]
        ok = "yes" if inside or abs(e) <= 0.25 else "no"
        return f"{'inside the range' if inside else f'nearest end {100 * e:+.0f}%'}; {ok}"
    return f"low end {100 * e1:+.0f}%, high end {100 * e2:+.0f}%; {ok}"


def new_rows() -> list[str]:
    """The rows of issue 35's pairs in the published-pairs table (`table`)."""
    lp = {n: sglang_lplb(n) for n in (16, 32)}
    g0 = [r["gain0"] for n in lp for r in lp[n]]
    g1 = [r["gain"] for n in lp for r in lp[n]]
    wf = {k: sglang_waterfill(V3, k) for k in ("other", "same", "trivial")}
    wf4 = {k: sglang_waterfill(V4, k) for k in ("other", "trivial")}
    atom = atom_prefill()
    vl = vllm_offline()
    bound = [a["bound"] for a in atom]
    bal = [a["balance"] for a in atom]
    h20 = (f"EP16 2 x 8 H20 (roofline preset), DeepSeek-V3, decode {H20_REQUESTS} requests per "
           f"rank at {H20_CONTEXT:,} tokens (assumed)")
    rows = [
        f"| SGLang LPLB, red16 and red32 (LMSYS blog 2026-06-26; sgl-project/sglang#24515) | "
        f"{h20}; 272 / 288 slots placed by `deepseek` on another dump (drift); before: SGLang's "
        f"`dynamic` dispatch (even split), after: `lp` with no solve overhead | "
        f"{_pct(PUB_LPLB[0])} to {_pct(PUB_LPLB[1])} | {_span(g0)} (median "
        f"{_pct(float(np.median(g0)))}, {len(g0)} served x calibration pairs) | "
        f"{_vs(g0, PUB_LPLB)} | - |",
        f"| same, with DeepSeek LPLB's {LP_OVERHEAD_S * 1e6:.0f} us per MoE layer and "
        f"micro-batch (the `lp_overhead_s` default) | as above | as above | {_span(g1)} | "
        f"{_vs(g1, PUB_LPLB)}: the overhead (block below) | - |",
        f"| SGLang Waterfill, DeepSeek-V3/R1 (same blog; sgl-project/sglang#19290) | {h20}; "
        f"256 slots placed by `deepseek` on another dump; shared expert local before, "
        f"`waterfill` after | {_pct(PUB_WATERFILL[0])} to {_pct(PUB_WATERFILL[1])} | "
        f"{_span(wf['other'])} (placed on the served dump: {_span(wf['same'])}; trivial "
        f"layout: {_span(wf['trivial'])}) | {_vs(wf['other'], PUB_WATERFILL)} | - |",
        f"| SGLang Waterfill, DeepSeek-V4 (same blog: 49,253 -> 51,677 tok/s) | DeepSeek-V4-Pro "
        f"config (the blog's V4 Flash has no config fixture here), the dumps reshaped to V4 "
        f"(no public V4 dump); 2 x 8 H20 assumed (the blog does not name V4's GPUs), decode "
        f"{H20_REQUESTS} requests per rank; trivial layout (EPLB not stated) | "
        f"{_pct(PUB_WATERFILL_V4)} | {_span(wf4['trivial'])} (384 slots placed by `deepseek` "
        f"on another dump: {_span(wf4['other'])}) | {_vs(wf4['trivial'], PUB_WATERFILL_V4)} "
        f"| - |",
    ]
    atom_dep = ("EP8 1 x 8 MI355X (roofline preset), DeepSeek-V4-Pro config, the prefill dumps "
                "reshaped to V4 (no public V4 dump), 8,192 tokens per rank of 8,192-token "
                "prompts; before: trivial on 384 slots")
    for key, what in (("rearrange", "after: `deepseek` on 384 slots (0 redundant)"),
                      ("N=64", "after: `deepseek` on 448 slots (64 redundant; ATOM's `naive`)")):
        pred = [a[key] for a in atom]
        rows.append(
            f"| ROCm ATOM EPLB, {key} (ROCm/ATOM#1210) | {atom_dep}; {what} | "
            f"{_pct(PUB_ATOM[key])} (6.48 req/s -> {6.48 * (1 + PUB_ATOM[key]):.2f}) | "
            f"{_span(pred)} (perfect balance {_span(bound)}; the trivial layout's GPU "
            f"max/mean {min(bal):.3f} to {max(bal):.3f}) | {_vs(pred, PUB_ATOM[key])}: the "
            f"published gain is above perfect balance on these loads; perfect balance gains it "
            f"from a trivial-layout max/mean of {_span_x(atom_needed_balance(PUB_ATOM[key]))} "
            f"| - |")
    pred = [a["biased"] for a in atom]
    rows.append(
        f"| ROCm ATOM EPLB, `biased` 64 redundant (same PR) | as above; after: `biased` on 448 "
        f"slots (the top experts replicated on every GPU, as ATOM's policy) | "
        f"{_pct(PUB_ATOM['biased'])} (-> 8.68 req/s) | {_span(pred)} (perfect balance "
        f"{_span(bound)}) | {_vs(pred, PUB_ATOM['biased'])}: above perfect balance on these "
        f"loads; perfect balance gains it from a trivial-layout max/mean of "
        f"{_span_x(atom_needed_balance(PUB_ATOM['biased']))} | - |")
    rows.append(
        f"| vLLM offline EPLB (vllm-project/vllm#41141; three datasets) | 1 x 8 B200 (roofline "
        f"preset), DP8 + EP, Qwen3.5-397B-A17B config with NVFP4 experts, the dumps reshaped to "
        f"Qwen3.5 (no public Qwen3.5 dump), 512 slots (no redundant: assumed); before: trivial, "
        f"after: `deepseek` placed on another dump (the PR records on one half of a dataset, "
        f"measures on the other); decode {VLLM_DECODE[0]} requests per rank at "
        f"{VLLM_DECODE[1]:,} tokens, prefill {VLLM_PREFILL[0]:,} tokens per rank of "
        f"{VLLM_PREFILL[1]:,}-token prompts (both assumed) | "
        f"{', '.join(_pct(x) for x in PUB_VLLM)} | prefill {_span(vl['prefill'])}; decode "
        f"{_span(vl['decode'])} | prefill {_vs(vl['prefill'], (min(PUB_VLLM), max(PUB_VLLM)))}"
        f"; decode {_vs(vl['decode'], (min(PUB_VLLM), max(PUB_VLLM)))}: the total tok/s "
        f"mixes both phases in proportions the PR does not give | - |")
    return rows


def lplb_table() -> str:
    """The SGLang LPLB pair under each placement source and overhead (docs/advise.md block
    ``advise_lplb``)."""
    rows = [
        "| redundant | placement solved on | gain, no solve overhead | gain at "
        f"{LP_OVERHEAD_S * 1e6:.0f} us | overhead per MoE layer and micro-batch at which the "
        "gain is 0 (us) |",
        "|---|---|---|---|---|",
    ]
    for n in (16, 32):
        for calib, what in (("same", "the served dump (in-sample)"),
                            ("other", "each other dump (drift)")):
            r = sglang_lplb(n, calib)
            be = [x["break_even_us"] for x in r]
            even = (f"{min(be):.1f} to {max(be):.1f}" if min(be) > 0 else
                    "none: it loses with no overhead" if max(be) <= 0 else
                    f"up to {max(be):.1f} (some pairs lose with none)")
            rows.append(f"| {n} | {what} | {_span([x['gain0'] for x in r])} | "
                        f"{_span([x['gain'] for x in r])} | {even} |")
    rows += ["", "The same unit at other decode batches (requests per rank, capped by the KV "
             "cache; placements solved on each other dump, no LP overhead):", "",
             "| requests per rank | LPLB, 32 redundant | Waterfill, DeepSeek-V3 |", "|---|---|---|"]
    for req in (64, H20_REQUESTS, 256):
        rows.append(f"| {req} | {_span([x['gain0'] for x in sglang_lplb(32, 'other', req)])} | "
                    f"{_span(sglang_waterfill(V3, 'other', req))} |")
    return "\n".join(rows)


def table() -> str:
    pre, dec = sglang_prefill(), sglang_decode()
    pre_even, dec_even = sglang_prefill("even"), sglang_decode("even")
    b, a = trtllm_imbalance()
    _, ag = trtllm_imbalance("greedy")
    rows = [
        "| pair (source) | deployment and preset | published gain | predicted gain (the "
        "SGLang EPLB rows: SGLang's replica routing, `--replicas sglang`) | error (ranges: "
        "each end's; within 25%?) | the SGLang EPLB rows predicted with an even split over "
        "replicas (error) |",
        "|---|---|---|---|---|---|",
        _pair("SGLang EPLB, prefill (LMSYS large-scale EP blog, 2025-05-05)",
              "EP32 4x8 H100, 16,384 tok/rank; before: trivial on 256 slots; after: 32 "
              "redundant (288 slots); preset sglang_96xh100", 0.49, pre, pre_even),
        _pair("SGLang EPLB, decode (same blog)",
              "EP72 9x8 H100, 288 slots, 256 req/rank; before: trivial; after: rebalanced; "
              "preset sglang_96xh100", 1.54, dec, dec_even),
        f"| TensorRT-LLM offline EPLB, imbalance (max-mean)/mean by rank (tech blog 4, Table 1)"
        f" | EP32, 256 -> 288 slots, GB200: no hardware preset, not needed for a balance figure;"
        f" DeepSeek-R1 = deepseek_v3 | 1.564 -> 0.109 (reduction 1.455) | {np.mean(b):.3f} -> "
        f"{np.mean(a):.3f} (reduction {np.mean(b) - np.mean(a):.3f}) | reduction "
        f"{_err(float(np.mean(b) - np.mean(a)), 1.455)}; before {_err(float(np.mean(b)), 1.564)}"
        f", after {_err(float(np.mean(a)), 0.109)} | - |",
        f"| same, with `solver=greedy` instead of `deepseek` (in-sample on the aggregate) | "
        f"as above | 0.109 after | {np.mean(ag):.3f} after | "
        f"after {_err(float(np.mean(ag)), 0.109)} | - |",
        *new_rows(),
    ]
    return "\n".join(rows)


def craft_table() -> str:
    """The craft lever on the Day-6 decode unit (EP144 = 18 x 8 H800, 288 slots, trivial today,
    256 requests per rank at context input + output / 2): each N's craft row beside the uniform
    redundant row at the same N where its slots split over 144 GPUs (only N = 32 here)."""
    rows = [
        "| dump | N | uniform N: step (ms), tok/s/node | craft N: step (ms), tok/s/node | "
        "craft gain over today | KV tokens / GPU (requests) | summed max GPU load, uniform "
        "/ craft (same packer) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (i, o) in DECODE.items():
        a = advise(DUMPS / name, "18x8", 288, phase="decode", hardware="h800",
                   tokens_per_rank=256, kv_tokens=i + o // 2, redundant=(0, 8, 16, 32),
                   levers=["today", "redundant", "craft"])
        t = a.table
        info = {c["N"]: c for c in a.meta.get("craft", [])}
        for n in (0, 8, 16, 32):
            u = t[(t.lever == "redundant") & (t.option == f"N={n}")]
            c = t[(t.lever == "craft") & (t.option == f"N={n}")]
            uni = (f"{u.step_ms.iloc[0]:.1f}, {u.tok_s_per_node.iloc[0]:,.0f}" if len(u)
                   else f"- ({E_SLOTS + n} slots do not split over 144 GPUs)")
            if not len(c):
                rows.append(f"| {name} | {n} | {uni} | skipped (see `advise`'s note) | - | - "
                            "| - |")
                continue
            k = info[n]
            rows.append(
                f"| {name} | {n} | {uni} | {c.step_ms.iloc[0]:.1f}, "
                f"{c.tok_s_per_node.iloc[0]:,.0f} | {c.gain_pct.iloc[0]:+.1f}% | "
                f"{int(c.kv_tokens_per_gpu.iloc[0]):,} ({int(c.max_requests_per_gpu.iloc[0])}) | "
                f"{k['uniform_objective_sum'] / k['objective_sum']:.4f}x |"
            )
    today = t[t.lever == "today"]
    rows.append("")
    rows.append(f"Today (trivial, every slot used) on the last dump: "
                f"{today.step_ms.iloc[0]:.1f} ms, {today.tok_s_per_node.iloc[0]:,.0f} tok/s/node, "
                f"{int(today.kv_tokens_per_gpu.iloc[0]):,} KV tokens per GPU "
                f"({int(today.max_requests_per_gpu.iloc[0])} requests).")
    return "\n".join(rows)


BLOCKS = {"advise_published": table, "advise_lplb": lplb_table,
          "advise_craft": craft_table}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if docs/advise.md is stale")
    args = ap.parse_args(argv)
    if not DUMPS.is_dir():
        print(f"needs the SGLang dumps at {DUMPS}", file=sys.stderr)
        return 2
    bodies = {key: make() for key, make in BLOCKS.items()}
    for body in bodies.values():
        print(body)
    return update_doc(DOC, bodies, check=args.check, script="advise_published.py")


if __name__ == "__main__":
    sys.exit(main())
