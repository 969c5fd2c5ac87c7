"""Saved compiled graphs (``models.saved_graphs``) on a tiny random Llama: compiled once, loaded, they
run a ragged runner's steps (prompts joining, decode steps, speculation, a long prompt) as solo runs
do, for a model of other weights too; a fresh process loads them without compiling; a folder of
another key or format, or with a torn file, is ignored and rebuilt; a second publisher keeps the
folder already there. One compile for the module (seconds)."""

import json
import subprocess
import sys

import pytest
import torch

from cdsl_struct.models.batch import Feed
from cdsl_struct.models.ragged import GROUPED_QUERIES, RaggedRunner
from cdsl_struct.models.saved_graphs import (
    MANIFEST,
    SavedForward,
    check_folder,
    compile_graphs,
    graphs_folder,
    graphs_key,
    load_graphs,
)
from tests.models.solo import close, solo, tiny_llama


@pytest.fixture(scope="module")
def saved_folder(model, tmp_path_factory):
    RaggedRunner(model, prefix_cache_bytes=0)  # the attention switched, as in a Generator
    return compile_graphs(model, graphs_folder(model, tmp_path_factory.mktemp("graphs")))


def test_loaded_graphs_run_the_steps_as_solo_runs(model, saved_folder):
    saved = load_graphs(model, saved_folder)
    assert isinstance(saved, SavedForward)
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    runner.compiled = saved
    a, b = [1, 2, 3, 4, 5, 6, 7], [9, 8]
    out = runner.run([Feed("a", a, 1), Feed("b", b, 1)])
    assert close(out[0], solo(model, a)) and close(out[1], solo(model, b))
    out = runner.run([Feed("a", a + [5], 1), Feed("b", b + [4], 1)])  # a decode step: the one-token graph
    assert close(out[0], solo(model, a + [5])) and close(out[1], solo(model, b + [4]))
    out = runner.run([Feed("a", a + [5, 6, 7], 3), Feed("b", b + [4, 9], 2)])  # speculation: several kept
    assert close(out[0], solo(model, a + [5, 6, 7], keep=3)) and close(out[1], solo(model, b + [4, 9], keep=2))
    long = [(7 * i + 2) % 50 for i in range(GROUPED_QUERIES * 8)]  # far longer than the traced prompt
    out = runner.run([Feed("c", long, 1)])
    assert close(out[0], solo(model, long))
    only = runner.run([Feed("c", long + [3], 1)])  # one row, one token
    assert close(only[0], solo(model, long + [3]))
    assert saved.steps == 5 and saved.active and not saved.misses


def test_the_graphs_run_at_any_thread_count(model, saved_folder):
    saved = load_graphs(model, saved_folder)
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    runner.compiled = saved
    before, sequence = torch.get_num_threads(), [5, 4, 3, 2, 1]
    try:
        for threads in (1, 3):  # the engine's ThreadGovernor changes the count between steps
            torch.set_num_threads(threads)
            sequence = sequence + [threads]
            assert close(runner.run([Feed("a", sequence, 1)])[0], solo(model, sequence))
    finally:
        torch.set_num_threads(before)
    assert saved.active and saved.steps == 2


def test_one_set_of_graphs_serves_other_weights_of_the_architecture(saved_folder):
    other = tiny_llama()
    torch.manual_seed(11)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    runner = RaggedRunner(other, prefix_cache_bytes=0)
    assert graphs_folder(other, saved_folder.parent) == saved_folder  # the key holds no weights
    runner.compiled = load_graphs(other, saved_folder)
    sequence = [4, 8, 15, 16, 23, 42]
    assert close(runner.run([Feed("x", sequence, 2)])[0], solo(other, sequence, keep=2))
    assert close(runner.run([Feed("x", sequence + [1], 1)])[0], solo(other, sequence + [1]))
    assert runner.compiled.steps == 2


