"""``Generator`` / ``generate()`` on the real embedded SmolLM2: every constraint kind gives its
value type, incomplete outputs carry no value, streaming, batches, methods, and typed errors."""

from __future__ import annotations

import re
import threading
import time

import jsonschema
import lark
import pytest
from pydantic import BaseModel, ConfigDict

import cdsl_struct as cs
from cdsl_struct import api, verbs
from cdsl_struct.api import Generator
from cdsl_struct.params import GenerationParams
from cdsl_struct.result import Result
from cdsl_struct.streaming import TextDeltas

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PASSAGE = "Extract the person as JSON.\n\nTom Baker, 52, lives in Leeds."
GREETING = 'start: greeting " " NAME\ngreeting: "hello" | "hi"\nNAME: /[A-Z][a-z]{1,8}/\n'


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    age: int


@pytest.fixture(scope="module")
def gen(smollm2, one_torch_thread):
    return Generator(smollm2)


def test_pydantic_schema_gives_an_instance(gen):
    result = gen.generate(PASSAGE, schema=Person, max_tokens=30)
    assert result.finish_reason == "stop" and result.complete
    assert isinstance(result.value, Person) and result.value.name == "Tom Baker"
    assert result.method == "speculative" and result.stats.tokens == len(result.tokens)


def test_json_schema_gives_parsed_json_that_validates(gen):
    messages = [{"role": "system", "content": "You extract data as JSON."}, {"role": "user", "content": PASSAGE}]
    result = gen.generate(messages, schema=PERSON, max_tokens=30)
    assert result.complete and isinstance(result.value, dict)
    jsonschema.validate(result.value, PERSON)


def test_regex_and_choices(gen):
    date = gen.generate("Write the date of the Moon landing (20 July 1969) as YYYY-MM-DD.",
                        regex=r"\d{4}-\d{2}-\d{2}", max_tokens=12)
    assert date.complete and date.value == date.text and len(date.text) == 10 and date.text[4] == "-"
    options = ["positive", "negative", "neutral"]
    choice = gen.generate("Sentiment of: 'I loved this film, wonderful!'", choices=options, max_tokens=6)
    assert choice.complete and choice.value in options and choice.text == choice.value


def test_grammar_gives_a_lark_tree(gen):
    result = gen.generate("Greet Anna in two words.", grammar=GREETING, max_tokens=8)
    assert result.complete and isinstance(result.value, lark.Tree)
    assert result.value.data == "start" and result.text.split(" ")[0] in ("hello", "hi")


def test_incomplete_output_has_no_value(gen):
    result = gen.generate(PASSAGE, schema=Person, max_tokens=3)
    assert (result.finish_reason, result.complete, result.value) == ("length", False, None)
    assert result.text and len(result.tokens) == 3
    # free text is a complete match at any point, but cut short it is still not presented as valid
    free = gen.generate("Tell me a long story about a dragon.", max_tokens=4)
    assert (free.finish_reason, free.complete, free.value) == ("length", False, None)


def test_free_text_stops_at_eos(gen):
    result = gen.generate("Reply with just the word OK.", max_tokens=24)
    assert result.finish_reason == "stop" and result.complete and result.value == result.text
    assert result.tokens[-1] in gen.vocabulary.eos_token_ids


def test_stream_deltas_concatenate_to_the_text(gen):
    stream = gen.stream("Count from one to five in words.", max_tokens=12)
    assert isinstance(stream, cs.TextStream) and not stream.done
    deltas = list(stream)
    assert stream.done and all(isinstance(d, str) for d in deltas) and isinstance(stream.result, Result)
    assert len(deltas) >= 2 and "".join(deltas) == stream.result.text
    assert stream.result == stream.result and list(stream) == []  # read to its end: nothing more
    alone = gen.generate("Count from one to five in words.", max_tokens=12)
    assert stream.result.text == alone.text and stream.result.tokens == alone.tokens  # greedy: the same request


def test_a_streams_result_read_early_waits_and_keeps_the_deltas(gen):
    stream = gen.stream("Count from one to five in words.", max_tokens=12)
    result = stream.result  # nothing iterated yet: waits for the end
    assert isinstance(result, Result) and result.finish_reason == "length"
    assert "".join(stream) == result.text  # the deltas are all still there


