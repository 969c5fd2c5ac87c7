"""A model's decoder blocks compiled once, saved to disk, and loaded by any later process with no tracing.

``CompiledForward`` compiles inside the process that decodes, and compiling cannot run beside decoding
there (``models.compiled``), so ``Generator(torch_compile=...)`` used to compile for about a minute
before it returned. Here a second process (``models.background_compile``) compiles the blocks with
torch's ahead-of-time ``aot_compile`` and saves the results; the decoding process loads them in about
a second and swaps them in between steps.

What is saved, per kind of block (its layers' class, attention type and count: ``compiled.layer_blocks``),
is two graphs of ``compiled.run_layers``: one for a step of one token (a decode step), one for a step of
two or more (``dynamic=True``: torch specialises a dimension of one, so a graph traced on many tokens
refuses a single one). The graphs hold no weights: a block's modules are the graph's inputs, so one
graph serves every block of its kind and any weights of the model's architecture, and the process that
compiles them can build the model from its config with random weights. The linear layers are traced
as plain matmuls: oneDNN's prepacked weights cannot be serialised (their layout has no meta form).

Guards are dropped but the token dimension's shape guards (``no_tensor_guards``), so a loaded graph
checks little of its inputs; ``SavedForward`` checks what it was compiled for itself (the hidden
states' dtype, rank and device, one token or many, no autograd) and runs any other block eagerly.

On disk (``cache_dir("compiled")``): a folder per ``graphs_key`` (the model's class and config, the
dtype, the versions of torch, transformers and this library, the CPU's instruction set, and the source
of the code the graphs trace), holding the graphs and a manifest of their sizes and hashes, written
last. A folder is published whole by a rename, so two processes compiling together leave one complete
folder; a folder whose manifest or files do not check out (another version, a torn write) is ignored
and replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from .attention import ragged_step as _step
from .compiled import (
    LAYERS_PER_GRAPH,
    attention_type,
    decoder_layers,
    inductor_config,
    layer_blocks,
    routed_blocks,
    run_layers,
)

log = logging.getLogger(__name__)

FORMAT = 1
"""The layout of a saved folder; a folder of another format is ignored."""
MANIFEST = "manifest.json"
SIZES = ("one", "many")
"""A graph for steps of one token, and one for steps of two or more."""
#: the modules whose code the saved graphs trace or call: a change to any of them is another key
_TRACED_SOURCES = ("compiled.py", "attention.py", "ragged_attention.py", "ragged_plan.py", "packed.py",
                   "saved_graphs.py")


def block_kind(block: tuple[Any, ...]) -> str:
    """The name of a block's kind: its layers' class, attention type and count (one graph set a kind)."""
    first = block[0]
    return f"{type(first).__name__}-{attention_type(first) or 'full_attention'}-{len(block)}"


def _kinds(model: Any) -> list[str]:
    """The kinds of ``model``'s blocks, in the order first met."""
    return list(dict.fromkeys(block_kind(block) for block in layer_blocks(decoder_layers(model), LAYERS_PER_GRAPH)))


def graphs_key(model: Any) -> str:
    """What saved graphs of ``model`` depend on, hashed: its class and config (its attention setting
    aside), its dtype, the versions of torch, transformers and this library, the CPU instruction set the
    kernels were built for, and the source of the code the graphs trace."""
    import transformers

    from ..paths import installed_version

    config = model.config.to_dict()
    for name in [k for k in config if k.startswith("_attn_implementation")]:
        config.pop(name)
    here = Path(__file__).parent
    sources = hashlib.sha256(b"".join((here / name).read_bytes() for name in _TRACED_SOURCES)).hexdigest()
    described = json.dumps({
        "format": FORMAT, "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "config": config, "dtype": str(next(model.parameters()).dtype), "torch": torch.__version__,
        "transformers": transformers.__version__, "cdsl_struct": installed_version("cdsl_struct"),
        "cpu": torch.backends.cpu.get_cpu_capability(), "layers_per_graph": LAYERS_PER_GRAPH,
        "inductor": sorted(k for k in inductor_config()), "sources": sources}, sort_keys=True, default=str)
    return hashlib.sha256(described.encode()).hexdigest()[:24]


