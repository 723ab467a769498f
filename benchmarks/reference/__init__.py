"""Reference (older) implementations that benchmarks time as baselines in the same process."""
