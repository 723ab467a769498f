"""The CLI's shared options are written once (issue 32 part 5): a flag that
`eplb.cli.option_groups` builds is added by no verb module itself, and every verb that takes it
shows the builder's help text."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from eplb.cli import option_groups as og
from eplb.cli.main import build_parser

CLI = Path(og.__file__).parent
FLAG = re.compile(r'add_argument\(\s*(?:"-\w",\s*)?"(--[\w-]+)"')


def _flags(path: Path) -> set[str]:
    return set(FLAG.findall(path.read_text()))


def _actions(parser: argparse.ArgumentParser, path=()):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _actions(sub, (*path, name))
        elif a.option_strings:
            yield " ".join(path), a


def _shared() -> set[str]:
    """Every flag the builders add (each builder run on a scratch parser)."""
    p = argparse.ArgumentParser()
    for build in (og.topology, og.bandwidths, og.failed_gpus, og.plugin, og.time_limit,
                  og.windows, og.ema, og.dispatch, og.top_k, og.runner, og.quiet, og.as_json,
                  og.formats, og.rescale, og.block_size):
        build(p)
    og.groups(p, topk="x")
    og.solver(p, default="x")
    og.solver_options(p, example="x")
    og.seed(p, "x")
    og.message_sizes(p, hidden="x")
    og.formats(p, out=False, flag="--in-format")
    return {f for a in p._actions for f in a.option_strings if f.startswith("--")} - {"--help"}


# a verb's flag that shares a shared flag's name but means something else there
OWN = {("trace.py", "--windows"),  # trace synth: how many windows to generate
       ("workload.py", "--rate")}  # workload synth: the generated arrivals' rate


def test_no_verb_adds_a_shared_flag_itself():
    shared = _shared()
    assert {"--topology", "--seed", "--dispatch", "--workers", "--format"} <= shared
    for path in sorted(CLI.glob("*.py")):
        if path.name != "option_groups.py":
            own = {f for f in _flags(path) & shared if (path.name, f) not in OWN}
            assert not own, f"{path.name} adds {own} itself"


def test_shared_flags_read_alike_in_every_verb():
    """Verbs pass only their own note or default: the builder's wording leads every help."""
    lead = {"--nvlink-gbps": "NVLink bandwidth per GPU in GB/s",
            "--topology": "nodes x GPUs per node, e.g. 4x8",
            "--groups": "expert groups for group-limited routing",
            "--seed": "seed of ", "--quiet": "no progress bar",
            "--time-limit": "time limit of search solvers (ilp) per solve"}
    seen = {flag: [] for flag in lead}
    for verb, action in _actions(build_parser()):
        flag = action.option_strings[-1]
        if flag in lead:
            assert action.help.startswith(lead[flag]), (verb, flag, action.help)
            seen[flag].append(verb)
    assert all(len(v) >= 2 for v in seen.values()), seen  # each is shared by several verbs


def test_dispatch_names_are_the_registered_policies():
    """The CLI's one tuple of dispatch names (kept there: importing `eplb.dispatch` at parse time
    loads ortools, test_import_light) is the registry's per-pick policies, in its order, and is
    what every verb's --dispatch help lists and `eplb execute` accepts."""
    import subprocess
    import sys

    from eplb.dispatch import POLICIES

    assert og.DISPATCH_NAMES == POLICIES
    listed = ", ".join(POLICIES)
    helps = {(verb, a.option_strings[-1]): a for verb, a in _actions(build_parser())
             if a.option_strings[-1] in ("--dispatch", "--pareto-dispatch")}
    assert {"evaluate", "execute", "compare"} <= {verb for verb, _ in helps}
    for (verb, flag), action in helps.items():
        assert listed in action.help, (verb, flag, action.help)
    assert tuple(helps["execute", "--dispatch"].choices) == POLICIES
    # the names cost no import of eplb.dispatch: building every verb's parser loads none of it
    code = ("import sys; from eplb.cli.main import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.startswith('eplb.dispatch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out
