"""One writer for the generated blocks in docs/: the text between `<!-- KEY:begin -->` and
`<!-- KEY:end -->` is replaced by a script's output, or, with ``check``, compared with it."""

from __future__ import annotations

import sys
from pathlib import Path

from eplb.atomic import atomic_write_text


def update_doc(doc: Path, blocks: dict[str, str], *, check: bool, script: str) -> int:
    """Write each ``blocks[KEY]`` between KEY's markers in ``doc`` (``\\n`` on each side; the
    first end marker after the begin marker closes a block), atomically; with ``check`` write
    nothing and return 1 when ``doc`` differs from what would be written (0 when not).
    `SystemExit` naming the file and the markers when a block is missing (nothing written)."""
    text = doc.read_text(encoding="utf-8")
    new = text
    for key, body in blocks.items():
        begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
        i = new.find(begin)
        j = -1 if i < 0 else new.find(end, i + len(begin))
        if j < 0:
            raise SystemExit(f"{doc} has no {begin} ... {end} block")
        new = new[: i + len(begin)] + "\n" + body + "\n" + new[j:]
    if check:
        if new != text:
            print(f"{doc.name} is stale; run python scripts/{script}", file=sys.stderr)
            return 1
        return 0
    atomic_write_text(doc, new)
    return 0
