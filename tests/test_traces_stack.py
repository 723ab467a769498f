"""Issue 22 §1: several dumps as the windows of one trace (`traces.stack`, ``eplb trace
stack``)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from eplb import traces
from eplb.errors import TraceError
from eplb.traces import Trace


def test_stack_keeps_windows_in_order_and_matches_layers():
    rng = np.random.default_rng(0)
    a = Trace(rng.random((2, 3, 8)), [3, 4, 5], meta={"top_k": 2, "model": "m"})
    b = Trace(rng.random((1, 3, 8)), [5, 3, 4], meta={"top_k": 2, "model": "m"})
    s = traces.stack([a, b])
    assert s.counts.shape == (3, 3, 8) and s.layer_ids.tolist() == [3, 4, 5]
    np.testing.assert_array_equal(s.counts[:2], a.counts)
    np.testing.assert_array_equal(s.counts[2], b.counts[0][[1, 2, 0]])  # by layer id
    assert s.meta["top_k"] == 2 and s.meta["model"] == "m"
    assert [p["windows"] for p in s.meta["provenance"]["parts"]] == [2, 1]
    np.testing.assert_allclose(s.load(), a.load() + b.load()[[1, 2, 0]])


def test_stack_refuses_what_does_not_line_up():
    rng = np.random.default_rng(1)
    a = Trace(rng.random((1, 2, 8)), [0, 1], meta={"top_k": 2})
    with pytest.raises(TraceError, match="experts"):
        traces.stack([a, Trace(rng.random((1, 2, 4)), [0, 1])])
    with pytest.raises(TraceError, match="top_k"):
        traces.stack([a, Trace(rng.random((1, 2, 8)), [0, 1], meta={"top_k": 4})])
    with pytest.raises(TraceError, match="no rows for layers"):
        traces.stack([a, Trace(rng.random((1, 1, 8)), [0])])
    with pytest.raises(TraceError, match="at least two"):
        traces.stack([a])
    # a dense dump drops all-zero layers: there the missing layer counts zero
    dense = Trace(rng.random((1, 1, 8)), [0], meta={"num_model_layers": 2, "top_k": 2})
    s = traces.stack([a, dense])
    assert s.counts[1, 1].sum() == 0


def test_cli_stack_sglang_dumps(tmp_path):
    rng = np.random.default_rng(2)
    paths = []
    for i in range(3):
        f = tmp_path / f"dump{i}.json"
        f.write_text(json.dumps({"logical_count": rng.integers(0, 50, (4, 16)).tolist()}))
        paths.append(str(f))
    out = tmp_path / "windows.npz"
    r = subprocess.run([sys.executable, "-m", "eplb.cli", "trace", "stack", *paths, "-o",
                        str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "3 windows" in r.stdout
    t = traces.read(out)
    assert t.num_windows == 3
    np.testing.assert_array_equal(t.counts[1], traces.read(paths[1]).counts[0])
    r = subprocess.run([sys.executable, "-m", "eplb.cli", "trace", "stack", paths[0], "-o",
                        paths[0]], capture_output=True, text=True)
    assert r.returncode == 2 and "eplb: error:" in r.stderr
