"""`eplb evaluate` says when a trace's per-rank counts go unused (source ranks that do not divide
the GPUs) and uses them when they divide."""

from __future__ import annotations

import numpy as np
import pytest

from eplb.cli import main
from eplb.traces import Trace, write_npz


@pytest.mark.parametrize("gpus, used", [(4, False), (6, True)])
def test_unused_source_ranks_are_named(tmp_path, capsys, gpus, used):
    rng = np.random.default_rng(0)
    src = rng.integers(0, 50, size=(1, 2, 3, 12)).astype(float)  # [W, L, R=3, E]
    write_npz(Trace(src.sum(2), source_counts=src, meta={"top_k": 2}), tmp_path / "t.npz")
    out = tmp_path / "p.json"
    assert main(["solve", str(tmp_path / "t.npz"), "--topology", f"1x{gpus}", "--slots",
                 str(4 * gpus), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(out), str(tmp_path / "t.npz")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("traffic"))
    if used:
        assert "expected (per-rank counts)" in line and "unused" not in line
    else:
        assert f"3 source ranks do not divide the {gpus} GPUs" in line
        assert "per-rank counts are unused" in line
