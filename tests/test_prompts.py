"""Prompt rendering: messages to text, earlier tool calls and their results, and the tools'
instruction after the results (issue 21: an agent's model called its tool again and again)."""

from __future__ import annotations

import json

import pytest
from jinja2 import TemplateError

from cdsl_struct.prompts import chat_header, ends_with_results, normalise_messages, prompt_ids
from cdsl_struct.tools import ToolPrompt, tool_request

CITY = {"type": "object", "properties": {"name": {"type": "string"}, "country": {"type": "string"}},
        "required": ["name", "country"]}
LOOKUP = {"type": "function", "function": {"name": "lookup_population", "description": "The population of a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}


def call(call_id: str, city: str) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "lookup_population", "arguments": json.dumps({"city": city})}}


def result(call_id: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


ASKED = {"role": "user", "content": "Name a city in Spain."}
CALLED = {"role": "assistant", "content": None, "tool_calls": [call("call_1", "Madrid")]}
ANSWERED = [ASKED, CALLED, result("call_1", "3300000")]


def test_a_call_reads_as_the_model_writes_it():
    (_, assistant) = normalise_messages([ASKED, CALLED])
    assert assistant == {"role": "assistant",
                         "content": '<tool_call>{"name": "lookup_population", "arguments": {"city": "Madrid"}}'}


def test_a_result_is_left_to_the_chat_template():
    *_, shown = normalise_messages(ANSWERED)
    assert shown == {"role": "tool", "content": "3300000"}


def test_for_templates_without_a_tool_role_results_are_tool_responses_in_one_user_turn():
    *_, shown = normalise_messages(ANSWERED, results_as_user=True)
    assert shown == {"role": "user", "content": '<tool_response>\n{"name": "lookup_population", "content": 3300000}'
                                                '\n</tool_response>'}
    two = {"role": "assistant", "content": "", "tool_calls": [call("a", "Madrid"), call("b", "Vigo")]}
    messages = [ASKED, two, result("b", "not found"), {"role": "tool", "name": "other", "content": "{\"x\": 1}"},
                {"role": "tool", "content": ""}, {"role": "user", "content": "Thanks."}]
    normalised = normalise_messages(messages, results_as_user=True)
    assert [m["role"] for m in normalised] == ["user", "assistant", "user"]
    blocks = ['{"name": "lookup_population", "content": "not found"}', '{"name": "other", "content": {"x": 1}}',
              '{"content": ""}']
    assert normalised[-1]["content"] == "\n".join(f"<tool_response>\n{b}\n</tool_response>" for b in blocks) \
        + "\n\nThanks."


def test_ends_with_results():
    assert ends_with_results(ANSWERED)
    assert not ends_with_results([*ANSWERED, {"role": "user", "content": "And in France?"}])
    assert not ends_with_results([ASKED])


def test_the_tool_prompt_says_what_to_do_after_results():
    answer = tool_request([LOOKUP]).system_prompt(CITY)
    assert isinstance(answer, ToolPrompt) and answer.startswith("You can call these functions:")
    assert "answer with JSON" in answer.after_results and "call another function" in answer.after_results
    assert "plain text" in tool_request([LOOKUP]).system_prompt().after_results
    assert tool_request([LOOKUP], "required").system_prompt().after_results is None


@pytest.fixture(scope="module")
def tokenizer_of():
    from cdsl_struct.models.tokenizers import load_tokenizer

    return load_tokenizer


def rendered(tokenizer, messages, system=None) -> str:
    return tokenizer.decode(prompt_ids(tokenizer, messages, system=system))


def test_the_instruction_follows_the_results(tokenizer_of):
    tokenizer = tokenizer_of("smollm2")
    system = tool_request([LOOKUP]).system_prompt(CITY)
    text = rendered(tokenizer, ANSWERED, system)
    assert text.startswith("<|im_start|>system\nYou can call these functions:")
    assert text.endswith("<|im_start|>tool\n3300000<|im_end|>\n<|im_start|>system\n" + system.after_results
                         + "<|im_end|>\n<|im_start|>assistant\n")
    follow_up = rendered(tokenizer, [*ANSWERED, {"role": "user", "content": "And in France?"}], system)
    assert system.after_results not in follow_up  # only a reply to results gets it
    assert system.after_results not in rendered(tokenizer, ANSWERED, str(system))


def test_a_template_without_a_tool_role_gets_the_results_in_a_user_turn(tokenizer_of):
    tokenizer = tokenizer_of("gemma3")  # its template refuses any role but user, assistant and system
    with pytest.raises(TemplateError):
        tokenizer.apply_chat_template(normalise_messages(ANSWERED), tokenize=False)
    system = tool_request([LOOKUP]).system_prompt(CITY)
    text = rendered(tokenizer, ANSWERED, system)
    assert '<start_of_turn>user\n<tool_response>\n{"name": "lookup_population", "content": 3300000}' in text
    assert system.after_results in text


class _SystemFirstOnly:
    """A tokenizer whose template refuses a system message anywhere but first (as some do)."""

    chat_template = "refuses a late system message"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        if any(m["role"] == "system" for m in messages[1:]):
            raise TemplateError("System message must be first")
        return [ord(c) for c in "".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]"]


def test_where_a_template_refuses_a_late_system_message_the_instruction_ends_the_results():
    system = ToolPrompt("Tools.", after_results="Answer now, or call another function.")
    text = "".join(map(chr, prompt_ids(_SystemFirstOnly(), ANSWERED, system=system)))
    assert text.startswith("[system]Tools.[user]Name a city in Spain.[assistant]<tool_call>")
    assert text.endswith("[tool]3300000\n\nAnswer now, or call another function.[assistant]")


def test_the_chat_header_is_what_every_user_prompt_starts_with(tokenizer_of):
    """``chat_header``: the template's default system turn and the user turn's opening, which every
    one-message prompt starts with (what a draft prefills once); none without a chat template."""
    tokenizer = tokenizer_of("smollm2")
    header = chat_header(tokenizer)
    assert tokenizer.decode(header).endswith("<|im_start|>user\n") and "system" in tokenizer.decode(header)
    for text in ("Describe a scene.", "Hello", "Write one short, natural sentence that uses all of these words: a, b."):
        assert prompt_ids(tokenizer, text)[:len(header)] == header
    assert prompt_ids(tokenizer, "Hello")[len(header):] != prompt_ids(tokenizer, "Write")[len(header):]

    class Plain:
        chat_template = None

    assert chat_header(Plain()) == []