def test_leaving_a_stream_early_cancels_its_request(gen):
    with gen.stream("Tell me a long story about a dragon.", max_tokens=200) as stream:
        first = next(stream)
    assert isinstance(first, str)
    result = stream.result  # ends within a step of the close
    assert result.finish_reason == "cancelled" and len(result.tokens) < 200
    assert gen.load().running_rows == 0
    unstarted = gen.stream("Say yes.", max_tokens=3)
    unstarted.close()
    assert list(unstarted) == []
    with pytest.raises(cs.RequestCancelled, match="closed before it started"):
        _ = unstarted.result


def test_a_streams_error_is_raised_by_the_iteration_and_by_result(gen):
    stream = gen.stream("hi", reward=lambda text, final: 1 / 0, method="cdlh", max_tokens=4)
    with pytest.raises(ZeroDivisionError):
        list(stream)
    with pytest.raises(ZeroDivisionError):
        _ = stream.result


def test_abandoned_stream_releases_the_generator(gen):
    with pytest.warns(DeprecationWarning, match=r"use stream\(prompt"):
        stream = gen.generate("Tell me a long story about a dragon.", max_tokens=40, stream=True)
    first = next(stream)
    assert isinstance(first, str)
    stream.close()
    done = []
    worker = threading.Thread(target=lambda: done.append(gen.generate("Say yes.", choices=["yes"], max_tokens=3)))
    worker.start()
    worker.join(timeout=60)
    assert done and done[0].value == "yes"


def test_text_deltas_never_split_a_character(gen):
    text = "日本語 café ✓"
    ids = gen.tokenizer.encode(text, add_special_tokens=False)
    deltas = TextDeltas(gen.vocabulary)
    pieces = [deltas.push([token]) for token in ids] + [deltas.flush()]
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    assert "" in pieces  # some tokens end mid-character and were held back


