"""Closing an answer before ``max_tokens`` cuts it (issue 40): the shortest completion search on
real constraint states, and real-model answers that come back valid, never over budget, marked
``closed_by_budget``, for nested objects, arrays with ``minItems``, strings, a grammar and a tool
call; where no valid ending fits, the answer is cut as before."""

from __future__ import annotations

import json

import jsonschema
import pytest

import cdsl_struct as cs
from cdsl_struct.api import Generator
from cdsl_struct.decoding.budget import closing_order, respell, shortest_completion

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "bio": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
    "home": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "note": {"type": "string"}}, "required": ["name", "bio", "age", "tags", "home"]}
PROMPT = "Describe Ada Lovelace as JSON, with a long bio."


@pytest.fixture(scope="module")
def gen(smollm2, one_torch_thread):
    generator = Generator(smollm2, draft="auto")
    yield generator
    generator.close()


@pytest.mark.parametrize("prefix", ['{', '{"name": "Ada", "bio": "born in 18', '{"name": "A", "bio": "b", "age": 3',
                                    '{"name": "A", "bio": "b", "age": 36, "tags": ["x'])
def test_the_search_finds_a_completion_that_makes_the_output_valid(smollm2, prefix):
    tokenizer = smollm2.tokenizer
    compiled = cs.compile(cs.JsonSchema(PERSON), tokenizer, eos_token_ids=smollm2.eos_token_ids)
    state = compiled.new_state()
    state.advance(tokenizer.encode(prefix, add_special_tokens=False))
    before = state.num_tokens
    completion = shortest_completion(state, 64, closing_order(compiled.vocabulary, compiled.vocab_size))
    assert completion is not None and state.num_tokens == before and not state.is_complete()  # rolled back
    text = prefix + compiled.vocabulary.decode(completion).decode()
    jsonschema.validate(json.loads(text), PERSON)
    state.advance(completion)
    assert state.is_complete()


def test_the_search_says_none_where_nothing_fits(smollm2):
    compiled = cs.compile(cs.JsonSchema(PERSON), smollm2.tokenizer, eos_token_ids=smollm2.eos_token_ids)
    state = compiled.new_state()
    assert shortest_completion(state, 5, closing_order(compiled.vocabulary, compiled.vocab_size)) is None


@pytest.fixture(scope="module")
def natural(gen):
    """The answer's first 91 tokens, cut (decoded once for the module): where it ends by ``length``,
    the whole answer is longer than the tests' largest budget (90), so each budget cuts it."""
    first = gen.generate(PROMPT, schema=PERSON, max_tokens=91, on_budget="cut")
    assert first.finish_reason == "length" and len(first.tokens) == 91
    return first


@pytest.mark.parametrize("budget", [45, 90])
def test_an_answer_over_its_budget_comes_back_closed_and_valid(gen, natural, budget):
    assert len(natural.tokens) > budget  # the budget really cuts this answer
    cut = gen.generate(PROMPT, schema=PERSON, max_tokens=budget, on_budget="cut")
    assert cut.finish_reason == "length" and cut.value is None and not cut.closed_by_budget
    closed = gen.generate(PROMPT, schema=PERSON, max_tokens=budget)  # "auto" closes JSON
    assert closed.finish_reason == "length" and closed.closed_by_budget and closed.complete
    assert len(closed.tokens) <= budget
    jsonschema.validate(closed.value, PERSON)
    assert len(closed.value["tags"]) >= 2 and "city" in closed.value["home"]


def test_a_budget_no_ending_fits_is_cut_as_before(gen):
    result = gen.generate(PROMPT, schema=PERSON, max_tokens=12)
    assert result.finish_reason == "length" and not result.complete and not result.closed_by_budget


def test_a_pydantic_answer_closes_into_its_model(gen):
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        landmarks: list[str]

    result = gen.generate("Describe Paris and ten of its landmarks.", schema=City, max_tokens=40)
    assert result.closed_by_budget and isinstance(result.value, City) and len(result.tokens) <= 40
    assert result.value.landmarks  # the model's own items, the list closed after them


