"""Hostile-input corpus: build bad inputs in a temp folder, run the CLI and the API, classify.

Each case is clean (success, or exit 2 with exactly one ``eplb: error:`` line on stderr; an
API call that returns or raises an `EplbError`) or failing (a traceback, a hang past the
timeout, another exit code, an input changed or removed, temporary files left behind, a wrong
answer accepted, invalid JSON from ``--json``). Prints one line per failing case and the
counts. Usage: ``python scripts/hostile_corpus.py [--timeout S] [--jobs N] [-k SUBSTRING]``.
Memory is capped per case (``RLIMIT_AS``, 3 GiB) so bombs fail fast instead of stressing the
machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import hashlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PY = sys.executable
MEM_LIMIT = 3 * 2**30


@dataclass
class Case:
    name: str
    argv: list[str] | None = None  # CLI arguments after ``eplb``
    api: str | None = None  # python source run with eplb imported
    expect_error: bool = False  # a success is a wrong answer
    keep: list[str] = field(default_factory=list)  # files that must survive unchanged
    env: dict[str, str] = field(default_factory=dict)
    signal_after: float | None = None  # send ``sig`` after this many seconds
    sig: int = signal.SIGTERM
    group: bool = False  # send the signal to the process group
    quick_exit: float | None = None  # the signalled run must end within this many seconds
    no_temps: str | None = None  # folder that must hold no hidden temporary files afterwards
    json_out: bool = False  # stdout must be strict JSON
    check: str | None = None  # python expression on (root, rc, stderr) that must be true
    klass: str = "misc"  # the class this case belongs to (for the counts)
    isolated: bool = False  # an API case run as its own process (plugins, entry points)
    mem_limit: int | None = None  # address space (bytes) of this case's process: refusing
    # before allocating passes, running out of memory first fails ("out of memory")
    timeout: float | None = None  # seconds before the case counts as a hang (default --timeout)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def _npy_header(path: Path, shape, dtype="<i8", payload=b"") -> Path:
    head = repr({"descr": dtype, "fortran_order": False, "shape": tuple(shape)}).encode()
    head += b" " * ((64 - (10 + len(head) + 1) % 64) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head + payload)
    return path


def build(root: Path) -> list[Case]:
    r = root
    cases: list[Case] = []
    klass = ["setup"]

    def add(case: Case) -> None:
        case.klass = klass[0] if case.klass == "misc" else case.klass
        cases.append(case)

    def run_cli(*argv):
        subprocess.run([PY, "-m", "eplb.cli", *argv], cwd=r, capture_output=True, check=True)

    # ------------------------------------------------------------ good inputs to start from
    run_cli("trace", "synth", "zipf", "-o", "t.npz", "--layers", "2", "--experts", "16",
            "--windows", "4")
    run_cli("solve", "t.npz", "--topology", "2x4", "--slots", "32", "-o", "p.json")
    run_cli("workload", "synth", "-n", "30", "--rate", "20", "-o", "w.jsonl")
    trace_json = json.dumps({"logical_count": [[[1, 2, 3, 4]] * 2] * 3})
    (r / "good.json").write_text(trace_json)
    subprocess.run([PY, "-m", "eplb.cli", "simulate", "deepseek_day6", "--workload", "w.jsonl",
                    "-o", "seedrun", "--no-plots", "--no-progress"], cwd=r, capture_output=True)
    cfg = (r / "seedrun" / "config.toml").read_text() if (r / "seedrun/config.toml").exists() \
        else ""
    (r / "c.toml").write_text(cfg)

    def cfg_with(name: str, old: str, new: str) -> str:
        (r / name).write_text(cfg.replace(old, new, 1))
        return name

    sim = ["--workload", "w.jsonl", "--no-plots", "--no-progress"]

    # ------------------------------------------------------------ trace readers (trace info)
    klass[0] = "formats"
    traces: dict[str, bytes | None] = {
        "empty.npz": b"",
        "garbage.npz": os.urandom(300),
        "truncated.npz": (r / "t.npz").read_bytes()[:200],
        "text.npy": b"hello",
        "deep.json": b"[" * 100_000 + b"]" * 100_000,
        "nan.json": json.dumps({"logical_count": [[[1, float("nan")]]]}).encode(),
        "strings.json": json.dumps({"logical_count": [[["a", "b"]]]}).encode(),
        "dupkey.json": b'{"logical_count": [[[1,2]]], "logical_count": [[[3,4]]]}',
        "bigint.json": b'{"logical_count": [[[9007199254740993, 1]]]}',
        "badutf8.json": b'{"logical_count": [[[1,2]]], "x": "\xff\xfe"}',
        "neg.json": json.dumps({"logical_count": [[[1, -2]]]}).encode(),
        "ragged.json": json.dumps({"logical_count": [[[1, 2], [3]]]}).encode(),
        "bool.json": json.dumps({"logical_count": [[[True, False]]]}).encode(),
        "csv_bool.csv": b"window,layer,expert,count\nTrue,0,0,5\nFalse,0,1,3\n",
        "csv_trunc.csv": b"window,layer,expert,count\n0,0,0,5\n0,0,",
        "csv_nan.csv": b"window,layer,expert,count\n0,0,0,nan\n0,0,1,3\n",
        "legacy.pt": b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.",
    }
    for name, data in traces.items():
        (r / name).write_bytes(data)
        add(Case(f"trace info {name}", ["trace", "info", name],
                 expect_error=name not in ("csv_nan.csv",)))
    _npy_header(r / "huge.npy", (10**6, 10**6))
    add(Case("trace info npy huge header", ["trace", "info", "huge.npy"], expect_error=True))
    _npy_header(r / "short.npy", (4, 4), payload=b"\0" * 16)
    add(Case("trace info npy truncated", ["trace", "info", "short.npy"], expect_error=True))
    _npz(r / "obj.npz", counts=np.array([[1, 2]], dtype=np.float64),
         meta=np.array(json.dumps({"top_k": "eight"})))
    add(Case("trace info top_k string", ["trace", "info", "obj.npz"], expect_error=True))
    _npz(r / "topk0.npz", counts=np.ones((2, 2, 4)), meta=np.array(json.dumps({"top_k": 0})))
    add(Case("trace info top_k 0", ["trace", "info", "topk0.npz"], expect_error=True))
    _fifo(r / "fifo.npz")
    _fifo(r / "fifo.json")
    add(Case("trace info FIFO .npz", ["trace", "info", "fifo.npz"], expect_error=True))
    add(Case("trace info FIFO .json", ["trace", "info", "fifo.json"], expect_error=True))
    add(Case("trace info /dev/zero", ["trace", "info", "/dev/zero"], expect_error=True))
    add(Case("trace info /dev/null", ["trace", "info", "/dev/null"], expect_error=True))
    (r / "emptydir").mkdir()
    add(Case("trace info empty dir", ["trace", "info", "emptydir"], expect_error=True))
    rd = r / "rankdir"
    (rd / "²").mkdir(parents=True)
    (rd / "²" / "x.csv").write_text("a,b\n1,2\n")
    add(Case("trace info rank folder ²", ["trace", "info", "rankdir"], expect_error=True))
    long = "x" * 300 + ".npz"
    add(Case("trace info name too long", ["trace", "info", long], expect_error=True))
    add(Case("traces.read name too long",
             api=f"from eplb import traces; traces.read({long!r})", expect_error=True))
    add(Case("trace info missing", ["trace", "info", "nope.npz"], expect_error=True))
    try:
        import pandas as pd

        pd.DataFrame({"window": pd.array([0, None], dtype="Int64"), "layer": [0, 0],
                      "expert": [0, 1], "count": [1, 2]}).to_parquet(r / "nullable.parquet")
        pd.DataFrame({"window": [0, 0], "layer": [0, 0], "expert": [0, 1],
                      "count": pd.to_datetime(["2020-01-01", "2020-01-02"])}
                     ).to_parquet(r / "datetime.parquet")
        add(Case("trace info parquet nullable", ["trace", "info", "nullable.parquet"],
                 expect_error=True))
        add(Case("trace info parquet datetime counts", ["trace", "info", "datetime.parquet"],
                 expect_error=True))
    except Exception:  # pragma: no cover - pyarrow missing
        pass

    try:  # .pt dumps (torch is an optional extra)
        import torch

        ones = torch.ones(2, 3, 4)
        pts = {"bf16": {"logical_count": ones.to(torch.bfloat16)},
               "fp8": {"logical_count": ones.to(torch.float8_e4m3fn)},
               "sparse": {"logical_count": ones.to_sparse()},
               "meta-device": {"logical_count": torch.ones(2, 3, 4, device="meta")},
               "rank-string": {"logical_count": ones, "rank": "zero"},
               "rank-list": {"logical_count": ones, "rank": [0, 1]},
               "records-shapes": {"last_physical_to_logical_map": torch.zeros(3, 4,
                                                                              dtype=torch.int64),
                                  "records": [{"global_physical_count": torch.ones(2, 4)}]}}
        for label, obj in pts.items():
            torch.save(obj, r / f"{label}.pt")
            add(Case(f"trace info .pt {label}", ["trace", "info", f"{label}.pt"],
                     expect_error=label not in ("bf16", "fp8")))
    except ImportError:  # pragma: no cover
        pass

    # ------------------------------------------------------------ placement files (evaluate)
    klass[0] = "formats"
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 12):
        bomb.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    bomb.append("num_slots: 32\ninitial_global_assignments: {0: *a11}")
    (r / "bomb.yaml").write_text("\n".join(bomb) + "\n")
    add(Case("evaluate YAML billion laughs", ["evaluate", "bomb.yaml", "t.npz", "--topology",
                                               "2x4"], expect_error=True))
    (r / "tag.yaml").write_text("!!python/object/apply:os.system ['echo pwned']\n")
    add(Case("evaluate YAML python tag", ["evaluate", "tag.yaml", "t.npz", "--topology", "2x4"],
             expect_error=True))
    doc = json.loads((r / "p.json").read_text())
    doc["meta"] = "a string"
    (r / "meta_str.json").write_text(json.dumps(doc))
    add(Case("evaluate placement meta string", ["evaluate", "meta_str.json", "t.npz"],
             expect_error=True))
    (r / "p_trunc.json").write_text((r / "p.json").read_text()[:100])
    add(Case("evaluate truncated placement", ["evaluate", "p_trunc.json", "t.npz"],
             expect_error=True))
    _fifo(r / "fifo_p.json")
    add(Case("evaluate FIFO placement", ["evaluate", "fifo_p.json", "t.npz"], expect_error=True))
    add(Case("evaluate --json denormal rdma", ["evaluate", "p.json", "t.npz", "--json",
                                                "--rdma-gbps", "1e-320"], json_out=True))
    add(Case("evaluate --combine-bytes 0", ["execute", "p.json", "--trace", "t.npz",
                                            "--combine-bytes", "0"], expect_error=True))

    # ------------------------------------------------------------ solve options
    klass[0] = "options"
    for opt in (["--slots", "0"], ["--slots", "-1"], ["--slots", "100000000000"],
                ["--time-limit", "nan"], ["--seed", "-1"], ["--nvlink-gbps", "0"],
                ["--nvlink-gbps", "nan"], ["--rdma-gbps", "inf"], ["--rdma-gbps", "-1"],
                ["--groups", "0"], ["--groups", "3"], ["--windows", "99"], ["--ema", "nan"],
                ["--ema", "2"], ["--option", "rdma_weight=1e308"],
                ["--option", "rdma_weight=nan"], ["--solver", "nope"],
                ["--failed-gpus", "99"], ["--topology", "0x8"], ["--topology", "1e9x8"]):
        argv = ["solve", "t.npz", "--topology", "2x4",
                *(["--slots", "32"] if opt[0] != "--slots" else []), *opt]
        if opt[0] == "--topology":
            argv = ["solve", "t.npz", *opt]
        if opt[0] == "--option":
            argv += ["--solver", "greedy"]
        # a huge but finite rdma_weight is a legal price: it must solve, not crash; groups
        # that do not divide the experts are placed by deepseek's global rule (it says so)
        add(Case(f"solve {' '.join(opt)}", argv,
                 expect_error=opt[1] != "rdma_weight=1e308" and opt != ["--groups", "3"]))
    add(Case("solve --groups 3 --solver hierarchical",
             ["solve", "t.npz", "--topology", "2x4", "--slots", "32", "--groups", "3",
              "--solver", "hierarchical"], expect_error=True))
    add(Case("solve -o same as input", ["solve", "t.npz", "--topology", "2x4", "-o", "t.npz"],
             expect_error=True, keep=["t.npz"]))
    add(Case("solve -o /dev/full", ["solve", "t.npz", "--topology", "2x4", "--slots", "32",
                                    "-o", "/dev/full"], expect_error=True))
    name250 = "n" * 245 + ".json"
    add(Case("solve -o 250-char name", ["solve", "t.npz", "--topology", "2x4", "--slots", "32",
                                        "-o", name250],
             check=f"(root / {name250!r}).is_file()", no_temps="."))
    add(Case("solve -o 300-char name", ["solve", "t.npz", "--topology", "2x4", "-o",
                                        "n" * 300 + ".json"], expect_error=True))
    add(Case("API write_placement /dev/full",
             api="from eplb.io import read_placement, write_placement\n"
                 "write_placement(read_placement('p.json'), '/dev/full', format='native')",
             expect_error=True))
    add(Case("API lower_bound num_groups=3",
             api="import numpy as np\nfrom eplb import Topology\n"
                 "from eplb.solvers.analysis.bounds import lower_bound\n"
                 "lower_bound(np.ones((1, 16)), Topology.parse('2x4', 32), num_groups=3, "
                 "hierarchical=True)", expect_error=True))

    # ------------------------------------------------------------ trace synth options
    klass[0] = "options"
    for opt in (["--layers", "0"], ["--layers", "-1"], ["--experts", "0"],
                ["--windows", "1000000000"], ["--tokens", "-1"], ["--top-k", "0"],
                ["--top-k", "300"], ["--first-layer", "-1"], ["--layers", "100000000"]):
        add(Case(f"trace synth {' '.join(opt)}", ["trace", "synth", "zipf", "-o", "s.npz", *opt],
                 expect_error=True))
    add(Case("trace convert to itself", ["trace", "convert", "t.npz", "./t.npz"],
             expect_error=True, keep=["t.npz"]))
    add(Case("trace convert to /dev/full", ["trace", "convert", "t.npz", "/dev/full",
                                            "--format", "npz"], expect_error=True))

    # ------------------------------------------------------------ environment
    klass[0] = "environment"
    for value in ("inf", "1e400", "-5", "abc", "nan"):
        add(Case(f"EPLB_MAX_BYTES={value}", ["trace", "info", "t.npz"],
                 env={"EPLB_MAX_BYTES": value}, expect_error=True))
    add(Case("API EPLB_MAX_BYTES=inf",
             api="from eplb import traces; traces.read('t.npz')",
             env={"EPLB_MAX_BYTES": "inf"}, expect_error=True))

    # ------------------------------------------------------------ workloads
    klass[0] = "workloads"
    (r / "wl_datetime.csv").write_text("arrival_s,input_tokens,output_tokens\n"
                                       "2020-01-01,10,10\n2020-01-02,10,10\n")
    (r / "wl_nan.csv").write_text("arrival_s,input_tokens,output_tokens\nnan,10,10\n")
    (r / "wl_neg.csv").write_text("arrival_s,input_tokens,output_tokens\n0,-10,10\n")
    (r / "wl_trunc.jsonl").write_text('{"timestamp": 0, "input_length": 10, "outp')
    (r / "wl_bin.jsonl").write_bytes(b"{" + os.urandom(200))
    _fifo(r / "wl_fifo.jsonl")
    for name in ("wl_datetime.csv", "wl_nan.csv", "wl_neg.csv", "wl_trunc.jsonl",
                 "wl_bin.jsonl", "wl_fifo.jsonl"):
        add(Case(f"workload info {name}", ["workload", "info", name], expect_error=True))
    (r / "one.csv").write_text("arrival_s,input_tokens,output_tokens\n0,10,10\n")
    add(Case("workload info --json one request", ["workload", "info", "one.csv", "--json"],
             json_out=True))
    for opt in (["-n", "0"], ["-n", "-1"], ["-n", "1000000000000"], ["--rate", "0"],
                ["--rate", "nan"], ["--rate", "inf"], ["--cv", "-1"], ["--cv", "nan"],
                ["--hit-rate", "2"], ["--block-size", "0"], ["--input-mean", "-5"]):
        add(Case(f"workload synth {' '.join(opt)}",
                 ["workload", "synth", "-o", "ws.jsonl", "--arrival", "gamma", *opt]
                 if opt[0] == "--cv" else ["workload", "synth", "-o", "ws.jsonl", *opt],
                 expect_error=True))
    shutil.copy(r / "w.jsonl", r / "m.jsonl")
    add(Case("workload synth --lengths-from m.jsonl -o m.jsonl",
             ["workload", "synth", "-n", "10", "--lengths-from", "m.jsonl", "-o", "m.jsonl"],
             expect_error=True, keep=["m.jsonl"]))
    add(Case("workload convert to itself", ["workload", "convert", "w.jsonl", "./w.jsonl"],
             expect_error=True, keep=["w.jsonl"]))
    add(Case("API synthesize huge n",
             api="from eplb.evaluation.serving import workload as W\n"
                 "W.synthesize(10**13)", expect_error=True))

    # ------------------------------------------------------------ cluster configs (simulate)
    klass[0] = "toml configs"
    (r / "bad_utf8.toml").write_bytes(b'model = "\xff\xfe"\n')
    (r / "binary.toml").write_bytes(os.urandom(500))
    (r / "nested.toml").write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    _fifo(r / "fifo.toml")
    confs = {
        "bad_utf8.toml": "bad_utf8.toml", "binary.toml": "binary.toml",
        "nested.toml": "nested.toml", "fifo.toml": "fifo.toml",
        "history_s inf": cfg_with("hist_inf.toml", "history_s = 600.0", "history_s = inf"),
        "rebalance 1e-9": cfg_with("rebal.toml", "rebalance_interval_s = 600.0",
                                   "rebalance_interval_s = 1e-9"),
        "migration_gbps 1e-9": cfg_with("mig.toml", "migration_gbps = 50.0",
                                        "migration_gbps = 1e-12"),
        "transfer_gbps 1e-9": cfg_with("xfer.toml", "transfer_gbps = 50.0",
                                       "transfer_gbps = 1e-12"),
        "count 1e18": cfg_with("count.toml", "count = 1\nnodes = 18",
                               "count = 1000000000000000000\nnodes = 18"),
        "nodes 0": cfg_with("nodes0.toml", "nodes = 4", "nodes = 0"),
        "block_size 0": cfg_with("block0.toml", "block_size = 512", "block_size = 0"),
        "tpot nan": cfg_with("tpot.toml", "tpot_s = 0.05", "tpot_s = nan"),
    }
    for label, name in confs.items():
        add(Case(f"simulate config {label}", ["simulate", name, *sim, "-o", f"o_{label[:8]}"],
                 expect_error=True))
    for opt in (["--rate", "1e-9"], ["--rate", "0"], ["--rate", "nan"], ["--duration", "nan"],
                ["--duration", "-1"], ["--head", "0"], ["--window", "5:1"], ["--speedup", "inf"],
                ["--seed", "-1"]):
        add(Case(f"simulate {' '.join(opt)}", ["simulate", "deepseek_day6", *sim, "-o",
                                               "o_opt", *opt], expect_error=True))
    add(Case("simulate -o ''", ["simulate", "deepseek_day6", *sim, "-o", ""], expect_error=True))
    add(Case("simulate -o . --force", ["simulate", "deepseek_day6", *sim, "-o", ".", "--force"],
             expect_error=True, keep=["t.npz", "w.jsonl"]))
    # --force with inputs inside the output folder
    d = r / "dl"
    d.mkdir()
    shutil.copy(r / "w.jsonl", d / "w.jsonl")
    shutil.copy(r / "c.toml", d / "c.toml")
    add(Case("simulate --force, workload inside -o",
             ["simulate", "deepseek_day6", "--workload", "dl/w.jsonl", "--no-plots",
              "--no-progress", "-o", "dl", "--force"], expect_error=True, keep=["dl/w.jsonl"]))
    add(Case("simulate --force, config inside -o",
             ["simulate", "dl/c.toml", "--workload", "w.jsonl", "--no-plots", "--no-progress",
              "-o", "dl", "--force"], expect_error=True, keep=["dl/c.toml"]))
    add(Case("simulate -o same as workload", ["simulate", "deepseek_day6", *sim, "-o",
                                              "w.jsonl"], expect_error=True, keep=["w.jsonl"]))
    (r / "real_out").mkdir()
    (r / "link_out").symlink_to("real_out")
    add(Case("simulate symlinked -o --force",
             ["simulate", "deepseek_day6", *sim, "-o", "link_out", "--force"],
             no_temps=".", check="(root / 'link_out' / 'summary.json').is_file()"))
    add(Case("API simulate bool bucket",
             api="from eplb.evaluation.serving import ClusterConfig, simulate, workload as W\n"
                 "simulate(ClusterConfig.load('deepseek_day6'), W.read('w.jsonl'), "
                 "bucket_s=True, progress=False)", expect_error=True))
    add(Case("API simulate tiny bucket",
             api="from eplb.evaluation.serving import ClusterConfig, simulate, workload as W\n"
                 "simulate(ClusterConfig.load('deepseek_day6'), W.read('w.jsonl'), "
                 "bucket_s=1e-12, progress=False)", expect_error=True))
    add(Case("API steady_state batch=1e20",
             api="from eplb.evaluation.serving import ClusterConfig\n"
                 "from eplb.evaluation.serving.results.steady import steady_state\n"
                 "steady_state(ClusterConfig.load('deepseek_day6'), 'decode', batch=10**20)",
             expect_error=True))

    # ------------------------------------------------------------ compare / replay
    klass[0] = "aliasing outputs"
    (r / "plots").mkdir()
    shutil.copy(r / "t.npz", r / "plots" / "pareto.csv")
    add(Case("compare --plot DIR holding an input",
             ["compare", "plots/pareto.csv", "--solvers", "greedy", "--topologies", "2x4:32",
              "--plot", "plots", "--quiet"], expect_error=True, keep=["plots/pareto.csv"]))
    add(Case("compare bad --plot format after CSV",
             ["compare", "t.npz", "--solvers", "greedy", "--topologies", "2x4:32", "-o",
              "cmp.csv", "--plot", "p.json", "--quiet"], expect_error=True,
             check="not (root / 'cmp.csv').exists()"))
    add(Case("API compare traffic bogus",
             api="from eplb.evaluation.compare import compare\n"
                 "compare(['t.npz'], solvers=['greedy'], topologies='2x4:32', progress=False, "
                 "traffic={'bogus': 1})", expect_error=True))
    add(Case("API replay traffic bogus",
             api="from eplb import traces, Topology\nfrom eplb.evaluation.replay import replay\n"
                 "replay(traces.read('t.npz'), Topology.parse('2x4', 32), policy='even', "
                 "bogus=1)", expect_error=True))
    for opt in (["--interval", "0"], ["--history", "-1"], ["--topk-groups", "2"],
                ["--expert-bytes", "nan"]):
        add(Case(f"replay {' '.join(opt)}", ["replay", "t.npz", "--topology", "2x4", "--slots",
                                             "32", "--quiet", *opt], expect_error=True))
    add(Case("execute --tokens 0", ["execute", "p.json", "--tokens", "0"], expect_error=True))

    # ------------------------------------------------------------ signals
    # a signal ends the run with 128 + N (-N: it arrived after eplb's handler was removed, as
    # the interpreter exits; a shell shows 128 + N for both); never 0 once signalled. Outputs
    # are complete or absent (atomic) and no temporary file is left (no_temps).
    klass[0] = "signals"
    add(Case("SIGTERM during simulate (plots)",
             ["simulate", "deepseek_day6", "--workload", "w.jsonl", "--no-progress", "-o",
              "sig_sim"], signal_after=6.0, no_temps=".",
             check="rc in (143, -15) if signalled else (rc == 0 and (root / 'sig_sim').exists())"))
    add(Case("SIGINT during simulate (plots)",
             ["simulate", "deepseek_day6", "--workload", "w.jsonl", "--no-progress", "-o",
              "sig_sim2"], signal_after=6.5, sig=signal.SIGINT, no_temps=".",
             check="rc in (130, -2) if signalled else (rc == 0 and (root / 'sig_sim2').exists())"))
    add(Case("SIGTERM to compare --workers 2",
             ["compare", "t.npz", "good.json", "--topologies", "2x4:32,1x8:32,2x4:64",
              "--workers", "2", "--time-limit", "2", "-o", "sig_cmp.csv", "--quiet"],
             signal_after=4.0, quick_exit=2.0, no_temps=".",
             check="rc in (143, -15) if signalled else rc == 0"))
    systematic(r, add, klass, sim)
    policy_and_limit_cases(r, add, klass, sim)
    return cases


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()
                  if p.name.startswith(".") and p.name.endswith((".tmp", ".old")))


def _limit_memory(limit: int = MEM_LIMIT) -> None:
    os.setsid()
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_case(case: Case, root: Path, timeout: float) -> tuple[str, str]:
    """``("clean" | "failing", reason)`` for one case."""
    before = {k: _digest(root / k) for k in case.keep}
    env = {**os.environ, **case.env, "PYTHONWARNINGS": "ignore", "MPLBACKEND": "Agg"}
    if case.api is not None:
        src = ("import sys\nfrom eplb.errors import EplbError\ntry:\n"
               + textwrap.indent(case.api, "    ")
               + "\nexcept EplbError as exc:\n"
               "    print('EPLB_ERROR', exc, file=sys.stderr)\n    sys.exit(2)\n")
        argv = [PY, "-c", src]
    else:
        argv = [PY, "-m", "eplb.cli", *(a.replace("{ROOT}", str(root)) for a in case.argv)]
    limit = MEM_LIMIT if case.mem_limit is None else case.mem_limit
    timeout = timeout if case.timeout is None else case.timeout
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=functools.partial(_limit_memory, limit))
    sent = None
    try:
        if case.signal_after is not None:
            try:
                proc.wait(timeout=case.signal_after)
            except subprocess.TimeoutExpired:
                sent = time.monotonic()
                if case.group:
                    os.killpg(proc.pid, case.sig)
                else:
                    proc.send_signal(case.sig)
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "failing", f"hang (no exit after {timeout:g} s)"
    return classify(case, root, proc.returncode, out.decode("utf-8", "replace"),
                    err.decode("utf-8", "replace"), before, sent, time.monotonic())


def classify(case: Case, root: Path, rc: int, stdout: str, stderr: str, before: dict,
             sent: float | None = None, ended: float = 0.0) -> tuple[str, str]:
    """``("clean" | "failing", reason)`` from a finished case's exit status and output."""
    reasons = []
    if "Traceback (most recent call last)" in stderr:
        last = [ln for ln in stderr.strip().splitlines() if ln.strip()][-1]
        reasons.append(f"traceback: {last[:120]}")
    for k, digest in before.items():
        if _digest(root / k) != digest:
            reasons.append(f"data loss: {k} changed or removed")
    if case.no_temps is not None:
        left = _temps(root / case.no_temps)
        if left:
            reasons.append(f"temporary files left: {left[:3]}")
    if case.quick_exit is not None and sent is not None and ended - sent > case.quick_exit:
        reasons.append(f"took {ended - sent:.1f} s to stop after the signal")
    if case.mem_limit is not None and ("out of memory" in stderr or "MemoryError" in stderr):
        reasons.append("memory before refusal: ran out of memory (address space "
                       f"{case.mem_limit / 2**30:.2g} GiB) instead of refusing the size first")
    if case.check is not None and not _holds(case.check, {
            "root": root, "rc": rc, "stderr": stderr, "signalled": sent is not None,
            "json": json}):
        last = [ln for ln in stderr.splitlines() if ln.strip()][-1:]
        reasons.append(f"check failed ({case.check}; rc {rc}; {last[0][:160] if last else ''})")
    if case.json_out and rc == 0:
        try:
            json.loads(stdout, parse_constant=lambda c: (_ for _ in ()).throw(
                ValueError(c)))
        except ValueError as exc:
            reasons.append(f"invalid JSON on stdout ({exc})")
    if case.signal_after is None and not reasons:
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        if rc == 0:
            if case.expect_error:
                reasons.append("wrong answer: bad input accepted (exit 0)")
        elif rc == 2:
            if case.api is None and not (len(lines) == 1 and lines[0].startswith("eplb: error:")):
                reasons.append(f"exit 2 but stderr is not one eplb: error: line: {lines[:2]}")
        else:
            tail = lines[-1][:120] if lines else ""
            reasons.append(f"exit {rc}: {tail}")
    return ("failing", "; ".join(reasons)) if reasons else ("clean", "")


