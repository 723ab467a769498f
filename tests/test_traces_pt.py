"""SGLang ``torch.save`` dumps (stat, per-pass, per-token); skipped when torch is absent."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from eplb import traces
from eplb.errors import TraceError

torch = pytest.importorskip("torch", reason="torch not installed: .pt dump tests skipped")


def test_pt_stat_dump(tmp_path):
    lc = torch.randint(0, 100, (3, 5, 16), dtype=torch.int32,
                       generator=torch.Generator().manual_seed(0))
    lc[:, :2] = 0  # dense layers
    torch.save({"rank": 0, "logical_count": lc, "average_utilization_rate_over_window": None},
               tmp_path / "stat.pt")
    t = traces.read(tmp_path / "stat.pt")
    assert t.layer_ids.tolist() == [2, 3, 4] and t.meta["num_model_layers"] == 5
    assert np.array_equal(t.counts, lc.numpy()[:, 2:].astype(float))
    assert t.meta["provenance"]["kind"] == "sglang-stat"


def test_pt_legacy_serialisation_is_sniffed(tmp_path):
    lc = torch.ones((2, 4), dtype=torch.int64)
    torch.save({"logical_count": lc}, tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    assert traces.sniff(tmp_path / "old.bin") == "pt"
    assert traces.read(tmp_path / "old.bin").counts.shape == (1, 2, 4)


def _per_pass_dump(path, *, per_token=False, L=4, E=8, extra=2, seed=0):
    """A per-pass dump: records of 2 passes x 2 ranks, physical slots P = E + extra."""
    g = torch.Generator().manual_seed(seed)
    P = E + extra
    p2l = torch.stack([torch.cat([torch.randperm(E, generator=g),
                                  torch.randint(0, E, (extra,), generator=g)])
                       for _ in range(L)])
    records, expected, tokens, ranks = [], np.zeros((2, L, E)), [], []
    for fid in (9, 4):
        for rank in (0, 1):
            rec = {"forward_pass_id": fid, "rank": rank, "gatherer_key": "primary"}
            if per_token:
                n = 3
                ids = torch.stack([torch.stack([torch.randperm(P, generator=g)[:2]
                                                for _ in range(n)]) for _ in range(L)])
                ids[0] = -1  # layer 0 dense: no picks
                rec["topk_ids_of_layer"] = ids
                gpc = torch.zeros((L, P), dtype=torch.int32)
                for lyr in range(1, L):
                    gpc[lyr] += torch.bincount(ids[lyr].flatten(), minlength=P).int()
                tokens.append(np.take_along_axis(p2l.numpy()[1:, None, :],
                                                 ids.numpy()[1:].reshape(L - 1, 1, -1), 2)
                              .reshape(L - 1, n, 2).transpose(1, 0, 2))
                ranks += [rank] * n
            else:
                gpc = torch.randint(0, 50, (L, P), generator=g, dtype=torch.int32)
                gpc[0] = 0
            rec["global_physical_count"] = gpc
            window = 0 if fid == 4 else 1  # windows in ascending forward-pass id
            for lyr in range(L):
                for p in range(P):
                    expected[window, lyr, p2l[lyr, p]] += gpc[lyr, p].item()
            records.append(rec)
    torch.save({"records": records, "last_physical_to_logical_map": p2l}, path)
    return expected, tokens, ranks


def test_pt_per_pass_dump_sums_physical_into_logical(tmp_path):
    expected, _, _ = _per_pass_dump(tmp_path / "pp.pt")
    t = traces.read(tmp_path / "pp.pt")
    assert t.layer_ids.tolist() == [1, 2, 3]
    assert np.array_equal(t.counts, expected[:, 1:])
    assert t.meta["provenance"]["forward_pass_ids"] == [4, 9]
    assert t.topk_ids is None


def test_pt_per_token_dump_gives_logical_token_picks(tmp_path):
    expected, tokens, ranks = _per_pass_dump(tmp_path / "pt.pt", per_token=True)
    t = traces.read(tmp_path / "pt.pt")
    assert np.array_equal(t.counts, expected[:, 1:])
    assert np.array_equal(t.topk_ids, np.concatenate(tokens))
    assert t.token_rank.tolist() == ranks
    assert np.array_equal(t.token_counts(), t.load())  # picks agree with the counts


def test_pt_without_torch_names_the_extra(tmp_path, monkeypatch):
    torch.save({"logical_count": torch.ones((2, 3))}, tmp_path / "a.pt")
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(TraceError, match=r"pip install 'eplb\[torch\]'"):
        traces.read(tmp_path / "a.pt")


def test_pt_pickled_object_is_refused(tmp_path):
    torch.save({"logical_count": torch.ones((2, 3)), "x": Path("/etc")}, tmp_path / "evil.pt")
    with pytest.raises(TraceError, match="weights_only=True"):
        traces.read(tmp_path / "evil.pt")




def test_pt_per_token_dump_with_padded_picks_keeps_counts_only(tmp_path):
    p2l = torch.arange(4).repeat(2, 1)  # [2 layers, 4 slots], slot p holds expert p
    ids = torch.tensor([[[0, 1], [2, -1]], [[3, 0], [1, 2]]])  # token 1 of layer 0 is padded
    gpc = torch.stack([torch.bincount(ids[lyr][ids[lyr] >= 0], minlength=4) for lyr in range(2)])
    rec = {"forward_pass_id": 0, "rank": 0, "topk_ids_of_layer": ids,
           "global_physical_count": gpc}
    torch.save({"records": [rec], "last_physical_to_logical_map": p2l}, tmp_path / "pad.pt")
    t = traces.read(tmp_path / "pad.pt")
    assert t.topk_ids is None  # picks are not exact, so no token arrays
    assert t.counts[0].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
