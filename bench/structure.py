"""Structure figures of a package: import cycles, the largest classes, function-local imports.

    .venv/bin/python bench/structure.py [--package trainyard_services.devcluster] [--top 5]

Prints the import cycles among the package's modules (strongly connected components of the
import graph, function-local imports included: a cycle hidden inside a function is still a
cycle), the largest classes by lines, and the count of function-local imports and
``importlib.import_module`` look-ups (the ways a cycle gets hidden). Exit status 0 always: this
is a measurement, the figures go in commit messages and docs.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
from pathlib import Path

import grimp


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return found


def import_cycles(package: str) -> list[list[str]]:
    top = package.split(".")[0]
    graph = grimp.build_graph(top, include_external_packages=False)
    modules = {m for m in graph.modules if m == package or m.startswith(package + ".")}
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules} for m in modules}
    return _strongly_connected(edges)


def _files(package: str) -> list[Path]:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    root = Path(list(spec.submodule_search_locations)[0])
    return sorted(root.rglob("*.py"))


def classes(package: str) -> list[tuple[int, str]]:
    sizes = []
    for path in _files(package):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                sizes.append((node.end_lineno - node.lineno + 1, f"{path.name}:{node.name}"))
    return sorted(sizes, reverse=True)


def hidden_imports(package: str) -> tuple[int, int]:
    """(function-local import statements, importlib.import_module calls)."""
    local = lookups = 0
    for path in _files(package):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local += sum(1 for inner in ast.walk(node) if isinstance(inner, (ast.Import, ast.ImportFrom)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "import_module":
                lookups += 1
    return local, lookups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="trainyard_services.devcluster")
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    cycles = import_cycles(args.package)
    print(f"import cycles: {len(cycles)}")
    for cycle in cycles:
        print("  " + " <-> ".join(m.rsplit(".", 1)[-1] if m != args.package else m for m in cycle))
    print("largest classes (lines):")
    for lines, name in classes(args.package)[:args.top]:
        print(f"  {lines:5d}  {name}")
    local, lookups = hidden_imports(args.package)
    print(f"function-local imports: {local}; importlib.import_module look-ups: {lookups}")


if __name__ == "__main__":
    main()
