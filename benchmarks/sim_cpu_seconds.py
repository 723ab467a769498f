"""CPU seconds of ``SECONDS`` simulated seconds of `bench_simulator`'s headline run (Day-6
preset, ``balanced_units`` mix at Day-6 per-node load) for the checkout at ``ROOT``: run it
alternately with two commits' checkouts (each with its own editable install) to compare them
on a shared machine, where CPU seconds move less than wall seconds.

    python benchmarks/sim_cpu_seconds.py ROOT SECONDS
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    root, seconds = sys.argv[1], float(sys.argv[2])
    sys.path.insert(0, f"{root}/benchmarks")
    import bench_simulator as bench

    from eplb.evaluation.serving.workload import day6

    mix = day6.day6_workload(20_000, 100.0, mix="balanced_units")
    rate = day6.DAY6["prefill_input_tok_s_per_node"] * 4 / day6.mix_stats(mix)["input_mean"]
    cpu = time.process_time()
    r = bench.run(bench._config(), rate, seconds, "balanced_units")
    print(
        f"{root}: CPU {time.process_time() - cpu:.2f} s, wall {r['wall_s']:.1f} s, steps "
        f"{r['prefill_steps']} prefill + {r['decode_steps']} decode",
        flush=True,
    )


if __name__ == "__main__":
    main()
