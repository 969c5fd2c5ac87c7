"""A JSON string value that goes round (a run of its words written again) ends where a sentence or
clause of it ends."""

import json
import random
import re

import pytest
import torch

from cdsl_struct.constraints import JsonSchema, compile
from cdsl_struct.constraints.mask import allocate_bitmask, apply_bitmask
from cdsl_struct.decoding.strings import JsonScan, MarkedScan, StringMoves, move_to_quote, string_tokens
from cdsl_struct.decoding.value_words import MIN_REPEAT_LETTERS, REPEATED_WORDS

# outputs SmolLM2-135M wrote in tool calls to ``max_tokens`` (tool-args, ``tune`` split)
_LOOPS = [
    ("The meeting moved to 3pm. Please check the meeting details on the email.com. Please provide the meeting "
     "details for the meeting to be completed. Please provide the meeting details for the meeting to be completed. ",
     "Please provide the meeting details for the meeting to be completed. Please provide the meeting details for "
     "the meeting to be completed."),
    ("john.john.john.email.john.john.john@john.john.john.email", "john.john.john.email.john.john.john@john.john.john."),
    ("SenderInes.m@clinic.pt.SenderInes.m@clinic.pt.SenderInes.m@clinic.pt.", "clinic.pt.SenderInes."),
    ("Sending email to: Omar and Olu. Please enable email forwarding for this message. Sending email to: Omar and "
     "Olu. Please enable", "this message. Sending email to: Omar and Olu."),
]
_NO_LOOPS = [
    "Ada Lovelace was an English mathematician and writer, chiefly known for her work on Charles Babbage's "
    "proposed mechanical general-purpose computer, the Analytical Engine.",
    "Hi Tom, the meeting moved to 3pm. See you there, and bring the slides. Best, Ana",
    "a b a b a b a b a b, a b a b.",  # words in a row, too few letters to count
    "New York, New York, is a song.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10.",
    "Mei.chen@uni.edu sent a message to mei.chen@uni.edu at 3pm. This email was sent to you.",  # an address again
]


def _looped_at(text: str) -> int | None:
    """Where ``text``, the contents of a JSON string value as written (escapes and all), first reads as
    gone round and ended a clause."""
    scan = JsonScan()
    scan.feed(b'{"k": "')
    for at, byte in enumerate(text.encode()):
        scan.feed(bytes((byte,)))
        if scan.value_looped:
            return at
    return None


@pytest.mark.parametrize(("text", "ends"), _LOOPS)
def test_a_value_that_goes_round_ends_after_the_first_clause_of_the_repeat(text, ends):
    at = _looped_at(text)
    assert at is not None and text.encode()[:at + 1].endswith(ends.encode())


@pytest.mark.parametrize("text", _NO_LOOPS)
def test_a_value_that_does_not_go_round_is_left_alone(text):
    assert _looped_at(text) is None


def test_case_escapes_and_other_scripts():
    assert _looped_at("One two three four five. ONE TWO THREE FOUR FIVE.") is not None
    text = "Line one of this text\\nline one of this text\\n"  # an escaped newline ends a line; its ``n`` is no letter
    assert _looped_at(text) == len(text) - 1
    quoted = 'Say \\"one two three four five\\" and \\"one two three four five\\"'
    assert _looped_at(quoted) is None  # ``\\"`` ends no clause
    assert _looped_at("Привет мир как твои дела. Привет мир как твои дела.") is not None


def _reference(prefix: str) -> tuple[bool, bool]:
    """(looped, boundary) of a string value's text ``prefix``: the finished words' runs of
    ``REPEATED_WORDS`` with ``MIN_REPEAT_LETTERS`` letters, one of them seen before."""
    finished = re.findall(r"[A-Za-z0-9\x80-\uffff]+(?=[^A-Za-z0-9\x80-\uffff])", prefix)
    grams = [tuple(w.lower() for w in finished[i:i + REPEATED_WORDS])
             for i in range(len(finished) - REPEATED_WORDS + 1)]
    grams = [g for g in grams if sum(map(len, g)) >= MIN_REPEAT_LETTERS]
    return len(set(grams)) < len(grams), bool(prefix) and prefix[-1] in ".!?;,\n"


def test_the_words_equal_a_reference_over_random_values():
    rng = random.Random(0)
    vocabulary = ["alpha", "beta", "Gamma", "delta", "x", "42", "émile"]
    for _ in range(300):
        text = "".join(rng.choice(vocabulary) + rng.choice([" ", ", ", ". ", "-", "\n", "", " ", '"'])
                       for _ in range(rng.randint(0, 14)))
        scan = JsonScan()
        scan.feed(b'{"k": "')
        for end, char in enumerate(text):
            looped, boundary = _reference(text[:end])
            assert scan.value_looped == (looped and boundary), text[:end]
            scan.feed(json.dumps(char, ensure_ascii=False)[1:-1].encode())


