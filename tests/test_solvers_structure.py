"""The rooms of `eplb.solvers`, read from the imports themselves so the layout cannot rot.

- ``policies/``: one module per registered function, named for it; no policy imports another;
- ``primitives/``: building blocks; import only primitives;
- ``analysis/``: bounds, migration, failures; import primitives and analysis, no policy;
- the front (``__init__``, ``registry``, ``legacy``, ``plugins``) on top;
  ``policies/__init__`` imports every policy (which registers them);
- no import cycles among solver modules, no function-local import of a solver module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

# read from the checkout, not imported: a broken rule (an import cycle) must fail these tests
# with its message, not stop the collection
PKG = Path(__file__).resolve().parents[1] / "solvers"
POLICIES = {
    "biased",
    "craft",
    "deepseek",
    "greedy",
    "greedy_traffic",
    "greedy_weighted",
    "hierarchical",
    "ilp",
    "ilp_weighted",
    "lplb",
    "relaxed",
    "repair",
    "robust",
}
FRONT = {"__init__", "registry", "legacy", "plugins"}
# room -> rooms its modules may import (besides the core and the floors below eplb.solvers)
MAY_IMPORT = {
    "primitives": {"primitives"},
    "analysis": {"primitives", "analysis"},
    "policies": {"primitives", "analysis", "front"},
}


def _name(path: Path) -> str:
    """``policies.greedy``, ``primitives.layout``, ``registry``; a package is its folder
    name (``policies``), the top package ``__init__``."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


MODULES = {_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _room(module: str) -> str:
    head = module.split(".")[0]
    return head if head in MAY_IMPORT else "front"


def _target(dotted: str) -> str | None:
    """The solver module a dotted import name refers to (``None`` outside `eplb.solvers`)."""
    if dotted == "eplb.solvers":
        return "__init__"
    if not dotted.startswith("eplb.solvers."):
        return None
    rest = dotted[len("eplb.solvers.") :].split(".")
    while rest and ".".join(rest) not in MODULES:
        rest.pop()  # eplb.solvers.primitives.layout.duplicates -> primitives.layout
    assert rest, f"{dotted} names no module of eplb.solvers"
    return ".".join(rest)


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(solver module, line, function-local)`` for every import in ``path``, including
    ``importlib.import_module("eplb.solvers...")`` calls."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node: ast.AST, local: bool) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}:{node.lineno}: relative import"
            base = node.module or ""
            # a module or a symbol of base (`from eplb import solvers` is eplb.solvers)
            names = [f"{base}.{a.name}" for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names = [str(node.args[0].value)]
        for n in names:
            target = _target(n)
            if target is not None:
                found.append((target, node.lineno, local))
        inner = local or isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
        )
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(p) if t != m} for m, p in MODULES.items()}


def test_the_rooms_hold_what_they_should():
    rooms = {m.split(".")[0] for m in MODULES if "." in m}
    assert rooms == set(MAY_IMPORT), rooms
    assert {m for m in MODULES if _room(m) == "front"} == FRONT
    assert {m.split(".", 1)[1] for m in MODULES if m.startswith("policies.")} == POLICIES


def _registrations(path: Path) -> list[str]:
    """Names passed to ``@register(...)`` / ``@solvers.register(...)`` in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in node.decorator_list:
                call = d if isinstance(d, ast.Call) else None
                fn = call.func if call else d
                name = getattr(fn, "id", None) or getattr(fn, "attr", None)
                if name == "register":
                    arg = call.args[0] if call and call.args else None
                    out.append(arg.value if isinstance(arg, ast.Constant) else "?")
    return out


def test_one_registered_function_per_policy_module():
    for module, path in MODULES.items():
        names = _registrations(path)
        if module.startswith("policies."):
            stem = module.split(".", 1)[1]
            assert names == [stem], f"{path.name} registers {names}, not exactly [{stem!r}]"
        else:
            assert not names, f"{module} registers {names}: policies live in policies/"
    # and what the registry holds is exactly those functions (no test spy left behind)
    from eplb import solvers  # imported here: the static checks above need no import

    assert set(solvers.available()) == POLICIES
    for name in POLICIES:
        fn = solvers.registry._REGISTRY[name].fn
        assert fn.__module__ == f"eplb.solvers.policies.{name}", (name, fn.__module__)


@pytest.mark.parametrize("room", sorted(MAY_IMPORT))
def test_rooms_import_only_the_rooms_below(room):
    bad = []
    for module, deps in _graph().items():
        if _room(module) != room:
            continue
        allowed = MAY_IMPORT[room] | ({room} if module == room else set())  # a room's index
        for dep in sorted(deps):
            if _room(dep) not in allowed:
                bad.append(f"{module} ({room}) imports {dep} ({_room(dep)})")
    assert not bad, "\n".join(bad)


def test_no_policy_imports_another_policy():
    bad = []
    for module, deps in _graph().items():
        if module.startswith("policies."):
            bad += [f"{module} imports {d}" for d in sorted(deps) if d.startswith("policies")]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            assert state.get(d) != 1, f"import cycle: {' -> '.join([*stack, m, d])}"
            if d not in state:
                visit(d, [*stack, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


# the one lazy import allowed: the compiled kernels import numba, an optional extra (`fast`),
# so the loader imports them only when asked (the guide: heavy dependencies load lazily)
OPTIONAL_EXTRAS = {("primitives/jit.py", "primitives.numba_kernels")}


def test_no_function_local_imports_of_solver_modules():
    bad = [
        f"{path.relative_to(PKG)}:{line} imports {target} inside a function"
        for path in MODULES.values()
        for target, line, local in _imports(path)
        if local and (str(path.relative_to(PKG)), target) not in OPTIONAL_EXTRAS
    ]
    assert not bad, "\n".join(bad)


def test_the_reader_sees_the_imports():
    """The checks above see real edges: a sample of imports that exist today."""
    graph = _graph()
    assert "registry" in graph["policies.greedy"]
    assert "primitives.even_split" in graph["policies.greedy"]
    assert "primitives.pairing" in graph["analysis.bounds"]  # from ...primitives import pairing
    assert "policies" in graph["__init__"]  # from eplb.solvers import policies
    assert "policies.ilp_weighted" in graph["policies"]