def test_batch_compiles_once_and_returns_a_list(gen, monkeypatch):
    calls = []
    real = api.compile
    monkeypatch.setattr(api, "compile", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    prompts = ["Is the sky blue? Answer yes or no.", "Is fire cold? Answer yes or no.", "Is snow white? yes or no."]
    results = gen.generate_batch(prompts, choices=["yes", "no"], max_tokens=4)
    assert isinstance(results, list) and len(results) == 3
    assert all(r.complete and r.value in ("yes", "no") for r in results)
    assert len(calls) == 1


def test_method_auto_selection(gen, smollm2):
    assert gen.choose_method("auto", has_reward=False) == "speculative"
    assert gen.choose_method("auto", has_reward=True) == "cdsl"
    bare = Generator(smollm2, draft=None)
    assert bare.choose_method("auto", has_reward=False) == "target"
    assert bare.choose_method("auto", has_reward=True) == "cdlh"
    with pytest.raises(ValueError, match="needs a draft"):
        bare.choose_method("cdsl", has_reward=True)
    result = bare.generate("Say yes.", choices=["yes", "no"], max_tokens=3)
    assert result.method == "target" and result.stats.proposed == 0


def test_keywords_with_a_schema_give_valid_json(gen):
    schema = {"type": "object", "properties": {"sentence": {"type": "string", "maxLength": 60}},
              "required": ["sentence"], "additionalProperties": False}
    result = gen.generate("Write a sentence about a dog and a ball, as JSON.", schema=schema, keywords=["dog", "ball"],
                          max_tokens=28)
    assert result.method == "cdsl"
    assert result.complete, result.text
    jsonschema.validate(result.value, schema)


@pytest.mark.parametrize("words", [["head", "shake", "walk"], ["climb", "gear", "wall"], ["athlete", "race", "run"]])
def test_keywords_in_a_schemas_string_value_are_not_listed(gen, words):
    """A schema's caption used to list the words ("Head shake, walk, head, shake, walk, ",
    "climb, gear, wall"): its string values are judged as lists are (``KeywordCoverage.json_values``)."""
    from cdsl_struct.rewards import list_shaped

    schema = {"type": "object", "properties": {"caption": {"type": "string"}}, "required": ["caption"]}
    result = gen.generate("Write a caption for a photo as JSON.", schema=schema, keywords=words, max_tokens=48)
    caption = result.value["caption"]
    assert not list_shaped(caption, final=True) and not caption.lower().startswith(f"{words[0]},"), result.text


@pytest.mark.parametrize("words", [["dog", "pull", "sleigh"], ["lady", "hair", "dryer"], ["pond", "rock", "throw"]])
def test_a_keyword_sentence_does_not_end_short_while_a_word_is_missing(gen, words):
    """With ``hold_ending`` (the default), a sentence of fewer than ``HOLD_ENDING_WORDS`` words ends with a
    keyword missing only where the budget closer ended it; CommonGen's terse wording made the model answer
    "Sleigh." before."""
    from cdsl_struct.keywords import HOLD_ENDING_WORDS
    from cdsl_struct.rewards.keywords import _WORD

    prompt = f"Write one short, natural sentence that uses all of these words: {', '.join(words)}."
    result = gen.generate(prompt, keywords=words, max_tokens=40)
    short = len(_WORD.findall(result.text)) < HOLD_ENDING_WORDS
    assert not (result.keywords.missing and short) or result.closed_by_budget, result.text


def test_keywords_with_digits_and_symbols_are_written_and_reported(gen):
    """README's keyword call with keywords that are not words: the sentence holds them as written and the
    report says so (it said missing for "C++" in a sentence that wrote it three times)."""
    for words in (["C++"], ["5G", "phone"]):
        result = gen.generate("Write a sentence.", keywords=words, max_tokens=40)
        assert result.keywords.complete, (words, result.text)
        assert all(word in result.text for word in words), result.text


def _row_ids(runner):
    """The engine rows whose keys (own sequence or branch) the target runner holds."""
    return {key[0] if isinstance(key, tuple) else key for key in list(runner.order)}


def test_keyword_requests_decode_together_and_a_cancelled_one_frees_its_rows(gen):
    """CDLH rows are rows of the engine's batch: two run at once, and cancelling one ends it at
    the next step and frees its own and its roll-outs' cache rows, while the other goes on."""
    from concurrent.futures import ThreadPoolExecutor

    first, second = threading.Event(), threading.Event()
    kwargs = dict(keywords=["dog", "ball"], max_tokens=200, method="cdlh", stream=False)
    with ThreadPoolExecutor(2) as pool:
        try:
            a = pool.submit(lambda: gen.generate("Write a long story about a dog.", cancel=first, **kwargs))
            b = pool.submit(lambda: gen.generate("Write a long story about a ball.", cancel=second, **kwargs))
            deadline = time.monotonic() + 60
            while len(_row_ids(gen.engine.runner)) < 2:  # both decoding at once (no lock serialises them)
                assert time.monotonic() < deadline and not (a.done() or b.done())
                time.sleep(0.01)
            first.set()
            cancelled = a.result(timeout=30)
            assert cancelled.finish_reason == "cancelled" and not cancelled.complete and cancelled.value is None
            assert len(cancelled.tokens) < 200
            assert len(_row_ids(gen.engine.runner)) == 1 and not b.done()  # the other row goes on alone
        finally:
            first.set()
            second.set()
        assert b.result(timeout=60).finish_reason == "cancelled"
    deadline = time.monotonic() + 10
    while gen.engine.runner.order:  # every row and branch released
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_sampling_is_seeded_and_valid(gen):
    kwargs = dict(regex=r"[a-z]{3,8}", max_tokens=8, temperature=0.9, top_p=0.95, seed=7)
    first, second = (gen.generate("Name an animal in lowercase.", **kwargs) for _ in range(2))
    assert first.tokens == second.tokens
    assert first.complete and first.text.isalpha() and first.text.islower()


def test_module_level_generate_reuses_one_generator(smollm2, monkeypatch):
    monkeypatch.setattr(verbs, "_generators", {})
    monkeypatch.setattr(api, "load_model", lambda name, **options: smollm2)
    first = cs.generate("Say yes.", choices=["yes", "no"], max_tokens=3)
    second = cs.generate("Say no.", choices=["yes", "no"], max_tokens=3)
    assert first.value in ("yes", "no") and second.value in ("yes", "no")
    assert len(verbs._generators) == 1


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(schema=PERSON, regex="a+"), ValueError, "at most one"),
    (dict(method="beam"), ValueError, "unknown method"),
    (dict(temperature=-1.0), ValueError, "temperature"),
    (dict(top_p=0.0), ValueError, "top_p"),
    (dict(max_tokens=0), ValueError, "max_tokens"),
    (dict(method="cdlh"), ValueError, "reward"),
    (dict(keywords=["dog"], method="target"), ValueError, "ignores rewards"),
    (dict(keywords=["dog"], temperature=0.5), ValueError, "greedily"),
    (dict(keywords="dog"), ValueError, "list of words"),
    (dict(choices="yes,no"), ValueError, "list of strings"),
    (dict(schema={"type": "objekt"}), cs.InvalidSchema, "invalid JSON Schema"),
    (dict(schema="{not json"), cs.InvalidSchema, "not valid JSON"),
    (dict(grammar="start: (\n"), cs.GrammarSyntaxError, "grammar"),
    (dict(regex="a(?=b)"), cs.UnsupportedFeature, "lookahead"),
    (dict(regex="a(b"), cs.GrammarSyntaxError, "invalid regex"),
    (dict(choices=[]), cs.UnsatisfiableSchema, "at least one"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}], regex="a+"), ValueError, "cannot be combined"),
    (dict(stop=["a", "b", "c", "d", "e"]), ValueError, "at most 4"),
    (dict(stop=[""]), ValueError, "non-empty"),
    (dict(presence_penalty=3.0), ValueError, "presence_penalty"),
    (dict(keywords=["dog"], presence_penalty=1.0), ValueError, "does not take penalties"),
])
def test_bad_inputs_raise_typed_errors(gen, kwargs, error, match):
    with pytest.raises(error, match=match):
        gen.generate("hi", **kwargs)