def test_inputs_the_graphs_were_not_compiled_for_run_eagerly(model, saved_folder):
    saved = load_graphs(model, saved_folder)
    runner = RaggedRunner(model.to(torch.float64), prefix_cache_bytes=0)
    try:
        runner.compiled = saved
        out = runner.run([Feed("a", [1, 2, 3], 1)])
        assert close(out[0].float(), solo(model, [1, 2, 3]).float())
        assert saved.misses and saved.active  # every block ran eagerly, nothing failed
    finally:
        model.to(torch.float32)


def test_a_fresh_process_loads_the_graphs_without_compiling(saved_folder):
    script = f"""
import torch, torch._dynamo
from cdsl_struct.models.batch import Feed
from cdsl_struct.models.ragged import RaggedRunner
from cdsl_struct.models.saved_graphs import load_graphs
from tests.models.solo import close, solo, tiny_llama
compiled = []
torch._dynamo.callback_handler.register_start_callback(lambda *_: compiled.append(1))
model = tiny_llama()
runner = RaggedRunner(model, prefix_cache_bytes=0)
runner.compiled = load_graphs(model, {str(saved_folder)!r})
a = [3, 1, 4, 1, 5]
assert close(runner.run([Feed("a", a, 1)])[0], solo(model, a))
assert close(runner.run([Feed("a", a + [9], 1)])[0], solo(model, a + [9]))
print(runner.compiled.steps, len(compiled))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["2", "0"]  # two steps through the graphs, no compile


def _copy(folder, to):
    import shutil

    shutil.copytree(folder, to)
    return to


def test_a_folder_of_another_key_or_format_or_a_torn_file_is_ignored(model, saved_folder, tmp_path):
    kinds = ["LlamaDecoderLayer-full_attention-2"]
    key = saved_folder.name.removeprefix("graphs-")
    assert check_folder(saved_folder, key, kinds) is not None
    assert check_folder(saved_folder, "another-key", kinds) is None  # another version's key
    older = _copy(saved_folder, tmp_path / saved_folder.name)
    manifest = json.loads((older / MANIFEST).read_text())
    (older / MANIFEST).write_text(json.dumps({**manifest, "format": manifest["format"] + 1}))
    assert load_graphs(model, older) is None
    torn = _copy(saved_folder, tmp_path / "torn" / saved_folder.name)
    graph = next(torn.glob("*.one.graph"))
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    assert load_graphs(model, torn) is None
    flipped = _copy(saved_folder, tmp_path / "flipped" / saved_folder.name)
    graph = next(flipped.glob("*.many.graph"))
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    graph.write_bytes(bytes(data))
    assert load_graphs(model, flipped) is None


def test_a_torn_folder_is_rebuilt_and_a_current_one_kept(model, saved_folder, tmp_path):
    torn = _copy(saved_folder, tmp_path / saved_folder.name)
    (torn / MANIFEST).write_text("{")  # a write cut short
    assert load_graphs(model, torn) is None
    assert compile_graphs(model, torn, check=False) == torn  # compiled afresh and published over it
    assert isinstance(load_graphs(model, torn), SavedForward)
    before = {path.name: path.stat().st_mtime_ns for path in torn.iterdir()}
    assert compile_graphs(model, torn) == torn  # current already: nothing compiled or written
    assert {path.name: path.stat().st_mtime_ns for path in torn.iterdir()} == before


def test_the_key_follows_the_architecture_and_dtype():
    model, other = tiny_llama(), tiny_llama()
    assert graphs_key(model) == graphs_key(other)
    RaggedRunner(other, prefix_cache_bytes=0)  # switching the attention implementation is not another key
    assert graphs_key(model) == graphs_key(other)
    assert graphs_key(model) != graphs_key(tiny_llama().to(torch.bfloat16))
    wider = tiny_llama()
    wider.config.rms_norm_eps = 1e-5
    assert graphs_key(model) != graphs_key(wider)
