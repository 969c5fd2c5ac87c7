"""The string guard: a JSON string value whose model moves on to a closing bracket is ended there, in a
schema's answer and in a tool call's arguments (where ``</`` ends it too)."""

import json
import random
from types import SimpleNamespace

import pytest
import torch
from pydantic import BaseModel

from cdsl_struct.api import Generator
from cdsl_struct.constraints import JsonSchema, Regex, compile
from cdsl_struct.constraints.mask import allocate_bitmask, apply_bitmask
from cdsl_struct.decoding.strings import (
    MAX_NUMBER_DIGITS,
    REPEATED_ITEMS,
    JsonScan,
    MarkedScan,
    StringMoves,
    guard_strings,
    guarded,
    move_to_quote,
    new_scan,
    reads_json,
    string_moves,
    string_tokens,
)
from cdsl_struct.options import Method
from cdsl_struct.rewards.keywords import json_string_values
from cdsl_struct.tools import ToolCallsGrammar, tool_request
from cdsl_struct.tools.formats import FORMATS


def _value_open(prefix: str) -> bool:
    """The reference: the text ends inside a string value (not a key) with no bracket of its own open."""
    values = json_string_values(prefix)
    if not values or values[-1][1]:  # an unclosed value can only be the one the text ends in
        return False
    text = values[-1][0]
    return sum(text.count(c) for c in "{[") <= sum(text.count(c) for c in "}]")


