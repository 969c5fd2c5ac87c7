"""``compile()``: spec + tokenizer -> cached, thread-safe ``CompiledConstraint``.

Compile once per (spec, vocabulary, backend, whitespace); make one cheap ``ConstraintState``
per sequence with ``new_state()``. ``backend="auto"`` tries the engines in the order that suits
the spec and falls back to the next one when an engine refuses the spec: a ``CompileError`` its
backend raised on purpose (unsupported feature, invalid or unsatisfiable input, timeout). Which
engine was used, and why others were skipped, is on the compiled object. Any other exception is
a bug and propagates as itself, with no fallback: each backend translates its engine's errors
into typed ones where their meaning is known.

The cache is keyed by what the engine compiles (``spec.key``: the schema, pattern or grammar
text, with the vocabulary, backend and whitespace). A pydantic model is not the engine's input,
so models with the same JSON Schema share one engine program, but each gets a
``CompiledConstraint`` whose ``spec.model`` is the model asked for.

Timeouts: an engine cannot be interrupted from Python, so each backend says how its timeout is
enforced (``Backend.enforces_timeout``):

- outlines-core's ``Index`` build has no limit of its own (``\\w{1,200}`` runs ~50 s on GPT-2's
  vocabulary), so with a timeout it runs in a worker process that is killed when the timeout
  passes, and the pickled ``Index`` comes back (``backends/outlines_core_process.py``). Measured
  on 2 cores: a warm worker adds a ~4 ms round trip, yet compiles are faster there (Llama-3,
  date regex 0.15 s vs 0.61 s in process; a small object schema 0.40 s vs 0.96 s), because the
  vocabulary it unpickled is laid out afresh; a cold worker costs 36 ms (GPT-2), 0.12 s
  (Llama-3), 0.22 s (Gemma-3) to start and receive its vocabulary, paid again after a timeout
  kills one. The index build releases the GIL, so the worker takes a core but not the caller's
  interpreter.
- llguidance bounds its own work (``LLParserLimits``: lexer fuel, grammar size, lexer states),
  so it compiles in a thread named ``cdsl-compile-llguidance``; at the timeout the caller gets
  ``CompileTimeout`` and the abandoned thread ends by itself within those limits.

Schema rewriting: when the first engine refuses a JSON Schema, the schema is rewritten into an
equivalent one without the keywords the engines lack (``schema_rewrite``: ``not``, ``oneOf``,
``if``/``then``/``else``, dependencies, unknown formats...) and each engine is tried with the
rewrite right after its attempt with the original. A schema the engine takes as given never
pays for the rewrite. The compiled constraint keeps the user's spec (results are validated
against the original schema) and lists the rules that fired in ``rewrites``; a rewrite that
cannot be exact is one more refusal in ``skipped``/``attempts`` (backend ``"rewrite"``).

``timeout=None`` compiles in the calling thread with no worker (``bench maskbench`` isolates
cases in processes of its own).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import CompileError, CompileTimeout
from .backends import BACKEND_NAMES, EngineProgram, get_backend
from .schema_rewrite import rewrite_schema
from .specs import ConstraintSpec, JsonSchema, as_spec
from .state import ConstraintState
from .vocabulary import TokenVocabulary
from .whitespace import DEFAULT_WHITESPACE, WhitespacePolicy

#: engines tried by ``backend="auto"``, per spec kind. llguidance first: it compiles in
#: milliseconds and expresses more of JSON Schema; outlines-core covers what it refuses.
AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "json_schema": ("llguidance", "outlines-core"),
    "regex": ("llguidance", "outlines-core"),
    "choice": ("llguidance", "outlines-core"),
    "grammar": ("llguidance",),
}
DEFAULT_TIMEOUT_S = 30.0
CACHE_SIZE = 256


@dataclass(eq=False)
class CompiledConstraint:
    """A spec compiled for one vocabulary by one engine. Immutable and safe to share."""

    spec: ConstraintSpec
    vocabulary: TokenVocabulary
    backend: str
    whitespace: WhitespacePolicy
    compile_seconds: float
    program: EngineProgram = field(repr=False)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(backend, reason) for each engine ``auto`` tried before this one."""
    rewrites: tuple[str, ...] = ()
    """Schema rewrite rules applied before the engine compiled it (empty: the schema as given)."""

    def new_state(self) -> ConstraintState:
        """A fresh per-sequence state at the start of the output."""
        return self.program.new_state(self)

    @property
    def vocab_size(self) -> int:
        return self.vocabulary.size


