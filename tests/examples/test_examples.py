"""Every script in ``examples/`` runs to success with fast settings, so none of them rots.

Each runs in a process of its own, as ``python examples/NAME.py``, with ``CDSL_EXAMPLE_FAST=1``
(examples with long loops do fewer rounds under it). The processes are forked from one Python
that has imported torch, transformers and the package already (``warm_python.py``), which spares
each example those imports. An example exits non-zero when its own check fails (an invalid or
incomplete output), so a zero exit means it did what it says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
NEEDS = {"server_openai_client.py": "openai", "outlines_types.py": "outlines"}
TIMEOUT_S = 900


@pytest.fixture(scope="module")
def warm_python() -> Iterator[subprocess.Popen]:
    """A ``warm_python.py`` process for this module's examples, in the repository root."""
    env = {**os.environ, "CDSL_EXAMPLE_FAST": "1", "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("warm_python.py"))], cwd=ROOT,
                               env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield process
    process.stdin.close()
    process.wait(timeout=60)


def test_every_example_is_listed():
    assert len(EXAMPLES) >= 10 and (ROOT / "examples" / "extract_json.py") in EXAMPLES


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(script: Path, warm_python: subprocess.Popen, tmp_path: Path):
    if script.name in NEEDS:
        pytest.importorskip(NEEDS[script.name])  # an optional extra that `make test` installs
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    job = {"script": str(script), "stdout": str(stdout), "stderr": str(stderr), "timeout": TIMEOUT_S}
    warm_python.stdin.write(json.dumps(job) + "\n")
    warm_python.stdin.flush()
    answer = warm_python.stdout.readline()
    assert answer, f"the warm Python ended (exit {warm_python.poll()}) while running {script.name}"
    code = json.loads(answer)["code"]
    out, err = stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
    assert code == 0, f"{script.name} exited {code}:\n{out[-2000:]}\n{err[-3000:]}"
    assert out.strip(), f"{script.name} printed nothing"