def graphs_folder(model: Any, root: Path | None = None) -> Path:
    """Where ``model``'s saved graphs live: ``root`` (default ``cache_dir("compiled")``) / ``graphs-KEY``."""
    if root is None:
        from ..paths import cache_dir

        root = cache_dir("compiled")
    return Path(root) / f"graphs-{graphs_key(model)}"


#: guards a saved graph drops though they are portable: a tensor guard pins the dispatch keys its input
#: was traced with (inference mode or not, autograd or not), which a loaded graph's caller does not
#: match; the global state guard pins torch's thread count, which the engine's ``ThreadGovernor``
#: changes between steps (the kernels are built for one thread each, so the count changes nothing
#: in them), and its grad mode, which ``SavedForward`` checks itself
_DROPPED_GUARDS = ("TENSOR_MATCH", "GLOBAL_STATE")


def no_tensor_guards(entries: list[Any]) -> list[bool]:
    """Dynamo's guard filter for a saved graph: the portable guards only (the identity guards on modules
    cannot be saved at all), less ``_DROPPED_GUARDS``: what is left is the shape guards of the token
    dimension. ``SavedForward`` checks dtype, rank, device and grad mode itself."""
    kept = torch.compiler.keep_portable_guards_unsafe(entries)
    return [keep and entry.guard_type not in _DROPPED_GUARDS for keep, entry in zip(kept, entries, strict=True)]


def _size(hidden_states: torch.Tensor) -> str:
    return "one" if hidden_states.shape[-2] == 1 else "many"


