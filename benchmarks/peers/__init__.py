"""Re-implementations of the EPLB policies serving engines run today, for side-by-side speed
benchmarks (`benchmarks/bench_peers.py`); not part of the library (they need torch).

Each module re-states one engine's algorithm with the same structure and cost (which torch /
numpy ops, which Python loops, what is vectorised); its docstring names the file and commit
read. Each exposes ``rebalance(load: float[L, E], num_slots, num_groups, num_nodes, num_gpus)
-> int64[L, P]`` (``phy2log``), hierarchical iff ``num_groups % num_nodes == 0`` (DeepSeek's
rule, which vLLM and SGLang's ``auto`` follow).
"""

PEERS = ("vllm_default", "sglang_deepseek", "sglang_deepseek_vec")
