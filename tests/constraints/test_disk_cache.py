"""Compiled programs on disk (``constraints.disk_cache``): an outlines-core index built once is read
back by a new process and masks as the built one; an entry of other versions, a torn file and an
altered payload are ignored and rebuilt; two processes compiling into one folder at once leave only
whole entries; ``off`` keeps nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cdsl_struct.constraints import Regex, TokenVocabulary, allocate_bitmask, allowed_tokens
from cdsl_struct.constraints.backends.outlines_core_backend import OutlinesCoreBackend
from cdsl_struct.constraints.disk_cache import FOLDER_ENV, MAGIC, ProgramCache
from cdsl_struct.constraints.whitespace import WhitespacePolicy

DATE = r"\d{4}-\d{2}-\d{2}"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(FOLDER_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def gpt2(vocab_of) -> TokenVocabulary:
    return vocab_of("gpt2")


def _masks(program, vocabulary, text: str) -> list[list[int]]:
    """The allowed tokens before each of ``text``'s tokens and after the last."""
    state, row, masks = program.new_state(), allocate_bitmask(vocabulary.size), []
    for token in vocabulary.encode(text):
        state.fill_mask(row)
        masks.append(allowed_tokens(row, vocabulary.size))
        state.advance(token)
    state.fill_mask(row)
    return masks + [allowed_tokens(row, vocabulary.size)]


def test_a_program_round_trips_and_other_versions_are_ignored(tmp_path):
    ours = ProgramCache(tmp_path, {"cdsl_struct": "1.0", "engine": "2.0"})
    key = ours.key("regex", "vocab")
    ours.store(key, {"index": [1, 2, 3]})
    assert ours.load(key) == {"index": [1, 2, 3]} and ours.hits == 1
    assert not list(tmp_path.glob("*.part"))  # the temporary file was renamed into place
    theirs = ProgramCache(tmp_path, {"cdsl_struct": "1.1", "engine": "2.0"})
    assert theirs.key("regex", "vocab") != key  # another version never looks up this entry
    (tmp_path / theirs.key("regex", "vocab")).write_bytes((tmp_path / key).read_bytes())  # copied under its name
    assert theirs.load(theirs.key("regex", "vocab")) is None and theirs.ignored == 1  # the header says 1.0


@pytest.mark.parametrize("damage", ["torn", "altered", "garbage"])
def test_a_damaged_entry_is_ignored_and_rebuilt(folder, gpt2, damage):
    backend, policy = OutlinesCoreBackend(), WhitespacePolicy.parse("flexible")
    built = backend.compile(Regex(DATE), gpt2, policy)
    (entry,) = [p for p in folder.iterdir() if not p.name.startswith(".")]
    data = entry.read_bytes()
    assert data.startswith(MAGIC)
    if damage == "torn":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "altered":
        entry.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    else:
        entry.write_bytes(b"not a program")
    from cdsl_struct.constraints.disk_cache import program_cache

    cache = program_cache("outlines-core")
    ignored = cache.ignored
    rebuilt = backend.compile(Regex(DATE), gpt2, policy)
    assert cache.ignored == ignored + 1
    assert entry.read_bytes() == data  # rebuilt and stored whole again
    assert _masks(rebuilt, gpt2, "2024-01-31") == _masks(built, gpt2, "2024-01-31")


def test_off_keeps_nothing(tmp_path, monkeypatch, gpt2):
    monkeypatch.setenv(FOLDER_ENV, "off")
    OutlinesCoreBackend().compile(Regex(r"[a-c]{3}"), gpt2, WhitespacePolicy.parse("flexible"))
    assert ProgramCache.for_engine("outlines-core").folder is None


_COMPILE_IN_A_PROCESS = """
    import json, sys
    from cdsl_struct.constraints import Regex, TokenVocabulary
    from cdsl_struct.constraints.backends.outlines_core_backend import OutlinesCoreBackend
    from cdsl_struct.constraints.disk_cache import program_cache
    from cdsl_struct.constraints.whitespace import WhitespacePolicy
    from cdsl_struct.models.tokenizers import load_tokenizer
    tokenizer = load_tokenizer("gpt2")
    vocabulary = TokenVocabulary.from_tokenizer(tokenizer, [tokenizer.eos_token_id])
    backend, policy = OutlinesCoreBackend(), WhitespacePolicy.parse("flexible")
    patterns = json.loads(sys.argv[1])
    for pattern in patterns:
        program = backend.compile(Regex(pattern), vocabulary, policy, timeout=60)
        state = program.new_state()
        assert not state.is_complete()
    cache = program_cache("outlines-core")
    print(json.dumps({"hits": cache.hits, "misses": cache.misses, "ignored": cache.ignored}))
"""


def _run_compiles(folder: Path, patterns: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(_COMPILE_IN_A_PROCESS), json.dumps(patterns)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, FOLDER_ENV: str(folder), "OMP_NUM_THREADS": "1"})


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_a_new_process_reads_what_another_built_and_two_at_once_leave_whole_entries(tmp_path):
    patterns = [DATE, r"[A-Z][a-z]{2,8}", r"(yes|no|maybe)", r"\d+(\.\d+)?", r"[a-f0-9]{8}"]
    first, second = _run_compiles(tmp_path, patterns), _run_compiles(tmp_path, patterns)  # together
    counts = [_finish(first), _finish(second)]
    assert all(c["ignored"] == 0 for c in counts)
    entries = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert len(entries) == len(patterns) and not list(tmp_path.glob(".*.part"))
    again = _finish(_run_compiles(tmp_path, patterns))  # a restart: every index read back, none built
    assert again == {"hits": len(patterns), "misses": 0, "ignored": 0}
