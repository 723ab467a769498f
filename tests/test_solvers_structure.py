"""The solvers package's shape (issue 12): primitives import no policy, no import cycles, no
function-local imports of solver modules, one registered function per policy."""

from __future__ import annotations

import ast
from pathlib import Path

from eplb import solvers

PKG = Path(solvers.__file__).parent
POLICIES = {
    "deepseek",
    "greedy",
    "greedy_traffic",
    "greedy_weighted",
    "hierarchical",
    "ilp",
    "repair",
    "relaxed",
    "robust",
}


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(solver modules imported at module level, solver modules imported inside functions)."""
    tree = ast.parse(path.read_text())
    top, local = set(), set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("solvers"):
            mod = node.module.split(".")
            names = [mod[1]] if len(mod) > 1 else [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith("solvers.")]
        if not names:
            continue
        (top if node.col_offset == 0 else local).update(names)
    return top, local


def _graph() -> dict[str, set[str]]:
    out = {}
    for path in PKG.glob("*.py"):
        if path.stem == "__init__":
            continue
        top, local = _imports(path)
        assert not local, f"{path.name} imports solver modules inside functions: {local}"
        out[path.stem] = top
    return out


def test_primitives_import_no_policy():
    graph = _graph()
    assert POLICIES <= set(graph)
    for mod, deps in graph.items():
        if mod not in POLICIES:
            assert not deps & POLICIES, f"primitive {mod} imports policies {deps & POLICIES}"


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in graph.get(m, ()):
            assert state.get(d) != 1, f"import cycle: {' -> '.join(stack + [m, d])}"
            if d not in state:
                visit(d, stack + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_one_registered_function_per_policy():
    registered = {n for n in solvers.available() if not n.startswith(("eval_", "test_"))}
    assert registered == POLICIES | {"ilp_weighted"}
    for name in registered:
        fn = solvers.registry._REGISTRY[name].fn
        assert fn.__module__.split(".")[1] in POLICIES
