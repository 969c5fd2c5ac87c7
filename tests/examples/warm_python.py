"""A Python that imports the model stack once and runs each script it is sent in a fresh fork.

The examples test sends one script at a time, one JSON line on stdin (``{"script", "stdout",
"stderr", "timeout"}``); this process forks, the child points its stdout and stderr at the two
files and runs the script as ``python script.py`` would (``__main__``, ``sys.argv``, the script's
folder first on ``sys.path``), and the parent answers with one JSON line ``{"code": exit code}``
(``-9`` where the child ran past its timeout and was killed). Each script still gets a process of
its own; what it is spared is the import of torch, transformers and the package, and the load and
self-check of the embedded model (several seconds of each example on a 2-core CPU). Nothing here
starts a thread before forking, and the model's one forward ran on one torch thread (no OpenMP pool
to inherit).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from typing import Any

import torch
import transformers.models.llama.modeling_llama  # noqa: F401 - the embedded model's class

import cdsl_struct.api  # torch, transformers and the package, imported once for every fork
from cdsl_struct.models import loading, self_check


def preload_embedded_model() -> None:
    """Load the embedded model here, once, and run the ragged runner's self-check on it (remembered
    per model object); a script's ``load_model("smollm2")`` with the default arguments then returns
    this model, its fork's copy-on-write view of it. Loading and the check are tested elsewhere
    (``tests/models``); each example would repeat them (about 4 s of a 2-core CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no OpenMP pool for the forks to inherit
    loaded = loading.load_model(loading.DEFAULT_MODEL)
    self_check.batch_runner(loaded.model)
    torch.set_num_threads(threads)
    real = loading.load_model

    def load_model(spec: Any = loading.DEFAULT_MODEL, *, device: Any = "auto", dtype: Any = "auto",
                   pack: bool = True) -> loading.LoadedModel:
        if str(spec) == loading.DEFAULT_MODEL and (device, dtype, pack) == ("auto", "auto", True):
            return loaded
        return real(spec, device=device, dtype=dtype, pack=pack)

    loading.load_model = load_model
    cdsl_struct.api.load_model = load_model


def run_in_child(script: str, stdout: str, stderr: str) -> int:
    """Run ``script`` as ``__main__`` with its output in the two files; its exit code."""
    for fd, path in ((1, stdout), (2, stderr)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - the child's own streams
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.argv = [script]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, int | None):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as an uncaught exception would be
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def wait(pid: int, timeout: float) -> int:
    """The exit code of child ``pid``, killed (``-9``) if it runs past ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.05)


def main() -> None:
    preload_embedded_model()
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child ends as a script does: atexit handlers, non-daemon threads joined
            raise SystemExit(run_in_child(job["script"], job["stdout"], job["stderr"]))
        print(json.dumps({"code": wait(pid, float(job["timeout"]))}), flush=True)


if __name__ == "__main__":
    main()
