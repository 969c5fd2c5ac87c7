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

- outlines-core's ``Index`` build has no limit of its own (Unicode ``\\w{1,200}``, ``unicode=True``,
  runs ~50 s on GPT-2's vocabulary), so with a timeout it runs in a worker process that is killed when the timeout
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

``timeout`` is one budget for the whole compile: every engine attempt and the schema rewrite
share it, so ``auto`` never takes more than ``timeout`` seconds however many engines it tries.
An engine before the last may take half of what is left, so one stuck on a spec still leaves
the next engine time. When an attempt timed out, the compile's error is that ``CompileTimeout``
(another engine's refusal is then not final: the one that ran out of time might have taken it).
``timeout=None`` compiles in the calling thread with no worker (``bench maskbench`` isolates
cases in processes of its own).

Caches: compiled constraints are kept (least recently used first out) up to ``CACHE_SIZE``
entries and ``CACHE_BYTES`` of engine programs (``EngineProgram.nbytes``). Refusals are kept
too (``FAILURE_CACHE_SIZE``), so a client sending the same bad or explosive spec again gets its
error at once instead of paying for the compile again; a ``CompileTimeout`` is kept only
``TIMEOUT_TTL_S`` seconds, since it depends on the machine's load as well as on the spec.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..errors import CompileError, CompileTimeout
from .backends import BACKEND_NAMES, EngineProgram, get_backend
from .backends.text_backend import is_free_text
from .closed_objects import closed_spec
from .schema_rewrite import rewrite_schema
from .specs import ConstraintSpec, JsonSchema, as_spec
from .state import ConstraintState
from .vocabulary import TokenVocabulary
from .whitespace import DEFAULT_WHITESPACE, WhitespacePolicy

#: engines tried by ``backend="auto"``, per spec kind (free text, ``backends.text_backend.is_free_text``,
#: is compiled by the table backend ``"text"`` first). llguidance first: it compiles in
#: milliseconds and expresses more of JSON Schema; outlines-core covers what it refuses.
AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "json_schema": ("llguidance", "outlines-core"),
    "regex": ("llguidance", "outlines-core"),
    "choice": ("llguidance", "outlines-core"),
    "grammar": ("llguidance",),
}
T = TypeVar("T")
DEFAULT_TIMEOUT_S = 30.0
CACHE_SIZE = 256
CACHE_BYTES = 512 * 1024 * 1024
FAILURE_CACHE_SIZE = 1024
TIMEOUT_TTL_S = 300.0


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
        return self.program.new_state()

    @property
    def vocab_size(self) -> int:
        return self.vocabulary.size