_cache: OrderedDict[tuple, CompiledConstraint] = OrderedDict()
_cache_lock = threading.Lock()
_key_locks: dict[tuple, threading.Lock] = {}


def compile(  # noqa: A001 - the natural name, as in re.compile / xgrammar
    spec: Any,
    tokenizer: Any,
    *,
    backend: str = "auto",
    whitespace: str | WhitespacePolicy = DEFAULT_WHITESPACE,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    eos_token_ids: Sequence[int] | None = None,
    cache: bool = True,
) -> CompiledConstraint:
    """Compile ``spec`` for ``tokenizer``.

    ``spec``: a ``JsonSchema``, ``Regex``, ``Choice`` or ``Grammar`` (or a schema dict / pydantic
    model). ``tokenizer``: a name (``"llama3"``...), path, HF tokenizer or ``TokenVocabulary``.
    ``backend``: ``"auto"``, ``"llguidance"`` or ``"outlines-core"``. ``whitespace``: JSON
    whitespace policy (see ``WhitespacePolicy``). ``timeout``: seconds per engine attempt.
    ``cache=False`` compiles afresh and keeps nothing (benchmarks).

    Raises ``CompileError`` subclasses: ``InvalidSchema``, ``UnsatisfiableSchema``,
    ``UnsupportedFeature``, ``GrammarSyntaxError``, ``CompileTimeout``. When every engine
    fails, the first engine's error is raised with ``.attempts`` listing all of them. Any other
    exception is a bug, raised as itself without trying another engine.
    """
    spec = as_spec(spec)
    vocabulary = (
        tokenizer if isinstance(tokenizer, TokenVocabulary)
        else TokenVocabulary.from_tokenizer(tokenizer, eos_token_ids)
    )
    policy = WhitespacePolicy.parse(whitespace)
    rewrite = backend == "auto"  # an explicit engine compiles the schema as given
    if backend == "auto":
        order = AUTO_ORDER[spec.kind]
    elif backend in BACKEND_NAMES:
        order = (backend,)
    else:
        raise ValueError(f"unknown backend {backend!r}; choose auto, {', '.join(BACKEND_NAMES)}")

    if not cache:
        return _compile_uncached(spec, vocabulary, order, policy, timeout, rewrite)
    key = (spec.key, vocabulary.fingerprint, backend, policy.key)
    compiled = _cached(key, lambda: _compile_uncached(spec, vocabulary, order, policy, timeout, rewrite))
    model = getattr(spec, "model", None)
    if getattr(compiled.spec, "model", None) is model:
        return compiled
    # Same engine program, but results must be instances of the model asked for.
    return _cached((*key, model), lambda: replace(compiled, spec=spec, skipped=list(compiled.skipped)))


def _cached(key: tuple, build: Callable[[], CompiledConstraint]) -> CompiledConstraint:
    """The cached value for ``key``, built once (other threads asking for it wait) if missing."""
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:  # two threads asking for the same constraint compile it once
        with _cache_lock:
            if key in _cache:
                return _cache[key]
        try:
            compiled = build()
        except BaseException:
            with _cache_lock:
                _key_locks.pop(key, None)
            raise
        with _cache_lock:
            _cache[key] = compiled
            _key_locks.pop(key, None)
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    return compiled


def clear_cache() -> None:
    """Forget every compiled constraint."""
    with _cache_lock:
        _cache.clear()