def test_a_grammar_answer_closes(gen):
    result = gen.generate("Compute 12 plus 7 times 3, written as a long expression.", grammar="arithmetic",
                          max_tokens=6)
    assert len(result.tokens) <= 6
    if result.closed_by_budget:
        assert result.complete and result.value is not None


def test_a_tool_call_cut_before_its_arguments_leaks_no_markup(gen):
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return ""

    result = gen.generate("What's the weather in Paris?", tools=[get_weather], tool_choice="required", max_tokens=8)
    assert result.finish_reason == "length" and not result.complete
    assert not result.content and "<tool_call>" not in (result.content or "")


def test_a_tool_call_cut_short_closes_into_a_call(gen):
    def get_weather(city: str, unit: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name, in full.
            unit: celsius or fahrenheit.
        """
        return ""

    result = gen.generate("What's the weather in the city of Paris, in celsius?", tools=[get_weather],
                          tool_choice="required", max_tokens=28, on_budget="close")
    assert len(result.tokens) <= 28
    assert result.closed_by_budget and result.tool_calls and result.tool_calls[0].name == "get_weather"
    assert set(result.tool_calls[0].arguments) == {"city", "unit"}


def test_an_ending_is_respelled_in_the_tokenizers_own_tokens(smollm2):
    compiled = cs.compile(cs.JsonSchema(PERSON), smollm2.tokenizer, eos_token_ids=smollm2.eos_token_ids)
    state = compiled.new_state()
    found = shortest_completion(state, 64, closing_order(compiled.vocabulary, compiled.vocab_size))
    spelled = respell(state, found, b"")
    assert len(spelled) < len(found) and state.num_tokens == 0
    assert b" " not in compiled.vocabulary.decode(spelled)  # JSON: no whitespace outside strings
    state.advance(spelled)
    assert state.is_complete()
    jsonschema.validate(json.loads(compiled.vocabulary.decode(spelled)), PERSON)


def test_a_json_ending_keeps_the_whitespace_inside_a_string(smollm2):
    compiled = cs.compile(cs.JsonSchema(PERSON), smollm2.tokenizer, eos_token_ids=smollm2.eos_token_ids)
    state = compiled.new_state()
    prefix = '{"name": "Ada Lovelace'
    state.advance(smollm2.tokenizer.encode(prefix, add_special_tokens=False))
    found = shortest_completion(state, 64, closing_order(compiled.vocabulary, compiled.vocab_size))
    spelled = respell(state, found, prefix.encode())
    value = json.loads(prefix + compiled.vocabulary.decode(spelled).decode())
    assert value["name"] == "Ada Lovelace"


REVIEW = {"type": "object", "properties": {
    "sentiment": {"enum": ["positive", "negative", "mixed"]}, "rating": {"type": "integer"},
    "summary": {"type": "string"}}, "required": ["sentiment", "rating", "summary"], "additionalProperties": False}


def test_while_closing_the_model_still_chooses_an_enum_member(gen):
    prompt = "Review: 'Terrible. It broke on day one and support never answered.' Extract the sentiment."
    natural = gen.generate(prompt, schema=REVIEW, max_tokens=200, on_budget="cut")
    assert natural.complete and natural.value["sentiment"] == "negative"
    compiled = cs.compile(cs.JsonSchema(REVIEW), gen.tokenizer, eos_token_ids=gen.loaded.eos_token_ids)
    state = compiled.new_state()
    shortest = respell(state, shortest_completion(state, 64, closing_order(compiled.vocabulary,
                                                                            compiled.vocab_size)), b"")
    assert json.loads(compiled.vocabulary.decode(shortest))["sentiment"] != "negative"
    # a budget the shortest ending barely fits: the row closes from its first token
    closed = gen.generate(prompt, schema=REVIEW, max_tokens=len(shortest) + 1, on_budget="close")
    assert closed.closed_by_budget and closed.complete and len(closed.tokens) <= len(shortest) + 1
    assert closed.value["sentiment"] == "negative"  # the model's member, not the shortest ending's


@pytest.mark.parametrize("method", ["cdlh", "cdsl"])
def test_reward_steered_rows_close_too(gen, natural, method):
    """CDLH and CDSL rows step their own lookahead programs; near the end of the budget the closer
    steps them as it steps a target row."""
    budget = 45
    assert len(natural.tokens) > budget
    closed = gen.generate(PROMPT, schema=PERSON, max_tokens=budget, keywords=["mathematician"], method=method)
    assert closed.method == method
    assert closed.finish_reason == "length" and closed.closed_by_budget and closed.complete
    assert len(closed.tokens) <= budget
    jsonschema.validate(closed.value, PERSON)


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _fence(schema: dict) -> cs.StructuralTag:
    return cs.StructuralTag([cs.Tag("```json\n", schema, "\n```")], triggers=["```"], at_least_one=True)


def test_the_search_opens_a_structural_tag_that_must_still_be_written(smollm2):
    """In free text no closing token ranks first: the tag's begin is tried as one move."""
    tokenizer = smollm2.tokenizer
    tag = _fence(CITY)
    compiled = cs.compile(tag, tokenizer, eos_token_ids=smollm2.eos_token_ids)
    state = compiled.new_state()
    state.advance(tokenizer.encode("The weather in Paris is mild today and", add_special_tokens=False))
    ranks = closing_order(compiled.vocabulary, compiled.vocab_size)
    assert shortest_completion(state, 24, ranks) is None  # token by token it never finds the trigger
    openers = [compiled.vocabulary.encode(text) for text in tag.openers()]
    completion = shortest_completion(state, 24, ranks, openers=openers)
    assert completion is not None and not state.is_complete()  # rolled back
    (segment,) = tag.parse("The weather in Paris is mild today and" + compiled.vocabulary.decode(completion).decode())
    jsonschema.validate(segment.value, CITY)


def test_a_structural_tag_never_written_closes_into_one(gen):
    result = gen.generate("Write a short story about a cat.", grammar=_fence(CITY), max_tokens=40)
    assert result.finish_reason == "length" and result.closed_by_budget and result.complete
    assert len(result.tokens) <= 40
    (segment,) = result.value
    jsonschema.validate(segment.value, CITY)


@pytest.mark.parametrize("where", ["sparse", "dense", "a key", "in a string"])
def test_the_closing_order_picks_the_allowed_tokens_that_rank_first(smollm2, where):
    import numpy as np

    from cdsl_struct.constraints.mask import allocate_bitmask, set_bit
    from cdsl_struct.decoding.budget import closing_ranks

    compiled = cs.compile(cs.JsonSchema(PERSON), smollm2.tokenizer, eos_token_ids=smollm2.eos_token_ids)
    size, eos = compiled.vocab_size, smollm2.eos_token_ids
    mask = allocate_bitmask(size)
    if where in ("sparse", "dense"):
        rng = np.random.default_rng(7)
        chosen = rng.choice(size, 40 if where == "sparse" else size // 2, replace=False)
        for token in [*chosen.tolist(), *eos]:
            set_bit(mask, token)
    else:
        state = compiled.new_state()
        state.advance(smollm2.tokenizer.encode('{"name": "A' if where == "in a string" else '{"name": "A", "',
                                               add_special_tokens=False))
        state.fill_mask(mask)
    bits = np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")[:size]
    allowed = [t for t in np.flatnonzero(bits).tolist() if t not in eos]
    ranks = closing_ranks(compiled.vocabulary, size)
    expected = sorted(allowed, key=lambda t: (ranks[t], t))[:6]
    order = closing_order(compiled.vocabulary, size)
    assert order.first_allowed(mask.numpy().view(np.uint32), 6) == expected


def test_rows_of_one_schema_take_the_ending_found_from_the_start_once(gen, monkeypatch):
    from cdsl_struct.decoding import budget

    schema = {"type": "object", "properties": {"city": {"type": "string"}, "landmarks": {
        "type": "array", "items": {"type": "string"}, "minItems": 1}}, "required": ["city", "landmarks"]}
    searches: list[int] = []
    real = budget.shortest_completion

    def counted(state, *args, **kwargs):
        searches.append(state.num_tokens)
        return real(state, *args, **kwargs)

    monkeypatch.setattr(budget, "shortest_completion", counted)
    first = gen.generate("Describe Paris and ten of its landmarks.", schema=schema, max_tokens=30)
    from_start = searches.count(0)
    second = gen.generate("Describe Paris and ten of its landmarks.", schema=schema, max_tokens=30)
    assert from_start == 1 and searches.count(0) == 1  # the second row searched only after writing
    assert first.closed_by_budget and second.text == first.text
    jsonschema.validate(second.value, schema)


@pytest.mark.parametrize("name", ["gemma", "hermes"])
def test_calls_the_model_keeps_writing_close_in_its_format(gen, name):
    """SmolLM2 writes the same call again and again: the run of forced tokens that opens the next
    call must not carry the row past the point to close (hermes), and forced tokens that complete
    a call must not let the model open another that cannot close in time (gemma's fences)."""
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return ""

    result = gen.generate("What is the weather in Paris?", tools=[get_weather], tool_choice="required",
                          max_tokens=60, tool_format=name, on_budget="close")
    assert len(result.tokens) <= 60 and result.finish_reason == "length"
    assert result.complete and result.closed_by_budget and result.tool_calls, result.text
    assert all(call.name == "get_weather" and "city" in call.arguments for call in result.tool_calls)


def test_a_sentence_closes_at_its_end_in_one_token(smollm2):
    """In a sentence ``"`` and ``,`` are allowed anywhere and end nothing: the prose order tries a
    sentence's end first, where JSON's order never finds one within its nodes."""
    from cdsl_struct.keywords import SENTENCE

    compiled = cs.compile(SENTENCE, smollm2.tokenizer, eos_token_ids=smollm2.eos_token_ids)
    state = compiled.new_state()
    state.advance(smollm2.tokenizer.encode("The dog rode home, then", add_special_tokens=False))
    assert shortest_completion(state, 24, closing_order(compiled.vocabulary, compiled.vocab_size)) is None
    completion = shortest_completion(state, 24, closing_order(compiled.vocabulary, compiled.vocab_size, prose=True))
    assert compiled.vocabulary.decode(completion) == b"."


def test_a_keyword_sentence_cut_by_the_budget_is_closed_as_a_sentence(gen):
    result = gen.generate("Write a long sentence about a dog.", keywords=["dog", "walk"], max_tokens=10)
    assert result.closed_by_budget and result.complete and result.finish_reason == "length"
    assert result.text.endswith((".", "!", "?")) and len(result.tokens) <= 10
    assert result.value == result.text


PLANETS = {"type": "object", "properties": {"planets": {"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "moons": {"type": "integer"}},
    "required": ["name", "moons"], "additionalProperties": False}}}, "required": ["planets"],
    "additionalProperties": False}


@pytest.mark.parametrize("budget", range(50, 111, 15))
def test_a_list_closes_at_every_budget_though_one_token_opens_another_item(gen, budget):
    """After an item, ``, {`` lengthens the shortest ending from two tokens to ten: without a look at the
    next token's ending, a row whose ending fitted went on past the point where any could (cut, unclosed)."""
    prompt = [{"role": "user", "content": "List the planets of the solar system and their moons."}]
    result = gen.generate(prompt, schema=PLANETS, max_tokens=budget, method="target")
    assert result.complete and len(result.tokens) <= budget, result.text
    jsonschema.validate(result.value, PLANETS)
    assert result.finish_reason == "stop" or result.closed_by_budget
