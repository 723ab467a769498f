"""Progress of long solves: a tqdm bar on a terminal, plain lines to stderr elsewhere.

See `Progress` and docs/core.md, section "Progress".
"""

from __future__ import annotations

import sys
import time

LINE_EVERY = 10  # items between two progress lines when stderr is not a terminal


class Progress:
    """``total`` items of ``unit`` labelled ``desc``: ``enabled=None`` shows a bar when stderr is
    a terminal, else a line every `LINE_EVERY` items (and at the end); ``False`` shows nothing.
    The bar is created at the first `update`, so worker processes can be forked before."""

    def __init__(
        self, total: int, desc: str, enabled: bool | None = None, unit: str = "layer"
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.done = 0
        self.start = time.perf_counter()
        self.bar = None
        tty = _isatty()
        self.lines = enabled is not False and not tty
        self.use_bar = enabled is not False and tty

    def update(self, n: int = 1, note: str = "") -> None:
        """Advance by ``n`` items; ``note`` is shown on the line or bar (e.g. layers optimal)."""
        self.done += n
        if self.use_bar and self.bar is None:
            from tqdm.auto import tqdm  # lazy: tqdm only when progress is shown

            self.bar = tqdm(
                total=self.total,
                desc=self.desc,
                unit=self.unit,
                leave=False,
                file=sys.stderr,
                initial=self.done - n,
            )
        if self.bar is not None:
            self.bar.update(n)
            if note:
                self.bar.set_postfix_str(note, refresh=False)
        elif self.lines and n and (self.done % LINE_EVERY == 0 or self.done == self.total):
            sec = time.perf_counter() - self.start
            extra = f", {note}" if note else ""
            print(
                f"{self.desc}: {self.done}/{self.total} {self.unit}s, {sec:.1f} s{extra}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _isatty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
