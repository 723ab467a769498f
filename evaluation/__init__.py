"""Evaluation of placements: balance metrics, all-to-all traffic, replay, comparisons, plots.

- `evaluation.metrics`: ``score(placement, load)`` per layer, ``score_windows`` per window,
  ``summarize``; balancedness, max/mean, imbalance, ratio to the lower bound, node balance.
- `evaluation.traffic`: ``simulate(placement, ...) -> TrafficReport``: tokens per GPU, NVLink
  and RDMA bytes, modelled all-to-all seconds (exact for token-level input, expectations for
  counts); ``simulate_trace`` for a `traces.Trace`.
- `evaluation.replay`: ``replay(trace, topology, solver=..., interval=..., history=...)``,
  periodic rebalancing scored without peeking, replicas and bytes moved.
- `evaluation.pareto`: ``sweep`` of the solvers' ``rdma_weight`` against the baselines.
- `evaluation.compare`: ``compare(traces, solvers=..., topologies=...)`` on a process pool or
  a Dask cluster -> tidy DataFrames, Markdown/CSV tables (`evaluation.tables`) and figures
  (`evaluation.plots`).
- `evaluation.align`: matching a placement's rows to a trace's layers.

Submodules are imported on use; ``import evaluation`` itself loads nothing heavy.
"""
