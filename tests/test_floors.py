"""The house's floors, read from the imports themselves so the rule cannot rot.

core (`eplb/`) <- `eplb.traces` <- `eplb.solvers` <- `eplb.testing`, `eplb.evaluation`
<- `eplb.cli`:
a package imports only packages on its own floor or below; only the CLI imports `eplb.cli`.
Every import counts, function-local ones included, and so do `importlib.import_module` strings.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]

# installed package -> its folder, and the packages it may import (besides its own)
FLOORS = {
    "eplb": set(),
    "eplb.traces": {"eplb"},
    "eplb.solvers": {"eplb", "eplb.traces"},
    "eplb.testing": {"eplb", "eplb.traces", "eplb.solvers"},
    "eplb.evaluation": {"eplb", "eplb.traces", "eplb.solvers"},
    "eplb.cli": {"eplb", "eplb.traces", "eplb.solvers", "eplb.evaluation", "eplb.testing"},
}


def _package_dirs() -> dict[str, Path]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: REPO / folder for name, folder in cfg["package-dir"].items()}


def _floor_of(module: str) -> str | None:
    """The top package (a FLOORS key) a dotted module name belongs to."""
    best = None
    for name in FLOORS:
        if (module == name or module.startswith(name + ".")) and (
            best is None or len(name) > len(best)
        ):
            best = name
    return best


@functools.cache
def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from eplb import solvers` names a package, not a core symbol
            if node.module == "eplb":
                found += [(node.lineno, f"eplb.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_lazy"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, node.args[0].value))
    return found


def _sources():
    for package, folder in _package_dirs().items():
        for path in sorted(folder.rglob("*.py")):
            # a folder mapped to another package (none nest today) belongs to that one
            yield package, path


def test_package_list_matches_the_tree():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    on_disk = set()
    for package, folder in _package_dirs().items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            on_disk.add(".".join((package, *rel)))
    assert listed == on_disk, f"pyproject packages differ from the tree: {listed ^ on_disk}"


def test_no_import_runs_back_up():
    bad = []
    for package, path in _sources():
        allowed = FLOORS[package] | {package}
        for line, module in _imports(path):
            top = _floor_of(module)
            if top is None or top in allowed:
                continue
            bad.append(f"{path.relative_to(REPO)}:{line} ({package}) imports {module}")
    assert not bad, "imports that run back up:\n" + "\n".join(bad)


def test_only_the_cli_imports_the_cli():
    for folder in ("paper", "scripts", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            for line, module in _imports(path):
                assert _floor_of(module) != "eplb.cli", f"{path}:{line} imports {module}"


def test_old_top_level_names_are_gone():
    tops = [d for d in REPO.iterdir() if d.is_dir() and d.name != "build" and d.name[0] != "."]
    for path in [p for d in tops for p in d.rglob("*.py")]:
        if any(part.startswith(".") for part in path.relative_to(REPO).parts):
            continue  # virtual environments and caches inside a folder
        for line, module in _imports(path):
            head = module.split(".")[0]
            assert head not in ("traces", "solvers", "evaluation"), f"{path}:{line} {module}"


@pytest.mark.parametrize("name", ["traces", "solvers", "evaluation", "testing", "cli"])
def test_only_eplb_is_installed_at_the_top(name, tmp_path):
    import importlib.util
    import sys

    # from a folder outside the checkout, the old names must not resolve to this project
    saved = sys.path[:]
    try:
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO]
        spec = importlib.util.find_spec(name)
    finally:
        sys.path[:] = saved
    assert spec is None or REPO not in Path(spec.origin or "").resolve().parents


def test_serving_config_imports_nothing_above_it():
    """Inside serving, ``config/`` is the ground: the step-time model, the simulator and the
    rest of serving read it, it reads none of them (a dispatch policy's settings live in
    ``config.dispatch``, its behaviour in the core's `eplb.dispatch`)."""
    folder = REPO / "evaluation" / "serving" / "config"
    bad = []
    for path in sorted(folder.rglob("*.py")):
        for line, module in _imports(path):
            if module.startswith("eplb.evaluation.serving") and not (
                module == "eplb.evaluation.serving.config"
                or module.startswith("eplb.evaluation.serving.config.")
            ):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not bad, "serving config imports above it:\n" + "\n".join(bad)
