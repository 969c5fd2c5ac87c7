"""Every script in ``examples/`` runs to success with fast settings, so none of them rots.

Each runs in its own process, as a user runs it, with ``CDSL_EXAMPLE_FAST=1`` (examples with
long loops do fewer rounds under it). An example exits non-zero when its own check fails (an
invalid or incomplete output), so a zero exit means it did what it says.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
NEEDS = {"server_openai_client.py": "openai", "outlines_types.py": "outlines"}


def test_every_example_is_listed():
    assert len(EXAMPLES) >= 10 and (ROOT / "examples" / "extract_json.py") in EXAMPLES


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(script: Path):
    if script.name in NEEDS:
        pytest.importorskip(NEEDS[script.name])  # an optional extra that `make test` installs
    env = {**os.environ, "CDSL_EXAMPLE_FAST": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    tail = f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{script.name} exited {done.returncode}:\n{tail}"
    assert done.stdout.strip(), f"{script.name} printed nothing"