def test_errors_are_raised_before_streaming_and_for_bad_prompts(gen):
    with pytest.raises(cs.InvalidSchema):
        gen.stream("hi", schema={"type": 3})
    with pytest.raises(ValueError, match="one prompt"):
        gen.generate(["a", "b"], stream=True)
    with pytest.raises(ValueError):
        gen.generate([])
    with pytest.raises(ValueError, match="role"):
        gen.generate([{"content": "no role"}])
    with pytest.raises(ValueError, match="context"):
        gen.generate("hi", max_tokens=100_000)
    for kwargs in ({}, {"keywords": ["dog"]}):  # keyword requests too, before anything decodes
        with pytest.raises(ValueError, match="at least one prompt token"):
            gen.generate_batch(["a", ""], chat=False, max_tokens=2, **kwargs)


@pytest.mark.parametrize(("kwargs", "param"), [
    (dict(prompt=[{"role": "wizard", "content": "hi"}]), "messages"), (dict(keywords=[]), "keywords"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools"),
    (dict(tool_choice="required"), "tool_choice"), (dict(method="magic"), "method"),
    (dict(prompt="", chat=False), "prompt"), (dict(stop=[""]), "stop")])
def test_a_bad_argument_names_itself(gen, kwargs, param):
    """The server turns ``InvalidArgument.param`` into the 400's ``param``."""
    prompt = kwargs.pop("prompt", "hi")
    with pytest.raises(cs.InvalidArgument) as info:
        gen.generate(prompt, max_tokens=2, **kwargs)
    assert info.value.param == param


def test_compile_timeout_is_typed(smollm2):
    slow = Generator(smollm2, draft=None, compile_timeout=1e-6)
    with pytest.raises(cs.CompileTimeout):
        slow.generate("hi", schema={"type": "object", "properties": {"unique_timeout_probe": {"type": "integer"}}})


def test_a_list_of_prompts_decodes_as_one_batch_and_matches_single_calls(gen):
    prompts = ["Ada Lovelace was 36. Extract the person.", "Alan Turing was 41. Extract the person.",
               "Marie Curie was 66. Extract the person."]
    steps_before = gen.engine.stats.steps
    together = gen.generate_batch(prompts, schema=PERSON, max_tokens=40)
    batched_steps = gen.engine.stats.steps - steps_before
    alone = [gen.generate(p, schema=PERSON, max_tokens=40) for p in prompts]
    assert [r.text for r in together] == [r.text for r in alone]
    assert batched_steps < sum(r.stats.target_passes - 1 for r in alone)  # rows shared steps


def test_concurrent_callers_with_a_bad_schema_fail_alone(gen):
    from concurrent.futures import ThreadPoolExecutor

    def failing_reward(text, final):
        raise RuntimeError("reward failed")

    bad = {"type": "object", "properties": {"a": {"type": "nonsense"}}}
    jobs = [dict(schema=PERSON), dict(schema=bad), dict(choices=["yes", "no"]), dict(regex=r"\d{3}"),
            dict(reward=failing_reward, method="cdlh")]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(gen.generate, "Ada Lovelace was 36. Answer.", max_tokens=30, **job) for job in jobs]
    with pytest.raises(cs.InvalidSchema):
        futures[1].result()
    with pytest.raises(RuntimeError, match="reward failed"):
        futures[4].result()
    good = [futures[i].result() for i in (0, 2, 3)]
    assert good[1].value in ("yes", "no") and len(good[2].text) <= 3
    assert good[0].finish_reason != "stop" or good[0].value is not None


