"""Shared fixtures: real tokenizers (fetched once into the cache by `make test`)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# dtype="auto" is bfloat16 on CPUs with native bfloat16 (models.device.cpu_has_native_bf16), float32
# elsewhere. The suite runs float32 on every machine: its exactness tests (speculation lossless,
# batched rows equal to solo ones) hold bit for bit in float32 only, since bfloat16 rounds
# differently by batch shape (as on GPUs). tests/models/test_bf16_default.py covers the default.
os.environ["CDSL_CPU_BF16"] = "0"
# compiled engine programs are kept on disk between processes (constraints.disk_cache); the suite keeps
# them in a folder of its own run, so no test reads a program an earlier run (or the user) stored
if "CDSL_STRUCT_PROGRAM_CACHE" not in os.environ:
    import tempfile

    os.environ["CDSL_STRUCT_PROGRAM_CACHE"] = tempfile.mkdtemp(prefix="cdsl-test-programs-")


FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def pytest_addoption(parser):
    parser.addoption("--write-file-seconds", action="store_true",
                     help=f"write each test file's measured seconds to {FILE_SECONDS.name} (the run order's weights)")


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    """Run the files that take longest first (``file_seconds.json``, written by
    ``--write-file-seconds``; a file not in it counts 1 s). With ``--dist loadfile
    --no-loadscope-reorder`` xdist hands whole files out in this order, so the last ones to start
    are short and the workers finish close together; xdist's own order (by number of tests) left
    one-test files of 40-50 s (Ray, the soak) for last."""
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    first_index = {_file(item.nodeid): index for index, item in reversed(list(enumerate(items)))}
    items.sort(key=lambda item: (-seconds.get(_file(item.nodeid), 1.0), first_index[_file(item.nodeid)]))


_measured: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _measured[_file(report.nodeid)] = _measured.get(_file(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session):
    """With ``--write-file-seconds``, merge this run's seconds into ``file_seconds.json``: the files a
    run left out (``make test`` leaves out the lab's, ``make test-lab`` runs only those) keep theirs."""
    if session.config.getoption("--write-file-seconds") and not hasattr(session.config, "workerinput"):
        root = FILE_SECONDS.parents[1]
        previous = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
        merged = {f: s for f, s in previous.items() if (root / f).exists()} | _measured
        FILE_SECONDS.write_text(json.dumps({f: round(s, 1) for f, s in sorted(merged.items())}, indent=0) + "\n")


def pytest_configure(config):
    """Give transformers' log handler its stream now, before any test captures stderr.

    The handler keeps the ``sys.stderr`` it first sees; if that is one test's ``capsys`` stream,
    every later transformers warning writes to a closed file and fails an unrelated test.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger("transformers")
    # absl binds its handler's stream at import (rouge-score imports absl; rouge-score itself, 3-6 s of
    # nltk, adds no handler and is left to the tests that use it)
    for module in ("absl.logging", "sacrebleu"):
        try:
            __import__(module)
        except ImportError:
            pass


@pytest.fixture(autouse=True)
def _log_handlers_outlive_capture():
    """After each test, point any log handler left holding a closed stream (a library that made its
    handler while a test captured stderr, such as absl under rouge-score) back at ``sys.stderr``."""
    yield
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for handler in (h for lg in loggers for h in lg.handlers):
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and getattr(stream, "closed", False):
            handler.stream = sys.stderr  # not setStream: it would flush the closed stream

MASKBENCH_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench"
SMALL_TOKENIZERS = ("gpt2", "smollm2", "llama2")
LARGE_TOKENIZERS = ("llama3", "qwen3", "gpt4o", "gemma3")


@pytest.fixture(scope="session")
def vocab_of():
    """``vocab_of(name)`` -> TokenVocabulary of a named real tokenizer (cached)."""
    from cdsl_struct.constraints import TokenVocabulary

    cache: dict[str, TokenVocabulary] = {}

    def get(name: str) -> TokenVocabulary:
        if name not in cache:
            cache[name] = TokenVocabulary.from_tokenizer(name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def smollm2():
    """The embedded default model (SmolLM2-135M-Instruct), loaded once."""
    import torch

    from cdsl_struct.models.loading import load_model

    torch.manual_seed(0)
    return load_model("smollm2")


@pytest.fixture(scope="session")
def dynamic_int8_draft(smollm2):
    """SmolLM2 under torch's own dynamic quantisation (one activation scale for a whole batch): the
    int8 self-draft as it was built before ``models.int8``, for the paths that still take such a draft."""
    import copy
    import warnings

    import torch

    from cdsl_struct.models.packed import unpack_linears

    plain = copy.deepcopy(smollm2.model).float()
    unpack_linears(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notice
        return torch.ao.quantization.quantize_dynamic(plain, {torch.nn.Linear}, dtype=torch.qint8).eval()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Decode with one torch thread for the module: on a shared 2-core machine, two threads
    competing with another process for the cores make each forward pass several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
