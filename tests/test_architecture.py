"""The folders are the architecture: each package imports only the packages below it, and no module imports
itself back through a cycle. A new import that breaks a layer fails here, with the edge that broke it."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each package and what it may import (bottom to top). calibration makes profiles from kernel timings and
# sits beside the engine, not above it; fidelity runs real engines and replays them through experiments.
ALLOWED = {
    "commandline": set(),
    "costmodels": {"simcore", "commandline"},   # a cost model implements simcore.costmodel's interface
    "simcore": {"commandline"},
    "policies": {"simcore"},
    "workloads": {"simcore", "commandline"},
    "calibration": {"costmodels", "commandline"},
    "experiments": {"commandline", "costmodels", "simcore", "policies", "workloads"},
    "fidelity": {"commandline", "costmodels", "simcore", "policies", "workloads", "calibration", "experiments"},
    "benchmarks": {"commandline", "costmodels", "simcore", "policies", "workloads", "calibration", "experiments",
                   "fidelity"},
}


def module_imports(path: Path, top_level_only: bool) -> set[str]:
    """Absolute imports of project modules in `path` (only those run at import time with top_level_only)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] in ALLOWED}


def modules() -> dict[str, Path]:
    found = {}
    for package in ALLOWED:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def test_each_package_imports_only_the_layers_below_it():
    broken = []
    for name, path in modules().items():
        package = name.split(".")[0]
        for m in module_imports(path, top_level_only=False):
            if m.split(".")[0] not in ALLOWED[package] | {package}:
                broken.append(f"{path.relative_to(ROOT)} imports {m}")
    assert not broken, "\n".join(sorted(set(broken)))


def test_no_import_cycle_between_modules():
    """Import-time edges only (an import inside a function runs later and cannot deadlock the loader)."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        found = {m for m in module_imports(path, True) if m in mods and m != name}
        # `from package import submodule` loads the submodule, not (again) the package's own __init__ edge
        graph[name] = {m for m in found if not any(o.startswith(m + ".") for o in found) or m == name}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack + [node, nxt]
            if nxt not in state and (cycle := visit(nxt, stack + [node])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [])):
            raise AssertionError("import cycle: " + " -> ".join(cycle[cycle.index(cycle[-1]):]))
