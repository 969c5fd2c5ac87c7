"""A RaggedRunner's steps through torch.compile (``models.compiled``) on a tiny random Llama: the
compiled steps give a solo run's logits through joins, speculation, crops, leaves and forks; a
step runs four linear kernels a layer (fused projections); the graphs serve every block of layers
and two models of one class each run their own weights, the guard filter dropping the guards on
modules but their tensors'; a second process loads the graphs from inductor's caches instead of
compiling them; a failing compiled forward falls back to eager without losing the step; runners
without ragged steps stay eager; ``"auto"`` compiles only a ragged runner on the CPU where inductor
finds a C++ compiler. One compiled runner for the module (compiling costs seconds)."""

import logging

import pytest
import torch
import torch._inductor.config as inductor_config

from cdsl_struct.models.batch import BatchRunner, Feed
from cdsl_struct.models.compiled import (
    compile_for,
    compile_mode,
    compile_runner,
    layer_blocks,
    module_guards_dropped,
    why_not_compiled,
)
from cdsl_struct.models.ragged import GROUPED_QUERIES, RaggedRunner
from tests.models.solo import close, solo, tiny_llama


def llama_of_width(hidden: int):
    """A tiny random Llama ``hidden`` wide: the compiled graphs serve every model of one class and
    shape, so a test that must see a compile uses a width no other test compiles."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(hidden)
    config = LlamaConfig(vocab_size=50, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def compiled_runner(model):
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    assert compile_runner(runner)
    assert runner.rows == 0 and runner.compiled.steps >= 4  # the warm-up's rows are gone
    return runner


def test_compiled_steps_match_solo_runs(model, compiled_runner):
    runner = compiled_runner
    steps = runner.compiled.steps
    a, b = [1, 2, 3, 4, 5, 6, 7], [9, 8]
    out = runner.run([Feed("a", a, 1), Feed("b", b, 1)])
    assert close(out[0], solo(model, a)) and close(out[1], solo(model, b))
    out = runner.run([Feed("a", a + [5, 6, 7], 4), Feed("b", b + [9], 2)])  # speculation: several kept
    assert close(out[0], solo(model, a + [5, 6, 7], keep=4)) and close(out[1], solo(model, b + [9], keep=2))
    a, b = a + [5, 11], b + [9, 12]  # a keeps one of its three: cropped
    prompt = [3] * (GROUPED_QUERIES + 4)  # a prompt joining the decode step, attending on its own
    out = runner.run([Feed("a", a, 1), Feed("b", b, 1), Feed("c", prompt, 1)])
    assert close(out[0], solo(model, a)) and close(out[1], solo(model, b)) and close(out[2], solo(model, prompt))
    runner.release("a")  # c moves into a's slot
    out = runner.run([Feed("d", b + [4, 4], 2, parent="b"), Feed("c", prompt + [1], 1)])
    assert close(out[0], solo(model, b + [4, 4], keep=2)) and close(out[1], solo(model, prompt + [1]))
    out = runner.run([Feed("d", b + [4, 4, 2], 1)])  # one row, one token
    assert close(out[0], solo(model, b + [4, 4, 2]))
    runner.release("b", "c", "d")
    out = runner.run([Feed("e", prompt[:9], 1)])  # a lone prompt: one kept position of many fed
    assert out[0].shape[0] == 1 and close(out[0], solo(model, prompt[:9]))
    assert runner.compiled.active and runner.compiled.steps == steps + 6
    runner.release("e")


@pytest.mark.parametrize("fed", [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]])
def test_a_step_runs_four_linear_kernels_a_layer(model, compiled_runner, fed):
    """Query, key and value run as one matmul, gate and up as another (``DedupePackedLinears``), in the
    one-token graph and in the many-token one."""
    compiled_runner.run([Feed("p", fed[:3], 1)])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        compiled_runner.run([Feed("p", fed, 1)])
    linears = [e.name for e in prof.events() if e.name in ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm")]
    assert len(linears) == 4 * model.config.num_hidden_layers + 1, linears  # and the LM head
    compiled_runner.release("p")


def test_layers_run_in_blocks_of_one_class_and_attention_type():
    class Full:
        attention_type = "full_attention"

    class Sliding:
        attention_type = "sliding_attention"

    layers = [Sliding(), Sliding(), Sliding(), Full(), Sliding(), Sliding()]
    assert [len(block) for block in layer_blocks(layers, 2)] == [2, 1, 1, 2]
    assert [len(block) for block in layer_blocks(layers, 6)] == [3, 1, 2]
    assert sum(layer_blocks(layers, 6), ()) == tuple(layers)


def test_gemma3_layers_run_in_blocks_of_their_attention_type():
    import transformers

    config = transformers.Gemma3TextConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                           sliding_window=64, layer_types=["sliding_attention"] * 2
                                           + ["full_attention"] + ["sliding_attention"] * 2)
    layers = list(transformers.Gemma3ForCausalLM(config).model.layers)  # the type is on their attention modules
    assert [len(block) for block in layer_blocks(layers, 6)] == [2, 1, 2]


def test_one_graph_serves_every_block_of_layers():
    """A block of one layer: the first step compiles a graph for the first layer and every other layer
    runs it (their weights and numbers are its inputs); each layer still runs its own weights."""
    from torch._dynamo.utils import counters

    from cdsl_struct.models.compiled import CompiledForward

    model = tiny_llama()
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    runner.compiled = CompiledForward(model, layers_per_graph=1)
    graphs = counters["stats"]["unique_graphs"]
    seq = [4, 3, 2, 1, 7]
    out = runner.run([Feed("a", seq, 1)])
    assert close(out[0], solo(model, seq)) and runner.compiled.steps == 1
    assert counters["stats"]["unique_graphs"] == graphs + 1  # one graph, not one a layer
    runner.release("a")


def test_two_models_of_one_class_each_run_their_own_weights(model, compiled_runner):
    """The weights are the graphs' inputs: a second model of the class runs the same graphs on its own
    weights (frozen graphs, which held the weights, had needed identity guards to tell them apart)."""
    other = tiny_llama()
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.mul_(-1.5)
    runner = RaggedRunner(other, prefix_cache_bytes=0)
    assert compile_runner(runner)
    seq = [1, 2, 3, 4, 5]
    theirs, ours = runner.run([Feed("a", seq, 1)])[0], compiled_runner.run([Feed("a", seq, 1)])[0]
    assert close(theirs, solo(other, seq)) and close(ours, solo(model, seq)) and not close(theirs, ours)
    compiled_runner.release("a")


def test_the_guard_filter_drops_module_guards_but_keeps_tensors_and_inputs():
    from cdsl_struct.models.compiled import run_layers

    model = llama_of_width(48)  # no graph was compiled for its width yet: its first step compiles
    entries = []

    def recording(guards):
        entries.extend(zip(guards, module_guards_dropped(guards), strict=True))
        return [keep for _, keep in entries[-len(guards):]]

    runner = RaggedRunner(model, prefix_cache_bytes=0)
    runner.compile(warm_up=False)
    runner.compiled.function = torch.compile(run_layers, dynamic=True, options={"guard_filter_fn": recording})
    runner.run([Feed("a", [1, 2, 3], 1)])
    on_layers = [(e, keep) for e, keep in entries if e.name.startswith("layers")]
    assert on_layers and any(not keep for _, keep in on_layers)  # types, hooks, attributes, identities
    assert not any(keep for e, keep in on_layers if e.guard_type == "ID_MATCH")
    weights = [e for e, keep in on_layers if keep and e.guard_type == "TENSOR_MATCH"]
    assert len(weights) >= len(list(model.model.layers[0].parameters()))
    assert all(keep for e, keep in entries if e.name.startswith(("hidden_states", "kwargs[")))  # the step's inputs
    runner.release("a")


def test_a_failing_compiled_forward_falls_back_to_eager_and_loses_no_step(model, caplog):
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    runner.compile(warm_up=False)
    calls = []

    def broken(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("no C++ compiler")

    runner.compiled.function = broken
    seq = [1, 2, 3, 4]
    with caplog.at_level(logging.WARNING, logger="cdsl_struct.models.compiled"):
        out = runner.run([Feed("a", seq, 1)])
        assert close(out[0], solo(model, seq))
        out = runner.run([Feed("a", seq + [5], 1)])
    assert close(out[0], solo(model, seq + [5]))
    assert len(calls) == 1 and not runner.compiled.active and runner.compiled.steps == 0  # tried once
    assert "running eagerly" in caplog.text and "no C++ compiler" in caplog.text


def test_a_runner_without_ragged_steps_stays_eager(model, caplog):
    runner = BatchRunner(model)
    with caplog.at_level(logging.WARNING, logger="cdsl_struct.models.compiled"):
        assert not compile_runner(runner)
    assert "running eagerly" in caplog.text
    out = runner.run([Feed("a", [1, 2, 3], 1)])
    assert close(out[0], solo(model, [1, 2, 3]))


def test_an_id_past_the_vocabulary_raises_as_eager_does(model, compiled_runner):
    steps = compiled_runner.compiled.steps
    with pytest.raises(IndexError):
        compiled_runner.run([Feed("x", [1, 2, model.config.vocab_size + 5], 1)])
    assert compiled_runner.compiled.steps == steps and compiled_runner.compiled.active
    compiled_runner.release("x")


def test_compile_modes_are_named_and_a_bad_one_raises():
    assert [compile_mode(v) for v in (True, False, None, "auto", "ON", "off")] == ["on", "off", "off", "auto",
                                                                                 "on", "off"]
    with pytest.raises(ValueError, match="auto, on, off"):
        compile_mode("fast")


def test_auto_compiles_a_ragged_cpu_runner_only_where_a_cxx_is_found(model, caplog, monkeypatch, tmp_path):
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    assert why_not_compiled(runner) is None  # this machine has g++, as the compiled tests above need
    assert "no ragged steps" in why_not_compiled(BatchRunner(model))
    with inductor_config.patch({"cpp.cxx": ("cdsl-no-such-cxx",)}):
        assert "no C++ compiler" in why_not_compiled(runner)
        with caplog.at_level(logging.INFO, logger="cdsl_struct.models.compiled"):
            assert not compile_for(runner, "auto")
    assert runner.compiled is None and "running eagerly: no C++ compiler" in caplog.text
    monkeypatch.setattr("sysconfig.get_path", lambda name, *args, **kwargs: str(tmp_path))  # no Python.h there
    assert "no Python.h" in why_not_compiled(runner)
    assert not compile_for(runner, "off") and runner.compiled is None
    out = runner.run([Feed("a", [1, 2, 3], 1)])
    assert close(out[0], solo(model, [1, 2, 3]))


def test_a_sealed_forward_never_compiles_on_a_step_it_has_no_graph_for(monkeypatch, tmp_path):
    """Sealed (after ``warm``), a step no compiled graph fits runs eagerly, with the eager results,
    and is remembered: the next process's warm-up compiles its shape."""
    from torch._dynamo.utils import counters

    from cdsl_struct.models.compiled import remember_shapes, remembered_shapes

    monkeypatch.setenv("CDSL_STRUCT_CACHE", str(tmp_path))
    model = llama_of_width(40)  # graphs compiled for the other tests' models would fit a model of their width
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    runner.compile(warm_up=False)
    runner.compiled.seal()  # nothing compiled yet: every shape misses
    graphs = counters["stats"]["unique_graphs"]
    seq = [1, 2, 3, 4, 5, 6]
    out = runner.run([Feed("a", seq, 2)])
    assert close(out[0], solo(model, seq, keep=2))
    assert counters["stats"]["unique_graphs"] == graphs  # no graph was compiled on the step's path
    assert runner.compiled.misses == {(6, 2): 1} and runner.compiled.steps == 0 and runner.compiled.active
    remember_shapes(runner.compiled)
    assert remembered_shapes(model) == [(6, 2)]
    runner.release("a")


