"""Every Python snippet of README.md runs as documented, on the embedded model (SmolLM2-135M).

Each fenced ```` ```python ```` block of README.md is run statement by statement, as a reader would
paste it; the value of each expression statement is kept (a ``TextStream`` is read to its end
and kept as its deltas and its Result; another iterator as its items), and ``CASES`` checks what
README says of it: a Person instance, a ``lark.Tree``, a list of
``ToolCall``, the finish reason.

Conventions, for the few snippets that cannot run alone:

- ``<!-- readme-test: skip (why) -->`` on the line before the fence: not run here (it needs
  something the test machine lacks, such as vLLM). Keep these few.
- ``<!-- readme-test: continues -->`` on the line before the fence: the snippet runs on from the
  names the previous snippet left (README's engine snippet uses the model and constraint the
  decoding snippet made).
- Names a snippet leaves to its reader (a function of theirs, a list of prompts, a model's
  ``logits``) are given by its case here (``Case.given``), made from the embedded model.

Every snippet that runs needs a case, found by a fragment of its text: a new snippet fails
``test_every_readme_snippet_has_a_case`` until it has one. ``load_model("smollm2")`` gives the
model the session already loaded (the snippets load it three times otherwise); everything else runs
as written.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lark
import pytest

from cdsl_struct.keywords import SENTENCE
from cdsl_struct.streaming import TextStream

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*(skip|continues)\b.*?-->")


@dataclass
class Snippet:
    """One ```python block of README.md."""

    code: str
    line: int
    mark: str | None
    """``"skip"``, ``"continues"`` or None (the marker on the line before the fence)."""


def readme_snippets() -> list[Snippet]:
    """README.md's Python snippets, in order."""
    lines = README.read_text(encoding="utf-8").splitlines()
    found: list[Snippet] = []
    index = 0
    while index < len(lines):
        if lines[index].strip() == "```python":
            start = index + 1
            end = next(i for i in range(start, len(lines)) if lines[i].strip() == "```")
            before = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
            marker = MARKER.search(before)
            found.append(Snippet("\n".join(lines[start:end]) + "\n", start + 1, marker.group(1) if marker else None))
            index = end
        index += 1
    return found


class Values:
    """The value of each expression statement a snippet ran, found by a fragment of its source."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []

    def of(self, fragment: str) -> Any:
        """The value of the one expression statement whose source holds ``fragment``."""
        matches = [value for source, value in self.items if fragment in source]
        assert len(matches) == 1, f"{len(matches)} statements hold {fragment!r}"
        return matches[0]


def run_snippet(snippet: Snippet, namespace: dict[str, Any]) -> Values:
    """Run ``snippet`` in ``namespace`` statement by statement; the expression statements' values."""
    values = Values()
    tree = ast.parse(snippet.code, filename=f"README.md:{snippet.line}")
    for statement in tree.body:
        source = ast.get_source_segment(snippet.code, statement) or ""
        where = f"README.md:{snippet.line + statement.lineno - 1}"
        if isinstance(statement, ast.Expr):
            value = eval(compile(ast.Expression(statement.value), where, "eval"), namespace)  # noqa: S307
            if isinstance(value, TextStream):  # read as README's reader would, to its end
                value = (list(value), value.result)
            elif hasattr(value, "__next__"):
                value = list(value)
            values.items.append((source, value))
        else:
            exec(compile(ast.Module([statement], type_ignores=[]), where, "exec"), namespace)  # noqa: S102
    return values


# --- what README says of each snippet -----------------------------------------------------------


@dataclass
class Case:
    """What one snippet needs and what README says it gives."""

    fragment: str
    """Text found in this snippet only."""
    check: Callable[[dict[str, Any], Values], None]
    given: Callable[[Any], dict[str, Any]] = field(default=lambda lm: {})
    """Names the snippet leaves to its reader, made from the loaded embedded model."""


