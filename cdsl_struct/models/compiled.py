"""A ``RaggedRunner``'s forward through ``torch.compile``: ``serve``'s default (``"auto"``: on the CPU
where inductor finds a C++ compiler), compiled in its second process (``server.handoff``).
``Generator(torch_compile=...)`` runs the same blocks from graphs compiled ahead of time in another
process and saved (``saved_graphs``, ``background_compile``).

Eager, a single-row decode step of SmolLM2 on two CPU cores is ~28 ms, and only about half of it
is the linear layers: ~1200 small ops (norms, rotary, activations, residual adds) and the Python
that dispatches ~6900 ops cost the rest. vLLM's CPU build compiles its layers for that reason.
Here the model's decoder layers are compiled in blocks of ``LAYERS_PER_GRAPH`` (``dynamic=True``: the
step's token count varies), one compiled function running every block, and the two things a graph
cannot hold, the write into the runner's ``SlotCache`` and the ragged attention (its plan is Python
data that changes every step), run as one opaque custom op, ``cdsl_struct::ragged_attend``
(``ragged.ragged_attend``). The linear layers multiply by weights prepacked for oneDNN at load
(``packed.prepack``) through another, ``cdsl_struct::packed_linear``; sibling projections of one input
run as one matmul (``DedupePackedLinears``), four oneDNN calls a layer instead of seven.

The graphs hold no weights: weights, packed weights and each layer's number are their inputs. So one
graph serves every block, and inductor's graph and AOTAutograd caches keep the graphs for the next
process (``$TORCHINDUCTOR_CACHE_DIR``, by default under the system's temporary folder; safe for
processes that share it). Until 2026-11-28 the model was compiled whole with inductor's freezing, the
weights folded in as constants: ~6 min for SmolLM2 in float32 on two AVX2 cores at every start,
since inductor's caches skip frozen graphs. Blocks of layers: ~1 min the first time, ~13 s from
the caches, and steps as fast as the whole model's (docs/benchmarks/2026-11-28-compiled-blocks.md).
A graph a layer compiled as fast but ran no faster than eager: ~0.3-0.7 ms of calls and guards a
layer. Measured before (docs/benchmarks/2026-11-25-compiled-serve.md): steps 1.1-1.26x faster than
eager in bf16, ``serve --torch-compile`` 25.6 ms a step against the eager server's 31-32.

Costs: inductor needs a C++ compiler, and the packed weights are read once (changing the model's
weights after compiling is not seen). ``warm`` compiles the shapes a server meets (one token, many)
and seals the forward: a step no graph fits runs eagerly rather than compiling on a request's path
(it had stalled one request 51.8 s), and is remembered for the next warm-up. The guards on the
layers' modules are dropped but their tensors' (``module_guards_dropped``).
Compiling must not run beside the engine's steps in one process (torch.fx patches
``nn.Module.__call__`` for every thread while it traces, and the compiler holds the GIL for
seconds), so ``serve`` compiles in a second process (``server.handoff``), and ``Generator`` loads
graphs a second process compiled (``background_compile``).
Any failure to compile or run compiled logs a warning once and the runner goes on
eagerly: the step is run again eagerly (it rewrites the same cache positions), so no request sees it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from ..options import COMPILE_MODES
from .attention import ragged_step as _step
from .packed import pack_linears, prepack

log = logging.getLogger(__name__)

class DedupePackedLinears(CustomGraphPass):
    """Inductor pass: of several ``packed_linear`` products with the same inputs, keep the first.

    Sibling projections of one input (query, key and value; gate and up) each multiply by their
    group's whole packed matrix and take their columns (``PackedLinear._traced``); one product is left,
    four oneDNN calls a layer instead of seven. The op is pure, so equal inputs give equal outputs."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        # the views each sibling takes of the input are separate nodes: equal views are merged first
        pure = {torch.ops.cdsl_struct.packed_linear.default, torch.ops.aten.view.default,
                torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default}
        seen: dict[tuple[Any, ...], torch.fx.Node] = {}
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in pure:
                continue
            key = (node.target, _hashable(node.args), _hashable(node.kwargs))
            first = seen.setdefault(key, node)
            if first is not node:
                node.replace_all_uses_with(first)
                graph.erase_node(node)

    def uuid(self) -> str:
        return get_hash_for_files((__file__,)).hex()


