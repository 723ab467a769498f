"""Check the roofline path across hardware without refitting: each measured Hopper preset (h800,
h100, h200) against its ``*_roofline`` twin (the same datasheet figures through the roofline
with the Hopper efficiencies and the H100-fitted stack constants, `config.roofline`) on the
calibration points of `calibrate_serving.py` (SGLang's 1K / 2K / 4K prefill, the balanced 4K
level, the EP72 decode, DeepSeek's profile prefill and decode), every point on every GPU.

Also checks that the stored efficiencies (`roofline.HOPPER`) are the ones the H800 kernel
tables give (`roofline.derive_hopper`) within 1%.

Run: ``python scripts/roofline_check.py [--check] [--write-doc]``: ``--check`` exits 1 when a
point's roofline throughput is more than ``TOL`` (15%) from the measured preset's or a stored
efficiency drifted, or the doc's blocks differ from what it computes; ``--write-doc`` writes
the check, the GPU presets and the efficiencies into docs/serving.md ("Your model, your GPU")."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import fields
from pathlib import Path

from calibrate_serving import CASES, _config
from docblock import update_doc

from eplb.evaluation.serving import steady_state
from eplb.evaluation.serving.config import hardware as hw_mod
from eplb.evaluation.serving.config.roofline import HOPPER, derive_hopper

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "serving.md"
TOL = 0.15  # the bound on every calibration point
DRIFT = 0.01  # stored efficiencies vs their derivation
GPUS = ("h800", "h100", "h200")


def rows() -> list[dict]:
    """One row per calibration point and GPU: measured and roofline tok/s per node."""
    out = []
    for case in CASES:
        base = _config(case.config, hw_mod.FITTED)
        for gpu in GPUS:
            got = {}
            for kind, name in (("measured", gpu), ("roofline", f"{gpu}_roofline")):
                cfg = base.replace(hardware=name)
                got[kind] = steady_state(cfg, case.phase, **dict(case.kwargs))["tok_s_per_node"]
            out.append({"point": case.label, "unit": case.config, "gpu": gpu, **got,
                        "error": got["roofline"] / got["measured"] - 1})
    return out


def drift() -> list[tuple[str, float, float]]:
    """``(name, stored, derived)`` of every efficiency off by more than `DRIFT`."""
    d = derive_hopper(hw_mod.HARDWARE["h800"])
    bad = []
    for f in fields(HOPPER):
        if f.name == "source":
            continue
        a, b = getattr(HOPPER, f.name), getattr(d, f.name)
        if abs(a / b - 1) > DRIFT:
            bad.append((f.name, a, b))
    return bad


def table(found: list[dict]) -> str:
    lines = ["| calibration point | unit | GPU | measured tables (tok/s/node) | roofline "
             "(tok/s/node) | roofline / measured - 1 |",
             "|---|---|---|---:|---:|---:|"]
    for r in found:
        lines.append(f"| {r['point']} | {r['unit']} | {r['gpu']} | {r['measured']:,.0f} | "
                     f"{r['roofline']:,.0f} | {100 * r['error']:+.1f}% |")
    worst = max(found, key=lambda r: abs(r["error"]))
    lines += ["", f"Worst: {worst['point']} on {worst['gpu']}, {100 * worst['error']:+.1f}% "
              f"(bound {100 * TOL:.0f}%). Efficiencies: `roofline.HOPPER` (derived from the H800 "
              "tables); stack constants: `hardware.FITTED`; nothing refitted."]
    return "\n".join(lines)


def presets_table() -> str:
    """Every GPU preset's datasheet figures, whether its curves are measured or a roofline,
    and its first source (each figure is cited in config/hardware.py or config/datasheets.py)."""
    lines = ["| preset | curves | FP8 / BF16 dense TFLOPS | HBM GB | HBM GB/s | NVLink / xGMI "
             "GB/s per direction | NIC GB/s | GPUs per node | source |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for name in hw_mod.hardware_names():
        hw = hw_mod.get_hardware(name)
        if name.endswith("_roofline"):
            continue
        source = (hw.sources[0] if hw.roofline is not None else
                  "NVIDIA SXM datasheet figures (config/hardware.py); kernel tables: "
                  + ", ".join(dict.fromkeys(x.split(" ")[0] for x in hw.sources)))
        lines.append(f"| {name} | {hw.curves} | {hw.fp8_tflops:g} / {hw.bf16_tflops:g} | "
                     f"{hw.hbm_gb:g} | {hw.hbm_gbps:g} | {hw.nvlink_gbps:g} | {hw.rdma_gbps:g} | "
                     f"{hw.gpus_per_node} | {source} |")
    return "\n".join(lines)


def efficiency_table() -> str:
    """`HOPPER`'s efficiencies beside their derivation from the H800 tables, and the stack
    constants carried along."""
    d = derive_hopper(hw_mod.HARDWARE["h800"])
    lines = ["| efficiency | stored | derived from the H800 tables |", "|---|---:|---:|"]
    for f in fields(HOPPER):
        if f.name != "source":
            lines.append(f"| `{f.name}` | {getattr(HOPPER, f.name):.4g} | "
                         f"{getattr(d, f.name):.4g} |")
    fit = hw_mod.FITTED
    lines += ["", "Stack constants read by name from `hardware.FITTED`: `engine_efficiency` "
              f"{fit.engine_efficiency:g} (fitted end to end on SGLang's H100 run; multiplies "
              "both roofs and prefill attention), pinned by SGLang's H100 kernel tables: "
              f"`layer_overhead_s` {fit.layer_overhead_s * 1e6:g} us, prefill attention at "
              f"{fit.prefill_attention_tflops:g} / 989 = "
              f"{fit.prefill_attention_tflops / 989:.3f} of the BF16 peak."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    found = rows()
    text = table(found)
    print(text)
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    status = 0
    for name, a, b in drift():
        print(f"efficiency {name}: stored {a:.4g}, derived {b:.4g}", file=sys.stderr)
        status = 1
    over = [r for r in found if abs(r["error"]) > TOL]
    for r in over:
        print(f"{r['point']} on {r['gpu']}: {100 * r['error']:+.1f}% > {100 * TOL:.0f}%",
              file=sys.stderr)
    status |= bool(over) if args.check else 0
    blocks = {"roofline-check": text, "hardware-presets": presets_table(),
              "hopper-efficiency": efficiency_table()}
    if args.check and not args.write_doc:
        status |= update_doc(DOC, blocks, check=True, script="roofline_check.py --write-doc")
    if args.write_doc:
        update_doc(DOC, blocks, check=False, script="roofline_check.py")
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
