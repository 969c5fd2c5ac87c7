"""``Generator`` and ``generate()``: the user-facing API.

A ``Generator`` loads a model (and its draft) once; every ``generate`` call resolves its
constraint, reward and method, compiles the constraint (cached), and hands its rows to the
Generator's ``BatchEngine``: target-only and speculative rows from every thread and every
prompt of a list share one target forward per step. CDLH and CDSL rows are rows of the same
engine: their steps are programs of passes (roll-outs, draft lookaheads) that the engine batches
with every other row's. ``generate()`` keeps one Generator per model and draft.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch
from typing_extensions import Unpack

from .arguments import Arguments, deprecated_shape, named_errors, read_arguments, split_batch
from .calls import Call, budget_mode, partial_reader_for, read_calls
from .constraints import (
    CompiledConstraint,
    JsonSchema,
    Regex,
    TokenVocabulary,
    compile,
)
from .constraints.backends.text_backend import FREE_TEXT
from .constraints.reasoning import with_reasoning
from .constraints.whitespace import DEFAULT_WHITESPACE
from .decoding import DraftModelProposer, SamplingParams, build_proposers
from .decoding.engine import BatchEngine, EngineLoad, Request
from .decoding.lookahead import CDLH, CDSL
from .decoding.loops import WordLoopGuard
from .decoding.stops import StopHoldback
from .errors import InvalidArgument, PromptTooLong
from .keywords import Keywords, named_prompt
from .models.background_compile import BackgroundCompile, CompileState, compile_in_background
from .models.compiled import compile_mode
from .models.loading import LoadedModel, load_model
from .models.runner import ModelRunner, self_draft
from .models.self_check import batch_runner
from .options import Method
from .params import GenerationParams, ParamOverrides
from .prompts import chat_header, prompt_ids
from .result import Result
from .rewards import Reward
from .streaming import (
    AsyncTextStream,
    PartialValues,
    TextDeltas,
    TextStream,
    ThoughtDeltas,
    legacy_stream,
)
from .tools import ToolCallsGrammar
from .tools.formats import resolve_format

AUTO_DRAFT = "lookup"
"""``draft="auto"``: prompt lookup (plus the grammar's forced tokens, always on). Both are free,
and on the embedded model they beat model drafts in wall time (BENCHMARKS.md)."""
CDSL_SELF_DRAFT = "int8"
"""The draft model CDSL uses on a CPU when ``draft`` names no model: the target's linear layers in int8,
each token's activations on its own scale (``models.int8``), so its rows draft in one batched forward
(docs/benchmarks/2026-11-23-commongen.md, the sweep, for int8 against the other self-drafts)."""
CDSL_SELF_DRAFT_OFF_CPU = "bf16"
"""The same elsewhere: fbgemm's int8 kernels run on the CPU only."""


def cdsl_self_draft(device: Any) -> str:
    """The self-draft CDSL builds for a target on ``device`` (int8 on a CPU, bf16 on a GPU or MPS)."""
    return CDSL_SELF_DRAFT if torch.device(device).type == "cpu" else CDSL_SELF_DRAFT_OFF_CPU


Emit = Callable[[str], None]


def on_own_thread(build: Callable[[], Any]) -> Any:
    """``build()`` run on a thread of its own that ends with it; its result, or its exception.

    Loading a model, its runner's self-check and the int8 draft's quantisation run OpenMP-parallel
    tensor ops, and the thread that runs them keeps an OpenMP team alive. The engine's forward runs
    on the engine's thread; with a second live team in the process (the caller's) libgomp counts
    more threads than cores and stops spinning for its workers, so every parallel region waits for
    a woken thread: a single-row SmolLM2 step took 37-39 ms against 29.5-31.5 ms with the loading
    done on a thread that had ended, and with the runner and the draft made on the caller's thread
    too, two torch threads ran keyword requests slower than one (2-core CPU, BENCHMARKS.md)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = build()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
            box["error"] = exc

    thread = threading.Thread(target=run, name="cdsl-struct-load")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class Generator:
    """Models loaded once, compiled constraints cached, rows decoded in batches; thread-safe.

    ``model``: ``"smollm2"`` (the embedded default), a ``.gguf`` file, a folder, an HF id in the
    local cache, or a ``LoadedModel``. ``device`` / ``dtype``: where and in what precision a
    named model is loaded (``"auto"``: cuda, then mps, then cpu; bfloat16 on a GPU that supports
    it and on a CPU with native bfloat16 instructions, else float32). ``max_batch_size``: rows per
    target forward; ``kv_budget_gb``: the KV
    cache a batch may use (default a quarter of the free memory): requests beyond either wait
    for rows to finish. ``draft``: ``"auto"`` (prompt lookup), ``None`` (no
    draft: ``method="auto"`` decodes target-only, or CDLH with a reward), or a spec for
    ``build_proposers``: ``"lookup"``, ``"bf16"``, ``"layers:N"``, a model path, or parts joined
    by ``+``. CDSL uses the draft's model part, else an int8 copy of the target (made on first
    use). ``backend`` / ``whitespace`` / ``compile_timeout`` are passed to ``compile``; ``k`` is
    the number of tokens speculated per step. ``extra_properties``: False (the default, as in
    Outlines, XGrammar and vLLM) closes JSON objects that list ``properties`` to keys they do not
    declare (``constraints.closed_objects``, applied by ``compile()``); True decodes schemas exactly as given.
    ``max_prompt_tokens``: longer prompts raise ``PromptTooLong`` (the model's context always bounds them).
    ``loop_guard`` (default on): a row whose output starts repeating one block of tokens is
    steered out of the cycle instead of running to ``max_tokens`` (``decoding.loops``; target
    and speculative rows; CDLH and CDSL rows never write a block of tokens, or of words whatever
    their case and punctuation, a third time in a row; it never loosens a constraint).
    ``string_guard`` (default on): where a JSON schema's string value is open and the model moves on to
    a closing bracket without its quote, the value ends there, in ``schema=`` answers and tool calls'
    arguments (``decoding.strings``; target, speculative, CDLH and CDSL rows; it only moves probability
    between tokens the constraint allows).
    ``torch_compile``: the batched target forward's decoder layers run through graphs compiled ahead of
    time (``models.saved_graphs``). The Generator returns once the model is loaded (and ~2 s of
    ``background_compile.prepare_loading``) and answers eagerly; a second
    process compiles the graphs and saves them under the user cache (a compile cannot run beside
    decoding in one process), and they are loaded and swapped in between steps
    (``models.background_compile``). A later process on the machine loads the saved graphs in
    seconds. ``compile_state()`` says where it stands, ``wait_compiled()`` waits for it.
    False / ``"off"`` (the default here), True / ``"on"`` (where it cannot compile, a warning is
    logged and decoding stays eager) or ``"auto"`` (compile on the CPU where inductor finds a C++
    compiler, else eager). Start-up and speed on a 2-core CPU: BENCHMARKS.md ("Generator start-up").
    ``tool_format``: how tool calls are written, ``"auto"``
    (the format of the model's chat template: ``tools.formats.detect_format``) or a name in
    ``tools.formats.FORMATS`` (``hermes``, ``llama3``, ``mistral``, ``gemma``, ``deepseek``, ``generic``).
    """

    def __init__(self, model: str | LoadedModel = "smollm2", *, draft: str | None = "auto",
                 backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE, compile_timeout: float = 30.0,
                 k: int = 6, device: Any = "auto", dtype: Any = "auto", max_batch_size: int = 32,
                 kv_budget_gb: float | None = None, extra_properties: bool = False,
                 max_prompt_tokens: int | None = None, loop_guard: bool = True, string_guard: bool = True,
                 torch_compile: bool | str = False, tool_format: str = "auto") -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        compile_mode(torch_compile)  # a bad value fails before minutes of loading
        self.loaded = model if isinstance(model, LoadedModel) else \
            on_own_thread(lambda: load_model(model, device=device, dtype=dtype))
        self.model_name: str = self.loaded.name
        self.tokenizer: Any = self.loaded.tokenizer
        self.vocabulary = TokenVocabulary.from_tokenizer(self.tokenizer, self.loaded.eos_token_ids)
        self.backend = backend
        self.whitespace = whitespace
        self.compile_timeout = compile_timeout
        self.extra_properties = extra_properties
        self.tool_format = resolve_format(tool_format, self.tokenizer)
        self.max_prompt_tokens = max_prompt_tokens
        self.loop_guard, self.string_guard = loop_guard, string_guard
        self.k = k
        self.draft: str | None = None if draft in (None, "none") else (AUTO_DRAFT if draft == "auto" else draft)
        self.proposers = on_own_thread(lambda: build_proposers(self.draft, self.loaded.model,
                                                               target_tokenizer=self.tokenizer))
        self._draft_lock = threading.Lock()
        self._sentence_guard: WordLoopGuard | None = None
        self._cdsl_draft: ModelRunner | None = next(
            (p.runner for p in self.proposers if isinstance(p, DraftModelProposer)), None)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.loaded.eos_token_ids[0]
        runner = on_own_thread(lambda: batch_runner(self.loaded.model, pad_token_id=pad,
                                                    max_rows=max_batch_size if max_batch_size > 64 else None))
        self.engine = BatchEngine(runner, max_batch_size=max_batch_size,
                                  kv_budget_bytes=None if kv_budget_gb is None else kv_budget_gb * 2**30)
        self.compiling: BackgroundCompile | None = on_own_thread(
            lambda: compile_in_background(self.engine.runner, torch_compile))
        self.engine.programs.share_prefix(chat_header(self.tokenizer))  # a draft prefills it once
        self.engine.start()

    def __repr__(self) -> str:
        return (f"Generator(model={self.model_name!r}, draft={self.draft!r}, backend={self.backend!r}, "
                f"device={str(self.device)!r})")

    @property
    def device(self) -> Any:
        """The ``torch.device`` the model runs on."""
        return self.loaded.device

    def close(self) -> None:
        """Stop the engine's threads (and a compile under way). Every request still in it ends, so no
        caller waits forever: a running one with its partial output (``finish_reason="cancelled"``), a
        waiting one with ``RequestCancelled``."""
        if self.compiling is not None:
            self.compiling.stop()
        self.engine.close()

    def compile_state(self) -> CompileState | None:
        """Where ``torch_compile``'s compiled forward stands (``loading``, ``compiling``, ``ready``,
        ``failed`` with its reason, ``stopped``); None where none is built (``"off"``, or eager by
        ``"auto"``'s choice)."""
        return None if self.compiling is None else self.compiling.state

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit) for ``torch_compile``'s compiled forward;
        whether steps now run through it. Requests need not wait: until then they run eagerly."""
        if self.compiling is None:
            runner = self.engine.runner
            return getattr(runner, "compiled", None) is not None and runner.compiled.active
        return self.compiling.wait(timeout)

    @property
    def max_batch_size(self) -> int:
        """Rows one target forward may decode together."""
        return self.engine.scheduler.max_batch_size

    def load(self) -> EngineLoad:
        """Rows decoding and waiting now (a snapshot)."""
        return self.engine.load()

    # --- public -------------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[Any], *, schema: Any = None, regex: str | None = None,
                 choices: Sequence[str] | None = None, grammar: Any = None,
                 keywords: Sequence[str] | Keywords | None = None, reward: Reward | Callable[..., float] | None = None,
                 tools: Sequence[Any] | None = None, tool_choice: Any = "auto", parallel_tool_calls: bool = True,
                 tool_format: Any = None, reasoning: Any = None, params: GenerationParams | None = None,
                 stream: bool = False,
                 chat: bool = True,
                 cancel: threading.Event | None = None, compile_timeout: float | None = None,
                 **overrides: Unpack[ParamOverrides]) -> Result:
        """Generate an answer to ``prompt`` under at most one hard constraint.

        ``prompt``: a string (one user message in the chat template; ``chat=False`` encodes it
        as it is) or a list of ``{"role", "content"}`` messages. One verb, one return type:
        ``generate`` returns a ``Result``, ``generate_batch`` a list of them, ``stream`` a
        ``TextStream``; ``agenerate``, ``agenerate_batch`` and ``astream`` are the same for an
        event loop. Deprecated (they warn, and work as before for one release): a list of prompts
        here (a list of Results; use ``generate_batch``) and ``stream=True`` (an iterator of text
        deltas whose last item is the Result; use ``stream``).

        Constraints (at most one): ``schema`` (JSON Schema dict or text, a pydantic model:
        ``value`` is then an instance, or an Outlines output type), ``regex``, ``choices``
        (``value`` is the chosen string), ``grammar`` (Lark text, a ``.lark`` path or a shipped
        name; ``value`` is a ``lark.Tree``). With none, the answer is free text that ends at EOS.

        ``tools`` (OpenAI tool dicts or functions, described to the model in a system message):
        ``tool_choice`` ``"auto"`` (text or calls; with ``schema``, an answer in that schema or
        calls), ``"required"``, a tool's name, or ``"none"`` (tools ignored);
        ``parallel_tool_calls`` (default true) allows more than one call; ``tool_format`` (a name in
        ``tools.formats.FORMATS``) writes this call's tools in that family's format instead of the
        Generator's. ``tool_calls`` holds the
        calls (``value`` too, when the output is complete), ``content`` the text before them;
        a call cut by ``max_tokens`` is kept with its partial ``arguments_text``.

        ``reasoning``: think first (``True``, a budget of thinking tokens, or a ``Reasoning``): the
        output may open the model's thinking markers (``<think>``… read from its chat template) and
        think freely for at most the budget (default: half of ``max_tokens``), after which the close
        marker is forced; the constraint then holds for the answer. ``Result.reasoning`` holds the
        thinking, ``text`` and ``value`` the answer; a stream yields the thinking as ``Thought``
        deltas. Without it, a template that can turn thinking off (Qwen 3) is asked to.

        Soft constraints: ``keywords`` (keyword coverage, inflections count) and ``reward``
        (a ``Reward`` or ``fn(text, final) -> float`` in [0, 1]) steer CDLH/CDSL and combine with
        any hard constraint. ``keywords``: a list of words or a ``Keywords`` (its options): the
        words the last user message does not already hold are named in it, the answer is one
        finished sentence unless another constraint is given (a sentence cut by ``max_tokens`` is
        closed early: ``closed_by_budget``), a list of the words earns no reward, and
        ``Result.keywords`` says which words the answer holds.

        How to decode: ``params``, a frozen ``GenerationParams`` (method, max_tokens, temperature,
        top_p, seed, stop, presence/frequency penalties, logprobs; its docstring says what each
        means), and any of its fields as keyword arguments, which override it
        (``generate(p, max_tokens=64)`` is ``generate(p, params=GenerationParams(max_tokens=64))``).
        CDLH and CDSL decode greedily, without penalties or logprobs. ``stop`` ends the output where
        the constraint accepts the text before the stop string (``decoding.stops``). ``cancel``: an
        event that, once set, ends the rows with ``finish_reason="cancelled"`` within a step.
        ``compile_timeout``: seconds this call's constraint may take to compile (default: the
        Generator's).

        ``value`` is None and ``complete`` False unless the output ended complete (at EOS, or at a
        stop string, in a complete state: ``finish_reason == "stop"``).

        Raises ``ValueError`` for bad parameters and the typed ``CompileError`` subclasses for a
        bad constraint, before anything is decoded.
        """
        call, encoded, batch = self._prepare(
            prompt, schema=schema, regex=regex, choices=choices, grammar=grammar, keywords=keywords, reward=reward,
            tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls, tool_format=tool_format,
            reasoning=reasoning, params=params, chat=chat, compile_timeout=compile_timeout, **overrides)
        if stream and batch:
            raise ValueError("stream=True takes one prompt, not a list of prompts")
        if stream or batch:
            warnings.warn(deprecated_shape(prompt, stream), DeprecationWarning, stacklevel=2)
        if stream:
            return legacy_stream(self._text_stream(call, encoded[0], cancel))  # type: ignore[return-value]
        if batch:
            return self._run_batch(call, encoded, cancel)  # type: ignore[return-value]
        return self._run(call, encoded[0], None, cancel)

    def generate_batch(self, prompts: Sequence[str | Sequence[Any]], *, cancel: threading.Event | None = None,
                       **options: Any) -> list[Result]:
        """``generate`` for a list of prompts (strings or message lists), decoded together as rows
        of one batch with the constraint compiled once: one Result per prompt, in order (with
        ``seed``, row ``i`` samples with ``seed + i``). ``options``: those of ``generate``."""
        if "stream" in options:
            raise ValueError("generate_batch() does not stream; use stream() for one prompt")
        if isinstance(prompts, str) or not split_batch(prompts)[1]:
            raise ValueError("generate_batch() takes a list of prompts (strings or message lists); "
                             "use generate() for one")
        call, encoded, _ = self._prepare(prompts, **options)
        return self._run_batch(call, encoded, cancel)

    def stream(self, prompt: str | Sequence[Any], *, cancel: threading.Event | None = None,
               **options: Any) -> TextStream:
        """``generate`` for one prompt, as a ``TextStream``: iterating it gives the text deltas
        (``str``) as they are decoded, and its ``result`` is then the Result (read earlier, it waits
        for the end). Leaving ``with gen.stream(p) as s:`` early, or ``s.close()``, cancels the
        request. Arguments are checked and the constraint compiled here, before anything decodes;
        decoding starts when the stream is first read. ``options``: those of ``generate``."""
        if "stream" in options:
            raise ValueError("stream() always streams; pass no stream= argument")
        if split_batch(prompt)[1]:
            raise ValueError("stream() takes one prompt; use generate_batch() for a list of prompts")
        call, encoded, _ = self._prepare(prompt, **options)
        return self._text_stream(call, encoded[0], cancel)

    async def agenerate(self, prompt: str | Sequence[Any], *, cancel: threading.Event | None = None,
                        **options: Any) -> Result:
        """``generate`` awaited from an event loop, which it never blocks: the call (compiling the
        constraint included) runs on a thread of its own. Cancelling the awaiting task cancels the
        request; the ``CancelledError`` propagates once its rows have ended (within a step).
        ``options``: those of ``generate``."""
        if "stream" in options:
            raise ValueError("agenerate() does not stream; use astream()")
        if split_batch(prompt)[1]:
            raise ValueError("agenerate() takes one prompt; use agenerate_batch() for a list of prompts")

        def work(_emit: Emit, event: threading.Event) -> Result:
            call, encoded, _ = self._prepare(prompt, **options)
            return self._run(call, encoded[0], None, event)

        return await AsyncTextStream(work, cancel).finish()

    async def agenerate_batch(self, prompts: Sequence[str | Sequence[Any]], *,
                              cancel: threading.Event | None = None, **options: Any) -> list[Result]:
        """``generate_batch`` awaited from an event loop, as ``agenerate`` (cancelling the task
        cancels every row)."""
        return await AsyncTextStream(lambda _emit, event: self.generate_batch(prompts, cancel=event, **options),
                                     cancel).finish()

    def astream(self, prompt: str | Sequence[Any], *, cancel: threading.Event | None = None,
                **options: Any) -> AsyncTextStream:
        """``stream`` for an event loop: an ``AsyncTextStream`` (``async for`` the text deltas, then
        its ``result``). The request, its checks and compiling included, runs on a thread of its
        own from the first ``__anext__``, where its errors are raised. Cancelling the task that
        iterates it, or leaving ``async with gen.astream(p) as s:`` early, cancels the request.
        ``options``: those of ``generate``."""
        if "stream" in options:
            raise ValueError("astream() always streams; pass no stream= argument")
        if split_batch(prompt)[1]:
            raise ValueError("astream() takes one prompt; use agenerate_batch() for a list of prompts")

        partials = PartialValues()  # its reader is known once the constraint resolved, on the thread

        def work(emit: Emit, event: threading.Event) -> Result:
            call, encoded, _ = self._prepare(prompt, **options)
            partials.reader = partial_reader_for(call)
            return self._run(call, encoded[0], emit, event)

        return AsyncTextStream(work, cancel, partials)

    def choose_method(self, method: str | Method, has_reward: bool) -> Method:
        """The decoder ``method`` means for this Generator (``"auto"`` resolved)."""
        chosen = Method.parse(method)
        if chosen is Method.AUTO:
            if has_reward:
                return Method.CDSL if self.draft else Method.CDLH
            return Method.SPECULATIVE if self.draft else Method.TARGET
        if chosen.steered and not has_reward:
            raise ValueError(f"method {chosen.value!r} steers by a reward: pass keywords= or reward=")
        if not chosen.steered and has_reward:
            raise ValueError(f"method {chosen.value!r} ignores rewards: use 'cdlh', 'cdsl' or 'auto' with "
                             "keywords/reward")
        if chosen is Method.CDSL and not self.draft:
            raise ValueError("method 'cdsl' needs a draft; this Generator was made with draft=None")
        return chosen

    # --- resolving a request ------------------------------------------------------------------

    def _prepare(self, prompt: Any, *, tools: Any = None, tool_choice: Any = "auto",
                 parallel_tool_calls: bool = True, tool_format: Any = None, chat: bool = True,
                 compile_timeout: float | None = None, **arguments: Any) -> tuple[Call, list[list[int]], bool]:
        """A request resolved (constraint compiled) and its prompts encoded: (call, prompts' ids, is_batch)."""
        written = self.tool_format if tool_format is None else resolve_format(tool_format, self.tokenizer)
        read = read_arguments(tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                              tool_format=written, **arguments)
        call = self._resolve(read, compile_timeout)
        prompts, batch = split_batch(prompt)
        if chat and call.keywords is not None:
            prompts = [named_prompt(p, call.keywords) for p in prompts]
        thinking = call.reasoning is not None
        return call, [self._encode(p, chat, call.system, read.params.max_tokens, thinking) for p in prompts], batch

    def _text_stream(self, call: Call, prompt: list[int], cancel: threading.Event | None) -> TextStream:
        return TextStream(lambda emit, event: self._run(call, prompt, emit, event), cancel,
                          PartialValues(partial_reader_for(call)))

    def _run_batch(self, call: Call, encoded: list[list[int]], cancel: threading.Event | None) -> list[Result]:
        """Decode prompts (token ids) as rows of one batch; with a seed, row ``i`` samples with ``seed + i``."""
        if len(encoded) == 1:
            return [self._run(call, encoded[0], None, cancel)]
        seed = call.params.seed
        rows = [call if seed is None else replace(call, sampling=replace(call.sampling, seed=seed + i))
                for i in range(len(encoded))]
        with ThreadPoolExecutor(min(len(encoded), 64), thread_name_prefix="cdsl-row") as pool:
            return list(pool.map(lambda pair: self._run(pair[0], pair[1], None, cancel),
                                 zip(rows, encoded, strict=True)))


    def _resolve(self, read: Arguments, compile_timeout: float | None = None) -> Call:
        params, steer, spec, calls = read.params, read.reward, read.spec, read.tools
        sampling = SamplingParams(temperature=params.temperature, top_p=params.top_p, seed=params.seed)
        with named_errors("method"):
            chosen = self.choose_method(params.method, steer is not None)
        if chosen.steered:
            if not sampling.greedy:
                raise InvalidArgument(f"method {chosen.value!r} decodes greedily; use temperature=0",
                                      param="temperature")
            if params.penalised or params.logprobs is not None:
                raise InvalidArgument(f"method {chosen.value!r} does not take penalties or logprobs",
                                      param="logprobs" if params.logprobs is not None else "presence_penalty")
        system = None
        if calls is not None:
            if spec is not None and not isinstance(spec, JsonSchema):
                raise ValueError("with tools, only schema= (the format of an answer that is not a call) may be "
                                 "given; regex, choices and grammar cannot be combined with tools")
            answer_format = spec.schema if spec is not None else None
            system = calls.system_prompt(answer_format)
            compiled = self.compile(ToolCallsGrammar(calls, answer_format=answer_format, whitespace=self.whitespace),
                                    compile_timeout)
        else:
            compiled = self.compile(spec if spec is not None else Regex(FREE_TEXT), compile_timeout)
        return Call(compiled, chosen, params, sampling, steer, calls, system,
                    spec if calls is not None else None, read.reasoning, read.keywords)

    def compile(self, spec: Any, timeout: float | None = None) -> CompiledConstraint:
        """``spec`` compiled for this model's tokenizer (cached by ``cdsl_struct.compile``, which
        closes JSON objects unless this Generator has ``extra_properties``) within ``timeout``
        seconds (default: the Generator's ``compile_timeout``)."""
        return compile(spec, self.vocabulary, backend=self.backend, whitespace=self.whitespace,
                       timeout=self.compile_timeout if timeout is None else timeout,
                       extra_properties=self.extra_properties)

    def _encode(self, prompt: Any, chat: bool, system: str | None, max_tokens: int,
                thinking: bool = False) -> list[int]:
        param = "prompt" if isinstance(prompt, str) else "messages"
        with named_errors(param):
            ids = prompt_ids(self.tokenizer, prompt, chat=chat, system=system, thinking=thinking)
        if not ids:  # checked for every prompt before any decodes, whatever the method
            raise InvalidArgument("a request needs at least one prompt token; this prompt encodes to none",
                                  param=param)
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise PromptTooLong(f"the prompt has {len(ids)} tokens; the limit is {self.max_prompt_tokens}")
        context = getattr(self.loaded.model.config, "max_position_embeddings", None)
        if context and len(ids) + max_tokens + 1 > context:
            raise PromptTooLong(f"prompt of {len(ids)} tokens plus max_tokens={max_tokens} exceeds the model's "
                                f"context of {context} tokens")
        return ids

    # --- decoding -----------------------------------------------------------------------------

    def _run(self, call: Call, prompt: list[int], emit: Emit | None = None,
             cancel: threading.Event | None = None) -> Result:
        """Decode one prompt (token ids) for a resolved call; ``emit`` receives text deltas."""
        result = self._decode(call, prompt, emit, cancel)
        if call.tools is not None:
            result = read_calls(call.tools, call.answer_format, result)
        ended = result.finish_reason == "stop" or result.closed_by_budget
        unfinished = {} if ended else {"complete": False, "value": None}
        report = None if call.keywords is None else call.keywords.report(result.text)
        return replace(result, method=call.method.value, prompt_tokens=len(prompt), keywords=report, **unfinished)

    def _decode(self, call: Call, prompt: list[int], emit: Emit | None,
                cancel: threading.Event | None) -> Result:
        compiled, thoughts = self._thinking(call, prompt)
        on_tokens = None
        if emit is not None:
            deltas, holdback = TextDeltas(self.vocabulary), StopHoldback(call.params.stop)

            def send(text: str) -> None:
                for piece in thoughts.push(text) if thoughts is not None else [text]:
                    emit(piece)

            def on_tokens(tokens: list[int]) -> None:
                send(holdback.push(deltas.push(tokens)))

        proposers = [getattr(p, "fork", lambda p=p: p)() for p in self.proposers] \
            if call.method is Method.SPECULATIVE else []
        row = Request(tuple(prompt), compiled, call.sampling, call.params.max_tokens, tuple(proposers), self.k,
                      on_tokens, stop=call.params.stop, penalties=call.penalties, logprobs=call.params.logprobs,
                      cancel_event=cancel, loop_guard=self.loop_guard, string_guard=self.string_guard,
                      strategy=self._strategy(call), on_budget=budget_mode(call))
        result = self.engine.submit(row).wait()
        if emit is not None:
            send(holdback.push(deltas.flush()))
            if thoughts is None:
                emit(holdback.finish(result.text))
            else:
                send(holdback.finish(thoughts.written + result.text if thoughts.phase == "answer" else holdback.text))
                for piece in thoughts.flush():
                    emit(piece)
        return result

    def _thinking(self, call: Call, prompt: list[int]) -> tuple[CompiledConstraint, ThoughtDeltas | None]:
        """The constraint a row of ``call`` decodes under (behind a thinking segment with
        ``reasoning=``, which the prompt's end may have opened or closed) and its stream splitter."""
        if call.reasoning is None:
            return call.compiled, None
        tail = self.vocabulary.decode(prompt[-64:]).decode("utf-8", errors="replace")
        with named_errors("reasoning"):
            compiled = with_reasoning(call.compiled, call.reasoning, getattr(self.tokenizer, "chat_template", None),
                                      tail, call.params.max_tokens)
        spec = compiled.spec
        return compiled, ThoughtDeltas(spec.open, spec.close, spec.phase)

    def _strategy(self, call: Call) -> Any:
        guard = self._word_guard() if self.loop_guard else None
        steering = {} if call.keywords is None else {"optimism": call.keywords.optimism}
        steering["string_guard"] = self.string_guard
        if call.method is Method.CDLH:
            return CDLH(call.reward, loop_guard=guard, reward_guard=True, **steering)
        if call.method is Method.CDSL:
            return CDSL(self._cdsl_draft_runner(), call.reward, loop_guard=guard, **steering)
        return None

    def _word_guard(self) -> WordLoopGuard:
        """The loop guard of keyword sentences, on tokens and words (made once: ~0.3 s for SmolLM2)."""
        with self._draft_lock:
            if self._sentence_guard is None:
                self._sentence_guard = WordLoopGuard(self.vocabulary.token_bytes)
            return self._sentence_guard

    def _cdsl_draft_runner(self) -> ModelRunner:
        """The draft model CDSL steers by the reward (CDSL wraps it in a ``GuidedDraft``)."""
        with self._draft_lock:  # concurrent first CDSL requests make one draft
            if self._cdsl_draft is None:
                kind = cdsl_self_draft(self.device)
                self._cdsl_draft = ModelRunner(on_own_thread(lambda: self_draft(self.loaded.model, kind)), name=kind)
            return self._cdsl_draft

