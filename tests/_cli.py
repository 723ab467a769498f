"""The one in-process runner of the ``eplb`` command for the tests (`run_cli`); a real
process start is tested where it matters (tests/test_serving_sim_cli.py)."""

from __future__ import annotations

import contextlib
import io

from eplb.cli import main


def run_cli(*argv: object) -> tuple[int, str, str]:
    """``eplb ARGV`` in this process (each argument through `str`): ``(exit code, stdout,
    stderr)``. An exit through `SystemExit` (argparse refusing an option, ``--help``) gives the
    status a process would: its int code, 0 for None, else 1 with the message on stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
            if code is None:
                code = 0
            elif not isinstance(code, int):
                print(code, file=err)
                code = 1
    return code, out.getvalue(), err.getvalue()
