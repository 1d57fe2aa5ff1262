"""The package's import graph keeps its layers (docs/design.md, "Layers").

Read from the source with ``ast`` (nothing is imported or run), so a lazy import inside a
function counts as much as one at the top: it is still a dependency, only a hidden one.

Checked here:
- no import from a lower layer to a higher one, and none between peer areas of one layer;
- no cycle between modules;
- nothing below the adapters imports Lightning or Accelerate;
- no module of the package imports the benchmarks or the tests;
- no file past 300 lines in ``src/`` or ``triton_kernels/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "hetero_strategy"
KERNELS = f"{PACKAGE}.triton_kernels"

# Bottom to top. A module imports modules of its own area and of lower layers only: the areas
# of one layer are peers and never import each other (the features below the runtime, the adapters).
LAYERS: list[set[str]] = [
    {"config"},
    {"dist"},
    {"cluster", "workloads", "triton_kernels"},
    {"hooks"},
    {"balance", "precision"},  # the probe times the hooks' codec work (hooks.cost)
    {"hybrid"},
    {"runtime"},
    {"lightning", "accelerate", "fabric"},
    {"transformers"},  # the HF Trainer's adapter calls the Accelerate plugin's parts (the Trainer is Accelerate's)
    {"wizard", "emulate"},
    {"commands"},
    {"cli", "_registration"},
    {""},  # the package's own __init__
]
FRAMEWORKS = ("lightning", "pytorch_lightning", "accelerate")
OUTSIDE = ("benchmarks", "tests", "recipes", "conftest")
MAX_LINES = 300


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for the package and its kernels (installed as a subpackage)."""
    out = {}
    for base, prefix in ((SRC / PACKAGE, PACKAGE), (ROOT / "triton_kernels", KERNELS)):
        for f in sorted(base.rglob("*.py")):
            parts = f.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((prefix, *parts))] = f
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """Every module ``name`` imports (absolute names), with the line, wherever the import stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((module, node.lineno))
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            found += [(f"{module}.{a.name}", node.lineno) for a in node.names if f"{module}.{a.name}" in MODULES]
    return found


def _area(module: str) -> str:
    """The package's top-level area a module belongs to ("" for the package's __init__)."""
    rest = module[len(PACKAGE) + 1:] if module.startswith(PACKAGE + ".") else ""
    return rest.split(".")[0]


def _layer(area: str) -> int:
    for i, layer in enumerate(LAYERS):
        if area in layer:
            return i
    raise AssertionError(f"{PACKAGE}.{area} is in no layer of tests/test_layers.py: place it there "
                         "and in docs/design.md")


def _edges() -> dict[str, list[tuple[str, int]]]:
    return {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_area_has_a_layer():
    for module in MODULES:
        _layer(_area(module))


def test_no_import_runs_up_the_layers_or_across_peers():
    bad = []
    for name, imports in _edges().items():
        mine = _area(name)
        for target, line in imports:
            if target not in MODULES:
                continue
            theirs = _area(target)
            if theirs == mine:
                continue
            if _layer(theirs) >= _layer(mine):
                bad.append(f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_framework_below_the_adapters():
    top_of_features = _layer("runtime")
    bad = [f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}"
           for name, imports in _edges().items() if _layer(_area(name)) <= top_of_features
           for target, line in imports if target.split(".")[0] in FRAMEWORKS]
    assert not bad, "Lightning/Accelerate below the adapters:\n" + "\n".join(bad)


def test_the_package_imports_no_benchmark_or_test():
    bad = [f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}"
           for name, imports in _edges().items()
           for target, line in imports if target.split(".")[0] in OUTSIDE or ".benchmarks" in target]
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start, children in graph.items():
        if start in index:
            continue
        work = [(start, iter(sorted(children)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            child = next(todo, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _package_graph() -> dict[str, set[str]]:
    """Imports between modules, without a package's __init__ importing its own submodules: that
    edge is how a package exports, and a submodule never needs its package's __init__ to load."""
    graph: dict[str, set[str]] = {}
    for name, imports in _edges().items():
        graph[name] = {t for t, _ in imports if t in MODULES and t != name and not t.startswith(name + ".")}
    return graph


def test_no_import_cycles():
    cycles = _cycles(_package_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_hand_built_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("base", ["src", "triton_kernels"])
def test_no_file_past_300_lines(base):
    long = [f"{f.relative_to(ROOT)}: {n}" for f in sorted((ROOT / base).rglob("*.py"))
            if (n := len(f.read_text().splitlines())) > MAX_LINES]
    assert not long, f"files past {MAX_LINES} lines:\n" + "\n".join(long)