def _holds(check: str, names: dict) -> bool:
    """Whether the case's ``check`` expression is true (an exception in it: false)."""
    try:
        return bool(eval(check, names))
    except Exception:
        return False


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang


def run_inprocess(case: Case, root: Path, timeout: float) -> tuple[str, str]:
    """An API case in this (worker) process (eplb imported once), output captured, an alarm
    for hangs; CLI cases run as their own processes (`run_case`)."""
    import contextlib
    import io
    import traceback

    if case.api is None or case.isolated or case.mem_limit is not None:
        # the CLI is run as users run it (scripts never import eplb.cli); plugin and memory
        # cases get a process of their own (registries, address-space limits)
        return run_case(case, root, timeout)
    from eplb.atomic import clear_signals
    from eplb.errors import EplbError

    before = {k: _digest(root / k) for k in case.keep}
    saved_env, cwd = dict(os.environ), os.getcwd()
    os.environ.update({**case.env, "PYTHONWARNINGS": "ignore", "MPLBACKEND": "Agg"})
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(1, int(timeout)))
    hang = False
    try:
        os.chdir(root)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                try:
                    exec(compile(case.api, "<case>", "exec"), {})
                    rc = 0
                except EplbError as exc:
                    print("EPLB_ERROR", exc, file=sys.stderr)
                    rc = 2
            except _Hang:
                hang = True
                rc = -9
            except BaseException:  # a traceback is the finding
                traceback.print_exc()
                rc = 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        clear_signals()
    if hang:
        return "failing", f"hang (no exit after {timeout:g} s)"
    return classify(case, root, rc, out.getvalue(), err.getvalue(), before)