class SavedForward:
    """A model's forward for ragged steps with its decoder blocks run by loaded saved graphs.

    The same contract as ``CompiledForward``: ``__call__`` returns the model's output, or None where
    the saved path failed (now or before), and the caller runs the step eagerly (it rewrites the same
    cache positions); ``failure`` holds the first error, ``steps`` counts steps run through the graphs.
    A block whose inputs the graphs were not compiled for runs eagerly and counts in ``misses``."""

    def __init__(self, model: Any, graphs: dict[tuple[str, str], Any], dtype: torch.dtype,
                 load_seconds: float = 0.0) -> None:
        self.model = model
        self.graphs = graphs
        """The loaded graphs by (block kind, ``"one"`` or ``"many"``)."""
        self.dtype = dtype
        self.layers = decoder_layers(model)
        self.blocks = layer_blocks(self.layers, LAYERS_PER_GRAPH)
        self.load_seconds = load_seconds
        self.failure: BaseException | None = None
        self.steps = 0
        self.misses: dict[tuple[int, int], int] = {}
        """Blocks run eagerly, by (tokens fed, 0): inputs no graph was compiled for."""

    @property
    def active(self) -> bool:
        """Whether steps still run through the graphs."""
        return self.failure is None

    def _run_block(self, block: tuple[Any, ...], hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        graph = self.graphs.get((block_kind(block), _size(hidden_states)))
        if graph is None or hidden_states.dtype != self.dtype or hidden_states.dim() != 3 \
                or hidden_states.shape[0] != 1 or hidden_states.device.type != "cpu" or torch.is_grad_enabled():
            shape = (int(hidden_states.shape[-2]), 0)
            self.misses[shape] = self.misses.get(shape, 0) + 1
            return run_layers(block, hidden_states, *args, **kwargs)
        return graph(block, hidden_states, *args, **kwargs)

    def __call__(self, **inputs: Any) -> Any:
        if self.failure is not None:
            return None
        try:
            with routed_blocks(self.blocks, self.layers, self._run_block):
                out = self.model(**inputs)
            self.steps += 1
            return out
        except Exception as exc:  # noqa: BLE001 - any error of a loaded graph: the eager path answers
            self.failure = exc
            log.warning("the saved compiled forward failed (%s: %s); running eagerly from now on",
                        type(exc).__name__, exc)
            return None


# --- reading -------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_folder(folder: Path, key: str, kinds: list[str]) -> dict[str, Any] | None:
    """The manifest of ``folder`` where it is complete and current (this format and ``key``, a graph of
    each size for each of ``kinds``, every file of its listed size and hash), else None."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("format") != FORMAT or manifest.get("key") != key:
            return None
        files = manifest["graphs"]
        for kind in kinds:
            for size in SIZES:
                entry = files[f"{kind}/{size}"]
                path = folder / entry["file"]
                if path.stat().st_size != entry["bytes"] or _sha256(path) != entry["sha256"]:
                    return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def load_graphs(model: Any, folder: Path | None = None) -> SavedForward | None:
    """``model``'s saved graphs (in ``folder``, default ``graphs_folder(model)``) loaded into a
    ``SavedForward``; None where none are saved there or the folder does not check out
    (``check_folder``), or loading failed (logged). Inductor builds any kernel of theirs its own cache
    lacks (seconds each)."""
    from .compiled import release_gil_in_cpu_kernels

    release_gil_in_cpu_kernels()  # the kernels' wrappers as the compiling process built them: cache hits
    folder = graphs_folder(model) if folder is None else Path(folder)
    kinds = _kinds(model)
    manifest = check_folder(folder, folder.name.removeprefix("graphs-"), kinds)
    if manifest is None:
        return None
    started = time.perf_counter()
    graphs = {}
    try:
        for kind in kinds:
            for size in SIZES:
                with open(folder / manifest["graphs"][f"{kind}/{size}"]["file"], "rb") as handle:
                    graphs[(kind, size)] = torch.compiler.load_compiled_function(handle)
    except Exception as exc:  # noqa: BLE001 - an artifact this torch cannot load: compiled afresh
        log.warning("could not load the saved compiled graphs in %s (%s: %s)", folder, type(exc).__name__, exc)
        return None
    dtype = next(model.parameters()).dtype
    return SavedForward(model, graphs, dtype, load_seconds=time.perf_counter() - started)


# --- compiling and saving ------------------------------------------------------------------------------


class _Capture:
    """A forward for ragged steps that runs eagerly and keeps, for each (block kind, size), the first
    call's block, inputs and ragged step (what ``aot_compile`` traces with)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.layers = decoder_layers(model)
        self.blocks = layer_blocks(self.layers, LAYERS_PER_GRAPH)
        self.calls: dict[tuple[str, str], tuple[Any, ...]] = {}

    def _run_block(self, block: tuple[Any, ...], hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.calls.setdefault((block_kind(block), _size(hidden_states)),
                              (block, hidden_states, args, kwargs, _step.cache, _step.plan, _step.attend))
        return run_layers(block, hidden_states, *args, **kwargs)

    def __call__(self, **inputs: Any) -> Any:
        with routed_blocks(self.blocks, self.layers, self._run_block):
            return self.model(**inputs)


def _captured_calls(model: Any) -> dict[tuple[str, str], tuple[Any, ...]]:
    """One call of each (block kind, size) of ``model``'s ragged steps: a prompt, then a decode step."""
    from .batch import Feed
    from .ragged import RaggedRunner

    runner = RaggedRunner(model, prefix_cache_bytes=0)
    capture = _Capture(model)
    runner.compiled = capture
    prompt = [(7 * i + 3) % runner.vocab_size for i in range(24)]
    runner.run([Feed("capture", prompt, 1)])
    runner.run([Feed("capture", prompt + prompt[:1], 1)])
    runner.release("capture")
    return capture.calls


def _compile_one(call: tuple[Any, ...]) -> Any:
    """``run_layers`` compiled ahead of time for one captured call."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_settings

    from .compiled import release_gil_in_cpu_kernels

    release_gil_in_cpu_kernels()
    block, hidden_states, args, kwargs, cache, plan, attend = call
    function = torch.compile(run_layers, dynamic=True, fullgraph=True, options={"guard_filter_fn": no_tensor_guards})
    _step.cache, _step.plan, _step.attend = cache, plan, attend
    try:  # floats stay constants, as CompiledForward compiles them
        with torch.inference_mode(), inductor_settings.patch(inductor_config()), \
                dynamo_config.patch(specialize_float=True):
            return function.aot_compile(((block, hidden_states, *args), kwargs))
    finally:
        _step.cache = _step.plan = _step.attend = None


def compile_graphs(model: Any, folder: Path | None = None, check: bool = True) -> Path:
    """Compile ``model``'s graphs, check them against the model's own forward (``check``), and publish
    them in ``folder`` (default ``graphs_folder(model)``; its name gives the key); that folder. A current
    folder already there is kept (another process got there first). Raises where compiling or the check
    fails."""
    from .self_check import check_ragged

    folder = graphs_folder(model) if folder is None else Path(folder)
    key = folder.name.removeprefix("graphs-")
    kinds = _kinds(model)
    if check_folder(folder, key, kinds) is not None:
        return folder
    calls = _captured_calls(model)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.{time.monotonic_ns()}.part")
    staging.mkdir(parents=True)
    try:
        entries = {}
        for kind in kinds:
            for size in SIZES:
                name = f"{kind}.{size}.graph"
                _compile_one(calls[(kind, size)]).save_compiled_function(str(staging / name))
                entries[f"{kind}/{size}"] = {"file": name, "bytes": (staging / name).stat().st_size,
                                             "sha256": _sha256(staging / name)}
        (staging / MANIFEST).write_text(json.dumps({"format": FORMAT, "key": key, "graphs": entries}))
        if check:
            _check_saved(model, staging, key, kinds, check_ragged)
        _publish(staging, folder, key, kinds)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _check_saved(model: Any, staging: Path, key: str, kinds: list[str], check_ragged: Any) -> None:
    """Load the graphs just written and run the ragged self-check through them; raise where it fails."""
    graphs = {}
    manifest = check_folder(staging, key, kinds)
    if manifest is None:
        raise RuntimeError(f"the graphs just written to {staging} do not check out")
    for kind in kinds:
        for size in SIZES:
            with open(staging / manifest["graphs"][f"{kind}/{size}"]["file"], "rb") as handle:
                graphs[(kind, size)] = torch.compiler.load_compiled_function(handle)
    saved = SavedForward(model, graphs, next(model.parameters()).dtype)
    problem = check_ragged(model, compiled=saved)
    if problem is not None or saved.failure is not None or saved.steps == 0:
        raise RuntimeError(f"the saved graphs disagree with the model's own forward: {problem or saved.failure}")


def _publish(staging: Path, folder: Path, key: str, kinds: list[str]) -> None:
    """Rename ``staging`` to ``folder``; where a folder is there already, keep it if it checks out (another
    process published first), else move it aside and publish ours."""
    for _ in range(3):
        try:
            os.rename(staging, folder)
            return
        except OSError:
            if check_folder(folder, key, kinds) is not None:
                return
            aside = folder.with_name(f".{folder.name}.{os.getpid()}.{time.monotonic_ns()}.stale")
            try:
                os.rename(folder, aside)
            except OSError:
                continue  # moved already by another process
            shutil.rmtree(aside, ignore_errors=True)
    raise OSError(f"could not publish the compiled graphs to {folder}")


__all__ = ["FORMAT", "SavedForward", "block_kind", "check_folder", "compile_graphs", "graphs_folder", "graphs_key",
           "load_graphs", "no_tensor_guards"]