def test_warm_compiles_the_remembered_shapes_and_seals(monkeypatch, tmp_path, model, compiled_runner):
    seen = []
    monkeypatch.setattr("cdsl_struct.models.compiled.remembered_shapes", lambda m: [(7, 3)])
    original = compiled_runner.run
    monkeypatch.setattr(compiled_runner, "run", lambda feeds: seen.append([(len(f.sequence), f.keep) for f in feeds])
                        or original(feeds))
    from cdsl_struct.models.compiled import warm

    warm(compiled_runner)
    assert seen[-1] == [(7, 3)] and compiled_runner.compiled.sealed and compiled_runner.rows == 0
    steps = compiled_runner.compiled.steps
    out = original([Feed("s", [2] * 7, 3)])  # the remembered shape runs compiled
    assert compiled_runner.compiled.steps == steps + 1 and close(out[0], solo(model, [2] * 7, keep=3))
    compiled_runner.release("s")


def test_a_second_process_loads_the_compiled_graphs_instead_of_compiling(compiled_runner):
    """The graphs hold no weights, so inductor's graph and AOTAutograd caches keep them: a new process
    compiling the same model (the module's, compiled above into the same cache folder) compiles none."""
    import json
    import subprocess
    import sys

    script = (
        "import json, torch\n"
        "from torch._dynamo.utils import counters\n"
        "from cdsl_struct.models.compiled import compile_runner\n"
        "from cdsl_struct.models.ragged import RaggedRunner\n"
        "from tests.models.solo import tiny_llama\n"
        "assert compile_runner(RaggedRunner(tiny_llama(), prefix_cache_bytes=0))\n"
        "print(json.dumps({k: dict(counters[k]) for k in ('inductor', 'aot_autograd')}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["inductor"].get("fxgraph_cache_hit", 0) >= 2 and not counts["inductor"].get("fxgraph_cache_miss")
    assert counts["aot_autograd"].get("autograd_cache_hit", 0) >= 2


def test_a_model_without_decoder_layers_stays_eager(caplog):
    from cdsl_struct.models.compiled import CompiledForward

    with caplog.at_level(logging.WARNING, logger="cdsl_struct.models.compiled"):
        compiled = CompiledForward(torch.nn.Sequential(torch.nn.ReLU()))
    assert not compiled.active and compiled(input_ids=torch.tensor([[1]])) is None
    assert "no decoder layers" in caplog.text and "running eagerly" in caplog.text