_cache: OrderedDict[tuple, CompiledConstraint] = OrderedDict()
_cache_bytes = 0
# key -> (error, expiry, the timeout it was compiled under)
_failures: OrderedDict[tuple, tuple[CompileError, float, float | None]] = OrderedDict()
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
    extra_properties: bool = False,
) -> CompiledConstraint:
    """Compile ``spec`` for ``tokenizer``.

    ``spec``: a ``JsonSchema``, ``Regex``, ``Choice`` or ``Grammar`` (or a schema dict / pydantic
    model). ``tokenizer``: a name (``"llama3"``...), path, HF tokenizer or ``TokenVocabulary``.
    ``backend``: ``"auto"``, ``"llguidance"`` or ``"outlines-core"``. ``whitespace``: JSON
    whitespace policy (see ``WhitespacePolicy``). ``timeout``: seconds for the whole compile, one
    budget that every engine attempt and the schema rewrite share (``None``: no limit, in this thread).
    ``cache=False`` compiles afresh and keeps nothing (benchmarks). ``extra_properties``: False
    (the default, as in ``generate()``, the server, Outlines, XGrammar and vLLM) closes JSON objects
    that list ``properties`` to keys they do not declare (``closed_objects``; the compiled
    ``spec`` is then the closed schema, whose outputs all satisfy the schema as given); True
    compiles the schema exactly as given.

    Raises ``CompileError`` subclasses: ``InvalidSchema``, ``UnsatisfiableSchema``,
    ``UnsupportedFeature``, ``GrammarSyntaxError``, ``CompileTimeout`` (the one budget spent); an
    unknown ``backend`` name is a ``ValueError``. When every engine
    fails, the first engine's error is raised with ``.attempts`` listing all of them. Any other
    exception is a bug, raised as itself without trying another engine.
    """
    spec = as_spec(spec)
    if not extra_properties:  # the one place objects are closed: every entry point compiles here
        spec = closed_spec(spec)
    vocabulary = (
        tokenizer if isinstance(tokenizer, TokenVocabulary)
        else TokenVocabulary.from_tokenizer(tokenizer, eos_token_ids)
    )
    policy = WhitespacePolicy.parse(whitespace)
    rewrite = backend == "auto"  # an explicit engine compiles the schema as given
    if backend == "auto":
        order = ("text", *AUTO_ORDER[spec.kind]) if is_free_text(spec) else AUTO_ORDER[spec.kind]
    elif backend in BACKEND_NAMES:
        order = (backend,)
    else:
        raise ValueError(f"unknown backend {backend!r}; choose auto, {', '.join(BACKEND_NAMES)}")

    if not cache:
        return _compile_uncached(spec, vocabulary, order, policy, timeout, rewrite)
    key = (spec.key, vocabulary.fingerprint, backend, policy.key)
    compiled = _cached(key, lambda: _compile_uncached(spec, vocabulary, order, policy, timeout, rewrite), timeout)
    model = getattr(spec, "model", None)
    if getattr(compiled.spec, "model", None) is model:
        return compiled
    # Same engine program, but results must be instances of the model asked for.
    return _cached((*key, model), lambda: replace(compiled, spec=spec, skipped=list(compiled.skipped)))


def _cached(key: tuple, build: Callable[[], CompiledConstraint], timeout: float | None = None) -> CompiledConstraint:
    """The cached value for ``key``, built once (other threads asking for it wait) if missing;
    a cached refusal is raised again without building (a timeout only for as long a ``timeout``)."""
    with _cache_lock:
        found = _lookup(key, timeout)
        if found is not None:
            return found
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:  # two threads asking for the same constraint compile it once
        with _cache_lock:
            found = _lookup(key, timeout)
            if found is not None:
                return found
        try:
            compiled = build()
        except CompileError as exc:
            with _cache_lock:
                _key_locks.pop(key, None)
                _remember_failure(key, exc, timeout)
            raise
        except BaseException:
            with _cache_lock:
                _key_locks.pop(key, None)
            raise
        with _cache_lock:
            _key_locks.pop(key, None)
            _store(key, compiled)
    return compiled


def _lookup(key: tuple, timeout: float | None) -> CompiledConstraint | None:
    """The cached constraint for ``key`` (``None`` if missing); raises its cached refusal unless
    that was a timeout under a shorter ``timeout`` than this one. Holds ``_cache_lock``."""
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    failure = _failures.get(key)
    if failure is not None:
        error, expiry, under = failure
        longer = isinstance(error, CompileTimeout) and (timeout is None or (under is not None and timeout > under))
        if time.monotonic() < expiry and not longer:
            raise error.with_traceback(None)
        del _failures[key]
    return None


def _store(key: tuple, compiled: CompiledConstraint) -> None:
    """Cache ``compiled``, then drop the least recently used entries over the count or byte
    bound (the newest entry stays even when it alone is over). Holds ``_cache_lock``."""
    global _cache_bytes
    if key in _cache:
        _cache_bytes -= _cache[key].program.nbytes
    _cache[key] = compiled
    _cache_bytes += compiled.program.nbytes
    while len(_cache) > 1 and (len(_cache) > CACHE_SIZE or _cache_bytes > CACHE_BYTES):
        _, dropped = _cache.popitem(last=False)
        _cache_bytes -= dropped.program.nbytes


