"""Every supported model family read from its config.json (the fixtures of tests/hf_configs.py,
each citing its source) and run through `steady_state` on a measured GPU (h800) and a
datasheet GPU (b200): what was read, what each family's step costs, which figures are roofline.

Run: ``python scripts/model_families.py [--check] [--write-doc]``: ``--check`` exits 1 when
docs/serving.md's table differs from what this computes; ``--write-doc`` rewrites it."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from docblock import update_doc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/hf_configs.py: the fixtures

from eplb.errors import InputError  # noqa: E402
from eplb.evaluation.serving import ClusterConfig, steady_state  # noqa: E402
from eplb.evaluation.serving.config import UnitConfig, kv_capacity_tokens  # noqa: E402
from eplb.evaluation.serving.config.model import ModelSpec  # noqa: E402
from eplb.evaluation.serving.config.schema import RoutingConfig  # noqa: E402
from tests import hf_configs as H  # noqa: E402

DOC = ROOT / "docs" / "serving.md"
GPUS = ("h800", "b200")
NODES = 2  # an EP16 unit of 2 x 8 GPUs per phase
DECODE_BATCH, CONTEXT = 64, 4096  # running requests per GPU, tokens each


def _unit(spec: ModelSpec, **kw) -> UnitConfig:
    slots = -(-spec.num_experts // (8 * NODES)) * 8 * NODES
    return UnitConfig(nodes=NODES, slots_per_layer=slots, **kw)


def rows() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:  # each config as the file a user names
        return _rows(Path(tmp))


def _rows(folder: Path) -> list[dict]:
    out = []
    for family, cfg in H.FAMILIES.items():
        spec = ModelSpec.from_hf_config(cfg)
        row = {"family": family, "spec": spec, "source": cfg["_source"].split("@")[0]}
        path = str(H.write(cfg, folder, f"{family}.json"))
        for gpu in GPUS:
            conf = ClusterConfig(
                model=path, hardware=gpu, prefill=_unit(spec, token_budget=16384),
                decode=_unit(spec, max_running_requests=DECODE_BATCH),
                routing=RoutingConfig(source="uniform"), name=family)
            unit = conf.decode
            try:
                cap = kv_capacity_tokens(spec, conf.hardware_spec, unit.slots_per_gpu)
            except InputError:
                cap = 0
            pre = steady_state(conf, "prefill", input_tokens=CONTEXT)
            dec = steady_state(conf, "decode", kv_tokens=CONTEXT)
            row[gpu] = (pre["tok_s_per_node"], dec["tok_s_per_node"],
                        cap >= DECODE_BATCH * CONTEXT, "roofline" in pre["curves"].values())
        out.append(row)
    return out


def table(found: list[dict]) -> str:
    lines = ["| family (`model_type`) | config from | MoE / all layers | experts, top-k, groups | "
             "shared expert | attention (layers) | weights / experts | KV B per token per "
             "layer | h800 prefill / decode tok/s/node | b200 prefill / decode tok/s/node |",
             "|---|---|---|---|---|---|---|---:|---:|---:|"]
    for r in found:
        s = r["spec"]
        attn = ", ".join(f"{g.kind} ({g.layers})" for g in s.attention_layers)
        shared = f"{s.shared_experts} x {s.shared_width}" if s.shared_experts else "none"
        cells = []
        for gpu in GPUS:
            pre, dec, fits, roof = r[gpu]
            mark = "" if fits else " (KV does not fit)"
            cells.append(f"{pre:,.0f} / {dec:,.0f}{mark}{' R' if roof else ''}")
        lines.append(
            f"| {r['family']} | {r['source']} | {s.moe_layers} / {s.num_layers} | {s.num_experts}, "
            f"{s.top_k}, {s.num_groups} (top {s.topk_groups}) | {shared} | {attn} | "
            f"{s.weight_dtype} / {s.expert_dtype} | {s.kv_bytes_per_token:,.0f} | "
            f"{cells[0]} | {cells[1]} |")
    lines += ["", f"`steady_state` of an EP{8 * NODES} unit ({NODES} x 8 GPUs) per phase, "
              f"balanced routing, prefill 16,384 tokens per GPU of {CONTEXT:,}-token prompts, "
              f"decode {DECODE_BATCH} requests per GPU at {CONTEXT:,} tokens of context; R: "
              "some kernel figures are roofline (on h800, FP4 experts have no measured table). "
              "KV does not fit: the batch needs more KV than the GPU holds after weights (shown "
              "anyway). Produced by `python scripts/model_families.py`."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args(argv)
    text = table(rows())
    print(text)
    if args.write_doc:
        return update_doc(DOC, {"model-families": text}, check=False,
                          script="model_families.py")
    if args.check:
        return update_doc(DOC, {"model-families": text}, check=True,
                          script="model_families.py --write-doc")
    return 0


if __name__ == "__main__":
    sys.exit(main())
