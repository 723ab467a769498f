"""Run every command block of README.md from a fresh clone (issue 37 part 4).

``python scripts/readme_commands.py`` clones the repository's committed HEAD into a
temporary folder and runs each fenced ``bash`` and ``python`` block there, in order, with the
``eplb`` and ``python`` of this environment: bash blocks with ``bash -eo pipefail``, python
blocks with ``python -c``. Set-up commands (``pip install``, ``python -m pytest``) are the
environment's own and are skipped. ``$EPLB_DATA`` and ``$EPLB_REQUESTS`` must name the real
dumps and request traces (README, "Data"); blocks that need one that is not set fail. Prints
one line per block (its first line, seconds, ok or the error) and exits 1 if any failed.

``tests/test_readme.py`` runs the blocks not marked ``<!-- readme: long -->`` in-process on
every test run (`run_block`); this script runs them all.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LONG = "<!-- readme: long -->"
SETUP = ("pip install", "python -m pytest")  # the environment's set-up, not re-run


@dataclass(frozen=True)
class Block:
    """A fenced block of the README: ``lang`` (bash or python), its ``text``, its first
    ``line`` (1-based) and whether it is marked ``long`` (run by this script only)."""

    lang: str
    text: str
    line: int
    long: bool


def blocks(readme: str) -> list[Block]:
    """The ``bash`` and ``python`` blocks of ``readme`` in order."""
    out = []
    for m in re.finditer(r"^```(bash|python)\n(.*?)^```$", readme, re.S | re.M):
        before = readme[: m.start()].rstrip().splitlines()
        out.append(Block(m.group(1), m.group(2), readme.count("\n", 0, m.start()) + 1,
                         bool(before) and before[-1].strip() == LONG))
    return out


# ----------------------------------------------------------------- in-process (the test)
def _lines(text: str) -> list[str | tuple[str, str]]:
    """Logical lines of a bash block (continuations joined), heredocs as ``(path, body)``."""
    raw, out, i = text.splitlines(), [], 0
    while i < len(raw):
        line = raw[i]
        while line.endswith("\\") and i + 1 < len(raw):
            i += 1
            line = line[:-1] + " " + raw[i].strip()
        here = re.fullmatch(r"\s*cat > (\S+) <<'(\w+)'\s*", line)
        if here:
            body = []
            i += 1
            while raw[i] != here.group(2):
                body.append(raw[i])
                i += 1
            out.append((here.group(1), "\n".join(body) + "\n"))
        else:
            out.append(line)
        i += 1
    return out


def _expand(token: str, env: dict) -> list[str]:
    value = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), token)
    if any(c in value for c in "*?["):
        found = sorted(glob.glob(value))
        return found or [value]
    return [value]


def run_block(block: Block, cwd: Path, env: dict,
              eplb: Callable[..., tuple[int, str, str]]) -> None:
    """Run ``block`` in this process with ``cwd`` as the working folder: each ``eplb ARGS``
    through ``eplb(*ARGS) -> (exit code, stdout, stderr)`` (the test passes its in-process
    runner), ``VAR=value``, ``$VAR``, globs, ``>`` redirects, ``&&`` and ``cat > FILE
    <<'EOF'`` heredocs in bash blocks; python blocks with `exec`. Raises `AssertionError`
    naming the command on a non-zero exit or a command other than ``eplb``."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        if block.lang == "python":
            exec(compile(block.text, f"README.md:{block.line}", "exec"), {"__name__": "readme"})
            return
        for line in _lines(block.text):
            if isinstance(line, tuple):
                Path(line[0]).write_text(line[1], encoding="utf-8")
                continue
            for command in re.split(r"\s&&\s", line):
                words = shlex.split(command, comments=True)
                if not words:
                    continue
                if len(words) == 1 and re.fullmatch(r"\w+=\S*", words[0]):
                    name, value = words[0].split("=", 1)
                    env[name] = _expand(value, env)[0]
                    continue
                if " ".join(words[:2]) in SETUP or " ".join(words[:3]) in SETUP:
                    continue
                target = None
                if ">" in words:
                    k = words.index(">")
                    target, words = words[k + 1], words[:k]
                argv = [x for w in words for x in _expand(w, env)]
                assert argv[0] == "eplb", f"README.md:{block.line}: not an eplb command: {line}"
                code, out, err = eplb(*argv[1:])
                assert code == 0, f"README.md:{block.line}: {command!r} exited {code}: " \
                    f"{err[-600:]}"
                if target is not None:
                    Path(target).write_text(out, encoding="utf-8")
    finally:
        os.chdir(old)


# ----------------------------------------------------------------- from a clone (this script)
BASH_PRELUDE = """
pip() { echo "(set-up, skipped: pip $*)"; }
python() { if [ "$1 $2" = "-m pytest" ]; then echo "(set-up, skipped: python $*)";
           else command python "$@"; fi; }
"""


def _run_cloned(block: Block, clone: Path) -> tuple[bool, str]:
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    if block.lang == "bash":
        cmd = ["bash", "-eo", "pipefail", "-c", BASH_PRELUDE + block.text]
    else:
        cmd = [sys.executable, "-c", block.text]
    r = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True)
    tail = (r.stderr or r.stdout).strip().splitlines()
    return r.returncode == 0, tail[-1] if tail else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help="only the blocks not marked long")
    args = ap.parse_args(argv)
    missing = [v for v in ("EPLB_DATA", "EPLB_REQUESTS") if not os.environ.get(v)]
    if missing and not args.fast:
        print(f"note: {', '.join(missing)} not set; blocks that read them will fail",
              file=sys.stderr)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "eplb"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        for block in blocks((clone / "README.md").read_text(encoding="utf-8")):
            if args.fast and block.long:
                continue
            start = time.perf_counter()
            ok, last = _run_cloned(block, clone)
            first = block.text.strip().splitlines()[0][:60]
            print(f"README.md:{block.line:<4} {block.lang:<6} {time.perf_counter() - start:6.1f} s"
                  f"  {'ok  ' if ok else 'FAIL'}  {first}" + ("" if ok else f"\n    {last}"))
            failed += not ok
    print(f"{failed} of the README's blocks failed" if failed else "every README block ran")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
