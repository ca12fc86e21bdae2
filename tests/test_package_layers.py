"""The package's layers: who may import whom, and no import circle.

Read from the source with ``ast`` (nothing is imported): every ``import`` / ``from ... import`` of the package, at
module level or inside a function, resolved to the absolute module name.
"""

import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "diffusers_var_accel"
PACKAGE = PACKAGE_DIR.name

#: Per unit (a subpackage or a top-level module), the units it must never import, however lazily.
FORBIDDEN: Dict[str, Set[str]] = {
    "next_scale": {"models", "schedulers", "pipelines", "bench", "cli", "loading", "hub", "demo", "embedded", "utils"},
    "models": {"schedulers", "pipelines", "bench", "cli", "loading", "hub", "demo", "embedded", "utils"},
    "schedulers": {"models", "pipelines", "bench", "cli", "loading", "hub", "demo", "embedded"},
    "pipelines": {"bench", "cli", "loading", "demo", "serve", "comparison", "calibration"},
    "bench": {"cli", "demo", "serve", "comparison"},
    "loading": {"cli", "bench", "demo", "serve", "comparison"},
    "families": {"next_scale", "models", "schedulers", "pipelines", "bench", "cli", "loading", "hub", "demo"},
    # below everything: writing files so that a killed process leaves none half-written
    "files": {"next_scale", "models", "schedulers", "pipelines", "bench", "cli", "loading", "hub", "demo", "embedded",
              "utils", "families", "calibration", "serve", "comparison"},
    # the web page and its comparison are front ends, above everything the command line uses
    "comparison": {"cli", "serve"},
}


def _imports(source: str, module: str, is_package: bool, top_level_only: bool) -> List[str]:
    """The package modules ``module`` imports (absolute names)."""
    package_parts = module.split(".") if is_package else module.split(".")[:-1]
    tree = ast.parse(source)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                # ``from . import name`` may import a submodule: count it as that module
                found += [f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target for a in node.names]
            else:
                found.append(node.module or "")
    return [name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")]


def _is_module(name: str) -> bool:
    path = PACKAGE_DIR.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_graph(top_level_only: bool) -> Dict[str, Set[str]]:
    """``{module: modules it imports}`` over the package's source files."""
    graph: Dict[str, Set[str]] = defaultdict(set)
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        graph[module] |= set(_imports(path.read_text(encoding="utf-8"), module, is_package, top_level_only))
    return graph


def unit(module: str) -> str:
    """The layer a module belongs to: its subpackage, or the top-level module itself (``<package>`` for the facade)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<package>"


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import circle of ``graph`` as a path ``[a, b, ..., a]``, or ``[]``."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> List[str]:
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node], _ = 2, stack.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def unit_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    units: Dict[str, Set[str]] = defaultdict(set)
    for module, targets in graph.items():
        for target in targets:
            if unit(target) != unit(module) and unit(target) != "<package>":  # the facade re-exports, imports nothing back
                units[unit(module)].add(unit(target))
    return units


def test_the_walker_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert "diffusers_var_accel.schedulers.scheduling_var_base" in import_graph(True)["diffusers_var_accel.schedulers.scheduling_lazyvar"]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_one_above_it(layer):
    bad: List[Tuple[str, str]] = [(module, target) for module, targets in import_graph(top_level_only=False).items()
                                  if unit(module) == layer for target in targets if unit(target) in FORBIDDEN[layer]]
    assert bad == [], f"{layer} must not import {sorted(FORBIDDEN[layer])}: {bad}"


def test_no_import_circle_between_modules():
    """Module-level imports form no circle (a lazy import inside a function runs after every module is loaded)."""
    graph = {m: {t for t in ts if t != PACKAGE} for m, ts in import_graph(top_level_only=True).items() if m != PACKAGE}
    assert find_cycle(graph) == []


def test_no_import_circle_between_subpackages():
    cycle = find_cycle(unit_graph(import_graph(top_level_only=True)))
    assert cycle == [], f"import circle between the package's subpackages: {' -> '.join(cycle)}"
