"""The benchmarks are the library's first users: they import only its public surface — top-level
modules and the names a package exports from its ``__init__`` — never a module inside a package,
and nothing outside ``bench/`` (but the CLI that runs them) imports a benchmark."""

from tests.test_import_graph import ROOT, module_graph


def _packages() -> set[str]:
    return {".".join(path.parent.relative_to(ROOT.parent).parts) for path in ROOT.rglob("__init__.py")}


def _public(module: str, packages: set[str]) -> bool:
    """``cdsl_struct.x`` (a top-level module or package), a package at any depth, or an
    integration (``cdsl_struct.integrations.vllm``: each is a module users import)."""
    return module in packages or module.count(".") == 1 or module.startswith("cdsl_struct.integrations.")


def test_benchmarks_import_only_public_modules():
    graph, packages = module_graph(), _packages()
    private = {bench: sorted(t for t in targets if not t.startswith("cdsl_struct.bench") and not _public(t, packages))
               for bench, targets in graph.items() if bench.startswith("cdsl_struct.bench.")}
    assert {bench: targets for bench, targets in private.items() if targets} == {}


def test_nothing_but_the_cli_imports_a_benchmark():
    users = {module for module, targets in module_graph().items()
             if not module.startswith("cdsl_struct.bench") and any(t.startswith("cdsl_struct.bench") for t in targets)}
    assert users <= {"cdsl_struct.cli"}


def test_the_check_catches_a_private_import():
    packages = _packages()
    assert not _public("cdsl_struct.decoding.lookahead", packages)
    assert _public("cdsl_struct.decoding", packages) and _public("cdsl_struct.api", packages)
    assert _public("cdsl_struct.constraints.schema_rewrite", packages)