# --- objects closed to undeclared keys, stop strings, penalties, cancellation -------------------


def test_undeclared_keys_are_not_generated_unless_allowed(gen, smollm2):
    from cdsl_struct.constraints.closed_objects import close_objects

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {
        "type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}, "required": ["name"],
        "$defs": {"mixin": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "allOf": [{"$ref": "#/$defs/mixin"}, {"properties": {"y": {"type": "integer"}}}]}
    closed = close_objects(schema)
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in closed  # combined with allOf: it cannot see those keys
    assert "additionalProperties" not in closed["$defs"]["mixin"]  # referenced from an allOf branch
    assert "additionalProperties" not in closed["allOf"][1]
    assert close_objects({"type": "object"}) == {"type": "object"}  # declares nothing: stays open
    strict = gen.compile(cs.JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}}}))
    loose = Generator(smollm2, draft=None, extra_properties=True)
    try:
        free = loose.compile(cs.JsonSchema({"type": "object", "properties": {"a": {"type": "integer"}}}))
    finally:
        loose.close()
    extra = gen.tokenizer.encode('{"a": 1, "b": 2}', add_special_tokens=False)  # the default spacing
    assert strict.new_state().validate(extra) < len(extra) and free.new_state().validate(extra) == len(extra)
    # generate() compiles through cs.compile's rule: the same constraint as compile(Person, tokenizer)
    schema_a = {"type": "object", "properties": {"a": {"type": "integer"}}}
    call, _, _ = gen._prepare("Say something.", schema=schema_a)
    assert call.compiled is cs.compile(schema_a, gen.vocabulary) is strict
    assert call.compiled.spec.schema["additionalProperties"] is False


def test_stop_string_ends_where_the_constraint_accepts(gen):
    free = gen.generate("1, 2, 3, 4,", chat=False, max_tokens=16, stop=["7"])
    assert free.finish_reason == "stop" and free.complete and "7" not in free.text and free.text.endswith(" ")
    assert gen.tokenizer.decode(free.tokens) == free.text
    digits = gen.generate("1, 2, 3, 4,", chat=False, max_tokens=30, regex=r"( [0-9],){6}", stop=["7"])
    assert "7" in digits.text  # "7" inside the pattern cannot end it: the output runs to its end
    assert digits.finish_reason == "stop" and re.fullmatch(r"( [0-9],){6}", digits.text)
    stream = gen.stream("1, 2, 3, 4,", chat=False, max_tokens=16, stop=["7"])
    assert "".join(stream) == stream.result.text == free.text


def test_keyword_rows_end_at_stop_strings_like_any_row(gen):
    kwargs = dict(keywords={"words": ["dog", "park"], "form": "text"}, method="cdlh", max_tokens=20)  # free text
    whole = gen.generate("Write two sentences about a dog in a park.", **kwargs)
    assert "." in whole.text[:-1], whole.text  # more than one sentence, so a stop at "." cuts it
    cut = gen.generate("Write two sentences about a dog in a park.", stop=["."], **kwargs)
    assert cut.finish_reason == "stop" and "." not in cut.text
    assert whole.text.startswith(cut.text)


def test_penalties_change_a_repetitive_answer(gen):
    words = r"(go|run|sit|eat)( (go|run|sit|eat)){7}"
    prompt = "go go go go go go go go go go"
    plain = gen.generate(prompt, chat=False, max_tokens=40, regex=words)
    penalised = gen.generate(prompt, chat=False, max_tokens=40, regex=words, frequency_penalty=2.0,
                             presence_penalty=2.0)
    assert plain.complete and penalised.complete  # the mask still holds under penalties

    def most_repeated(text: str) -> int:
        return max(text.split().count(word) for word in set(text.split()))

    assert most_repeated(plain.text) >= 5 > most_repeated(penalised.text)


