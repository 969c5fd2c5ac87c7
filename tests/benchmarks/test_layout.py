"""The lab apart from the product: ``python -m benchmarks <name>`` runs every research harness with
its own options, the wheel's ``cdsl-struct bench`` keeps only what users run against their own
deployment, and the harnesses use only the package's public surface."""

import ast
from pathlib import Path

import pytest

from benchmarks import HARNESSES
from benchmarks.__main__ import main
from cdsl_struct.bench import HARNESSES as PRODUCT
from cdsl_struct.cli import main as cli_main
from tests.bench.test_public_api import _packages, _public
from tests.test_import_graph import ROOT

LAB = ROOT.parent / "benchmarks"


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_every_lab_harness_parses_its_options(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0 and "--json" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(PRODUCT))
def test_every_product_bench_parses_its_options(name, capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["bench", name, "--help"])
    assert done.value.code == 0 and "--json" in capsys.readouterr().out


def test_the_product_keeps_the_deployment_benches_and_the_lab_extends_two():
    assert set(PRODUCT) == {"serve", "throughput", "maskbench", "overhead"}
    assert set(PRODUCT) & set(HARNESSES) == {"serve", "throughput"}  # + --against, + other libraries


def test_lab_imports_only_the_public_surface():
    """No harness reaches into a private name or a module inside a package of ``cdsl_struct``."""
    packages = _packages()
    private = []
    for path in sorted(LAB.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("cdsl_struct"):
                module = node.module or ""
                public = module.startswith("cdsl_struct.bench") or _public(module, packages)
                if not public or any(alias.name.startswith("_") for alias in node.names):
                    private.append(f"{path.name}: {module} {[a.name for a in node.names]}")
    assert private == []


def test_nothing_in_the_package_imports_the_lab():
    assert not [p for p in ROOT.rglob("*.py") if "benchmarks" in {n.split(".")[0] for n in _imports(p)}]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names} | {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level}
