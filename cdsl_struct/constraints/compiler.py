"""``compile()``: spec + tokenizer -> cached, thread-safe ``CompiledConstraint``.

Compile once per (spec, vocabulary, backend, whitespace); make one cheap ``ConstraintState``
per sequence with ``new_state()``. ``backend="auto"`` tries the engines in the order that suits
the spec and falls back to the next one on a compile error or timeout; which engine was used,
and why others were skipped, is on the compiled object.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import CompileError, CompileTimeout
from .backends import BACKEND_NAMES, EngineProgram, get_backend
from .specs import ConstraintSpec, as_spec
from .state import ConstraintState
from .vocabulary import TokenVocabulary
from .whitespace import WhitespacePolicy

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
    whitespace: str | WhitespacePolicy = "compact",
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
    fails, the first engine's error is raised with ``.attempts`` listing all of them.
    """
    spec = as_spec(spec)
    vocabulary = (
        tokenizer if isinstance(tokenizer, TokenVocabulary)
        else TokenVocabulary.from_tokenizer(tokenizer, eos_token_ids)
    )
    policy = WhitespacePolicy.parse(whitespace)
    if backend == "auto":
        order = AUTO_ORDER[spec.kind]
    elif backend in BACKEND_NAMES:
        order = (backend,)
    else:
        raise ValueError(f"unknown backend {backend!r}; choose auto, {', '.join(BACKEND_NAMES)}")

    if not cache:
        return _compile_uncached(spec, vocabulary, order, policy, timeout)
    key = (spec.key, vocabulary.fingerprint, backend, policy.key)
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
            compiled = _compile_uncached(spec, vocabulary, order, policy, timeout)
        finally:
            with _cache_lock:
                _key_locks.pop(key, None)
        with _cache_lock:
            _cache[key] = compiled
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
) -> CompiledConstraint:
    failures: list[tuple[str, CompileError]] = []
    for name in order:
        start = time.perf_counter()
        try:
            program = _run_with_timeout(
                lambda name=name: get_backend(name).compile(spec, vocabulary, policy), timeout, name
            )
        except CompileError as exc:
            failures.append((name, exc))
            continue
        return CompiledConstraint(
            spec=spec,
            vocabulary=vocabulary,
            backend=name,
            whitespace=policy,
            compile_seconds=time.perf_counter() - start,
            program=program,
            skipped=[(n, str(e)) for n, e in failures],
        )
    first = failures[0][1]
    first.attempts = [(n, str(e)) for n, e in failures]  # type: ignore[attr-defined]
    if len(failures) > 1:
        first.args = (str(first) + "; " + "; ".join(f"{n}: {e}" for n, e in failures[1:]),)
    raise first


def _run_with_timeout(work: Any, timeout: float | None, name: str) -> EngineProgram:
    """Run an engine compile; give up after ``timeout`` seconds.

    Engines cannot be interrupted, so a timed-out compile keeps running in its daemon thread
    and its result is dropped. (``cdsl-struct bench maskbench`` isolates cases in worker
    processes that it can kill.) Any exception an engine raises becomes a ``CompileError``.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["program"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    if timeout is None:
        target()
    else:
        thread = threading.Thread(target=target, name=f"cdsl-compile-{name}", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            raise CompileTimeout(f"{name}: compile took longer than {timeout:g} s")
    if "error" in outcome:
        error = outcome["error"]
        if isinstance(error, CompileError):
            raise error
        raise CompileError(f"{name}: {type(error).__name__}: {error}") from error
    return outcome["program"]
