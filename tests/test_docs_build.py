"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor between
the pages (README.md and BENCHMARKS.md included, through docs/hooks.py), no docstring the API
reference cannot render, and every name in ``cdsl_struct.__all__`` in the reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cdsl_struct

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    log = build.stdout + build.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert build.returncode == 0 and not warnings, (
        "mkdocs build --strict failed (the doc tools are the extra 'docs': pip install -e '.[docs]'):\n"
        + ("\n".join(warnings) or log[-4000:])
    )

    assert (site / "index.html").is_file()  # README.md
    assert (site / "benchmark-results" / "index.html").is_file()  # BENCHMARKS.md
    reference = (site / "reference" / "cdsl_struct" / "index.html").read_text(encoding="utf-8")
    missing = [name for name in cdsl_struct.__all__ if f'id="cdsl_struct.{name}"' not in reference]
    assert not missing, f"public names missing from the API reference: {missing}"