def _worker_init() -> None:
    limit = 6 * 2**30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import eplb.evaluation  # noqa: F401 - imported once per worker


def _run_chunk(chunk: list[tuple[int, Case]], root: Path, timeout: float, mode: str):
    results = []
    for i, case in chunk:
        box = root.parent / f"{root.name}-{i}"  # each case gets its own copy of the inputs
        # hard links stay hard links in the copy (the aliasing cases need them)
        shutil.copytree(root, box, symlinks=True,
                        copy_function=functools.partial(_copy_or_fifo, linked={}))
        ro = case.env.get("EPLB_CORPUS_RO")
        if ro:
            os.chmod(box / ro, 0o555)
        try:
            runner = run_inprocess if mode == "inprocess" else run_case
            results.append((i, *runner(case, box, timeout)))
        except MemoryError:
            results.append((i, "failing", "MemoryError escaped"))
        finally:
            if ro:
                os.chmod(box / ro, 0o755)
            shutil.rmtree(box, ignore_errors=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case (default 60)")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    ap.add_argument("-k", metavar="TEXT", help="only cases whose name contains TEXT")
    ap.add_argument("--class", dest="klass", metavar="TEXT",
                    help="only the cases of this class (as --list names it; else every class "
                    "whose name contains TEXT)")
    ap.add_argument("--results", metavar="FILE",
                    help="append one JSON line per finished case (name, class, verdict, why)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--limit", type=int, default=0, metavar="N",
                    help="run about N cases spread over the corpus (default: all)")
    ap.add_argument("--list", action="store_true", help="print the case counts and exit")
    ap.add_argument("--subprocess", action="store_true",
                    help="run API cases as processes too (default: inside worker processes)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="eplb-hostile-"))
    try:
        cases = build(root)
        if args.k:
            cases = [c for c in cases if args.k in c.name]
        if args.klass:  # a class named exactly, else every class whose name contains TEXT
            exact = any(c.klass == args.klass for c in cases)
            cases = [c for c in cases
                     if (c.klass == args.klass if exact else args.klass in c.klass)]
        if args.list:
            for name in dict.fromkeys(c.klass for c in cases):
                print(f"  {name}: {sum(c.klass == name for c in cases)}")
            print(f"{len(cases)} cases")
            return 0
        import random

        random.Random(0).shuffle(cases)  # classes interleaved: a cut-short run is a sample
        if args.limit:
            cases = cases[:: max(1, len(cases) // args.limit)]
        print(f"{len(cases)} cases", flush=True)
        results = []

        verdicts: dict[int, tuple[str, str]] = {}
        chunks = [list(enumerate(cases))[k:k + 10] for k in range(0, len(cases), 10)]
        mode = "subprocess" if args.subprocess else "inprocess"
        log = open(args.results, "a", encoding="utf-8") if args.results else None
        # fresh worker processes every `batch` chunks (memory, leaked state); not through
        # max_tasks_per_child, whose worker replacement deadlocks on Python 3.11 (seen here)
        batch = 5 * max(1, args.jobs)
        for first in range(0, len(chunks), batch):
            if args.subprocess:
                pool = concurrent.futures.ThreadPoolExecutor(args.jobs)
            else:
                pool = concurrent.futures.ProcessPoolExecutor(args.jobs,
                                                              initializer=_worker_init)
            with pool:
                futs = {pool.submit(_run_chunk, ch, root, args.timeout, mode): ch
                        for ch in chunks[first:first + batch]}
                for fut in concurrent.futures.as_completed(futs):
                    try:
                        got = fut.result()
                    except Exception:  # a worker died (memory, a crash): rerun as processes
                        got = _run_chunk(futs[fut], root, args.timeout, "subprocess")
                    for i, verdict, why in got:
                        verdicts[i] = (verdict, why)
                        case = cases[i]
                        tag = "FAIL " if verdict == "failing" else "clean"
                        print(f"{tag} [{case.klass}] {case.name!r}" + (f": {why}" if why else ""),
                              flush=True)
                        if log is not None:
                            log.write(json.dumps({"name": case.name, "class": case.klass,
                                                  "verdict": verdict, "why": why}) + "\n")
                            log.flush()
                    if len(verdicts) % 100 < 10:
                        print(f"... {len(verdicts)}/{len(cases)} done", flush=True)
        if log is not None:
            log.close()
        results = [(c, *verdicts[i]) for i, c in enumerate(cases)]
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    clean = sum(v == "clean" for _, v, _ in results)
    print("\nclass: clean / failing")
    for name in dict.fromkeys(c.klass for c, _, _ in results):
        mine = [v for c, v, _ in results if c.klass == name]
        print(f"  {name}: {mine.count('clean')} / {mine.count('failing')}")
    print(f"\n{len(results)} cases: {clean} clean, {len(results) - clean} failing")
    return 0 if clean == len(results) else 1


def _copy_or_fifo(src: str, dst: str, linked: dict[tuple[int, int], str]) -> None:
    """Copy ``src`` to ``dst``; a FIFO is made anew, and a file with several hard links is
    linked to its first copy (``linked``: ``(device, inode)`` -> copied path)."""
    import stat

    st = os.stat(src)
    if stat.S_ISFIFO(st.st_mode):
        os.mkfifo(dst)
    elif st.st_nlink > 1 and (st.st_dev, st.st_ino) in linked:
        os.link(linked[st.st_dev, st.st_ino], dst)
    else:
        shutil.copy2(src, dst)
        if st.st_nlink > 1:
            linked[st.st_dev, st.st_ino] = dst



# ------------------------------------------------------------------ systematic families
PICKLE = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03."
OPTION_VALUES = ("0", "-1", "1e300", "inf", "nan", "1e-320")


def _byte_variants(good: bytes, seed: int, sized: bool = True
                   ) -> dict[str, tuple[bytes, bool]]:
    """name -> (content, must be refused) for one good file: truncations, garbage, flips.
    ``sized``: the format declares its extent (npz, npy, JSON, Parquet, .pt, YAML), so a
    truncation is detectable; a CSV, JSON-lines or TOML file cut at a line end is legal."""
    rng = np.random.default_rng(seed)
    n = len(good)
    out: dict[str, tuple[bytes, bool]] = {"empty": (b"", True), "one-byte": (good[:1], True),
                                          "garbage": (rng.bytes(512), True),
                                          "pickle": (PICKLE, True),
                                          "nul-padded": (good + b"\0" * 4096, False),
                                          "junk-appended": (good + rng.bytes(64), False)}
    for frac in (0.1, 0.5, 0.9, 0.99):
        out[f"truncated-{int(frac * 100)}%"] = (good[: int(n * frac)], sized and frac <= 0.5)
    for k in range(4):
        flipped = bytearray(good)
        pos = int(rng.integers(0, n))
        flipped[pos] ^= 1 << int(rng.integers(0, 8))
        out[f"bitflip-{k}"] = (bytes(flipped), False)
    return out


_OPTIONS_SRC = """
import argparse, json
from eplb.cli.main import build_parser
def walk(parser, prefix):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from walk(sp, [*prefix, name])
        elif a.option_strings and a.type is not None:
            yield [prefix, a.option_strings[-1]]
print(json.dumps(list(walk(build_parser(), []))))
"""


def _option_table():
    """(verb path, option) for every typed option, as the CLI declares them (asked in a
    process of its own, as a user would ask ``--help``; scripts do not import the CLI)."""
    got = subprocess.run([PY, "-c", _OPTIONS_SRC], capture_output=True, text=True, check=True)
    return [(tuple(verb), opt) for verb, opt in json.loads(got.stdout)]


def systematic(r: Path, add, klass: list, sim: list[str]) -> None:
    """Families x variants: every input format x byte variants x readers; every typed CLI
    option x hostile values; every numeric TOML key x hostile values; outputs that alias
    inputs in several spellings x every output option; odd output targets x every output
    option; contradictory topologies; API functions x wrong types."""

    def run_cli(*argv):
        return subprocess.run([PY, "-m", "eplb.cli", *argv], cwd=r, capture_output=True)

    # good files of every format
    for fmt, name in (("parquet", "t.parquet"), ("csv", "t.csv"), ("sglang", "t_sg.json")):
        run_cli("trace", "convert", "t.npz", name, "--format", fmt)
    counts = np.load(r / "t.npz")["counts"] if "counts" in np.load(r / "t.npz").files else None
    if counts is not None:
        np.save(r / "t.npy", counts)
    for fmt, name in (("sglang", "p_sg.json"), ("trtllm", "p.yaml"), ("npz", "p.npz"),
                      ("vllm", "p_vllm.json")):
        run_cli("solve", "t.npz", "--topology", "2x4", "--slots", "32", "-o", name,
                "--format", fmt)
    for name in ("w.csv", "w.parquet"):
        run_cli("workload", "convert", "w.jsonl", name)
    try:
        import torch

        torch.save({"logical_count": torch.ones(2, 3, 16)}, r / "t.pt")
    except ImportError:  # pragma: no cover
        pass

    readers = {  # good file -> commands reading it as what it is
        "t.npz": [["trace", "info"], ["solve", "--topology", "2x4", "--slots", "32", "--FILE"]],
        "t.npy": [["trace", "info"]],
        "t.csv": [["trace", "info"], ["solve", "--topology", "2x4", "--slots", "32", "--FILE"]],
        "t.parquet": [["trace", "info"]],
        "t_sg.json": [["trace", "info"], ["replay", "--topology", "2x4", "--slots", "32",
                                           "--quiet", "--FILE"]],
        "t.pt": [["trace", "info"]],
        "p.json": [["evaluate", "--FILE", "t.npz"]],
        "p_sg.json": [["evaluate", "--FILE", "t.npz"]],
        "p.yaml": [["evaluate", "--FILE", "t.npz"]],
        "p.npz": [["evaluate", "--FILE", "t.npz"]],
        "p_vllm.json": [["evaluate", "--FILE", "t.npz"]],
        "w.jsonl": [["workload", "info"]],
        "w.csv": [["workload", "info"]],
        "w.parquet": [["workload", "info"], ["workload", "convert", "--FILE", "wc.csv"]],
    }
    (r / "c.toml").exists() and readers.setdefault("c.toml", [["simulate", "--FILE", *sim,
                                                                 "-o", "o_bytes"]])
    vdir = r / "variants"
    vdir.mkdir()

    def argv_for(cmd: list[str], path: str) -> list[str]:
        return [path if a == "--FILE" else a for a in cmd] if "--FILE" in cmd else [*cmd, path]

    klass[0] = "formats: truncated / garbage / bit flips"
    goods = {name: (r / name).read_bytes() for name in readers if (r / name).is_file()}
    for seed, (name, good) in enumerate(sorted(goods.items())):
        stem, suffix = os.path.splitext(name)
        sized = suffix not in (".csv", ".jsonl", ".toml")
        for label, (data, bad) in _byte_variants(good, seed, sized).items():
            vname = f"variants/{stem}.{label}{suffix}"
            (r / vname).write_bytes(data)
            for cmd in readers[name]:
                klass[0] = ("disguised pickles" if label == "pickle"
                            else "formats: truncated / garbage / bit flips")
                add(Case(f"{cmd[0]} {name} {label}", argv_for(cmd, vname), expect_error=bad,
                         keep=[vname]))
        klass[0] = "formats: disguised as another format"
        for other, data in sorted(goods.items()):
            if other == name:
                continue
            vname = f"variants/{stem}.as-{other.replace('.', '_')}{suffix}"
            (r / vname).write_bytes(data)
            add(Case(f"{readers[name][0][0]} {name} holding {other}",
                     argv_for(readers[name][0], vname), keep=[vname],
                     expect_error=Path(other).suffix in (".toml", ".yaml")
                     and Path(name).suffix not in (".toml", ".yaml")))
        klass[0] = "FIFOs / devices / odd paths"
        specials = {"fifo": lambda p: os.mkfifo(p), "devzero": lambda p: p.symlink_to("/dev/zero"),
                    "devnull": lambda p: p.symlink_to("/dev/null"), "dir": lambda p: p.mkdir(),
                    "dangling-link": lambda p: p.symlink_to("nope-nothing-here"),
                    "link-loop": lambda p: p.symlink_to(p.name)}
        for label, make in specials.items():
            vname = f"variants/{stem}.{label}{suffix}"
            make(r / vname)
            add(Case(f"{readers[name][0][0]} {name} as {label}", argv_for(readers[name][0],
                                                                         vname),
                     expect_error=True))
        for label, odd in (("space", f"a b{suffix}"), ("unicode", f"é²ü{suffix}"),
                           ("dash", f"-x{suffix}"), ("newline", f"a\nb{suffix}"),
                           ("name-255", "n" * (255 - len(suffix)) + suffix)):
            vname = f"variants/{odd}"
            (r / vname).write_bytes(good)
            add(Case(f"{readers[name][0][0]} {name} named {label}",
                     argv_for(readers[name][0], vname), keep=[vname]))

    # numeric content: NaN / inf / negative / huge / nested / wrong types in each text format
    klass[0] = "formats: NaN / inf / huge / nested / mistyped values"
    values = {"nan": "NaN", "inf": "Infinity", "neg": "-3", "huge": "1e300",
              "bigint": "1" + "0" * 30, "string": '"x"', "bool": "true", "null": "null",
              "nested": "[[[[1]]]]", "deep": "[" * 5000 + "1" + "]" * 5000}
    for label, v in values.items():
        (r / f"variants/sg_{label}.json").write_text('{"logical_count": [[[1, 2, ' + v
                                                     + ", 4]]]}")
        add(Case(f"trace info sglang value {label}", ["trace", "info",
                                                      f"variants/sg_{label}.json"],
                 expect_error=True))
        csv_v = {"nan": "nan", "inf": "inf", "neg": "-3", "huge": "1e300", "bigint": "1" + "0" * 30,
                 "string": "x", "bool": "True", "null": "", "nested": "[1]",
                 "deep": "[" * 50}[label]
        (r / f"variants/t_{label}.csv").write_text(f"window,layer,expert,count\n0,0,0,{csv_v}\n"
                                                   "0,0,1,3\n")
        add(Case(f"trace info csv count {label}", ["trace", "info", f"variants/t_{label}.csv"],
                 expect_error=label not in ("nan",)))  # csv: an empty/nan count may mean 0
        (r / f"variants/w_{label}.jsonl").write_text(
            '{"timestamp": 0, "input_length": ' + v + ', "output_length": 10}\n')
        add(Case(f"workload info jsonl input_length {label}",
                 ["workload", "info", f"variants/w_{label}.jsonl"], expect_error=True))
        doc = json.loads((r / "p.json").read_text())
        text = json.dumps(doc)
        key = next(iter(k for k in doc if isinstance(doc[k], list)), None)
        if key is not None:
            (r / f"variants/p_{label}.json").write_text(
                text.replace(f'"{key}": [', f'"{key}": [{v}, ', 1))
            add(Case(f"evaluate placement {key} value {label}",
                     ["evaluate", f"variants/p_{label}.json", "t.npz"], expect_error=True))

    # every typed CLI option x hostile values
    klass[0] = "numeric options (0, negative, huge, inf, nan, denormal)"
    bases = {
        ("solve",): ["solve", "t.npz", "--topology", "2x4", "--slots", "32"],
        ("evaluate",): ["evaluate", "p.json", "t.npz"],
        ("replay",): ["replay", "t.npz", "--topology", "2x4", "--slots", "32", "--quiet"],
        ("compare",): ["compare", "t.npz", "--solvers", "greedy", "--topologies", "2x4:32",
                       "--quiet"],
        ("execute",): ["execute", "p.json", "--trace", "t.npz"],
        ("simulate",): ["simulate", "deepseek_day6", *sim, "-o", "o_num"],
        ("trace", "synth"): ["trace", "synth", "zipf", "-o", "s.npz", "--layers", "2",
                             "--experts", "16", "--windows", "2"],
        ("trace", "info"): ["trace", "info", "t.npz"],
        ("workload", "synth"): ["workload", "synth", "-o", "ws.jsonl", "-n", "10"],
        ("workload", "info"): ["workload", "info", "w.jsonl"],
        ("workload", "convert"): ["workload", "convert", "w.jsonl", "wc.csv"],
    }
    for verb, opt in _option_table():
        base = bases.get(verb)
        if base is None:
            continue
        for value in OPTION_VALUES:
            add(Case(f"{' '.join(verb)} {opt} {value}", [*base, opt, value],
                     expect_error=value == "nan", json_out="--json" in base))

    # every numeric TOML key x hostile values
    klass[0] = "toml configs"
    cfg = (r / "c.toml").read_text() if (r / "c.toml").exists() else ""
    import re

    lines = cfg.splitlines()
    for i, line in enumerate(lines):
        m = re.fullmatch(r"([a-z_]+) = (-?[0-9.e+-]+)", line)
        if not m:
            continue
        for label, v in (("neg", "-1"), ("inf", "inf"), ("nan", "nan"), ("string", '"x"'),
                         ("bool", "true")):
            name = f"variants/cfg_{i}_{label}.toml"
            (r / name).write_text("\n".join([*lines[:i], f"{m.group(1)} = {v}",
                                             *lines[i + 1:]]) + "\n")
            add(Case(f"simulate config line {i} {m.group(1)} = {v}",
                     ["simulate", name, *sim, "-o", f"o_cfg_{i}_{label}"],
                     expect_error=label in ("nan", "string", "bool"), keep=[name]))

    # outputs that alias inputs, in several spellings
    klass[0] = "aliasing outputs"
    os.link(r / "t.npz", r / "t_hard.npz")
    (r / "t_link.npz").symlink_to("t.npz")
    (r / "sub").mkdir()
    spellings = {"same": "t.npz", "dot": "./t.npz", "abs": "{ROOT}/t.npz",  # the sandbox's
                 "updir": "sub/../t.npz", "symlink": "t_link.npz", "hardlink": "t_hard.npz"}
    makers = {
        "solve -o": lambda o: ["solve", "t.npz", "--topology", "2x4", "--slots", "32", "-o", o],
        "trace convert": lambda o: ["trace", "convert", "t.npz", o],
        "trace stack -o": lambda o: ["trace", "stack", "t.npz", "t.npz", "-o", o],
        "trace info --plot": lambda o: ["trace", "info", "t.npz", "--plot", o],
        "evaluate -o": lambda o: ["evaluate", "p.json", "t.npz", "-o", o],
        "evaluate --plot": lambda o: ["evaluate", "p.json", "t.npz", "--plot", o],
        "replay -o": lambda o: ["replay", "t.npz", "--topology", "2x4", "--slots", "32",
                                "--quiet", "-o", o],
        "replay --plot": lambda o: ["replay", "t.npz", "--topology", "2x4", "--slots", "32",
                                    "--quiet", "--plot", o],
        "compare -o": lambda o: ["compare", "t.npz", "--solvers", "greedy", "--topologies",
                                 "2x4:32", "--quiet", "-o", o],
        "compare --plot": lambda o: ["compare", "t.npz", "--solvers", "greedy",
                                     "--topologies", "2x4:32", "--quiet", "--plot", o],
        "simulate -o": lambda o: ["simulate", "deepseek_day6", "--workload", "w.jsonl",
                                  "--no-plots", "--no-progress", "-o", o, "--force"],
    }
    for what, make in makers.items():
        for label, spelled in spellings.items():
            add(Case(f"{what} = input ({label})", make(spelled), expect_error=True,
                     keep=["t.npz"]))

    # odd output targets
    klass[0] = "read-only / full disks / odd output paths"
    (r / "ro").mkdir()
    (r / "ro_file.npz").write_bytes(b"x")
    os.chmod(r / "ro_file.npz", 0o444)
    targets = {"/dev/full": "/dev/full", "missing folder": "no/such/dir/out.x",
               "under a file": "t.npz/out.x", "name 300": "n" * 300 + ".x",
               "path 5000": "/".join(["d" * 200] * 25) + "/o.x", "empty": "",
               "read-only file": "ro_file.npz", "existing folder": "ro"}
    for what, make in makers.items():
        for label, target in targets.items():
            suffix = {"plot": ".png", "-o": ".csv"}.get(what.split()[-1].lstrip("-"), ".csv")
            if what.startswith("solve") or what.startswith("trace convert") \
                    or what.startswith("trace stack"):
                suffix = ".npz" if not what.startswith("solve") else ".json"
            t = target.replace(".x", suffix) if target.endswith(".x") else target
            if label == "existing folder" and what.startswith(("simulate", "compare --plot")):
                continue  # folders are legal there
            add(Case(f"{what} to {label}", make(t), expect_error=True, keep=["ro_file.npz"]))
    (r / "ro_dir").mkdir()
    for what in ("solve -o", "evaluate -o", "compare -o", "simulate -o"):
        # root writes into a read-only folder: there the case only checks for a clean exit
        add(Case(f"{what} into a read-only folder", makers[what]("ro_dir/out.json"
                 if what == "solve -o" else "ro_dir/out"), expect_error=os.geteuid() != 0,
                 env={"EPLB_CORPUS_RO": "ro_dir"}))

    # contradictory topologies
    klass[0] = "contradictory topologies"
    for topo, slots in (("0x8", 32), ("2x0", 32), ("3x8", 32), ("2x3", 32), ("2x4", 7),
                        ("2x4", 8), ("2x4", 0), ("2x4", -32), ("-2x4", 32), ("axb", 32),
                        ("1e3x8", 32), ("2x4x3", 32), ("2x4", 10**12), ("8x1", 32),
                        ("2x4", 33), ("16x16", 32), ("2.5x4", 32), ("x", 32)):
        for verb in ("solve", "replay", "evaluate"):
            if verb == "evaluate":
                argv = ["evaluate", "p.json", "t.npz", "--topology", topo]
            else:
                argv = [verb, "t.npz", "--topology", topo, "--slots", str(slots)]
                if verb == "replay":
                    argv.append("--quiet")
            add(Case(f"{verb} --topology {topo} --slots {slots}", argv,
                     expect_error=not (topo in ("2x4", "8x1") and slots in (8, 32, 33))
                     and not (verb == "evaluate" and topo in ("2x4", "8x1"))))

    # API functions x wrong types and shapes
    klass[0] = "API wrong types / shapes"
    calls = {
        "traces.read": "from eplb import traces\ntraces.read(X)",
        "Topology.parse": "from eplb import Topology\nTopology.parse(X, 32)",
        "read_placement": "from eplb.io import read_placement\nread_placement(X)",
        "write_placement": "from eplb.io import write_placement\nwrite_placement(X, 'o.json')",
        "solve": "from eplb import Topology, solvers\n"
                 "solvers.solve('greedy', X, Topology.parse('2x4', 32))",
        "lower_bound": "from eplb import Topology\n"
                       "from eplb.solvers.analysis.bounds import lower_bound\n"
                       "lower_bound(X, Topology.parse('2x4', 32))",
        "workload.read": "from eplb.evaluation.serving import workload as W\nW.read(X)",
        "synthesize": "from eplb.evaluation.serving import workload as W\nW.synthesize(X)",
        "ClusterConfig.load": "from eplb.evaluation.serving import ClusterConfig\n"
                              "ClusterConfig.load(X)",
        "replay": "from eplb import Topology\nfrom eplb.evaluation.replay import replay\n"
                  "replay(X, Topology.parse('2x4', 32), policy='even')",
    }
    junk = {"None": "None", "str": "'nope'", "bool": "True", "nan": "float('nan')",
            "empty array": "np.ones(0)", "1-d array": "np.ones(3)",
            "nan array": "np.full((2, 16), np.nan)", "object array": "np.array([{}], dtype=object)",
            "dict": "{'a': 1}", "huge int": "10**30", "negative": "-5", "bytes": "b'\\xff'"}
    for fname, src in calls.items():
        for label, value in junk.items():
            add(Case(f"API {fname}({label})", api="import numpy as np\n" + src.replace("X", value),
                     expect_error=True))


# ------------------------------------------------------------------ plugins, limits (issue 38)
DATA_LOSS = "data loss: outputs over files read or imported"
ENDLESS = "never-ending work"
MEMORY = "memory before refusal"
PLUGINS = "plugins and entry points"
WRONG = "tracebacks and wrong accepts"
MEM_CAP = 3 * 2**30 // 2  # address space of a memory case: the imports fit, a 2 GiB array not

_POLICY = """
import numpy as np
from eplb import solvers
"""

_PLUGINS = {  # module file -> source (each registers the policies named in it)
    "mypol.py": _POLICY + """
@solvers.register("mine")
def mine(load, topology, seed=0):
    return solvers.solve("greedy", load, topology, seed=seed)
""",
    "polhelper.py": "def delegate(name, load, topology):\n"
                    "    from eplb import solvers\n"
                    "    return solvers.solve(name, load, topology)\n",
    "usehelper.py": _POLICY + """
import polhelper
@solvers.register("helped")
def helped(load, topology):
    return polhelper.delegate("greedy", load, topology)
""",
    "pkgplug/__init__.py": "",
    "pkgplug/sub.py": _POLICY + """
@solvers.register("pkgmine")
def pkgmine(load, topology):
    return solvers.solve("greedy", load, topology)
""",
    "boom.py": _POLICY + "raise ZeroDivisionError('plugin boom fails at import')\n",
    "syntaxerr.py": "def broken(:\n    pass\n",
    "badsig.py": _POLICY + """
@solvers.register("badsig")
def badsig(load):
    return load
""",
    "raiser.py": _POLICY + """
@solvers.register("raiser")
def raiser(load, topology):
    raise ValueError("raiser: this policy always fails")
""",
    "sleepy.py": _POLICY + """
import time
@solvers.register("sleepy")
def sleepy(load, topology, time_limit=None):
    while True:  # ignores time_limit
        time.sleep(0.05)
""",
    "spinner.py": _POLICY + """
@solvers.register("spinner")
def spinner(load, topology):
    n = 0
    while True:  # a pure-Python loop: no sleep, no time limit honoured
        n += 1
""",
    "metaset.py": _POLICY + """
from eplb import Placement
@solvers.register("metaset")
def metaset(load, topology):
    p = solvers.solve("greedy", load, topology)
    return Placement(p.phy2log, p.num_experts, p.topology,
                     meta={"tags": {"b", "a"}, "score": float("nan"), "inf": float("inf")})
""",
    "badreturn.py": _POLICY + """
@solvers.register("badreturn")
def badreturn(load, topology):
    return [[0, 1]]
""",
}

_GOOD_EP = ({"goodpol": "goodpkg:goodpol"}, {"goodpkg.py": _POLICY + """
def goodpol(load, topology):
    return solvers.solve("greedy", load, topology)
"""})
_FAILING_EPS = {  # policies that load but fail when they run
    "raisepkg": ({"raise_ep": "raisepkg:raiser"}, {"raisepkg.py": _POLICY + """
def raiser(load, topology):
    raise KeyError("raise_ep always fails")
"""}),
    "sleepypkg": ({"sleepy_ep": "sleepypkg:sleepy"}, {"sleepypkg.py": _POLICY + """
import time
def sleepy(load, topology, time_limit=None):
    while True:
        time.sleep(0.05)
"""}),
}
_ENTRY_POINTS = {  # site folder -> {distribution: (entry points, {module file: source})}
    "site_good": {"goodpkg": _GOOD_EP},
    "site_slow": {"goodpkg": _GOOD_EP, **_FAILING_EPS},
    "site_bad": {  # every way an installed package's entry point can be broken
        "goodpkg": _GOOD_EP,
        "brokenpkg": ({"brokenattr": "brokenpkg:nope"}, {"brokenpkg.py": "X = 1\n"}),
        "missingpkg": ({"missingmod": "no_such_module_here:fn"}, {}),
        "badsigpkg": ({"badsig_ep": "badsigpkg:notapolicy"},
                      {"badsigpkg.py": "def notapolicy(x):\n    return x\n"}),
        "classpkg": ({"class_ep": "classpkg:Policy"},
                     {"classpkg.py": "class Policy:\n    def __init__(self, a, b, *, c):\n"
                                     "        pass\n"}),
        "boompkg": ({"boom_ep": "boompkg"}, {"boompkg.py": "raise RuntimeError('boompkg!')\n"}),
        "duppkg": ({"dup_ep": "duppkg"}, {"duppkg.py": _POLICY + """
@solvers.register("greedy")
def greedy(load, topology):
    raise ValueError("an impostor greedy")
"""}),
        "exitpkg": ({"exit_ep": "exitpkg"}, {"exitpkg.py": "import sys\nsys.exit(3)\n"}),
    },
}


_ENTRY_POINTS["site_mixed"] = {**_ENTRY_POINTS["site_bad"], **_FAILING_EPS}


def _write_site(folder: Path, dists: dict) -> None:
    """A folder on PYTHONPATH that importlib.metadata reads as installed distributions with
    ``eplb.solvers`` entry points."""
    folder.mkdir()
    for dist, (eps, modules) in dists.items():
        info = folder / f"{dist}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(
            "[eplb.solvers]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
        for name, src in modules.items():
            (folder / name).write_text(src)


def _pt_records(path: Path, p2l_max: int, topk: tuple[int, ...] = ()) -> None:
    """An SGLang per-pass ``.pt`` dump whose map names expert ``p2l_max`` (``topk``: one
    per-token record per entry, with that many picks per token)."""
    import torch

    p2l = torch.tensor([[0, 1, 2, p2l_max]], dtype=torch.int64)
    records = [{"global_physical_count": torch.ones(1, 4), "forward_pass_id": i}
               for i in range(max(1, len(topk)))]
    for rec, k in zip(records[:len(topk)], topk, strict=True):
        rec["topk_ids_of_layer"] = torch.zeros(1, 3, k, dtype=torch.int64)
    torch.save({"last_physical_to_logical_map": p2l, "records": records}, path)


def _vllm_stats(path: Path, p2l_max: int) -> None:
    meta = {"record_type": "eplb_load_meta", "model": "m", "num_layers": 1}
    stats = {"record_type": "eplb_load_stats", "step": 0, "expert_load": [[1, 2, 3, 4]],
             "p2l_map": [[0, 1, 2, p2l_max]]}
    path.write_text(json.dumps(meta) + "\n" + json.dumps(stats) + "\n")


def _rankdir(root: Path, layers=("0",), ranks=("0",), rows="0,\"[1, 2, 3, 4]\"\n") -> Path:
    for rank in ranks:
        (root / rank).mkdir(parents=True, exist_ok=True)
        for lyr in layers:
            (root / rank / f"moe_layer-{lyr}.csv").write_text(
                "iteration,expert distribution\n" + rows)
    return root


def policy_and_limit_cases(r: Path, add, klass: list, sim: list[str]) -> None:
    """Issue 38's classes, from cases built here: outputs over files a run read or imported
    (plugins, entry points' modules); searches, plugins and readers that never end; sizes
    implied by ids and counts; broken plugins and entry points; tracebacks and wrong accepts
    in the workload and trace readers and the API."""
    import pandas as pd

    def run_cli(*argv, env=None):
        return subprocess.run([PY, "-m", "eplb.cli", *argv], cwd=r, capture_output=True,
                              env={**os.environ, **(env or {})})

    for name, src in _PLUGINS.items():
        (r / name).parent.mkdir(exist_ok=True)
        (r / name).write_text(src)
    for folder, dists in _ENTRY_POINTS.items():
        _write_site(r / folder, dists)
    bundled = Path(__file__).resolve().parents[1] / "traces" / "data"
    shutil.copy(bundled / "deepseek-v3-calibrated.npz", r / "ds.npz")
    solve = ["solve", "t.npz", "--topology", "2x4", "--slots", "32"]
    cmp = ["compare", "t.npz", "--topologies", "2x4:32", "--quiet"]
    advise = ["advise", "ds.npz", "--topology", "4x8", "--slots", "288", "--levers",
              "rebalance"]
    bad_site = {"PYTHONPATH": "site_bad"}  # broken entry points beside working ones
    slow_site = {"PYTHONPATH": "site_slow"}  # entry points that load, then fail or overrun
    mixed_site = {"PYTHONPATH": "site_mixed"}  # both
    tight = ["--set", "slo.ttft_s=1.0"]  # a goodput target 30 requests bracket quickly

    # -------------------------------------------------------------- (1) data loss
    klass[0] = DATA_LOSS
    native = ["--format", "native"]
    for plugin, solver, target in (("mypol", "mine", "mypol.py"),
                                   ("usehelper", "helped", "polhelper.py"),
                                   ("usehelper", "helped", "usehelper.py"),
                                   ("pkgplug.sub", "pkgmine", "pkgplug/sub.py"),
                                   ("pkgplug.sub", "pkgmine", "pkgplug/__init__.py")):
        add(Case(f"solve --plugin {plugin} -o {target}",
                 [*solve, "--plugin", plugin, "--solver", solver, "-o", target, *native],
                 expect_error=True, keep=[target]))
    add(Case("solve --plugin mypol -o ./mypol.py (npz)",
             [*solve, "--plugin", "mypol", "--solver", "mine", "-o", "./mypol.py", "--format",
              "npz"], expect_error=True, keep=["mypol.py"]))
    for flag in ("-o", "--markdown", "--layers-csv"):
        add(Case(f"compare --plugin mypol {flag} mypol.py",
                 [*cmp, "--plugin", "mypol", "--solvers", "mine", flag, "mypol.py"],
                 expect_error=True, keep=["mypol.py"]))
    add(Case("solve entry point's module -o site_good/goodpkg.py",
             [*solve, "--solver", "goodpol", "-o", "site_good/goodpkg.py", *native],
             env={"PYTHONPATH": "site_good"}, expect_error=True, keep=["site_good/goodpkg.py"]))
    add(Case("solve entry point (unused) module -o site_good/goodpkg.py",
             [*solve, "--solver", "greedy", "-o", "site_good/goodpkg.py", *native],
             env={"PYTHONPATH": "site_good"}, expect_error=True, keep=["site_good/goodpkg.py"]))
    add(Case("compare entry point's module --markdown site_good/goodpkg.py",
             [*cmp, "--solvers", "goodpol", "--markdown", "site_good/goodpkg.py"],
             env={"PYTHONPATH": "site_good"}, expect_error=True, keep=["site_good/goodpkg.py"]))
    add(Case("solve --plugin mypol -o mypol.py through a symlink",
             [*solve, "--plugin", "mypol", "--solver", "mine", "-o", "mypol_link.py", *native],
             expect_error=True, keep=["mypol.py"]))
    (r / "mypol_link.py").symlink_to("mypol.py")
    # simulate --force over a folder an eplb run wrote, holding the initial placement the
    # config names (listed in the folder's manifest, as if that run had written it)
    run_cli("solve", "ds.npz", "--topology", "4x8", "--slots", "288", "--format", "sglang",
            "-o", "init_sg.json")
    run_cli("simulate", "deepseek_day6", *sim, "-o", "dl_init")
    if (r / "dl_init").is_dir() and (r / "init_sg.json").is_file():
        shutil.copy(r / "init_sg.json", r / "dl_init" / "init.json")
        manifest = json.loads((r / "dl_init" / ".eplb-output.json").read_text())
        manifest["files"].append("init.json")
        (r / "dl_init" / ".eplb-output.json").write_text(json.dumps(manifest))
        add(Case("simulate -o DIR --force, the config's eplb.initial inside DIR",
                 ["simulate", "deepseek_day6", *sim, "-o", "dl_init", "--force", "--set",
                  "eplb.initial='dl_init/init.json'"], expect_error=True,
                 keep=["dl_init/init.json"], timeout=90))
    run_cli(*solve, "-o", "prev.json")
    add(Case("advise --previous prev.json -o prev.json",
             [*advise, "--previous", "prev.json", "-o", "prev.json"], expect_error=True,
             keep=["prev.json"]))

    # -------------------------------------------------------------- (2) never-ending work
    klass[0] = ENDLESS
    for tol in ("1e-300", "1e-17", "2e-16"):
        add(Case(f"simulate --capacity --rel-tol {tol}",
                 ["simulate", "deepseek_day6", *sim, "--capacity", "--rel-tol", tol, *tight],
                 expect_error=True, timeout=90))
    for tol in ("1e-300", "1e-16"):
        add(Case(f"API capacity rel_tol={tol}",
                 api="from eplb.evaluation.serving import ClusterConfig, capacity, workload as W\n"
                     "capacity(ClusterConfig.load('deepseek_day6'), W.read('w.jsonl'), "
                     f"slo={{'ttft_s': 1.0, 'tpot_s': 0.05}}, rel_tol={tol}, progress=False)",
                 expect_error=True, timeout=90))
    add(Case("simulate --capacity --rel-tol 0.3 (ends)",
             ["simulate", "deepseek_day6", *sim, "--capacity", "--rel-tol", "0.3", *tight],
             check="rc == 0", timeout=120))
    for what, argv, env in (
            ("solve --plugin sleepy", [*solve, "--plugin", "sleepy", "--solver", "sleepy"], {}),
            ("solve --plugin spinner", [*solve, "--plugin", "spinner", "--solver", "spinner"],
             {}),
            ("compare --plugin sleepy", [*cmp, "--plugin", "sleepy", "--solvers", "sleepy"],
             {}),
            ("compare --plugin spinner --workers 2",
             [*cmp, "--plugin", "spinner", "--solvers", "spinner,greedy", "--workers", "2"], {}),
            ("replay entry point sleepy_ep", ["replay", "t.npz", "--topology", "2x4", "--slots",
                                              "32", "--quiet", "--solver", "sleepy_ep"], slow_site),
            ("advise entry point sleepy_ep", [*advise, "--solver", "sleepy_ep"], slow_site),
    ):
        add(Case(f"{what} --time-limit 1 (the policy ignores it)",
                 [*argv, "--time-limit", "1"], env=env, expect_error=True, timeout=40))
    add(Case("simulate eplb.solver = sleepy_ep, eplb.options.time_limit = 1",
             ["simulate", "deepseek_day6", *sim, "-o", "o_sleepy", "--set",
              "eplb.solver=sleepy_ep", "--set", "eplb.options={time_limit = 1}"], env=slow_site,
             expect_error=True, timeout=60))
    add(Case("advise --solver ilp --time-limit 1 (the option exists)",
             [*advise, "--solver", "ilp", "--time-limit", "1"], check="rc == 0", timeout=120))
    add(Case("API solve spinner time_limit=1",
             api="import spinner\nfrom eplb import solvers, traces, Topology\n"
                 "solvers.solve('spinner', traces.read('t.npz'), Topology.parse('2x4', 32), "
                 "time_limit=1)", isolated=True, expect_error=True, timeout=40))
    fd = _rankdir(r / "rd_fifo", layers=("1",))
    _fifo(fd / "0" / "moe_layer-0.csv")
    add(Case("trace info rank folder, layer CSV a FIFO", ["trace", "info", "rd_fifo"],
             expect_error=True, timeout=30))
    fd = _rankdir(r / "rd_datafifo")
    _fifo(fd / "data.json")
    add(Case("trace info rank folder, data.json a FIFO", ["trace", "info", "rd_datafifo"],
             expect_error=True, timeout=30))
    add(Case("API traces.read rank folder with a FIFO layer",
             api="from eplb import traces\ntraces.read('rd_fifo')", expect_error=True,
             timeout=30))
    add(Case("trace stack a rank folder with a FIFO", ["trace", "stack", "rd_fifo", "t.npz",
                                                        "-o", "st.npz"], expect_error=True,
             timeout=30))

    # -------------------------------------------------------------- (3) memory before refusal
    klass[0] = MEMORY
    ten_mb = {"EPLB_MAX_BYTES": "10e6"}
    hlen = 2**32 - 64
    (r / "npy_hlen.npy").write_bytes(b"\x93NUMPY\x02\x00" + struct.pack("<I", hlen) + b"{" * 64)
    (r / "npy_hlen3.npy").write_bytes(b"\x93NUMPY\x03\x00" + struct.pack("<I", hlen) + b"{" * 64)
    for name in ("npy_hlen.npy", "npy_hlen3.npy"):
        add(Case(f"trace info {name} (header length 2**32 - 64)", ["trace", "info", name],
                 expect_error=True, mem_limit=MEM_CAP))
    with zipfile.ZipFile(r / "npz_hlen.npz", "w") as zf:
        zf.writestr("counts.npy", (r / "npy_hlen.npy").read_bytes())
    add(Case("trace info npz member with header length 2**32 - 64",
             ["trace", "info", "npz_hlen.npz"], expect_error=True, mem_limit=MEM_CAP))
    (r / "csv_e5e8.csv").write_text("window,layer,expert,count\n0,0,0,1\n0,0,500000000,1\n")
    add(Case("trace info CSV expert id 5e8", ["trace", "info", "csv_e5e8.csv"],
             expect_error=True, mem_limit=MEM_CAP))
    add(Case("solve CSV expert id 5e8 (EPLB_MAX_BYTES=10e6)",
             [*solve[:1], "csv_e5e8.csv", *solve[2:]], expect_error=True, mem_limit=MEM_CAP,
             env=ten_mb))
    (r / "csv_r3e8.csv").write_text("window,layer,expert,count,rank\n0,0,0,1,0\n"
                                    "0,0,1,1,300000000\n")
    add(Case("trace info CSV rank id 3e8", ["trace", "info", "csv_r3e8.csv"],
             expect_error=True, mem_limit=MEM_CAP))
    pd.DataFrame({"window": [0, 0], "layer": [0, 0], "expert": [0, 500_000_000],
                  "count": [1, 1]}).to_parquet(r / "pq_e5e8.parquet")
    add(Case("trace info Parquet expert id 5e8", ["trace", "info", "pq_e5e8.parquet"],
             expect_error=True, mem_limit=MEM_CAP))
    zd = _rankdir(r / "rd_zero", layers=("1",))
    (zd / "0" / "moe_layer-0.csv").symlink_to("/dev/zero")
    add(Case("trace info rank folder, layer CSV linked to /dev/zero",
             ["trace", "info", "rd_zero"], expect_error=True, mem_limit=MEM_CAP, timeout=30))
    big = _rankdir(r / "rd_big")
    with open(big / "0" / "moe_layer-0.csv", "a") as fh:
        fh.truncate(64 * 2**20)  # a 64 MB sparse file under a 10 MB limit
    add(Case("trace info rank folder, 64 MB layer CSV (EPLB_MAX_BYTES=10e6)",
             ["trace", "info", "rd_big"], expect_error=True, env=ten_mb))
    try:
        for exp in (27, 33, 40):
            _pt_records(r / f"pt_p2l_{exp}.pt", 2**exp)
            for spelled in ("10e6", "10MB"):
                add(Case(f"trace info .pt physical-to-logical id 2**{exp} "
                         f"(EPLB_MAX_BYTES={spelled})", ["trace", "info", f"pt_p2l_{exp}.pt"],
                         expect_error=True, env={"EPLB_MAX_BYTES": spelled}, mem_limit=MEM_CAP))
        _pt_records(r / "pt_topk23.pt", 3, topk=(2, 3))
        add(Case("trace info .pt records mixing top-k 2 and 3",
                 ["trace", "info", "pt_topk23.pt"], expect_error=True, klass=WRONG))
    except ImportError:  # pragma: no cover - torch is an optional extra
        pass
    for exp in (27, 30, 31):
        _vllm_stats(r / f"vllm_p2l_{exp}.jsonl", 2**exp - (exp == 31))
        add(Case(f"trace info vLLM stats physical-to-logical id 2**{exp}",
                 ["trace", "info", f"vllm_p2l_{exp}.jsonl"], expect_error=True, env=ten_mb,
                 mem_limit=MEM_CAP))
    # 20 requests draw at most 20 of a billion system prompts: built without the others
    add(Case("workload synth --system-prompts 1000000000",
             ["workload", "synth", "-n", "20", "--system-prompts", "1000000000",
              "--system-prompt-tokens", "1024", "-o", "sp.jsonl"],
             mem_limit=MEM_CAP, timeout=60))
    add(Case("API synthesize system_prompts=1e9",
             api="from eplb.evaluation.serving import workload as W\n"
                 "W.synthesize(20, system_prompts=10**9, system_prompt_tokens=1024)",
             mem_limit=MEM_CAP, timeout=60))
    add(Case("simulate --set decode.nodes=2048",
             ["simulate", "deepseek_day6", *sim, "-o", "o_nodes", "--set", "decode.nodes=2048",
              "--set", "decode.slots_per_layer=16384"], expect_error=True, mem_limit=MEM_CAP,
             timeout=90))
    add(Case("simulate --set decode.mtp_draft_tokens=1000000000",
             ["simulate", "deepseek_day6", *sim, "-o", "o_mtp", "--set",
              "decode.mtp_draft_tokens=1000000000"], expect_error=True, mem_limit=MEM_CAP,
             timeout=60))
    add(Case("advise --redundant 1000000",
             [*advise[:-1], "redundant", "--redundant", "1000000"], expect_error=True,
             mem_limit=MEM_CAP, timeout=60))
    add(Case("advise --redundant 999744 (E + N a multiple of the GPUs)",
             [*advise[:-1], "redundant,craft", "--redundant", "999744"], expect_error=True,
             mem_limit=MEM_CAP, timeout=60))
    run_cli("trace", "synth", "zipf", "-o", "big.npz", "--layers", "8", "--experts", "256",
            "--windows", "8")  # 128 KiB of counts
    add(Case("trace stack above EPLB_MAX_BYTES",
             ["trace", "stack", "big.npz", "big.npz", "big.npz", "-o", "stacked.npz"],
             env={"EPLB_MAX_BYTES": "300000"}, expect_error=True))
    add(Case("API traces.stack above EPLB_MAX_BYTES",
             api="from eplb import traces\nt = traces.read('big.npz')\n"
                 "traces.stack([t, t, t])", env={"EPLB_MAX_BYTES": "300000"},
             isolated=True, expect_error=True))

    # -------------------------------------------------------------- (4) plugins, entry points
    klass[0] = PLUGINS
    for plugin in ("boom", "syntaxerr", "badsig", ".mod", "..mod", "mypol.py", "a..b", " ",
                   "-x", "no_such_plugin_mod", "os.path:join"):
        add(Case(f"solve --plugin {plugin!r}", [*solve, "--plugin", plugin, "--solver", "greedy"],
                 expect_error=True))
    add(Case("compare --plugin boom", [*cmp, "--plugin", "boom", "--solvers", "greedy"],
             expect_error=True))
    add(Case("API load_plugins(['boom'])", api="from eplb import solvers\n"
             "solvers.load_plugins(['boom'])", isolated=True, expect_error=True))
    add(Case("API load_plugins(['.mod'])", api="from eplb import solvers\n"
             "solvers.load_plugins(['.mod'])", isolated=True, expect_error=True))
    for name in ("raiser", "badreturn"):
        add(Case(f"solve --plugin {name} (the policy fails)",
                 [*solve, "--plugin", name, "--solver", name], expect_error=True))
        add(Case(f"compare --plugin {name} --workers 2 (the policy fails)",
                 [*cmp, "--plugin", name, "--solvers", f"{name},greedy", "--workers", "2",
                  "-o", f"cmp_{name}.csv"], expect_error=True))
    add(Case("solve --plugin metaset -o (meta holds a set and NaN)",
             [*solve, "--plugin", "metaset", "--solver", "metaset", "-o", "ms.json"],
             check="rc == 0 and json.loads((root / 'ms.json').read_text(), "
                   "parse_constant=lambda c: 1 / 0) is not None"))
    add(Case("solve --plugin metaset -o .npz (meta holds a set and NaN)",
             [*solve, "--plugin", "metaset", "--solver", "metaset", "-o", "ms.npz"],
             check="rc == 0"))
    add(Case("compare --plugin mypol --workers 2 (workers load the plugin)",
             [*cmp, "--plugin", "mypol", "--solvers", "mine,greedy", "--workers", "2",
              "--topologies", "2x4:32,1x8:32,2x4:64,1x8:64", "-o", "cmp_w2.csv"],
             check="rc == 0 and set(__import__('pandas').read_csv(root / 'cmp_w2.csv')"
                   "['status']) == {'ok'}"))
    add(Case("compare --plugin mypol --workers 2 with a progress bar (spawned workers)",
             [*[a for a in cmp if a != "--quiet"], "--plugin", "mypol", "--solvers",
              "mine,greedy", "--workers", "2", "--topologies", "2x4:32,1x8:32,2x4:64,1x8:64",
              "-o", "cmp_w2b.csv"],
             check="rc == 0 and set(__import__('pandas').read_csv(root / 'cmp_w2b.csv')"
                   "['status']) == {'ok'}"))
    # one broken installed package must not break the others, nor other verbs
    for what, argv in (("solve --solver greedy", [*solve, "--solver", "greedy"]),
                       ("solve --solver goodpol", [*solve, "--solver", "goodpol"]),
                       ("solve --help", ["solve", "--help"]),
                       ("advise --solver deepseek", advise),
                       ("compare --solvers greedy", [*cmp, "--solvers", "greedy"]),
                       ("compare (default solvers)", [*cmp, "--time-limit", "1"]),
                       ("replay --solver greedy", ["replay", "t.npz", "--topology", "2x4",
                                                   "--slots", "32", "--quiet"]),
                       ("evaluate", ["evaluate", "p.json", "t.npz"])):
        add(Case(f"{what} with broken entry points installed", argv, env=bad_site,
                 check="rc == 0", timeout=120))
    for name, pkg in (("brokenattr", "brokenpkg"), ("missingmod", "missingpkg"),
                      ("badsig_ep", "badsigpkg"), ("class_ep", "classpkg"),
                      ("raise_ep", "raisepkg")):
        add(Case(f"solve --solver {name} (broken entry point of {pkg})",
                 [*solve, "--solver", name], env=mixed_site, expect_error=True,
                 check=f"rc != 2 or {pkg!r} in stderr"))
    add(Case("solve --solver exit_ep (a package whose module calls sys.exit)",
             [*solve, "--solver", "exit_ep"], env=bad_site, expect_error=True,
             check="rc != 2 or 'exitpkg' in stderr"))
    add(Case("solve --solver boom_ep (a package whose module fails to import)",
             [*solve, "--solver", "boom_ep"], env=bad_site, expect_error=True,
             check="rc != 2 or 'boompkg' in stderr"))
    for env in (slow_site, mixed_site):
        where = env["PYTHONPATH"]
        add(Case(f"advise --solver raise_ep (raises in solve; {where})",
                 [*advise, "--solver", "raise_ep"], env=env, expect_error=True,
                 check="rc != 2 or 'raisepkg' in stderr"))
        add(Case(f"simulate eplb.solver = raise_ep (raises in solve; {where})",
                 ["simulate", "deepseek_day6", *sim, "-o", "o_raise", "--set",
                  "eplb.solver='raise_ep'"], env=env, expect_error=True, timeout=120,
                 check="rc != 2 or 'raisepkg' in stderr"))
        add(Case(f"compare --solvers raise_ep,greedy --workers 2 ({where})",
                 [*cmp, "--solvers", "raise_ep,greedy", "--workers", "2"], env=env,
                 expect_error=True))
    add(Case("API solvers.available() with broken entry points",
             api="import sys\nsys.path.insert(0, 'site_bad')\nfrom eplb import solvers\n"
                 "names = solvers.available()\nassert 'greedy' in names and 'goodpol' in names\n"
                 "solvers.solve('greedy', __import__('numpy').ones((1, 16)), "
                 "__import__('eplb').Topology.parse('2x4', 32))",
             isolated=True))
    add(Case("API solve('brokenattr') with broken entry points",
             api="import sys\nsys.path.insert(0, 'site_bad')\nfrom eplb import solvers\n"
                 "solvers.solve('brokenattr', __import__('numpy').ones((1, 16)), "
                 "__import__('eplb').Topology.parse('2x4', 32))",
             isolated=True, expect_error=True))

    # -------------------------------------------------------------- (5) tracebacks, accepts
    klass[0] = WRONG
    digits = "7" * 5000
    lines = {
        "wl_bigint_input.jsonl": '{"timestamp": 0, "input_length": ' + digits
                                 + ', "output_length": 10}\n',
        "wl_bigint_hash.jsonl": '{"timestamp": 0, "input_length": 10, "output_length": 10, '
                                '"hash_ids": [' + digits + "]}\n",
        "wl_hugetime.jsonl": '{"timestamp": 1' + "0" * 400 + ', "input_length": 10, '
                             '"output_length": 10}\n',
        "wl_deep.jsonl": '{"timestamp": 0, "input_length": 10, "output_length": 10, "x": '
                         + "[" * 100_000 + "]" * 100_000 + "}\n",
        "wl_bigint.csv": f"arrival_s,input_tokens,output_tokens\n0,{digits},10\n",
        "wl_hugetime.csv": "arrival_s,input_tokens,output_tokens\n1" + "0" * 400 + ",10,10\n",
        "wl_azure_header.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n",
        "wl_azure_bigint.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                               f"2023-11-16 18:15:46.6805900,{digits},10\n",
        "wl_azure_year.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                             "9999-12-31 23:59:59,10,10\n0001-01-01 00:00:00,10,10\n",
    }
    for name, text in lines.items():
        (r / name).write_text(text)
        add(Case(f"workload info {name}", ["workload", "info", name], expect_error=True))
        add(Case(f"API workload.read {name}",
                 api=f"from eplb.evaluation.serving import workload as W\nW.read({name!r})",
                 expect_error=True))
    frame = {"arrival_s": [0.0, 1.0], "input_tokens": [10, 20], "output_tokens": [5, 5]}
    parquets = {
        "wl_int64na.parquet": pd.DataFrame({**frame, "input_tokens": pd.array([10, None],
                                                                              dtype="Int64")}),
        "wl_int64na_out.parquet": pd.DataFrame({**frame, "output_tokens": pd.array(
            [None, 3], dtype="Int64")}),
        "wl_datetime.parquet": pd.DataFrame({**frame, "arrival_s": pd.to_datetime(
            ["2024-01-01", "2024-01-02"])}),
        "wl_timedelta.parquet": pd.DataFrame({**frame, "arrival_s": pd.to_timedelta(
            [0, 1], unit="s")}),
        "wl_tz.parquet": pd.DataFrame({**frame, "arrival_s": pd.to_datetime(
            ["2024-01-01", "2024-01-02"]).tz_localize("UTC")}),
    }
    for name, df in parquets.items():
        df.to_parquet(r / name)
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = pa.Table.from_pandas(pd.DataFrame(frame), preserve_index=False)
    odd_meta = {"meta_notutf8": {b"eplb.workload.meta": b"\xff\xfe"},
                "meta_list": {b"eplb.workload.meta": b"[1, 2]"},
                "meta_deep": {b"eplb.workload.meta": b"[" * 50_000 + b"]" * 50_000},
                "meta_provenance_list": {b"eplb.workload.meta": b'{"provenance": [1]}'},
                "block_huge": {b"eplb.workload.block_size": b"1" + b"0" * 30},
                "block_neg": {b"eplb.workload.block_size": b"-512"},
                "block_digits": {b"eplb.workload.block_size": b"9" * 5000},
                "block_super": {b"eplb.workload.block_size": "²".encode()}}
    for label, md in odd_meta.items():
        pq.write_table(base.replace_schema_metadata(md), r / f"wl_{label}.parquet")
        parquets[f"wl_{label}.parquet"] = None
    for name in parquets:
        add(Case(f"workload info {name}", ["workload", "info", name],
                 expect_error=name not in ("wl_meta_list.parquet", "wl_meta_deep.parquet",
                                           "wl_meta_provenance_list.parquet",
                                           "wl_meta_notutf8.parquet")))
    add(Case("workload info --block-size 1e30", ["workload", "info", "w.jsonl", "--block-size",
                                                 "1" + "0" * 30], expect_error=True))
    add(Case("API workload.read block_size=10**30",
             api="from eplb.evaluation.serving import workload as W\n"
                 "W.read('w.jsonl', block_size=10**30)", expect_error=True))
    add(Case("API Workload datetime arrival_s",
             api="import pandas as pd\nfrom eplb.evaluation.serving.workload import Workload\n"
                 "Workload(pd.DataFrame({'arrival_s': pd.to_datetime(['2024-01-01']), "
                 "'input_tokens': [10], 'output_tokens': [5]}))", expect_error=True))
    # per-rank folders: superscripts and Arabic-Indic digits are not ids
    _rankdir(r / "rd_sup", rows="²,\"[1, 2, 3, 4]\"\n")  # a label: numbered by row instead
    add(Case("trace info rank folder, iteration '²'", ["trace", "info", "rd_sup"]))
    dup = _rankdir(r / "rd_arabic", layers=("0", "1"))
    (dup / "0" / "moe_layer-\u0661.csv").write_text((dup / "0" / "moe_layer-1.csv").read_text())
    add(Case("trace info rank folder, layer file duplicated as moe_layer-\u0661.csv",
             ["trace", "info", "rd_arabic"], expect_error=True))
    rk = _rankdir(r / "rd_arabic_rank", ranks=("0", "1"))
    shutil.copytree(rk / "1", rk / "\u0661")
    add(Case("trace info rank folder, rank folder duplicated as \u0661",
             ["trace", "info", "rd_arabic_rank"], expect_error=True))
    fw = _rankdir(r / "rd_fullwidth", layers=("0",))
    (fw / "0" / "moe_layer-\uff10.csv").write_text((fw / "0" / "moe_layer-0.csv").read_text())
    add(Case("trace info rank folder, layer file duplicated as moe_layer-\uff10.csv",
             ["trace", "info", "rd_fullwidth"], expect_error=True))
    # schedulers and API calls with a wrong type
    for sched in ("bogus", "::x::", "tcp://", "tcp://127.0.0.1:1"):
        add(Case(f"compare --scheduler {sched!r}", [*cmp, "--solvers", "greedy", "--scheduler",
                                                    sched], expect_error=True, timeout=60))
    add(Case("simulate --rates --scheduler '::x::'",
             ["simulate", "deepseek_day6", *sim, "--rates", "10,20", "--scheduler", "::x::"],
             expect_error=True, timeout=60))
    api_calls = {
        "ClusterConfig.from_toml(None)": "from eplb.evaluation.serving import ClusterConfig\n"
                                         "ClusterConfig.from_toml(None)",
        "ClusterConfig.from_toml(3)": "from eplb.evaluation.serving import ClusterConfig\n"
                                      "ClusterConfig.from_toml(3)",
        "Workload.head('x')": "from eplb.evaluation.serving import workload as W\n"
                              "W.read('w.jsonl').head('x')",
        "Workload.head(1.5)": "from eplb.evaluation.serving import workload as W\n"
                              "W.read('w.jsonl').head(1.5)",
        "Workload.head(-3)": "from eplb.evaluation.serving import workload as W\n"
                             "W.read('w.jsonl').head(-3)",
        "parse_variant(None)": "from eplb.evaluation.serving.config.overrides import "
                               "parse_variant\nparse_variant(None)",
        "parse_variant(5)": "from eplb.evaluation.serving.config.overrides import "
                            "parse_variant\nparse_variant(5)",
        "overrides.apply([None])": "from eplb.evaluation.serving import ClusterConfig\n"
                                   "from eplb.evaluation.serving.config.overrides import apply\n"
                                   "apply(ClusterConfig.load('deepseek_day6'), [None])",
        "overrides.apply('k=v')": "from eplb.evaluation.serving import ClusterConfig\n"
                                  "from eplb.evaluation.serving.config.overrides import apply\n"
                                  "apply(ClusterConfig.load('deepseek_day6'), 'decode.count=2')",
        "load_plugins('mypol')": "from eplb import solvers\nsolvers.load_plugins('mypol')",
        "load_plugins([None])": "from eplb import solvers\nsolvers.load_plugins([None])",
    }
    for label, src in api_calls.items():
        add(Case(f"API {label}", api=src, expect_error=True,
                 isolated=label.startswith("load_plugins")))
    # a vLLM mapping with an empty (-1) slot: no runtime file has one
    run_cli(*solve, "-o", "map.jsonl")
    text = (r / "map.jsonl").read_text()
    doc = json.loads(text)
    doc["initial_global_assignments"]["0"][5] = -1
    (r / "map_neg.jsonl").write_text(json.dumps(doc) + "\n")
    add(Case("evaluate vLLM mapping with a -1 slot", ["evaluate", "map_neg.jsonl", "t.npz",
                                                      "--topology", "2x4", "--slots", "32"],
             expect_error=True))
    add(Case("API read_placement vLLM mapping with a -1 slot",
             api="from eplb import Topology\nfrom eplb.io import read_placement\n"
                 "read_placement('map_neg.jsonl', topology=Topology.parse('2x4', 32))",
             expect_error=True))
    run_cli(*solve, "-o", "map_sg.json", "--format", "sglang")
    doc = json.loads((r / "map_sg.json").read_text())
    doc["physical_to_logical_map"][0][3] = -1
    (r / "map_sg_neg.json").write_text(json.dumps(doc))
    add(Case("evaluate SGLang map with a -1 slot", ["evaluate", "map_sg_neg.json", "t.npz",
                                                    "--topology", "2x4", "--slots", "32"],
             expect_error=True))
    add(Case("simulate --capacity --rates (--rates was ignored)",
             ["simulate", "deepseek_day6", *sim, "--capacity", "--rates", "10,20"],
             expect_error=True, timeout=60))
    add(Case("simulate --rates 10 --capacity --rel-tol 0.5", ["simulate", "deepseek_day6",
                                                              *sim, "--rates", "10",
                                                              "--capacity", "--rel-tol", "0.5"],
             expect_error=True, timeout=60))


if __name__ == "__main__":
    sys.exit(main())
