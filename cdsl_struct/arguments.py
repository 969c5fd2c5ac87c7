"""A ``generate`` call's arguments read without a model (``read_arguments``): the parameters, the
reward, the tools and the hard constraint, checked and parsed, so a bad spec raises its typed error
before anything loads. Imports neither torch nor transformers; ``calls`` and ``Generator`` build on it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .constraints import Choice, ConstraintSpec, Grammar, Regex
from .constraints.reasoning import Reasoning
from .constraints.specs import as_spec
from .errors import CdslError, InvalidArgument
from .keywords import Keywords
from .options import Method, one_constraint
from .params import GenerationParams
from .rewards import Reward, WeightedMean
from .rewards.base import as_reward
from .tools import ToolRequest, tool_request
from .tools.formats import GENERIC, ToolFormat, resolve_format


@dataclass(frozen=True)
class Arguments:
    """What a ``generate`` call's arguments mean without a model: its decoding parameters, its reward,
    its hard constraint (None: free text; with keywords and nothing else, their form's), its tools
    (None: no call can be made; written in the format given, else the generic one), its reasoning and
    its keyword request. ``read_arguments`` makes one."""

    params: GenerationParams
    reward: Reward | None
    spec: ConstraintSpec | None
    tools: ToolRequest | None
    reasoning: Reasoning | None
    keywords: Keywords | None = None


def read_arguments(*, schema: Any = None, regex: Any = None, choices: Any = None, grammar: Any = None,
                   keywords: Any = None, reward: Any = None, tools: Any = None, tool_choice: Any = "auto",
                   parallel_tool_calls: bool = True, tool_format: Any = None, reasoning: Any = None,
                   params: GenerationParams | None = None, **overrides: Any) -> Arguments:
    """Read and check everything of a ``generate`` call that needs no model: parameters, method name,
    reward, tool definitions and choice (``tool_format``: a ``ToolFormat`` or a name; else the generic
    format), tool format name, the constraint (a regex, a Lark grammar and
    a JSON Schema are parsed here) and reasoning. Raises the typed error the call would (the
    ``CompileError`` subclasses, ``InvalidArgument``), so a bad spec fails before a model loads."""
    chosen = GenerationParams.of(params, **overrides)
    with named_errors("method"):
        Method.parse(chosen.method)
    with named_errors("keywords"):
        wanted = Keywords.of(keywords)
    with named_errors("reward"):
        steer = reward_for(wanted, reward, prose=schema is None and tools is None,
                           json=schema is not None and tools is None)
    written = tool_format if isinstance(tool_format, ToolFormat) else \
        GENERIC if tool_format in (None, "auto") else resolve_format(tool_format)
    with named_errors("tools", "tool_choice"):
        calls = tool_request(tools, tool_choice, parallel_tool_calls, written)
    spec = answer_spec(schema=schema, regex=regex, choices=choices, grammar=grammar)
    if spec is None and calls is None and wanted is not None:
        spec = wanted.constraint
    with named_errors("reasoning"):
        thinking = Reasoning.of(reasoning)
    return Arguments(chosen, steer, spec, calls, thinking, wanted)


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


def reward_for(keywords: Keywords | None, reward: Any, prose: bool = True, json: bool = False) -> Reward | None:
    """The reward that steers a call: the keywords' coverage, the user's reward, or their mean.
    ``prose``: the answer is text, not JSON (a schema's or a tool call's), whose commas make no list;
    ``json``: a schema's JSON, whose string values are judged so (``Keywords.reward``)."""
    rewards: list[Reward] = []
    if keywords is not None:
        rewards.append(keywords.reward(prose, json))
    if reward is not None:
        if not callable(reward):
            raise InvalidArgument("reward must be a Reward or a function fn(text, final) -> float", param="reward")
        rewards.append(as_reward(reward))
    if not rewards:
        return None
    return rewards[0] if len(rewards) == 1 else WeightedMean(rewards)


def split_batch(prompt: Any) -> tuple[list[Any], bool]:
    """(prompts, is_batch): a string or a message list is one prompt; a list of them a batch."""
    if isinstance(prompt, str):
        return [prompt], False
    if not isinstance(prompt, Sequence) or not prompt:
        raise InvalidArgument("prompt must be a string, a non-empty list of messages, or a list of prompts",
                              param="prompt")
    if all(isinstance(p, dict) for p in prompt):
        return [prompt], False
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, (list, tuple)) for p in prompt):
        return list(prompt), True
    raise InvalidArgument("a list prompt must hold only messages (dicts), only strings, or only message lists",
                          param="prompt")


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
