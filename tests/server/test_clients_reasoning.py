"""The real-client battery with a thought before each answer (issue 39): every request asks our
``reasoning`` extension for a forced thought, so each response carries ``reasoning_content`` beside
the content or the tool calls, and instructor, langchain-openai and pydantic-ai still read their
typed answers and calls; instructor's completion carries the thought, and pydantic-ai reads it into
a thinking part."""

from __future__ import annotations

import pytest

from .conftest import SERVER_EXTRA
from .test_clients import CLIENTS_EXTRA, PASSAGE, Person

pytest.importorskip("fastapi", reason=SERVER_EXTRA)

THINK = {"reasoning": {"budget": 12, "required": True}}
MAX_TOKENS = 80
#: one call each: after a thought SmolLM2 (never trained to think) writes its call again and again
ONE_CALL = {"parallel_tool_calls": False}


def test_instructor_reads_the_answer_after_the_thought(base_url):
    instructor = pytest.importorskip("instructor", reason=CLIENTS_EXTRA)
    import openai

    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0), mode=mode)
        person, completion = client.chat.completions.create_with_completion(
            model="smollm2", response_model=Person, max_retries=0, max_tokens=MAX_TOKENS, extra_body=THINK,
            messages=[{"role": "user", "content": PASSAGE}], **(ONE_CALL if mode is instructor.Mode.TOOLS else {}))
        assert isinstance(person, Person), mode
        assert completion.choices[0].message.model_extra["reasoning_content"], mode


def test_langchain_tools_and_structured_output_after_the_thought(base_url):
    pytest.importorskip("langchain_openai", reason=CLIENTS_EXTRA)
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"sunny in {city}"

    llm = ChatOpenAI(base_url=base_url, api_key="x", model="smollm2", temperature=0, max_tokens=MAX_TOKENS,
                     max_retries=0, extra_body=THINK)
    message = llm.bind_tools([get_weather], tool_choice="any", **ONE_CALL).invoke("What is the weather in Paris?")
    (call,) = message.tool_calls[:1]
    assert call["name"] == "get_weather" and "city" in call["args"] and message.invalid_tool_calls == []
    for method in ("function_calling", "json_schema"):
        answer = llm.with_structured_output(Person, method=method, include_raw=True).invoke(PASSAGE)
        assert isinstance(answer["parsed"], Person) and answer["parsing_error"] is None, method


def test_pydantic_ai_output_after_the_thought(base_url):
    pytest.importorskip("pydantic_ai", reason=CLIENTS_EXTRA)
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, ThinkingPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    model = OpenAIChatModel("smollm2", provider=OpenAIProvider(base_url=base_url, api_key="x"))
    settings = {"max_tokens": MAX_TOKENS, "temperature": 0, "extra_body": THINK, **ONE_CALL}
    result = Agent(model, output_type=Person, model_settings=settings).run_sync(
        PASSAGE, usage_limits=UsageLimits(request_limit=4))
    assert isinstance(result.output, Person)
    thoughts = [part.content for message in result.all_messages() if isinstance(message, ModelResponse)
                for part in message.parts if isinstance(part, ThinkingPart)]
    assert thoughts and all(thoughts)