def test_cancel_event_ends_rows_within_a_step(gen):
    cancel = threading.Event()
    cancel.set()
    result = gen.generate("Tell me a long story.", max_tokens=200, cancel=cancel)
    assert result.finish_reason == "cancelled" and not result.complete and len(result.tokens) <= 8


def test_keywords_get_a_self_draft_that_runs_on_the_target_device(smollm2):
    """int8 dynamic quantisation is CPU-only (building it for a GPU target raises): CDSL's default
    self-draft is int8 on a CPU and bf16 on a GPU or MPS, so keywords= works on every device."""
    from unittest import mock

    import torch

    from cdsl_struct.api import cdsl_self_draft
    from cdsl_struct.models import runner

    assert cdsl_self_draft("cpu") == "int8"
    assert cdsl_self_draft("cuda:0") == "bf16" and cdsl_self_draft(torch.device("mps")) == "bf16"
    with mock.patch.object(runner, "model_device", return_value=torch.device("cuda", 0)):
        with pytest.raises(cs.CdslError, match="CPU only"):
            runner.self_draft(smollm2.model, cdsl_self_draft("cpu"))
        assert runner.self_draft(smollm2.model, cdsl_self_draft("cuda:0")).dtype == torch.bfloat16


def test_cdsl_drafts_on_the_generators_draft_model_when_it_has_one(smollm2, one_torch_thread):
    """A draft model given to the Generator (here the target's first layers; any model with the
    target's tokenizer) is the draft CDSL steers and verifies; only without one does CDSL make a
    self-draft."""
    from cdsl_struct.decoding import DraftModelProposer

    gen = cs.Generator(smollm2, draft="layers:4")
    try:
        (proposer,) = [p for p in gen.proposers if isinstance(p, DraftModelProposer)]
        result = gen.generate("Write a sentence.", keywords=["dog"], max_tokens=12)
        assert result.method == "cdsl" and result.stats.draft_passes > 0
        assert gen._cdsl_draft_runner() is proposer.runner
        assert len(proposer.runner.model.model.layers) == 4
    finally:
        gen.close()


def test_methods_are_an_enum_that_takes_their_names():
    from cdsl_struct import Method

    assert Method.parse("cdsl") is Method.CDSL and Method.CDSL == "cdsl"
    assert [m for m in Method if m.steered] == [Method.CDLH, Method.CDSL]
    with pytest.raises(ValueError, match="choose from auto, target, speculative, cdlh, cdsl"):
        Method.parse("magic")


def test_each_verb_has_one_return_type(gen):
    assert isinstance(gen.generate("Say yes.", choices=["yes", "no"], max_tokens=3), Result)
    stream = gen.stream("Say yes or no.", choices=["yes", "no"], max_tokens=3)
    deltas, streamed = list(stream), stream.result
    assert all(isinstance(d, str) for d in deltas) and isinstance(streamed, Result)
    assert "".join(deltas) == streamed.text and streamed.value in ("yes", "no")
    one = gen.generate_batch(["Say yes."], choices=["yes", "no"], max_tokens=3)
    assert isinstance(one, list) and len(one) == 1 and one[0].value in ("yes", "no")
    two = gen.generate_batch([[{"role": "user", "content": "Say no."}], [{"role": "user", "content": "Say yes."}]],
                             choices=["yes", "no"], max_tokens=3)
    assert [isinstance(r, Result) for r in two] == [True, True]
    with pytest.raises(ValueError, match="list of prompts"):
        gen.generate_batch("Say yes.", choices=["yes", "no"])
    with pytest.raises(ValueError, match="list of prompts"):
        gen.generate_batch([{"role": "user", "content": "Say no."}], choices=["yes", "no"])  # one message list
    with pytest.raises(ValueError, match="one prompt"):
        gen.stream(["a", "b"], choices=["yes", "no"])
    with pytest.raises(ValueError, match="stream"):
        gen.generate_batch(["a"], stream=True)


