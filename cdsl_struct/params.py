"""``GenerationParams``: how one request decodes (method, budget, sampling, stops, penalties,
logprobs), frozen and validated in one place.

``Generator.generate`` takes one (or the same names as keyword arguments), the server's protocol
layer builds one per request, a ``cdsl-struct batch`` job carries one to every row (and to Ray
actors, as a plain dict), and ``cdsl-struct generate`` / ``batch`` build theirs from the same
command-line options. Light (no torch), so the CLI builds its parsers without loading a model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from typing_extensions import TypedDict

from .errors import InvalidArgument
from .options import METHODS, Method

MAX_STOPS = 4
"""Stop strings one request may give (OpenAI's limit)."""
MAX_TOP_LOGPROBS = 20
"""The most alternatives ``logprobs`` may ask for per token (OpenAI's limit)."""
DEFAULT_MAX_TOKENS = 256
"""``max_tokens`` of a request that names none."""


#: what ``GenerationParams.on_budget`` takes
ON_BUDGET = ("auto", "close", "cut")


@dataclass(frozen=True)
class GenerationParams:
    """How one request decodes. Built once, checked once, never changed (``replace`` makes a new one).

    ``method``: ``"auto"`` (CDSL with a reward and a draft, CDLH with a reward and no draft, else
    speculative with a draft, else target), ``"target"``, ``"speculative"``, ``"cdlh"``, ``"cdsl"``
    (a string is read as its ``Method``). ``max_tokens``: the output's budget (>= 1).
    ``temperature``: 0 is greedy, above it samples with ``top_p`` in (0, 1] and ``seed`` (any
    integer; None draws one). ``stop``: up to four non-empty strings (one string is one stop).
    ``presence_penalty`` / ``frequency_penalty``: in [-2, 2], as OpenAI's. ``logprobs``: record each
    token's log-probability and that many alternatives (0 to 20; None records none). ``on_budget``:
    what happens when ``max_tokens`` would cut a constrained answer: ``"close"`` ends it validly a
    little early where a valid ending fits (``Result.closed_by_budget``; ``decoding.budget``),
    ``"cut"`` stops where the budget ends, ``"auto"`` closes JSON and grammar answers and cuts the
    rest (free text, regexes, choices, and tool calls: closing one invents arguments an agent might
    run; ``"close"`` asks for it). Target and speculative decoding close; CDLH/CDSL cut.

    Every bad value raises ``InvalidArgument`` naming the field.
    """

    method: Method = Method.AUTO
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    on_budget: str = "auto"

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "method", Method.parse(self.method))
        except ValueError as exc:
            raise InvalidArgument(str(exc), param="method") from None
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}", param="max_tokens")
        _check_number("temperature", self.temperature, low=0.0)
        _check_number("top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        for name in ("presence_penalty", "frequency_penalty"):
            _check_number(name, getattr(self, name), low=-2.0, high=2.0)
        if self.seed is not None and not _is_int(self.seed):
            raise InvalidArgument(f"seed must be an integer, got {self.seed!r}", param="seed")
        if self.on_budget not in ON_BUDGET:
            raise InvalidArgument(f"on_budget must be one of {', '.join(ON_BUDGET)}, got {self.on_budget!r}",
                                  param="on_budget")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise InvalidArgument(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}] or None, "
                                  f"got {self.logprobs!r}", param="logprobs")

    @classmethod
    def of(cls, params: GenerationParams | None = None, **changes: Any) -> GenerationParams:
        """``params`` (default: the defaults) with ``changes`` applied; an unknown name is an
        ``InvalidArgument`` that lists the known ones."""
        unknown = sorted(set(changes) - FIELD_NAMES)
        if unknown:
            raise InvalidArgument(f"unknown generation parameter {unknown[0]!r}; the parameters are "
                                  f"{', '.join(sorted(FIELD_NAMES))}", param=unknown[0])
        base = params if params is not None else cls()
        if not isinstance(base, GenerationParams):
            raise InvalidArgument(f"params must be a GenerationParams, got {type(base).__name__}", param="params")
        return replace(base, **changes) if changes else base

    @property
    def penalised(self) -> bool:
        """Whether a presence or frequency penalty applies."""
        return bool(self.presence_penalty or self.frequency_penalty)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able): what ``from_dict`` reads back."""
        data = asdict(self)
        data["method"] = self.method.value
        data["stop"] = list(self.stop)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationParams:
        """The params ``to_dict`` wrote (unknown keys are an ``InvalidArgument``)."""
        return cls.of(None, **data)


FIELD_NAMES = frozenset(f.name for f in fields(GenerationParams))


class ParamOverrides(TypedDict, total=False):
    """``GenerationParams``' fields as keyword arguments (``Generator.generate(max_tokens=...)``)."""

    method: str | Method
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: str | list[str] | tuple[str, ...] | None
    presence_penalty: float
    frequency_penalty: float
    logprobs: int | None


def add_param_arguments(parser: Any) -> None:
    """The command-line options of ``GenerationParams`` (``generate`` and ``batch`` share them)."""
    defaults = GenerationParams()
    parser.add_argument("--method", default=defaults.method.value, choices=METHODS,
                        help="decoder (default auto: with --keywords cdsl, or cdlh under --draft none; else "
                             "speculative, or target under --draft none)")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens,
                        help=f"most tokens to generate (default {defaults.max_tokens})")
    parser.add_argument("--temperature", type=float, default=defaults.temperature,
                        help="0 is greedy (default); above 0 samples")
    parser.add_argument("--top-p", type=float, default=defaults.top_p, help="nucleus mass when sampling (default 1)")
    parser.add_argument("--seed", type=int, default=None, help="random seed when sampling")
    parser.add_argument("--stop", action="append", default=None, metavar="TEXT",
                        help=f"end the output at this text where the constraint allows (repeatable, "
                             f"at most {MAX_STOPS})")
    parser.add_argument("--presence-penalty", type=float, default=0.0, help="in [-2, 2], as OpenAI's (default 0)")
    parser.add_argument("--frequency-penalty", type=float, default=0.0, help="in [-2, 2], as OpenAI's (default 0)")
    parser.add_argument("--on-budget", default=defaults.on_budget, choices=ON_BUDGET,
                        help="an answer --max-tokens would cut: close ends it validly a little early, cut stops "
                             "it; auto (default) closes JSON and grammar answers")


def params_from_args(args: Any) -> GenerationParams:
    """The ``GenerationParams`` the options of ``add_param_arguments`` were parsed into."""
    return GenerationParams(method=args.method, max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, seed=args.seed, stop=tuple(args.stop or ()),
                            presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                            on_budget=getattr(args, "on_budget", "auto"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_number(name: str, value: Any, *, low: float, high: float = math.inf, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < low or (low_open and value == low) or value > high:
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]" if high != math.inf else f">= {low:g}"
        raise InvalidArgument(f"{name} must be a finite number {'in ' if high != math.inf else ''}{bounds}, "
                              f"got {value!r}", param=name)


def _stop_strings(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, (list, tuple)) else None
    if stops is None or not all(isinstance(s, str) and s for s in stops):
        raise InvalidArgument("stop must be a non-empty string or a list of non-empty strings", param="stop")
    if len(stops) > MAX_STOPS:
        raise InvalidArgument(f"at most {MAX_STOPS} stop strings are allowed, got {len(stops)}", param="stop")
    return stops