def _random_json(rng: random.Random, depth: int = 0) -> object:
    kind = rng.choice(["str", "num", "obj", "arr"] if depth < 3 else ["str", "num"])
    if kind == "str":
        return "".join(rng.choice('ab {}[]",:\\ é') for _ in range(rng.randint(0, 8)))
    if kind == "num":
        return rng.randint(-50, 50)
    if kind == "obj":
        return {"".join(rng.choice('k{"}:,') for _ in range(rng.randint(1, 4))): _random_json(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def test_the_scan_knows_an_open_value_from_a_key_and_a_value_with_brackets_of_its_own():
    rng = random.Random(0)
    for _ in range(300):
        text = json.dumps(_random_json(rng), ensure_ascii=False, separators=rng.choice([(",", ":"), (", ", ": ")]))
        scan = JsonScan()
        for end, char in enumerate(text):
            assert scan.value_open == _value_open(text[:end]), text[:end]
            scan.feed(char.encode())
    for prefix, open_ in [('{"a": "London', True), ('{"a', False), ('{"a": "x {y', False), ('{"a": "{y}', True),
                          ('{"a": "]', True), ('["x", "y', True), ('{"a": ["b', True), ('{"a": "q\\"', True),
                          ('{"a": "x"', False)]:
        scan = JsonScan()
        scan.feed(prefix.encode())
        assert scan.value_open is open_, prefix


def test_the_quote_and_the_closing_brackets_of_a_vocabulary(vocab_of):
    vocabulary = vocab_of("smollm2")
    tokens = string_tokens(vocabulary)
    assert string_tokens(vocabulary) is tokens  # built once
    assert vocabulary.token_bytes[tokens.quote] == b'"'
    closers = {vocabulary.token_bytes[t] for t in tokens.closers.tolist()}
    assert {b" }", b"}", b"]", b" ]", b" },"} <= closers
    assert not closers & {b'"', b'"}', b",", b" ,", b"{"}
    opens = {vocabulary.token_bytes[t] for t in tokens.opens.tolist()}
    assert {b'"]', b'"}', b'"},'} <= opens and not opens & {b'"', b'",', b"]", b'""'}


def test_the_move_puts_the_closers_probability_on_the_quote_and_nothing_where_the_quote_is_refused(vocab_of):
    vocabulary = vocab_of("smollm2")
    tokens = string_tokens(vocabulary)
    compiled = compile(JsonSchema({"type": "object", "properties": {"a": {"type": "string", "minLength": 3}},
                                   "required": ["a"]}), vocabulary)
    masks = []
    for text in ('{"a": "Lon', '{"a": "L'):  # the quote allowed; not yet (minLength)
        state = compiled.new_state()
        for token in vocabulary.encode(text):
            state.advance(token)
        mask = allocate_bitmask(compiled.vocab_size)
        state.fill_mask(mask)
        masks.append(mask)
    logits = torch.randn(2, compiled.vocab_size, generator=torch.Generator().manual_seed(1))
    apply_bitmask(logits, torch.stack(masks))
    host = logits.clone().numpy()
    before = torch.softmax(logits, -1)
    moved = logits.clone()
    move_to_quote(moved, StringMoves([0, 1]), tokens)
    move_to_quote(host, StringMoves([0, 1]), tokens)
    assert torch.allclose(torch.from_numpy(host), moved, atol=1e-5)  # the same on either path
    after = torch.softmax(moved, -1)
    closers = tokens.closers
    assert after[0, tokens.quote] == pytest.approx(float(before[0, tokens.quote] + before[0, closers].sum()), rel=1e-4)
    assert torch.all(after[0, closers] == 0)
    assert torch.equal(moved[1], logits[1])  # the quote refused there: nothing moves, nothing is allowed
    assert torch.equal(torch.isfinite(moved[0]) | (torch.isfinite(logits[0])), torch.isfinite(logits[0]))


def test_a_step_moves_exactly_at_the_positions_inside_a_value(vocab_of):
    vocabulary = vocab_of("smollm2")
    session = SimpleNamespace(compiled=compile(JsonSchema({"type": "object"}), vocabulary),
                              output=vocabulary.encode('{"city": "Lon'), json_scan=None)
    proposed = vocabulary.encode('don", "x": "y')
    rows = string_moves(session, proposed, start=10).rows
    texts = [vocabulary.decode(session.output + proposed[:i]).decode() for i in range(len(proposed) + 1)]
    assert rows == [10 + i for i, text in enumerate(texts) if _value_open(text)] and rows[0] == 10
    assert session.json_scan.fed == len(session.output)  # the output is read once; the proposal is not kept
    session.output = session.output + proposed[:2]  # two of them committed: read on from there
    assert string_moves(session, proposed[2:], start=0).rows == [row - 12 for row in rows if row >= 12]
    assert not string_moves(session, proposed, start=0).tag_rows  # ``</`` ends nothing in a schema's answer
    starts = string_moves(session, proposed[2:], start=0).start_rows  # where a string may open: outside one
    assert starts == [i for i, text in enumerate(texts[2:]) if text.count('"') % 2 == 0 and text.rstrip()[-1] == ":"]
    assert starts  # after ``"x":`` (a value may start), not after a key or a value
    assert guarded(session)
    assert not guarded(SimpleNamespace(compiled=compile(Regex("[a-z]+"), vocabulary)))
    # an output type that writes JSON: ``list[str]`` is an Outlines regex of a JSON array
    typed = SimpleNamespace(compiled=compile(list[str], vocabulary), output=vocabulary.encode('["Lon'), json_scan=None)
    assert guarded(typed) and string_moves(typed, [], start=0).rows == [0]


class _Person(BaseModel):
    name: str
    age: int
    city: str


def _without_and_with_the_guard(smollm2, prompt: str, schema, max_tokens: int):
    """The answer without the guard and with it, and with it under speculation (prompt lookup), which must
    choose the same tokens as target-only."""
    bare = Generator(smollm2, draft=None, string_guard=False).generate(prompt, schema=schema, max_tokens=max_tokens)
    ended = Generator(smollm2, draft=None).generate(prompt, schema=schema, max_tokens=max_tokens)
    fast = Generator(smollm2).generate(prompt, schema=schema, max_tokens=max_tokens, method="speculative")
    assert fast.text == ended.text
    return bare, ended


def test_a_city_the_model_leaves_open_is_ended_where_it_moves_on(smollm2, one_torch_thread):
    prompt = "Ada Lovelace was 36 and lived in London. Extract the person."
    swallowed, ended = _without_and_with_the_guard(smollm2, prompt, _Person, 40)
    assert '"London }' in swallowed.text and swallowed.finish_reason == "length"  # the failure, without the guard
    assert ended.finish_reason == "stop" and ended.value.city == "London"
    assert ended.text.endswith('"London" }')


def test_program_rows_are_guarded_too_and_the_generator_says_whether(smollm2, one_torch_thread):
    from cdsl_struct.decoding.lookahead import CDSL

    built = CDSL(torch.nn.Linear(1, 1), lambda text, final: 1.0, string_guard=True)
    assert built.draft.string_guard and built.cdlh.string_guard  # the draft and fallback it builds
    prompt = "Ada Lovelace was 36 and lived in London. Extract the person."
    generator = Generator(smollm2)
    for method in ("cdlh", "cdsl"):  # a flat reward: the target's own choices, as a plain row's
        result = generator.generate(prompt, schema=_Person, method=method, reward=lambda text, final: 1.0,
                                    max_tokens=30)
        assert result.finish_reason == "stop" and result.value.city == "London", (method, result.text)
    assert Generator(smollm2, draft=None, string_guard=False)._strategy(
        SimpleNamespace(method=Method.CDLH, reward=lambda text, final: 1.0, keywords=None)).string_guard is False


def test_guarding_one_position_of_a_program(vocab_of):
    vocabulary = vocab_of("smollm2")
    tokens = string_tokens(vocabulary)
    session = SimpleNamespace(compiled=compile(JsonSchema({"type": "object"}), vocabulary),
                              output=vocabulary.encode('{"city": "Lon'), json_scan=None)
    row = torch.zeros(session.compiled.vocab_size)
    guard_strings(session, vocabulary.encode("don"), row, last_only=True)  # inside the value: moved
    assert row[tokens.closers].eq(-float("inf")).all() and row[tokens.quote] > 0
    row = torch.zeros_like(row)
    guard_strings(session, vocabulary.encode('don", "x": 1'), row, last_only=True)  # outside it: untouched
    assert row.eq(0).all()
    guard_strings(session, vocabulary.encode('don", "x":'), row, last_only=True)  # a value may start: ``"]`` ends
    assert row[tokens.closers].eq(0).all() and row[tokens.opens].eq(-float("inf")).all()
    assert row[tokens.quote] > 0 and (row == 0).sum() == row.numel() - len(tokens.opens) - 1


@pytest.mark.parametrize(("text", "number", "digits"), [
    ('{"a": -12', True, 2), ('{"a": -1.5e+10', True, 4), ('{"a": 12, ', False, 2), ('{"a": 12 ', False, 2),
    ('{"a": true', False, 0), ('{"a": "1234', False, 0), ('[1, 22, 333', True, 3), ('{"e": 7}', False, 1),
])
def test_the_scan_counts_the_digits_of_the_number_being_written(text, number, digits):
    scan = JsonScan()
    scan.feed(text.encode())
    assert (scan.number, scan.digits) == (number, digits)
    assert not scan.number_long
    scan.feed(b"9" * MAX_NUMBER_DIGITS)
    assert scan.number_long == (not scan.in_string), text  # a string's digits are text


def _numbers_and_arrays(value: object, numbers: list[int], arrays: list[tuple[frozenset, int]]) -> None:
    """The reference: each number's digits in the order JSON writes them, and each array's string and
    object items (as the guard compares them) and repeats in the order its ``]`` comes."""
    if isinstance(value, dict):
        for item in value.values():
            _numbers_and_arrays(item, numbers, arrays)
    elif isinstance(value, list):
        seen, repeated = set(), 0
        for item in value:
            _numbers_and_arrays(item, numbers, arrays)
            if isinstance(item, str):
                key = json.dumps(item, ensure_ascii=False)[1:-1].casefold().strip(" .,!?;:").encode()  # as written
            elif isinstance(item, dict):  # as written, whitespace outside strings aside, ASCII lower-cased
                key = json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode().lower()
            else:
                continue
            repeated += key in seen
            seen.add(key)
        arrays.append((frozenset(seen), repeated))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        numbers.append(sum(ch.isdigit() for ch in json.dumps(value)))


def _repeating_json(rng: random.Random, depth: int = 0) -> object:
    kind = rng.choice(["str", "num", "obj", "arr", "arr"] if depth < 3 else ["str", "num"])
    if kind == "str":
        return rng.choice(["Ana", "ana!", " Bo", "bo", 'x"y', "\\n", "é", ""])
    if kind == "num":
        return rng.choice([rng.randint(-10 ** 20, 10 ** 20), rng.random() * 10 ** rng.randint(0, 25), 7])
    if kind == "obj":
        return {rng.choice(["a", "B", "c"]) + str(i): _repeating_json(rng, depth + 1) for i in range(rng.randint(0, 3))}
    return [_repeating_json(rng, depth + 1) for _ in range(rng.randint(0, 6))]


def test_the_scan_counts_every_numbers_digits_and_every_arrays_repeats_as_json_holds_them():
    rng = random.Random(5)
    for _ in range(300):
        value = _repeating_json(rng)
        text = json.dumps(value, ensure_ascii=False, separators=rng.choice([(",", ":"), (", ", ": ")]))
        numbers, arrays = [], []
        _numbers_and_arrays(value, numbers, arrays)
        scan, seen_numbers, seen_arrays = JsonScan(), [], []
        for char in text:
            if not scan.in_string and scan.number and char in ",]} ":
                seen_numbers.append(scan.digits)
                assert scan.number_long == (scan.digits >= MAX_NUMBER_DIGITS)
            if not scan.in_string and char == "]":
                seen_arrays.append(scan.items[-1])
                assert scan.looping == (scan.items[-1][1] >= REPEATED_ITEMS)
            scan.feed(char.encode())
        if scan.number:  # a number alone
            seen_numbers.append(scan.digits)
        assert (seen_numbers, seen_arrays) == (numbers, arrays), text


def test_a_long_numbers_digits_are_kept_off_only_where_something_else_is_allowed(vocab_of):
    vocabulary = vocab_of("smollm2")
    tokens = string_tokens(vocabulary)
    compiled = compile(JsonSchema({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
                       vocabulary)
    session = SimpleNamespace(compiled=compiled, output=vocabulary.encode('{"n": ' + "1" * MAX_NUMBER_DIGITS),
                              json_scan=None)
    assert string_moves(session, [], start=0).number_rows == [0]
    state = compiled.new_state()
    state.advance(session.output)
    mask = allocate_bitmask(compiled.vocab_size)
    state.fill_mask(mask)
    logits = torch.randn(2, compiled.vocab_size, generator=torch.Generator().manual_seed(3))
    apply_bitmask(logits, torch.stack([mask, mask]))
    only_digits = torch.full_like(logits[1], float("-inf"))
    only_digits[tokens.digits] = logits[1, tokens.digits]
    logits[1] = only_digits  # a mask that lets the number only go on (a minimum it has not reached)
    guarded_rows, host = logits.clone(), logits.clone().numpy()
    move_to_quote(guarded_rows, StringMoves(number_rows=[0, 1]), tokens)
    move_to_quote(host, StringMoves(number_rows=[0, 1]), tokens)
    assert torch.equal(torch.from_numpy(host), guarded_rows)
    ending = torch.isfinite(guarded_rows[0]).nonzero().flatten().tolist()
    assert ending and all(vocabulary.token_bytes[t][:1] not in b"0123456789.eE+-" for t in ending)  # ", }"
    assert torch.isfinite(logits[0, tokens.digits]).any()  # digits were allowed there, and are off now
    assert torch.isfinite(logits[1]).any() and torch.equal(guarded_rows[1], logits[1])  # nothing else: unchanged


def test_the_scan_counts_an_arrays_repeated_items_and_where_it_loops():
    assert REPEATED_ITEMS == 2
    scan = JsonScan()
    scan.feed(b'{"a": ["Denzel!", "x", " denzel", {"k": ["x", "x"]}, "y", "x')  # the inner array counts its own
    assert len(scan.items) == 2 and scan.items[1][1] == 1 and not scan.looping
    assert scan.item == b"x" and scan.item_looping  # closed here, "x" would be the second repeat
    scan.feed(b'y')
    assert not scan.item_looping
    scan.feed(b'", "x"')
    assert scan.looping and scan.item_done and not scan.in_string
    scan.feed(b" ")
    assert scan.item_done  # whitespace keeps the place after the item
    scan.feed(b"]")
    assert not scan.looping and not scan.item_done and scan.items == [None]
    keys = JsonScan()
    keys.feed(b'{"a": 1, "a": 2, "a": 3, "b": [1, 1, 1]')  # keys and numbers are no string items
    assert not keys.looping


def test_a_looping_arrays_comma_moves_onto_its_bracket_and_a_fused_closing_quote_onto_the_quote(vocab_of):
    vocabulary = vocab_of("smollm2")
    tokens = string_tokens(vocabulary)
    assert vocabulary.token_bytes[tokens.bracket] == b"]"
    assert all(vocabulary.token_bytes[t].lstrip()[:1] == b"," for t in tokens.commas.tolist())
    assert {vocabulary.encode(text)[0] for text in ('",', '", "')} <= set(tokens.quote_commas.tolist())
    compiled = compile(JsonSchema({"type": "array", "items": {"type": "string"}}), vocabulary)
    after, inside = vocabulary.encode('["a", "b", "a", "a"'), vocabulary.encode('["a", "b", "a", "a')
    for output, name in ((after, "array_rows"), (inside, "item_rows")):
        session = SimpleNamespace(compiled=compiled, output=output, json_scan=None)
        assert getattr(string_moves(session, [], start=0), name) == [0]
    masks = []
    for output in (after, inside):
        state = compiled.new_state()
        state.advance(output)
        mask = allocate_bitmask(compiled.vocab_size)
        state.fill_mask(mask)
        masks.append(mask)
    logits = torch.randn(2, compiled.vocab_size, generator=torch.Generator().manual_seed(4))
    apply_bitmask(logits, torch.stack(masks))
    moves = StringMoves(array_rows=[0], item_rows=[1])
    moved, host = logits.clone(), logits.clone().numpy()
    move_to_quote(moved, moves, tokens)
    move_to_quote(host, moves, tokens)
    assert torch.allclose(torch.from_numpy(host), moved, atol=1e-5)
    before, now = torch.softmax(logits, -1), torch.softmax(moved, -1)
    assert torch.all(now[0, tokens.commas] == 0) and torch.all(now[1, tokens.quote_commas] == 0)
    assert now[0, tokens.bracket] == pytest.approx(float(before[0, tokens.bracket] + before[0, tokens.commas].sum()),
                                                   rel=1e-4)
    assert now[1, tokens.quote] == pytest.approx(float(before[1, tokens.quote] + before[1, tokens.quote_commas].sum()),
                                                 rel=1e-4)


def test_a_list_the_model_loops_in_ends(smollm2, one_torch_thread):
    """``"items": ["Bread", "Bread", "Bread", "Eggs", "Eggs", "Bread", ...`` to ``max_tokens`` before."""
    schema = {"type": "object", "properties": {"owner": {"type": "string"},
                                               "items": {"type": "array", "items": {"type": "string"}}},
              "required": ["owner", "items"], "additionalProperties": False}
    prompt = "Shopping list for Sofia: butter, beans, onions, pasta.\n\nWhat is the shopping list?"
    looped, ended = _without_and_with_the_guard(smollm2, prompt, schema, 96)
    assert looped.finish_reason == "length"
    assert ended.finish_reason == "stop" and ended.value["owner"] == "Sofia", ended.text
    items = ended.value["items"]
    assert len(items) - len({item.casefold() for item in items}) == REPEATED_ITEMS


def test_an_arrays_objects_count_as_items_whitespace_and_ascii_case_aside():
    scan = JsonScan()
    scan.feed(b'{"a": [{"n": "Mars", "m": {"k": [1]}}, { "n" : "MARS", "m": {"k": [ 1 ]} }, {"n": "Mars ", "m": {}}')
    assert scan.items[-1][1] == 1 and scan.item_done and not scan.looping  # "Mars " differs inside its string
    scan.feed(b', {"n": "mars", "m": {"k": [1]}')
    assert scan.record_looping and not scan.looping  # closed here, it would be the second repeat
    scan.feed(b" ")
    assert scan.record_looping
    scan.feed(b"}")
    assert scan.looping and scan.item_done and not scan.record_looping
    scan.feed(b', {"n": "x", "m": "}')
    assert not scan.record_looping  # inside a string
    last = JsonScan()
    last.feed(b'[{"n": "a"}, {"n": "b"}, {"n": "a"}, {"n": "a')
    assert last.record_string_looping and not last.record_looping  # ``"}`` here would be the second repeat
    last.feed(b"b")
    assert not last.record_string_looping
    inner = JsonScan()
    inner.feed(b'{"o": {"n": 1}, "p": {"n": 1}, "q": {"n": 1')
    assert inner.records == [None, None] and not inner.record_looping  # objects outside arrays are no items


def test_a_looping_arrays_fused_closing_brace_moves_onto_the_brace(vocab_of):
    vocabulary = vocab_of("smollm2")
    tokens = string_tokens(vocabulary)
    assert vocabulary.token_bytes[tokens.brace] == b"}" and vocabulary.token_bytes[tokens.quote_brace] == b'"}'
    fused = {vocabulary.token_bytes[t] for t in tokens.brace_commas.tolist()}
    assert {b"},", b" },"} <= fused and all(raw.strip()[:1] == b"}" and b"," in raw for raw in fused)
    assert {vocabulary.token_bytes[t] for t in tokens.quote_brace_commas.tolist()} == {b'"},'}
    schema = {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "string"}}}}
    compiled = compile(JsonSchema(schema), vocabulary)
    outputs = ('[{"n": "a"}, {"n": "b"}, {"n": "a"}, {"n": "a"', '[{"n": "a"}, {"n": "b"}, {"n": "a"}, {"n": "a')
    masks = []
    for output, name in zip(outputs, ("object_rows", "object_string_rows"), strict=True):
        session = SimpleNamespace(compiled=compiled, json_scan=None, output=vocabulary.encode(output))
        assert getattr(string_moves(session, [], start=0), name) == [0]
        state = compiled.new_state()
        state.advance(session.output)
        mask = allocate_bitmask(compiled.vocab_size)
        state.fill_mask(mask)
        masks.append(mask)
    logits = torch.randn(2, compiled.vocab_size, generator=torch.Generator().manual_seed(6))
    apply_bitmask(logits, torch.stack(masks))
    moves = StringMoves(object_rows=[0], object_string_rows=[1])
    moved, host = logits.clone(), logits.clone().numpy()
    move_to_quote(moved, moves, tokens)
    move_to_quote(host, moves, tokens)
    assert torch.allclose(torch.from_numpy(host), moved, atol=1e-5)
    before, now = torch.softmax(logits, -1), torch.softmax(moved, -1)
    for row, fused_ids, plain in ((0, tokens.brace_commas, tokens.brace), (1, tokens.quote_brace_commas,
                                                                           tokens.quote_brace)):
        assert before[row, fused_ids].sum() > 0 and torch.all(now[row, fused_ids] == 0)
        assert now[row, plain] == pytest.approx(float(before[row, plain] + before[row, fused_ids].sum()), rel=1e-4)


def test_a_list_of_records_the_model_loops_in_ends(smollm2, one_torch_thread):
    """``{"name": "Uranus", ...}, {"name": "Neptune", ...}, {"name": "Pluto", ...}, {"name": "Uranus", ...`` to
    ``max_tokens`` before."""
    planet = {"type": "object", "properties": {"name": {"type": "string"}, "moons": {"type": "integer"}},
              "required": ["name", "moons"]}
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": planet}}, "required": ["items"]}
    looped, ended = _without_and_with_the_guard(smollm2, "Give me the planets of the solar system as JSON.", schema,
                                                200)
    assert looped.finish_reason == "length"
    assert ended.finish_reason == "stop", ended.text
    names = [item["name"] for item in ended.value["items"]]
    assert len(names) - len(set(names)) == REPEATED_ITEMS and names[-2:] == ["Uranus", "Neptune"]


class _City(BaseModel):
    name: str
    country: str
    population: int


def test_a_number_the_model_runs_on_with_is_ended(smollm2, one_torch_thread):
    """``"population": 1111111100000000111111110111...`` to ``max_tokens`` without the guard."""
    bare, ended = _without_and_with_the_guard(smollm2, "Tell me about Paris as JSON.", _City, 60)
    assert bare.finish_reason == "length" and len(str(bare.value.population)) > MAX_NUMBER_DIGITS  # closed late
    assert ended.finish_reason == "stop" and len(str(ended.value.population)) == MAX_NUMBER_DIGITS


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_check.sh runs it)")
def test_the_move_on_a_gpu_equals_the_cpus_and_never_waits_for_it(vocab_of):
    tokens = string_tokens(vocab_of("smollm2"))
    logits = torch.randn(6, 49152, generator=torch.Generator().manual_seed(2))
    logits[3, tokens.quote] = -float("inf")  # a row whose quote the mask refused
    on_host = logits.clone()
    moves = StringMoves([0, 3, 5], [3, 5], [1, 2], [4], item_rows=[0, 5], array_rows=[2])
    move_to_quote(on_host, moves, tokens)
    on_card = logits.cuda()
    torch.cuda.set_sync_debug_mode("error")
    try:
        move_to_quote(on_card, moves, tokens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.allclose(on_card.cpu(), on_host, atol=1e-5) and torch.equal(on_card[3].cpu(), logits[3])


_TOOLS = [{"type": "function", "function": {"name": "send_email", "parameters": {"type": "object", "properties": {
    "to": {"type": "string"}, "body": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "meta": {"type": "object"}}}}}]


def _calls_text(fmt, free: str, calls: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """A tool output in ``fmt`` after ``free`` text, and where each call's JSON lies in it."""
    pieces, spans, at = [free, fmt.open], [], len(free) + len(fmt.open)
    for i, call in enumerate(calls):
        if i:
            pieces.append(fmt.separator)
            at += len(fmt.separator)
        if fmt.name_then is not None:
            head, body = call["name"] + fmt.name_then, json.dumps(call["arguments"], ensure_ascii=False)
        else:
            head = ""
            body = json.dumps({"name": call["name"], fmt.arguments_key: call["arguments"]}, ensure_ascii=False)
        if fmt.trigger_in_call and not i:  # the call's JSON starts with the trigger: ``open`` is empty
            assert body.startswith(fmt.trigger)
        pieces += [head, body]
        spans.append((at + len(head), at + len(head) + len(body)))
        at += len(head) + len(body)
    return "".join(pieces) + fmt.close, spans


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_calls_scan_reads_only_the_calls_json_in_every_format(name):
    fmt = FORMATS[name]
    calls = [{"name": "send_email", "arguments": {"to": "a}b@x.org", "body": 'Hi <b>all</b>, "q" {x} [1]',
                                                  "tags": ["p", "q}"], "meta": {"k": "v"}}},
             {"name": "send_email", "arguments": {"to": "tom@x.org", "body": "Hello"}}]
    for mode, free, answer in (("auto", 'Sure: {"x": "y" and [z ', None), ("call", "", None),
                               ("auto", "", {"type": "object"})):
        request = tool_request(_TOOLS, "required" if mode == "call" else "auto", tool_format=fmt)
        scan = new_scan(ToolCallsGrammar(request, answer_format=answer))
        assert isinstance(scan, MarkedScan)
        text, spans = _calls_text(fmt, free, calls)
        for end, char in enumerate(text):
            inside = next((text[start:end] for start, stop in spans if start <= end < stop), None)
            expected = inside is not None and _value_open(inside)
            assert scan.value_open == expected, (name, mode, text[:end])
            assert scan.tag_open == (expected and "<" not in _open_string(inside)), (name, mode, text[:end])
            scan.feed(char.encode())
    answer_scan = new_scan(ToolCallsGrammar(tool_request(_TOOLS, "auto", tool_format=fmt),
                                            answer_format={"type": "object"}))
    answer_scan.feed(b'{"reply": "Lon')  # an answer in the answer format: JSON from the first byte
    assert answer_scan.value_open and answer_scan.tag_open


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_calls_long_number_is_read_and_the_texts_digits_are_not(name):
    """A number in a call's arguments is ended past ``MAX_NUMBER_DIGITS``; digits in the free text before
    the call, or in a string argument, are text."""
    fmt = FORMATS[name]
    long = "7" * MAX_NUMBER_DIGITS
    calls = [{"name": "send_email", "arguments": {"to": long, "meta": {"n": int(long)}}}]
    text, spans = _calls_text(fmt, f"I have {long} apples ", calls)
    scan = new_scan(ToolCallsGrammar(tool_request(_TOOLS, "auto", tool_format=fmt)))
    number_at = text.index(f'"n": {long}') + len(f'"n": {long}')  # where the number in "meta" has all its digits
    for end, char in enumerate(text):
        assert scan.number_long == (end == number_at), (name, text[:end])
        scan.feed(char.encode())


def _open_string(prefix: str) -> str:
    """The text of the string value ``prefix`` ends in (from its opening quote)."""
    values = json_string_values(prefix)
    return values[-1][0] if values else ""


def test_the_closing_tags_of_a_vocabulary_move_in_calls_only_where_the_string_has_no_tag(vocab_of):
    vocabulary = vocab_of("smollm2")
    tokens = string_tokens(vocabulary)
    tags = {vocabulary.token_bytes[t] for t in tokens.tags.tolist()}
    assert {b"</", b" </"} <= tags and not tags & {b"<", b" <", b"}"}
    logits = torch.randn(3, vocabulary.size, generator=torch.Generator().manual_seed(3))
    host = logits.clone().numpy()
    moved = logits.clone()
    for into in (moved, host):
        move_to_quote(into, StringMoves([0, 1], [1]), tokens)
    assert torch.allclose(torch.from_numpy(host), moved, atol=1e-5)
    before, after = torch.softmax(logits, -1), torch.softmax(moved, -1)
    assert torch.equal(moved[0, tokens.tags], logits[0, tokens.tags])  # a row without tag moves keeps its ``</``
    assert after[1, tokens.quote] == pytest.approx(float(before[1, tokens.quote] + before[1, tokens.closers].sum()
                                                          + before[1, tokens.tags].sum()), rel=1e-4)
    assert torch.equal(moved[2], logits[2])
    request = tool_request(_TOOLS, "required")
    session = SimpleNamespace(compiled=compile(ToolCallsGrammar(request), vocabulary), json_scan=None,
                              output=vocabulary.encode('<tool_call>{"name": "send_email", "arguments": {"body": "Hi'))
    assert guarded(session)
    proposed = vocabulary.encode(' <b>x", "to": "y')
    moves = string_moves(session, proposed, start=0)
    assert moves.rows[0] == 0 and moves.tag_rows[0] == 0  # "Hi: no tag yet
    texts = [vocabulary.decode(session.output + proposed[:i]).decode() for i in range(len(proposed) + 1)]
    assert moves.tag_rows == [i for i in moves.rows if "<" not in _open_string(texts[i].split('"arguments": ', 1)[1])]
    assert len(moves.tag_rows) < len(moves.rows)  # after " <b": a tag of its own


def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name.
        unit: celsius or fahrenheit.
    """


def send_email(to: str, subject: str, body: str) -> str:
    """Send an email.

    Args:
        to: The recipient's address.
        subject: The subject line.
        body: The message.
    """


def search_flights(origin: str, destination: str, date: str) -> str:
    """Search flights.

    Args:
        origin: city of departure
        destination: city of arrival
        date: the day, YYYY-MM-DD
    """


def test_an_argument_the_model_ends_with_the_calls_closing_tag_is_ended_there(smollm2, one_torch_thread):
    prompt = "Send an email to tom@x.org saying hi"
    options = {"tools": [get_weather, send_email, search_flights], "tool_choice": "required", "max_tokens": 96}
    bare = Generator(smollm2, draft=None, string_guard=False).generate(prompt, **options)
    assert "</tool_call>" in bare.tool_calls[0].arguments["subject"]  # the failure, without the guard
    ended = Generator(smollm2, draft=None).generate(prompt, **options)
    assert ended.finish_reason == "stop"
    arguments = ended.tool_calls[0].arguments
    assert arguments["to"] == "tom@x.org" and not any("<" in value for value in arguments.values()), arguments
    fast = Generator(smollm2).generate(prompt, method="speculative", **options)  # the same tokens, speculating
    assert fast.text == ended.text


def test_a_structural_tags_json_contents_are_read_and_nothing_else():
    from cdsl_struct.constraints.structural_tag import StructuralTag, Tag

    spec = StructuralTag([Tag("<city>", {"type": "object"}, "</city>"), Tag("<n>", Regex(r'[0-9{"]+'), "</n>"),
                          Tag("<say>", {"type": "string"}, "</say>")])
    assert reads_json(spec) and not reads_json(StructuralTag([Tag("<n>", Regex("[0-9]+"), "</n>")]))
    pieces = ['Note {"x": "y and <n>', '1{"2', '</n> then <city>', '{"name": "Pa]ris", "k": ["<b>"]}',
              '</city> and <say>', '"hello there"', "</say> bye"]
    text, spans, at = "".join(pieces), [], 0
    for i, piece in enumerate(pieces):
        if i in (3, 5):  # the JSON contents
            spans.append((at, at + len(piece)))
        at += len(piece)
    scan = new_scan(spec)
    for end, char in enumerate(text):
        inside = next((text[start:end] for start, stop in spans if start <= end < stop), None)
        top_string = inside is not None and inside.startswith('"') and inside.count('"') % 2 == 1
        expected = inside is not None and (_value_open(inside) or top_string)
        assert scan.value_open == expected, text[:end]
        assert scan.tag_open == (expected and "<" not in (_open_string(inside) if not top_string else inside)), \
            text[:end]
        scan.feed(char.encode())
