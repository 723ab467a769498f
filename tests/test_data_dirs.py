"""`eplb.data_dirs`: the one place tests, scripts, benchmarks and the paper find the data kept
outside the repository."""

from pathlib import Path

from eplb import data_dirs


def test_variables_win_and_the_defaults_sit_beside_the_checkout(monkeypatch, tmp_path):
    monkeypatch.setenv("EPLB_DATA", str(tmp_path / "t"))
    monkeypatch.setenv("EPLB_REQUESTS", "~/r")
    assert data_dirs.traces_dir() == tmp_path / "t"
    assert data_dirs.requests_dir() == Path("~/r").expanduser()
    for var in ("EPLB_DATA", "EPLB_REQUESTS"):
        monkeypatch.setenv(var, "")  # empty counts as unset
    assert data_dirs.traces_dir() == data_dirs.REPO.parent / "shared" / "traces"
    assert data_dirs.requests_dir() == data_dirs.REPO.parent / "shared" / "requests"
    assert (data_dirs.REPO / "eplb" / "data_dirs.py").is_file()  # REPO is the checkout
