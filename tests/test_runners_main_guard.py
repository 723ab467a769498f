"""`eplb.runners.run` on spawned workers from a plain script: a top-level call without an
``if __name__ == "__main__":`` guard is refused with one `EplbError` saying what to add (its
workers would import the script and run it again); under the guard it runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

HEAD = """
import operator, threading, time
from eplb import runners
# a thread in the parent: the runner spawns its workers instead of forking
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
"""


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(HEAD) + textwrap.dedent(body), encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120,
        cwd=tmp_path,
    )


def test_unguarded_top_level_call_is_refused(tmp_path):
    out = _run(tmp_path, "print(runners.run(operator.neg, [1, 2, 3], workers=2))\n")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("eplb.errors.EplbError:"), out.stderr
    assert 'if __name__ == "__main__":' in last and "line 6" in last
    assert "BrokenProcessPool" not in out.stderr and "died" not in out.stderr


def test_guarded_call_runs_on_spawned_workers(tmp_path):
    out = _run(
        tmp_path,
        """
        if __name__ == "__main__":
            print(runners.run(operator.neg, [1, 2, 3], workers=2))
        """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[-1, -2, -3]"