def _compile_uncached(
    spec: ConstraintSpec,
    vocabulary: TokenVocabulary,
    order: tuple[str, ...],
    policy: WhitespacePolicy,
    timeout: float | None,
    rewrite: bool = False,
) -> CompiledConstraint:
    failures: list[tuple[str, CompileError]] = []
    rewritten: JsonSchema | None = None
    rules: tuple[str, ...] = ()  # non-empty once the rewrite was tried
    rewrite_seconds = 0.0
    for name in order:
        for use_rewrite in (False, True):
            if use_rewrite:
                if not (rewrite and isinstance(spec, JsonSchema)):
                    break
                if not rules:  # the first refusal: rewrite once, reuse for every engine
                    tick = time.perf_counter()
                    rewritten, rules = _rewrite(spec, failures)
                    rewrite_seconds = time.perf_counter() - tick
                if rewritten is None:
                    break
            engine_spec = rewritten if use_rewrite and rewritten is not None else spec
            start = time.perf_counter() - (rewrite_seconds if use_rewrite else 0.0)
            try:
                program = _attempt(name, engine_spec, vocabulary, policy, timeout)
            except CompileError as exc:  # the engine refused the spec: try the next candidate
                failures.append((f"{name}+rewrite" if use_rewrite else name, exc))
                continue
            return CompiledConstraint(
                spec=spec,
                vocabulary=vocabulary,
                backend=name,
                whitespace=policy,
                compile_seconds=time.perf_counter() - start,
                program=program,
                skipped=[(n, str(e)) for n, e in failures],
                rewrites=rules if use_rewrite else (),
            )
    first = failures[0][1]
    first.attempts = [(n, str(e)) for n, e in failures]  # type: ignore[attr-defined]
    if len(failures) > 1:
        first.args = (str(first) + "; " + "; ".join(f"{n}: {e}" for n, e in failures[1:]),)
    raise first


def _rewrite(spec: JsonSchema, failures: list[tuple[str, CompileError]]) -> tuple[JsonSchema | None, tuple[str, ...]]:
    """The exact rewrite of ``spec`` and the rules that fired; ``None`` when no rule applies or
    the rewrite was refused (the refusal joins ``failures``). ``rules`` is non-empty once tried."""
    try:
        rewrite = rewrite_schema(spec.schema)
    except CompileError as exc:
        failures.append(("rewrite", exc))
        return None, ("refused",)
    if not rewrite.rules:
        return None, ("none",)
    return JsonSchema(rewrite.schema), rewrite.rules


def _attempt(
    name: str, spec: ConstraintSpec, vocabulary: TokenVocabulary, policy: WhitespacePolicy, timeout: float | None
) -> EngineProgram:
    """One engine's compile, under ``timeout`` enforced as that backend says."""
    backend = get_backend(name)
    if getattr(backend, "enforces_timeout", False):
        return backend.compile(spec, vocabulary, policy, timeout=timeout)  # type: ignore[call-arg]
    if timeout is None:
        return backend.compile(spec, vocabulary, policy)
    return _run_in_thread(lambda: backend.compile(spec, vocabulary, policy), timeout, name)


def _run_in_thread(work: Callable[[], EngineProgram], timeout: float, name: str) -> EngineProgram:
    """Run ``work`` in a thread; ``CompileTimeout`` after ``timeout`` seconds.

    The thread cannot be stopped, so this is only for engines whose own limits bound their work:
    past the timeout it is abandoned and its result dropped. Whatever ``work`` raises is
    re-raised here unchanged.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["program"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"cdsl-compile-{name}", daemon=True)
    start = time.perf_counter()
    thread.start()
    thread.join(timeout)
    # A compile that finished just past the deadline (the join woke late) is a timeout too, so
    # the outcome depends on the time taken, not on thread scheduling.
    if thread.is_alive() or time.perf_counter() - start > timeout:
        raise CompileTimeout(f"{name}: compile took longer than {timeout:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["program"]
