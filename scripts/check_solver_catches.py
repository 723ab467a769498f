"""Which property of `eplb.testing.check_solver` catches which broken policy.

Runs `check_solver` (default settings unless --max-examples) on every policy of
`eplb.testing.broken` and prints, per property, how many of them it catches and which, then
per broken policy the properties that failed and the seconds its check took. For issue 18
part 6's and issue 33 part 4's notes: ``python scripts/check_solver_catches.py``.
"""

from __future__ import annotations

import argparse
import time

from eplb.format import text_table
from eplb.testing import check_solver
from eplb.testing.broken import BROKEN
from eplb.testing.check import PROPERTIES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-examples", type=int, default=25, help="hypothesis examples per property")
    args = ap.parse_args()
    failed, seconds = {}, {}
    for name, b in BROKEN.items():
        start = time.process_time()
        report = check_solver(
            b.fn, max_examples=args.max_examples, raise_on_failure=False, **b.kwargs
        )
        seconds[name] = time.process_time() - start
        failed[name] = report.failed
    rows = []
    for prop in PROPERTIES:
        caught = [n for n, f in failed.items() if prop in f]
        rows.append([prop, f"{len(caught)}/{len(BROKEN)}", ", ".join(caught) or "-"])
    print(f"check_solver(max_examples={args.max_examples}) on {len(BROKEN)} broken policies")
    print("property: of check_solver; caught: broken policies it fails; which: their names")
    print(text_table(rows, ["property", "caught", "which"]))
    print()
    print("broken policy: what is wrong; first: the property meant to catch it; failed: all "
          "failed; cpu s: its check's CPU seconds")
    print(
        text_table(
            [
                [n, b.wrong, b.caught_by, ", ".join(failed[n]) or "NONE (not caught)",
                 f"{seconds[n]:.1f}"]
                for n, b in BROKEN.items()
            ],
            ["broken policy", "what is wrong", "first", "failed", "cpu s"],
        )
    )
    missed = [n for n, f in failed.items() if not f]
    print(f"\ncaught {len(BROKEN) - len(missed)} of {len(BROKEN)} broken policies")


if __name__ == "__main__":
    main()