def check_generate(ns: dict[str, Any], values: Values) -> None:
    import cdsl_struct as cs

    person = ns["Person"]
    r = ns["r"]
    assert r.finish_reason == "stop" and isinstance(values.of("r.value"), person)  # "a Person instance"
    text, reason, stats = values.of("r.text, r.finish_reason")
    assert text == r.text and reason == "stop" and stats["tokens"] == len(r.tokens)
    date = values.of("regex=")
    assert date.finish_reason == "stop" and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", date.value)
    assert values.of('cs.generate("Is it positive?"') in ("yes", "no")
    assert isinstance(values.of('grammar="arithmetic"'), lark.Tree)  # "a lark.Tree"
    text, report = values.of("r4.text, r4.keywords")  # "one finished sentence", every word covered
    assert ns["r4"].method == "cdsl" and ns["r4"].complete and re.fullmatch(SENTENCE.pattern, text)
    assert report.covered == ("dog", "ride", "walk") and not report.missing
    calls = values.of("tools=[get_weather]")
    assert calls and all(isinstance(c, cs.ToolCall) for c in calls) and calls[0].name == "get_weather"
    assert [type(r) for r in values.of('gen.generate_batch(["prompt 1", "prompt 2"]')] == [cs.Result] * 2
    deltas, last = values.of("gen.stream(")  # "a TextStream: str deltas, then .result"
    assert all(isinstance(d, str) for d in deltas) and isinstance(last, cs.Result)
    assert "".join(deltas) == last.text
    streamed = ns["s"]  # the with-block's TextStream, iterated to its end
    assert isinstance(streamed, cs.TextStream) and isinstance(ns["piece"], str)
    assert streamed.result.finish_reason in ("stop", "length") and streamed.result.text.endswith(ns["piece"])
    thought, person_after = values.of("r2.reasoning, r2.value")  # "the thinking, then a Person"
    assert isinstance(thought, str) and isinstance(person_after, person) and ns["r2"].finish_reason == "stop"
    closed, reason, closed_value = values.of("r3.closed_by_budget, r3.finish_reason, r3.value")
    assert closed is True and reason == "length" and isinstance(closed_value, person)
    assert len(ns["r3"].tokens) <= 10
    answer = values.of("asyncio.run(gen.agenerate(")
    assert isinstance(answer, cs.Result) and answer.value in ("yes", "no")


def given_constraint_api(lm: Any) -> dict[str, Any]:
    import torch
    from pydantic import BaseModel

    class MyPydanticModel(BaseModel):
        name: str

    opening = lm.tokenizer.encode("{", add_special_tokens=False)
    return {"MyPydanticModel": MyPydanticModel, "logits": torch.zeros(len(lm.tokenizer)),
            "token_id": opening[0], "token_ids": lm.tokenizer.encode('"name": "Ada"}', add_special_tokens=False),
            "n": 1}


def check_constraint_api(ns: dict[str, Any], values: Values) -> None:
    logits = ns["logits"]
    assert values.of("state.validate(") == len(ns["token_ids"])  # the rest of the object: every token accepted
    allowed = ~logits.isinf()
    assert 0 < int(allowed.sum()) < logits.numel()  # the mask kept only the tokens the JSON may start with
    assert isinstance(values.of("state.forced_tokens()"), list)


def given_decoding(lm: Any) -> dict[str, Any]:
    return {"schema": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                       "required": ["name", "age"]},
            "messages": [{"role": "user", "content": "Ada Lovelace was 36. Extract the person."}]}


def check_decoding(ns: dict[str, Any], values: Values) -> None:
    value, reason, _ = values.of("result.value, result.finish_reason")
    assert reason == "stop" and set(value) == {"name", "age"}


def given_engine(lm: Any) -> dict[str, Any]:
    asks = [[{"role": "user", "content": f"{who} was {age}. Extract the person."}]
            for who, age in (("Ann", 3), ("Bo", 5))]
    return {"prompts": [lm.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)["input_ids"]
                        for m in asks]}


def check_engine(ns: dict[str, Any], values: Values) -> None:
    import cdsl_struct as cs

    results = ns["results"]
    assert len(results) == 2 and all(isinstance(r, cs.Result) for r in results)
    assert all(r.finish_reason in ("stop", "length") for r in results)
    ns["engine"].close()


