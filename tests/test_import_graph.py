"""The package's modules import each other in one direction: no circle among their imports, those
inside functions included (only imports under ``TYPE_CHECKING`` are left out). ``from . import x``
depends on the module ``x``, not on the package that holds it."""

import ast
from pathlib import Path

import cdsl_struct

ROOT = Path(cdsl_struct.__file__).parent


def module_graph() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports at module level."""
    files = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(inner) for node in ast.walk(tree)
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for inner in ast.walk(node)}
        graph[name] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(max(0, node.level - 1)):
                    base = base.rsplit(".", 1)[0]
                target = (base + ("." + node.module if node.module else "")) if node.level else node.module or ""
                targets = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in files else target
                           for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_checker_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles_in_the_package():
    graph = module_graph()
    assert len(graph) > 50 and graph["cdsl_struct.api"]  # the graph was read
    assert circles(graph) == []


def test_modules_stay_small_and_the_shipped_benches_few():
    """No module of the package or of the lab's ``benchmarks/`` over 600 lines; the benches the wheel
    ships (``cdsl_struct/bench``: what users run against their deployment) 1,500 lines at most."""
    lines = {path: len(path.read_text(encoding="utf-8").splitlines())
             for folder in (ROOT, ROOT.parent / "benchmarks") for path in folder.rglob("*.py")}
    assert len(lines) > 100
    assert {str(path): n for path, n in lines.items() if n > 600} == {}
    assert sum(n for path, n in lines.items() if (ROOT / "bench") in path.parents) <= 1500
