"""The package's layers: the library below the lab, who may import whom, no import circle, and no family named
outside its own files.

Read from the source with ``ast`` (nothing is imported): every ``import`` / ``from ... import`` of the package, at
module level or inside a function, resolved to the absolute module name; every string constant outside docstrings.
The lab (``diffusers_var_accel/lab/``: command line, benchmarks, counters, calibration, the shapes world, the web
page, model cards) is one unit per subpackage or module (``lab.bench``, ``lab.cli``, ...); everything else is the
library, which never imports the lab.
"""

import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "diffusers_var_accel"
PACKAGE = PACKAGE_DIR.name
LAB = "lab"

#: The library's units (a subpackage or a top-level module of the package; the facade is ``<package>``).
LIBRARY_UNITS = {
    "next_scale",
    "models",
    "schedulers",
    "pipelines",
    "embedded",
    "utils",
    "families",
    "builtin_methods",
    "files",
    "version",
    "hub",
    "presets",
}
#: The lab's units, read from its folder.
LAB_UNITS = {
    f"{LAB}.{p.stem}"
    for p in (PACKAGE_DIR / LAB).iterdir()
    if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
}
_ALL_UNITS = LIBRARY_UNITS | LAB_UNITS

#: Per unit, the units it must never import, however lazily. Every library unit: the whole lab, and what is above it.
FORBIDDEN: Dict[str, Set[str]] = {
    "next_scale": LAB_UNITS | {"models", "schedulers", "pipelines", "hub", "embedded", "utils"},
    "models": LAB_UNITS | {"schedulers", "pipelines", "hub", "embedded", "utils"},
    "schedulers": LAB_UNITS | {"models", "pipelines", "hub", "embedded"},
    "pipelines": set(LAB_UNITS),
    "hub": LAB_UNITS | {"next_scale", "models"},
    "families": LAB_UNITS | {"next_scale", "models", "schedulers", "pipelines", "hub"},
    # the built-in methods' names, for the command line's help without torch
    "builtin_methods": _ALL_UNITS - {"builtin_methods"},
    # below everything: writing files so that a killed process leaves none half-written
    "files": _ALL_UNITS - {"files"},
    # the packaged model's path and names only: the pipelines resolve the name "embedded" through it
    "embedded": _ALL_UNITS - {"embedded"},
    # the version string: the cards, the job's invocation stamp and setup.py read it without loading the package
    "version": _ALL_UNITS - {"version"},
    # what the families' tiny builders share; the builders themselves live in pipelines/<family>/tiny.py
    "utils": LAB_UNITS | {"pipelines", "hub", "embedded", "schedulers", "next_scale"},
    # the lab's own layers: the benchmark and the counters below the front ends
    f"{LAB}.bench": {f"{LAB}.cli", f"{LAB}.demo", f"{LAB}.serve", f"{LAB}.comparison"},
    f"{LAB}.loading": {f"{LAB}.cli", f"{LAB}.bench", f"{LAB}.demo", f"{LAB}.serve", f"{LAB}.comparison"},
    f"{LAB}.comparison": {f"{LAB}.cli", f"{LAB}.serve", f"{LAB}.demo"},
    f"{LAB}.user_errors": _ALL_UNITS - {f"{LAB}.user_errors"},
    f"{LAB}.generate_job": {f"{LAB}.cli", f"{LAB}.demo", f"{LAB}.serve", f"{LAB}.comparison", f"{LAB}.calibration"},
    f"{LAB}.families": {f"{LAB}.cli", f"{LAB}.demo", f"{LAB}.serve", f"{LAB}.comparison", f"{LAB}.calibration"},
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
    """The layer a module belongs to: its subpackage, or the top-level module itself (``<package>`` for the facade);
    in the lab, ``lab.<subpackage or module>``."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == LAB:
        return f"{LAB}.{parts[2]}"
    return parts[1] if len(parts) > 1 else "<package>"


#: Modules of the library that may import the lab, each with the reason.
LAB_IMPORTS_ALLOWED = {
    f"{PACKAGE}.__main__": "``python -m diffusers_var_accel`` is the command line's entry point, run, never imported",
}


def test_the_library_never_imports_the_lab():
    """Nothing outside ``lab/`` imports it (lazy imports inside functions included), and importing the package
    loads no lab module."""
    import subprocess
    import sys

    bad = [
        (module, target)
        for module, targets in import_graph(top_level_only=False).items()
        if unit(module) not in LAB_UNITS and module not in LAB_IMPORTS_ALLOWED
        for target in targets
        if unit(target) in LAB_UNITS or target == f"{PACKAGE}.{LAB}"
    ]
    assert bad == [], f"the library imports the lab: {bad}"
    probe = (
        f"import sys, {PACKAGE}, {PACKAGE}.pipelines.pipeline_loading; "
        f"print(sorted(m for m in sys.modules if m.startswith('{PACKAGE}.{LAB}')))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", f"importing the library loaded lab modules: {loaded}"


def test_every_unit_is_library_or_lab():
    """A new top-level module or subpackage is placed on purpose: in the library's list, or under ``lab/``."""
    found = {
        p.stem
        for p in PACKAGE_DIR.iterdir()
        if (p.suffix == ".py" and p.stem not in ("__init__", "__main__")) or (p / "__init__.py").is_file()
    } | {p.name for p in PACKAGE_DIR.iterdir() if p.is_dir() and p.name == "presets"}
    assert found - {LAB} == LIBRARY_UNITS


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import circle of ``graph`` as a path ``[a, b, ..., a]``, or ``[]``."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> List[str]:
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
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
            if (
                unit(target) != unit(module) and unit(target) != "<package>"
            ):  # the facade re-exports, imports nothing back
                units[unit(module)].add(unit(target))
    return units


def test_the_walker_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert (
        "diffusers_var_accel.schedulers.scheduling_var_base"
        in import_graph(True)["diffusers_var_accel.schedulers.scheduling_lazyvar"]
    )


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_one_above_it(layer):
    bad: List[Tuple[str, str]] = [
        (module, target)
        for module, targets in import_graph(top_level_only=False).items()
        if unit(module) == layer
        for target in targets
        if unit(target) in FORBIDDEN[layer] or (layer in LIBRARY_UNITS and target == f"{PACKAGE}.{LAB}")
    ]
    assert bad == [], f"{layer} must not import {sorted(FORBIDDEN[layer])}: {bad}"


def test_no_import_circle_between_modules():
    """Module-level imports form no circle (a lazy import inside a function runs after every module is loaded)."""
    graph = {m: {t for t in ts if t != PACKAGE} for m, ts in import_graph(top_level_only=True).items() if m != PACKAGE}
    assert find_cycle(graph) == []


def test_no_import_circle_between_subpackages():
    cycle = find_cycle(unit_graph(import_graph(top_level_only=True)))
    assert cycle == [], f"import circle between the package's subpackages: {' -> '.join(cycle)}"


#: Import circles the whole-package test tolerates, each with the reason (remove an entry once it is gone: the test
#: fails on an entry that no longer matches a circle).
KNOWN_CIRCLES: Dict[frozenset, str] = {}


def strongly_connected(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[Set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_component_walker_finds_every_circle():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}
    assert sorted(map(sorted, strongly_connected(graph))) == [["a", "b"], ["c", "d"]]
    assert strongly_connected({"a": {"b"}, "b": {"c"}}) == []


def test_no_import_circle_in_the_whole_package():
    """No circle among every import of the package, lazy ones inside functions and the package root included (a
    lazy import that closes a circle ties the modules' layers together just the same)."""
    graph = {module: set(targets) for module, targets in import_graph(top_level_only=False).items()}
    circles = strongly_connected(graph)
    unknown = [sorted(c) for c in circles if frozenset(c) not in KNOWN_CIRCLES]
    assert unknown == [], f"import circles: {unknown}"
    stale = [sorted(c) for c in KNOWN_CIRCLES if set(c) not in circles]
    assert stale == [], f"KNOWN_CIRCLES lists circles that are gone (remove them): {stale}"


# ---------------------------------------------------------------------------------------------------------------------
# no family named outside models/ and pipelines/<family>/
# ---------------------------------------------------------------------------------------------------------------------
#: Modules outside models/ and pipelines/<family>/ that may name a family in code, each with the reason.
FAMILY_NAMES_ALLOWED: Dict[str, str] = {
    "families.py": "the registry: where each family's names are registered",
    "lab/families/__init__.py": "the lab's registry: where each family's lab names are registered",
    # each family's `var-accel convert <family>` options, written without torch so that --help needs none; a test
    # (tests/lab/test_cli_startup.py) checks them against the family's own converter's options
    "lab/families/convert_commands.py": "the convert sub-commands' torch-free options (Infinity's named configs)",
    # the device benchmark names what it measures: the two real models at their official inference dtypes, and the
    # tiny stand-ins of its dry run (it was a script outside the package; it times named models, not a registry)
    "lab/bench/gpu.py": "the GPU runner: Infinity-2B and HART-0.7B, their dtypes and the dry run's tiny models",
    "lab/bench/latency.py": "the latency script's built-in models (tiny, infinity-2b, tiny-hart, hart-0.7b)",
    "__init__.py": "the package facade's __all__ lists each family's public classes",
    # StageVARScheduler.paper_variant is the paper's own reading of Infinity-2B (its released preset with the
    # paper's projection over the whole fidelity stage): a published setting for one model, as a preset is
    "schedulers/scheduling_stagevar.py": "paper_variant: the FasterVAR paper's setting for Infinity-2B",
}


def family_names() -> Set[str]:
    """Every name that stands for one family: the family's, its tiny ``--model``, its preset model, the models its
    launch structures build, its pipeline class."""
    from diffusers_var_accel.families import MODEL_FAMILIES
    from diffusers_var_accel.lab.families import lab_family

    names = set()
    for name, family in MODEL_FAMILIES.items():
        lab = lab_family(name)
        names |= {name, lab.tiny_model, family.preset_model, family.pipeline_class_name}
        if lab.launch_structures:
            names |= set(lab.launch_structure_builder().models)
    return names - {""}


def string_constants(source: str) -> List[Tuple[int, str]]:
    """``(line, text)`` of every string constant of ``source`` in code: docstrings (a module's, a class's or a
    function's first statement) are prose and left out; f-strings' literal parts are in."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.add(id(value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_the_string_walker_skips_docstrings_only():
    source = '"""infinity"""\ndef f():\n    """hart"""\n    return "hart", f"{1}tiny"\n'
    assert [text for _, text in string_constants(source)] == ["hart", "tiny"]


def family_named_outside_its_files() -> Dict[str, List[Tuple[int, str]]]:
    from diffusers_var_accel.families import MODEL_FAMILIES

    names = family_names()
    found: Dict[str, List[Tuple[int, str]]] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR).parts
        if parts[0] == "models" or (parts[0] == "pipelines" and len(parts) > 2 and parts[1] in MODEL_FAMILIES):
            continue
        if parts[:2] == (LAB, "bench") and parts[-1].split("_")[0] in MODEL_FAMILIES:  # a family's counters
            continue
        hits = [(line, text) for line, text in string_constants(path.read_text(encoding="utf-8")) if text in names]
        if hits:
            found["/".join(parts)] = hits
    return found


def test_no_module_outside_the_family_files_names_a_family():
    """A family's names (``"hart"``, ``"tiny-hart"``, ``"hart-0.7b"``, ``"HARTPipeline"``...) appear as string
    constants only in models/, pipelines/<family>/ and the allowed modules: everything else reads them from the
    registry."""
    found = family_named_outside_its_files()
    assert {path: hits for path, hits in found.items() if path not in FAMILY_NAMES_ALLOWED} == {}
    stale = sorted(set(FAMILY_NAMES_ALLOWED) - set(found))
    assert stale == [], f"FAMILY_NAMES_ALLOWED lists modules that name no family any more (remove them): {stale}"


def test_the_family_name_check_sees_a_family_named_in_code():
    names = family_names()
    assert {"infinity", "hart", "tiny", "tiny-hart", "InfinityPipeline", "HARTPipeline"} <= names
    source = 'def load(model):\n    """tiny or tiny-hart: prose"""\n    return model == "tiny-hart"\n'
    assert [text for _, text in string_constants(source) if text in names] == ["tiny-hart"]
