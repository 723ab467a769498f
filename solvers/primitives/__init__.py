"""Building blocks of the policies: replica counts, packing, pairing, layouts, DeepSeek's
kernels, the exact model and its runner, repair machinery, forecasts, option checks. A
primitive imports no policy and no analysis module (`tests/test_solvers_structure.py`)."""