def _hashable(value: Any) -> Any:
    """``value`` (a node's arguments) with its lists and dicts as tuples."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _hashable(item)) for key, item in value.items()))
    return value


def inductor_config() -> dict[str, Any]:
    """inductor settings while compiling, set as a config patch around each call (``torch.compile(options=
    ...)`` did not apply them in torch 2.13). No freezing: the weights stay graph inputs (the linears
    multiply by the packed copies ``packed.prepack`` made), so inductor's graph and AOTAutograd caches
    hold the compiled graphs and a second process loads them instead of compiling."""
    return {"emulate_precision_casts": True, "cpp.threads": 1,
            "post_grad_custom_post_pass": DedupePackedLinears()}


#: how torch 2.13's inductor calls a compiled CPU kernel from its Python wrapper: holding the GIL
#: for the kernel's whole run
_KERNEL_CALL_HOLDING_GIL = "kernel({}); Py_RETURN_NONE;"
#: the same call with the arguments parsed under the GIL and the kernel (pure C++ on raw pointers)
#: run without it, the GIL taken back on the way out, exceptions included
_KERNEL_CALL_RELEASING_GIL = (
    "{{ auto _run = [](auto... _args) {{ PyThreadState* _state = PyEval_SaveThread(); "
    "try {{ kernel(_args...); }} catch (...) {{ PyEval_RestoreThread(_state); throw; }} "
    "PyEval_RestoreThread(_state); }}; _run({}); }} Py_RETURN_NONE;")


def release_gil_in_cpu_kernels() -> bool:
    """Make inductor's CPU kernels release the GIL while they run; whether the call template was
    the one this knows (another torch version's is left alone).

    The engine computes the next step's masks in worker threads while the forward runs, and the
    server's event loop runs beside both; eager ATen ops release the GIL, but each of a compiled
    graph's hundreds of fused kernels held it. Released, another Python thread did 7.5x more work
    during compiled calls."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    current = getattr(CppPythonBindingsCodeCache, "call_entry_function", None)
    if current == _KERNEL_CALL_RELEASING_GIL:
        return True
    if current != _KERNEL_CALL_HOLDING_GIL:
        return False
    CppPythonBindingsCodeCache.call_entry_function = _KERNEL_CALL_RELEASING_GIL
    return True


def module_guards_dropped(entries: list[Any]) -> list[bool]:
    """Dynamo's guard filter for a compiled decoder layer: of the guards on its modules (their types,
    hook dicts, attributes and identities), keep only the tensor ones (each weight's dtype, shape and
    strides); keep every guard on the step's inputs.

    The identities must go: one graph serves every layer, whose modules and weights are other objects.
    The rest cost guard checks on every call (a transformers model's modules have a dozen or more
    each: ~1.5 ms a SmolLM2 step when the model was compiled whole) and guard nothing the runner
    changes. A layer's number, the one attribute that differs between layers, is an input
    (``ragged_attention.layer_number``), and the weights are inputs, so a graph never runs one layer's
    weights for another."""
    return [entry.guard_type == "TENSOR_MATCH" or not _on_module(entry.orig_guard.source) for entry in entries]


def _on_module(source: Any) -> bool:
    """Whether a guard's source is a module or reached through one (the block's ``layers`` included)."""
    root = source.get_base() if hasattr(source, "get_base") else source
    return source.is_unspecialized_nn_module() or getattr(root, "local_name", None) == "layers"


#: decoder layers run by one compiled graph: a graph per layer cost ~0.3-0.7 ms of calls and guards
#: a layer on two CPU cores (SmolLM2's 30 layers ran no faster than eager), the whole model ~5 min
#: of compiling; six layers trace in seconds and are called five times a SmolLM2 step
LAYERS_PER_GRAPH = 6


def attention_type(layer: Any) -> str | None:
    """A decoder layer's attention type (``"sliding_attention"``, ``"full_attention"``), where its model
    mixes them: the layer's ``attention_type`` (Qwen, Mistral), else its attention module's
    ``layer_type`` (Gemma 3 keeps it there and hands each layer its type's mask and rotary embedding)."""
    kind = getattr(layer, "attention_type", None)
    return kind if kind is not None else getattr(getattr(layer, "self_attn", None), "layer_type", None)


def layer_blocks(layers: list[Any], size: int = LAYERS_PER_GRAPH) -> list[tuple[Any, ...]]:
    """``layers`` in runs of at most ``size`` consecutive layers of one class and one attention type
    (``attention_type``: a model mixing sliding and full attention hands its layers different masks and
    rotary embeddings, and a block's layers all get its first layer's)."""
    blocks: list[list[Any]] = []
    for layer in layers:
        kind = (type(layer), attention_type(layer))
        last = blocks[-1] if blocks else None
        if last is None or len(last) == size or (type(last[0]), attention_type(last[0])) != kind:
            blocks.append([layer])
        else:
            last.append(layer)
    return [tuple(block) for block in blocks]


def run_layers(layers: tuple[Any, ...], hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Run ``layers`` one after another, as the model's own loop does (the function compiled)."""
    for layer in layers:
        hidden_states = type(layer).forward(layer, hidden_states, *args, **kwargs)
    return hidden_states


def _passed_on(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The forward of a layer its block's first layer already ran."""
    return hidden_states


@contextmanager
def routed_blocks(blocks: list[tuple[Any, ...]], layers: list[Any], function: Any) -> Iterator[None]:
    """While open, each block's first layer runs ``function(block, hidden_states, ...)`` for the whole
    block and the block's other layers pass their input on; the layers' own forwards after."""
    try:
        for block in blocks:
            block[0].__dict__["forward"] = partial(function, block)
            for layer in block[1:]:
                layer.__dict__["forward"] = _passed_on
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


def decoder_layers(model: Any) -> list[Any]:
    """The repeated decoder blocks of a transformers causal LM (``get_decoder().layers``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not layers:
        raise TypeError(f"{type(model).__name__} has no decoder layers to compile")
    return list(layers)


class CompiledForward:
    """A model's forward for ragged steps with its decoder layers compiled, and an eager fallback.

    The layers run in blocks (``layer_blocks``) through one compiled function (``run_layers``), whose
    graphs serve every block alike: the weights, the packed ones and each layer's number are the
    graph's inputs, not its constants (regional compilation). Compiling costs a block's trace and
    kernels, not the model's, and the graphs hold no weights, so inductor's caches keep them for the
    next process. The embedding, the final norm and the LM head run eagerly around the layers. The
    layers run compiled only inside ``__call__``: the same model called otherwise (the runner's eager
    fallback, a self-draft sharing its layers) runs eagerly.

    Until ``seal`` (``warm`` seals once the shapes a server meets are compiled), a call whose shapes
    no graph fits compiles one. Sealed, it never compiles: such a call runs the layers eagerly
    (dynamo's run-only mode: the graphs compiled so far, else the plain forward, same results), so no
    request waits for a compile on its path; ``misses`` counts those calls by (tokens fed,
    positions kept), and ``remember_shapes`` keeps them for the next start's warm-up.

    ``__call__`` returns the model's output, or None when the compiled path failed (now or
    before): the caller then runs the step eagerly. ``failure`` holds the first error."""

    def __init__(self, model: Any, layers_per_graph: int = LAYERS_PER_GRAPH) -> None:
        self.model = model
        self.failure: BaseException | None = None
        try:
            self.layers = decoder_layers(model)
        except TypeError as exc:  # not a decoder of the shape transformers' causal LMs share: stays eager
            self.layers, self.failure = [], exc
            log.warning("torch.compile: %s; running eagerly", exc)
        self.blocks = layer_blocks(self.layers, layers_per_graph)
        pack_linears(model)
        self.packed = prepack(model)
        self.config = inductor_config()
        self.releases_gil = release_gil_in_cpu_kernels()
        # guard filters came with the torch that has torch's own filters; an older one would refuse the option
        filters = hasattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe")
        options = {"guard_filter_fn": module_guards_dropped} if filters else None
        self.function = torch.compile(run_layers, dynamic=True, options=options)
        """``run_layers`` compiled (run-only once sealed)."""
        self.sealed = False
        """Whether calls only run graphs compiled already (``seal``)."""
        self.warm_seconds = 0.0
        self.steps = 0
        """Steps run compiled."""
        self.misses: dict[tuple[int, int], int] = {}
        """Sealed steps no compiled graph fitted (run eagerly), by (tokens fed, positions kept)."""

    @property
    def active(self) -> bool:
        """Whether steps still run compiled."""
        return self.failure is None

    def seal(self) -> None:
        """From now on never compile: a call no compiled graph fits runs eagerly and counts as a miss."""
        import torch._dynamo

        self.function = torch._dynamo.run(run_layers)
        self.sealed = True

    def __call__(self, **inputs: Any) -> Any:
        if self.failure is not None:
            return None
        import torch._dynamo.config as dynamo_config
        import torch._inductor.config as inductor_config

        try:
            with routed_blocks(self.blocks, self.layers, self.function):
                if self.sealed:
                    _step.ran_eagerly = False
                    out = self.model(**inputs)
                    if _step.ran_eagerly:
                        shape = (int(inputs["input_ids"].shape[-1]), _kept(inputs.get("logits_to_keep")))
                        self.misses[shape] = self.misses.get(shape, 0) + 1
                        return out
                else:  # floats stay constants: a float made symbolic restarts the trace, then is specialised
                    with inductor_config.patch(self.config), dynamo_config.patch(specialize_float=True):
                        out = self.model(**inputs)
            self.steps += 1
            return out
        except Exception as exc:  # noqa: BLE001 - any compiler or kernel error: the eager path answers
            self.failure = exc
            log.warning("torch.compile'd forward failed (%s: %s); running eagerly from now on",
                        type(exc).__name__, exc)
            return None


def _kept(logits_to_keep: Any) -> int:
    """How many positions a step keeps (``logits_to_keep``: a tensor of positions, or a count)."""
    return int(logits_to_keep.numel()) if isinstance(logits_to_keep, torch.Tensor) else int(logits_to_keep or 0)


SHAPES_FILE = "shapes-{}.json"
"""Under ``cache_dir("compiled")``: the (tokens fed, positions kept) a model's sealed forward missed."""


def _shapes_path(model: Any) -> Path:
    from ..paths import cache_dir

    config = getattr(model, "config", None)
    described = config.to_json_string() if hasattr(config, "to_json_string") else repr(type(model))
    dtype = str(next(iter(model.parameters())).dtype) if hasattr(model, "parameters") else ""
    key = hashlib.sha256(f"{described}|{dtype}|{torch.__version__}".encode()).hexdigest()[:16]
    return cache_dir("compiled") / SHAPES_FILE.format(key)


def remembered_shapes(model: Any) -> list[tuple[int, int]]:
    """The (tokens fed, positions kept) an earlier process's sealed forward of this model missed."""
    try:
        shapes = json.loads(_shapes_path(model).read_text())
        return [(int(fed), int(kept)) for fed, kept in shapes if 0 < kept <= fed]
    except (OSError, ValueError, TypeError):
        return []


def remember_shapes(compiled: CompiledForward) -> None:
    """Add ``compiled``'s misses to the shapes its model's next warm-up compiles (written atomically)."""
    if not compiled.misses:
        return
    path = _shapes_path(compiled.model)
    shapes = sorted(set(remembered_shapes(compiled.model)) | set(compiled.misses))
    temporary = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        temporary.write_text(json.dumps(shapes))
        os.replace(temporary, path)
    except OSError as exc:
        log.warning("could not remember the compiled forward's shapes in %s (%s)", path, exc)


def warm(runner: Any, length: int = 40, shapes: list[tuple[int, int]] | None = None) -> float:
    """Compile ``runner``'s forward for the shapes a server meets, on throw-away rows: a prompt,
    one row of one token, several rows, several kept positions (speculation), and ``shapes`` (tokens
    fed, positions kept: by default those an earlier process missed); then seal it. Seconds it took."""
    from .batch import Feed

    started = time.perf_counter()
    prompt = [(7 * i + 3) % runner.vocab_size for i in range(length)]
    rows = [("cdsl-warm", i) for i in range(3)]
    try:
        runner.run([Feed(rows[0], prompt, 1)])  # a prompt: many tokens, one kept
        runner.run([Feed(rows[0], prompt + prompt[:1], 1)])  # one token
        runner.run([Feed(rows[1], prompt[:length // 2], 1), Feed(rows[2], prompt[:length // 3], 1)])
        runner.run([Feed(row, runner.held(row) + prompt[:2], 2) for row in rows])  # several rows, kept
    finally:
        runner.release(*rows)
    for fed, kept in remembered_shapes(runner.model) if shapes is None else shapes:
        tokens = [(5 * i + 1) % runner.vocab_size for i in range(fed)]
        try:
            runner.run([Feed(("cdsl-warm", "shape"), tokens, kept)])
        finally:
            runner.release(("cdsl-warm", "shape"))
    seconds = time.perf_counter() - started
    if runner.compiled is not None:
        runner.compiled.warm_seconds = seconds
        runner.compiled.seal()
    return seconds


def compile_mode(value: bool | str | None) -> str:
    """``value`` as one of ``COMPILE_MODES`` (True is ``"on"``; False and None are ``"off"``)."""
    if value is True or value is False or value is None:
        return "on" if value else "off"
    mode = str(value).lower()
    if mode not in COMPILE_MODES:
        raise ValueError(f"torch_compile must be one of {', '.join(COMPILE_MODES)} or a bool, got {value!r}")
    return mode


def why_not_compiled(runner: Any) -> str | None:
    """Why ``"auto"`` leaves ``runner`` eager, or None where it compiles: only a ragged runner on the
    CPU with a C++ compiler and the Python headers (the case measured; inductor on a GPU needs
    triton and is not measured here)."""
    if not getattr(runner, "ragged", False):
        return f"{type(runner).__name__} has no ragged steps to compile"
    device = getattr(runner, "device", None)
    if torch.device(device).type != "cpu":
        return f"the model runs on {device}; compiling is measured on the CPU only"
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as exc:  # noqa: BLE001 - inductor raises its own types for a missing or broken compiler
        return f"no C++ compiler for inductor ({type(exc).__name__}: {exc})"
    headers = Path(sysconfig.get_path("include"))
    if not (headers / "Python.h").exists():  # inductor builds each graph's kernels as a Python extension
        return f"no Python.h in {headers} for inductor's extensions (install the Python development headers)"
    return None


def compile_for(runner: Any, mode: bool | str | None) -> bool:
    """Compile ``runner``'s steps as ``mode`` (``COMPILE_MODES``) says; whether they now run compiled.
    ``"auto"`` logs why it stays eager where it does; ``"on"`` tries, and warns where it cannot."""
    mode = compile_mode(mode)
    if mode == "off":
        return False
    if mode == "auto":
        reason = why_not_compiled(runner)
        if reason is not None:
            log.info("torch_compile auto: running eagerly: %s", reason)
            return False
    return compile_runner(runner)


def compile_runner(runner: Any) -> bool:
    """Compile ``runner``'s steps and warm them (``RaggedRunner.compile``); whether its steps now run
    compiled. A padded ``BatchRunner`` (a model family without ragged steps) is left eager, with a warning."""
    if not getattr(runner, "ragged", False):
        log.warning("torch_compile: %s has no ragged steps to compile; running eagerly", type(runner).__name__)
        return False
    seconds = runner.compile()
    if runner.compiled.active:
        log.info("torch_compile: the target's forward compiled and warmed in %.0f s", seconds)
    return runner.compiled.active
