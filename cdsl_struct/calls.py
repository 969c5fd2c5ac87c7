"""A ``generate`` call resolved: what a request decodes under and how (``Call``), and the
helpers that read a call's arguments into it (the constraint, the reward, the prompts) and its
Result back (tool calls). ``Generator`` (``api.py``) uses them; they hold no model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .constraints import Choice, CompiledConstraint, ConstraintSpec, Grammar, JsonSchema, Regex
from .constraints.reasoning import Reasoning
from .constraints.specs import as_spec
from .decoding import SamplingParams
from .decoding.penalties import Penalties
from .errors import CdslError, InvalidArgument
from .options import Method, one_constraint
from .params import GenerationParams
from .result import Result, parse_value
from .rewards import KeywordCoverage, Reward, WeightedMean
from .rewards.base import as_reward
from .streaming import partial_calls_reader, partial_reader
from .tools import InvalidToolCall, ToolRequest, parse_tool_output

KEYWORD_MAX_REPEATS = 2
"""``keywords=``: each keyword may appear this often before repeats lower the reward (stuffing never scores)."""



@dataclass(frozen=True)
class Call:
    """One ``generate`` call, resolved: what to decode under, how, and for how long."""

    compiled: CompiledConstraint
    method: Method
    """``params.method`` resolved for this Generator (never ``AUTO``)."""
    params: GenerationParams
    sampling: SamplingParams
    reward: Reward | None = None
    tools: ToolRequest | None = None
    system: str | None = None
    answer_format: ConstraintSpec | None = None
    """With tools: the spec of an answer that is not a call (``schema=`` beside ``tools``)."""
    reasoning: Reasoning | None = None
    """Think first, then answer under ``compiled`` (``reasoning=``)."""

    @property
    def penalties(self) -> Penalties | None:
        return Penalties(self.params.presence_penalty, self.params.frequency_penalty) \
            if self.params.penalised else None


def budget_mode(call: Call) -> str:
    """``close`` or ``cut`` for ``call`` (``GenerationParams.on_budget``; ``auto``: close JSON and
    grammar answers; cut tool calls, whose closing would invent arguments an agent might run)."""
    mode = call.params.on_budget
    if mode == "auto":
        closable = call.tools is None and isinstance(call.compiled.spec, (JsonSchema, Grammar))
        return "close" if closable else "cut"
    return mode


def partial_reader_for(call: Call) -> Callable[[str], Any] | None:
    """How a stream of ``call`` reads partial values: its JSON schema's, or under tools the calls
    begun so far with their partial arguments."""
    if call.tools is not None:
        return partial_calls_reader(call.tools.format)
    return partial_reader(call.compiled.spec)


def answer_spec(*, schema: Any, regex: Any, choices: Any, grammar: Any) -> ConstraintSpec | None:
    """The hard constraint named by at most one of the arguments (None: free text)."""
    one_constraint({"schema": schema, "regex": regex, "choices": choices, "grammar": grammar})
    if schema is not None:
        return as_spec(schema)
    if regex is not None:
        if isinstance(regex, Regex):
            return regex
        if not isinstance(regex, str):
            raise ValueError(f"regex must be a string, got {type(regex).__name__}")
        return Regex(regex)
    if choices is not None:
        if isinstance(choices, Choice):
            return choices
        if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) \
                or not all(isinstance(c, str) for c in choices):
            raise ValueError("choices must be a list of strings")
        return Choice(choices)
    if grammar is not None:
        if isinstance(grammar, Grammar):
            return grammar
        if not isinstance(grammar, (str, Path)):
            raise ValueError("grammar must be Lark text, a .lark path or a shipped grammar's name")
        return Grammar(grammar)
    return None


def read_calls(tools: ToolRequest, answer: ConstraintSpec | None, result: Result) -> Result:
    """``result`` split into content and calls; a complete output's value is its calls (or, with no
    call, its answer, parsed by the answer format when there is one)."""
    complete = result.complete
    try:
        output = parse_tool_output(tools, result.text, complete=complete)
    except InvalidToolCall:  # cannot happen under the constraint; never pass it on as valid
        complete = False
        output = parse_tool_output(tools, result.text, complete=False)
    value = None
    if complete:
        value = output.calls or (parse_value(answer, output.content or "") if answer else output.content)
    return replace(result, content=output.content, tool_calls=output.calls, complete=complete, value=value)


def reward_for(keywords: Any, reward: Any) -> Reward | None:
    rewards: list[Reward] = []
    if keywords is not None:
        if isinstance(keywords, (str, bytes)) or not all(isinstance(w, str) for w in keywords) or not keywords:
            raise ValueError("keywords must be a non-empty list of words")
        rewards.append(KeywordCoverage(keywords, max_repeats=KEYWORD_MAX_REPEATS))
    if reward is not None:
        if not callable(reward):
            raise ValueError("reward must be a Reward or a function fn(text, final) -> float")
        rewards.append(as_reward(reward))
    if not rewards:
        return None
    return rewards[0] if len(rewards) == 1 else WeightedMean(rewards)


def split_batch(prompt: Any) -> tuple[list[Any], bool]:
    """(prompts, is_batch): a string or a message list is one prompt; a list of them a batch."""
    if isinstance(prompt, str):
        return [prompt], False
    if not isinstance(prompt, Sequence) or not prompt:
        raise ValueError("prompt must be a string, a non-empty list of messages, or a list of prompts")
    if all(isinstance(p, dict) for p in prompt):
        return [prompt], False
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, (list, tuple)) for p in prompt):
        return list(prompt), True
    raise ValueError("a list prompt must hold only messages (dicts), only strings, or only message lists")


def deprecated_shape(prompt: Any, stream: bool) -> str | None:
    """The deprecation message for a ``generate`` call in one of the old shapes (None: the new one)."""
    if stream:
        return ("generate(..., stream=True) is deprecated; use stream(prompt, ...), a TextStream that yields the "
                "text deltas and holds the Result in .result")
    try:
        batch = split_batch(prompt)[1]
    except ValueError:  # a bad prompt: generate() says so
        return None
    return ("generate(list_of_prompts) is deprecated; use generate_batch(prompts, ...), which always returns "
            "a list of Results") if batch else None


@contextmanager
def named_errors(param: str, named_first: str | None = None) -> Iterator[None]:
    """Re-raise a plain ``ValueError`` from the block as ``InvalidArgument`` naming ``param`` (or
    ``named_first`` when the message starts with that name)."""
    try:
        yield
    except (InvalidArgument, CdslError):
        raise
    except ValueError as exc:
        name = named_first if named_first and str(exc).startswith(named_first) else param
        raise InvalidArgument(str(exc), param=name) from exc