def test_each_value_counts_its_own_words_and_keys_none():
    scan = JsonScan()
    scan.feed(b'{"a": "one two three four five", "b": "one two three four five')
    assert not scan.words.looped  # the first value's words do not count in the second
    scan.feed(b' one two three four five,')
    assert scan.value_looped
    copy = scan.copy()
    copy.feed(b" more")
    assert scan.value_looped and not copy.value_looped  # a copy reads on alone
    keys = JsonScan()
    keys.feed(b'{"one two three four five one two three four five,')
    assert keys.words is None and not keys.value_looped
    call = MarkedScan(triggers=(b"<tool_call>",))
    call.feed(b'one two three four five. one two three four five. <tool_call>{"a": "x')  # text outside a call
    assert not call.words.looped


def test_the_value_ends_where_its_quote_is_allowed_on_either_path(vocab_of):
    vocabulary = vocab_of("smollm2")
    tokens = string_tokens(vocabulary)
    starts = {vocabulary.token_bytes[t] for t in tokens.quote_starts.tolist()}
    assert {b'"', b'",', b'"}'} <= starts and all(raw[:1] == b'"' for raw in starts)
    compiled = compile(JsonSchema({"type": "object", "properties": {"a": {"type": "string"},
                                                                    "b": {"type": "string", "minLength": 90}},
                                   "required": ["a", "b"]}), vocabulary)
    masks = []
    for text in ('{"a": "one two three four five. one two three four five.', '{"a": "x", "b": "one two three '
                 'four five. one two three four five.'):  # the quote allowed; refused (minLength)
        state = compiled.new_state()
        state.advance(vocabulary.encode(text))
        mask = allocate_bitmask(compiled.vocab_size)
        state.fill_mask(mask)
        masks.append(mask)
    logits = torch.randn(2, compiled.vocab_size, generator=torch.Generator().manual_seed(2))
    apply_bitmask(logits, torch.stack(masks))
    moved, host = logits.clone(), logits.clone().numpy()
    move_to_quote(moved, StringMoves(ended_rows=[0, 1]), tokens)
    move_to_quote(host, StringMoves(ended_rows=[0, 1]), tokens)
    assert torch.allclose(torch.from_numpy(host), moved, atol=1e-5)
    assert torch.logsumexp(moved[0], 0) == pytest.approx(float(torch.logsumexp(logits[0], 0)), rel=1e-5)
    allowed = torch.isfinite(moved[0]).nonzero().flatten().tolist()
    assert allowed and {vocabulary.token_bytes[t] for t in allowed} <= starts  # only tokens that end the value
    assert len(allowed) > 1  # ``"``, ``",`` and ``"}`` (and more) all allowed there
    kept = logits[0, allowed]  # in proportion to their own
    assert torch.allclose(torch.softmax(moved[0, allowed], 0), torch.softmax(kept, 0), atol=1e-6)
    assert torch.equal(moved[1], logits[1])  # the quote refused: nothing moves


def _tool(name: str, description: str, required: list[str], **properties: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_TEXT = {"type": "string"}
_TOOLS = [  # tool-args' four tools
    _tool("get_weather", "Current weather in a city.", ["city"], city=_TEXT,
          unit={"type": "string", "enum": ["celsius", "fahrenheit"]}),
    _tool("send_email", "Send an email.", ["to", "subject", "body"],
          to={"type": "string", "description": "the recipient's address"}, subject=_TEXT, body=_TEXT),
    _tool("search_flights", "Find flights between two cities.", ["origin", "destination", "date"], origin=_TEXT,
          destination=_TEXT, date={"type": "string", "description": "YYYY-MM-DD"}),
    _tool("create_event", "Add an event to the calendar.", ["title", "day"], title=_TEXT, day=_TEXT,
          attendees={"type": "array", "items": _TEXT}),
]


def test_a_body_the_model_writes_over_and_over_ends_after_one_repeat(smollm2, one_torch_thread):
    """``"body": "... We love to share our passion for music and the world of music. We love to share our love for
    music and the world of music. We love ...`` to ``max_tokens`` without the guard (tool-args, ``tune``)."""
    from cdsl_struct.api import Generator

    prompt, options = "Schedule Piano lesson for Saturday.", {"tools": _TOOLS, "tool_choice": "required",
                                                              "max_tokens": 96}
    bare = Generator(smollm2, draft=None, string_guard=False).generate(prompt, **options)
    assert bare.finish_reason == "length" and bare.text.count("We love to share our") >= 3, bare.text
    ended = Generator(smollm2, draft=None).generate(prompt, **options)
    assert ended.finish_reason == "stop", ended.text
    body = ended.tool_calls[0].arguments["body"]
    assert body.count("We love to share our") == 2 and body.endswith("the world of music."), body
    fast = Generator(smollm2).generate(prompt, method="speculative", **options)  # the same tokens, speculating
    assert fast.text == ended.text
