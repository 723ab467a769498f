"""Outputs never rename over what is not a regular file: a device node stays a device
node (as root, a rename over /dev/full once replaced it with a regular file)."""

from __future__ import annotations

import os
import stat

import pytest

from eplb import EplbError
from eplb.atomic import atomic_directory, staged_outputs


def _device(tmp_path):
    """A private /dev/null twin (a regression must not replace the real one)."""
    dev = tmp_path / "null"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, AttributeError, OSError):
        pytest.skip("cannot create a device node here (not root)")
    return dev


def test_staged_file_output_to_a_device_writes_into_it(tmp_path):
    dev = _device(tmp_path)
    with staged_outputs() as stage:
        stage.file(dev).write_text("a,b\n1,2\n")
    assert stat.S_ISCHR(os.stat(dev).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]


def test_folder_output_refuses_an_existing_file(tmp_path):
    mine = tmp_path / "out"
    mine.write_text("not eplb's")
    with pytest.raises(EplbError, match="not a folder"):
        with atomic_directory(mine) as tmp:
            (tmp / "x.csv").write_text("1")
    assert mine.read_text() == "not eplb's"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
