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


def test_token_trace_on_gpus_its_ranks_do_not_divide(tmp_path):
    """A token-level trace recorded on 4 ranks, evaluated on 6 GPUs: no 'records no expert
    groups' claim about a trace that has them, and --save-slots says why it has no slots."""
    from tests._cli import run_cli

    rng = np.random.default_rng(1)
    N, L, E, K = 64, 2, 12, 2
    ids = np.stack([np.stack([rng.choice(E, K, replace=False) for _ in range(L)])
                    for _ in range(N)])
    counts = np.zeros((1, L, E))
    for layer in range(L):
        np.add.at(counts[0, layer], ids[:, layer].ravel(), 1)
    tok = Trace(counts, topk_ids=ids, token_rank=np.arange(N) % 4, meta={"top_k": K})
    write_npz(tok, tmp_path / "tok.npz")
    for gpus in (4, 6):
        assert run_cli("solve", tmp_path / "tok.npz", "--topology", f"1x{gpus}", "--slots",
                       str(2 * gpus if gpus >= 6 else 12), "-o", tmp_path / f"p{gpus}.json")[0] == 0
    code, out, _ = run_cli("evaluate", tmp_path / "p4.json", tmp_path / "tok.npz")
    assert code == 0 and "exact (token-level)" in out and "records no expert groups" not in out
    code, _, err = run_cli("evaluate", tmp_path / "p6.json", tmp_path / "tok.npz",
                           "--save-slots", tmp_path / "s.npy")
    assert code == 2 and "4 source ranks do not divide the 6 GPUs" in err, err
    assert not (tmp_path / "s.npy").exists()