def _remember_failure(key: tuple, error: CompileError, timeout: float | None) -> None:
    """Cache a refusal (a timeout only for ``TIMEOUT_TTL_S``). Holds ``_cache_lock``."""
    ttl = TIMEOUT_TTL_S if isinstance(error, CompileTimeout) else float("inf")
    _failures[key] = (error, time.monotonic() + ttl, timeout)
    _failures.move_to_end(key)
    while len(_failures) > FAILURE_CACHE_SIZE:
        _failures.popitem(last=False)


def cache_info() -> dict[str, int]:
    """How many constraints and bytes of engine programs are cached, and how many refusals."""
    with _cache_lock:
        return {"entries": len(_cache), "bytes": _cache_bytes, "failures": len(_failures)}


def clear_cache() -> None:
    """Forget every compiled constraint and cached refusal."""
    global _cache_bytes
    with _cache_lock:
        _cache.clear()
        _failures.clear()
        _cache_bytes = 0


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
    budget = _Budget(timeout)
    for name in order:
        for use_rewrite in (False, True):
            if budget.spent():
                break
            if use_rewrite:
                if not (rewrite and isinstance(spec, JsonSchema)):
                    break
                if not rules:  # the first refusal: rewrite once, reuse for every engine
                    tick = time.perf_counter()
                    rewritten, rules = _rewrite(spec, failures, budget)
                    rewrite_seconds = time.perf_counter() - tick
                if rewritten is None:
                    break
            engine_spec = rewritten if use_rewrite and rewritten is not None else spec
            start = time.perf_counter() - (rewrite_seconds if use_rewrite else 0.0)
            try:
                program = _attempt(name, engine_spec, vocabulary, policy, budget.share(last=name == order[-1]))
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
    if budget.spent() and not any(isinstance(e, CompileTimeout) for _, e in failures):
        failures.append(("budget", CompileTimeout(f"compile took longer than {timeout:.3g} s (all attempts together)")))
    # A timeout is the verdict when one happened: the engines left untried, or stopped, might
    # have taken the spec with more time, so no refusal can be final (nor cached as final).
    timeouts = [i for i, (_, e) in enumerate(failures) if isinstance(e, CompileTimeout)]
    lead = timeouts[0] if timeouts else 0
    first = failures[lead][1]
    first.attempts = [(n, str(e)) for n, e in failures]  # type: ignore[attr-defined]
    others = [f"{n}: {e}" for i, (n, e) in enumerate(failures) if i != lead]
    if others:
        first.args = (str(first) + "; " + "; ".join(others),)
    raise first


class _Budget:
    """The seconds left of one compile's ``timeout`` (``None``: no limit)."""

    def __init__(self, timeout: float | None) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def share(self, *, last: bool) -> float | None:
        """The time one attempt may take: all that is left for the last engine, half of it for
        one before, so an engine stuck on a spec still leaves the next one time to try."""
        left = self.left()
        return left if left is None or last else left / 2

    def spent(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def _rewrite(spec: JsonSchema, failures: list[tuple[str, CompileError]],
             budget: _Budget) -> tuple[JsonSchema | None, tuple[str, ...]]:
    """The exact rewrite of ``spec`` and the rules that fired; ``None`` when no rule applies or
    the rewrite was refused or ran out of time (the refusal joins ``failures``). ``rules`` is
    non-empty once tried."""
    left = budget.left()
    try:
        if left is None:
            rewrite = rewrite_schema(spec.schema)
        else:  # pure Python: bounded by its own work limits, abandoned past the budget
            rewrite = _run_in_thread(lambda: rewrite_schema(spec.schema), left, "rewrite")
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
    if backend.enforces_timeout:
        return backend.compile(spec, vocabulary, policy, timeout=timeout)
    if timeout is None:
        return backend.compile(spec, vocabulary, policy)
    return _run_in_thread(lambda: backend.compile(spec, vocabulary, policy), timeout, name)


def _run_in_thread(work: Callable[[], T], timeout: float, name: str) -> T:
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
        raise CompileTimeout(f"{name}: compile took longer than {timeout:.3g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["program"]