def given_transformers(lm: Any) -> dict[str, Any]:
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    tokenizer = lm.tokenizer
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                           tokenize=False)
             for prompt in ("Ada Lovelace was 36. Extract the person.", "How old was Ada Lovelace? She was 36.")]
    return {"Person": Person, "tokenizer": tokenizer, "model": lm.model,
            "inputs": tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)}


def check_transformers(ns: dict[str, Any], values: Values) -> None:
    person, number = ns["texts"]
    ns["Person"].model_validate_json(person)  # a row under a pydantic model: a Person's JSON
    assert re.fullmatch(r"[0-9]{1,3}", number)


def check_outlines(ns: dict[str, Any], values: Values) -> None:
    import cdsl_struct as cs

    assert values.of('to_spec(Literal["yes", "no"])') == cs.Choice(["yes", "no"])
    email = values.of("to_spec(types.email)")
    assert isinstance(email, cs.Regex) and email.pattern == ns["types"].email.pattern  # "exactly Outlines' pattern"
    listed = values.of("to_spec(list[int])")
    assert isinstance(listed, cs.Regex) and re.fullmatch(listed.pattern, "[1, 2]")


CASES = [
    Case('grammar="arithmetic"', check_generate),
    Case("state.fill_mask(row)", check_constraint_api, given_constraint_api),
    Case("decode(target, compiled, prompt", check_decoding, given_decoding),
    Case("engine = BatchEngine(", check_engine, given_engine),
    Case("**constrained(constraints)", check_transformers, given_transformers),
    Case("to_spec(types.email)", check_outlines),
]


def case_of(snippet: Snippet) -> Case:
    found = [case for case in CASES if case.fragment in snippet.code]
    assert len(found) == 1, f"README.md:{snippet.line}: {len(found)} cases match this snippet; give it one"
    return found[0]


SNIPPETS = readme_snippets()
RUN = [s for s in SNIPPETS if s.mark != "skip"]


def test_every_readme_snippet_has_a_case():
    assert len(SNIPPETS) >= 6
    assert len(SNIPPETS) - len(RUN) <= 2, "keep the snippets that cannot run here few"
    for snippet in RUN:
        case_of(snippet)
    assert SNIPPETS[0].mark != "continues"


@pytest.fixture(scope="module")
def embedded(smollm2, one_torch_thread):
    """``load_model`` and ``cs.generate`` as the snippets call them, giving the session's model; the
    Generators they make are closed at the end."""
    import cdsl_struct.api as api
    import cdsl_struct.models.loading as loading
    import cdsl_struct.verbs as verbs

    real = loading.load_model

    def load_model(name: Any = "smollm2", *args: Any, device: Any = "auto", dtype: Any = "auto", **kw: Any) -> Any:
        same = name == "smollm2" and not args and not kw and device == "auto" and dtype == "auto"
        return smollm2 if same else real(name, *args, device=device, dtype=dtype, **kw)

    made_before = set(verbs._generators)
    patch = pytest.MonkeyPatch()
    patch.setattr(loading, "load_model", load_model)
    patch.setattr(api, "load_model", load_model)
    namespaces: dict[int, dict[str, Any]] = {}
    yield namespaces
    patch.undo()
    for namespace in namespaces.values():
        if hasattr(namespace.get("gen"), "close"):
            namespace["gen"].close()
    for key in set(verbs._generators) - made_before:
        verbs._generators.pop(key).close()


@pytest.mark.parametrize("snippet", RUN, ids=[f"line{s.line}" for s in RUN])
def test_readme_snippet_runs_as_documented(snippet, embedded, smollm2):
    position = SNIPPETS.index(snippet)
    namespace: dict[str, Any] = {"__name__": "readme"}
    if snippet.mark == "continues":
        previous = SNIPPETS[position - 1]
        if position - 1 not in embedded:
            test_readme_snippet_runs_as_documented(previous, embedded, smollm2)
        namespace = dict(embedded[position - 1])
    case = case_of(snippet)
    namespace.update(case.given(smollm2))
    values = run_snippet(snippet, namespace)
    embedded[position] = namespace
    case.check(namespace, values)
