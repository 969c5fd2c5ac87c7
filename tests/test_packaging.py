"""The built distribution carries what users and type checkers need: the ``py.typed`` marker (PEP 561)
and the shipped grammars; and not the lab (``benchmarks/``, the research harnesses)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import cdsl_struct

ROOT = Path(cdsl_struct.__file__).resolve().parents[1]


def test_the_package_is_marked_typed():
    assert (Path(cdsl_struct.__file__).parent / "py.typed").is_file()


def test_the_wheel_ships_py_typed(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("cdsl_struct", "benchmarks"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "results"))
    build = ("import sys; from setuptools import build_meta; "
             "print(build_meta.build_wheel(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", build, str(tmp_path / "dist")], cwd=source, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = tmp_path / "dist" / done.stdout.strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    assert "cdsl_struct/py.typed" in names
    # the shipped grammars too: grammar="arithmetic" works from a pip install, not only from a clone
    assert {f"cdsl_struct/grammars/{name}.lark" for name in ("arithmetic", "json", "sql_select")} <= set(names)
    # the lab stays in the repository: only the deployment benches ship
    assert not [n for n in names if n.startswith("benchmarks/")]
    assert {n.rsplit("/", 1)[-1] for n in names if n.startswith("cdsl_struct/bench/")} == {
        "__init__.py", "host_reads.py", "maskbench.py", "overhead.py", "serve.py", "serving.py", "serving_mix.py",
        "throughput.py"}