def test_the_old_shapes_still_work_and_warn_naming_their_replacement(gen):
    prompts = ["Say yes.", "Say no."]
    with pytest.warns(DeprecationWarning, match=r"generate\(list_of_prompts\) is deprecated; use generate_batch"):
        old = gen.generate(prompts, choices=["yes", "no"], max_tokens=3)
    assert [r.text for r in old] == [r.text for r in gen.generate_batch(prompts, choices=["yes", "no"], max_tokens=3)]
    with pytest.warns(DeprecationWarning, match=r"stream=True\) is deprecated; use stream\(prompt"):
        items = list(gen.generate("Count from one to five in words.", max_tokens=8, stream=True))
    *deltas, last = items  # the old shape: str deltas, then the Result
    assert all(isinstance(d, str) for d in deltas) and isinstance(last, Result) and "".join(deltas) == last.text
    with pytest.warns(DeprecationWarning, match="use generate_batch") as caught:
        cs.generate(prompts, choices=["yes", "no"], max_tokens=3)
    assert len(caught) == 1 and caught[0].filename == __file__  # once, at the caller's line


def test_the_new_verbs_never_warn(gen, smollm2, monkeypatch):
    import warnings

    monkeypatch.setattr(verbs, "_generators", {})
    monkeypatch.setattr(api, "load_model", lambda name, **options: smollm2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert isinstance(cs.generate("Say yes.", choices=["yes", "no"], max_tokens=3), Result)
        batch = cs.generate_batch(["Say yes.", "Say no."], choices=["yes", "no"], max_tokens=3)
        assert [type(r) for r in batch] == [Result, Result]
        stream = cs.stream("Say yes.", choices=["yes", "no"], max_tokens=3)
        assert isinstance(stream, cs.TextStream) and "".join(stream) == stream.result.text


def test_params_object_and_keyword_overrides_decode_alike(gen):
    params = GenerationParams(max_tokens=12, stop=("\n",))
    by_object = gen.generate("Name a colour.", regex="[a-z]+( [a-z]+)*", params=params)
    by_keywords = gen.generate("Name a colour.", regex="[a-z]+( [a-z]+)*", max_tokens=12, stop="\n")
    assert by_object.tokens == by_keywords.tokens
    shorter = gen.generate("Name a colour.", regex="[a-z]+( [a-z]+)*", params=params, max_tokens=1)
    assert len(shorter.tokens) == 1 and params.max_tokens == 12  # the override makes new params
    with pytest.raises(cs.InvalidArgument, match="unknown generation parameter") as info:
        gen.generate("hi", max_token=3)
    assert info.value.param == "max_token"
    with pytest.raises(cs.InvalidArgument) as info:
        gen.generate("hi", keywords=["dog"], params=GenerationParams(temperature=0.7))
    assert info.value.param == "temperature"


def test_keyword_strategies_carry_the_generators_loop_guard(smollm2):
    from types import SimpleNamespace

    from cdsl_struct.decoding.loops import SENTENCE_GUARD, WordLoopGuard
    from cdsl_struct.options import Method
    from cdsl_struct.rewards import KeywordCoverage

    call = SimpleNamespace(method=Method.CDLH, reward=KeywordCoverage(["dog"]), keywords=None)
    gen = Generator(smollm2, draft=None)
    guard = gen._strategy(call).loop_guard
    assert isinstance(guard, WordLoopGuard) and gen._strategy(call).loop_guard is guard  # made once
    assert (guard.min_repeats, guard.min_tokens) == (SENTENCE_GUARD.min_repeats, SENTENCE_GUARD.min_tokens)
    assert len(guard.texts) == gen.vocabulary.size
    assert Generator(smollm2, draft=None, loop_guard=False)._strategy(call).loop_guard is None


def test_keyword_requests_steer_with_their_own_optimism(smollm2):
    from types import SimpleNamespace

    from cdsl_struct.keywords import OPTIMISM, Keywords
    from cdsl_struct.options import Method

    gen = Generator(smollm2, draft=None)
    words = Keywords(("dog",))

    def strategy(method, keywords):
        return gen._strategy(SimpleNamespace(method=method, reward=words.reward(), keywords=keywords))

    assert strategy(Method.CDLH, words).optimism == OPTIMISM != 0.5
    assert strategy(Method.CDLH, Keywords(("dog",), optimism=0.5)).optimism == 0.5
    assert strategy(Method.CDLH, None).optimism == 0.5  # a reward of the caller's own: the paper's
    cdsl = strategy(Method.CDSL, Keywords(("dog",), optimism=0.3))
    assert cdsl.optimism == cdsl.draft.optimism == cdsl.cdlh.optimism == 0.3
