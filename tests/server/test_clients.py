"""Real function-calling clients against the real server on the embedded SmolLM2: instructor
(TOOLS and JSON_SCHEMA modes), langchain-openai (``bind_tools`` with an ``@tool`` function and
``with_structured_output`` both ways) and pydantic-ai (an output type; ``NativeOutput`` beside a
tool). Their schemas are the ones these libraries generate, without ``additionalProperties``."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from .conftest import SERVER_EXTRA

pytest.importorskip("fastapi", reason=SERVER_EXTRA)
CLIENTS_EXTRA = "needs the clients extra: pip install 'cdsl_struct[clients]'"

PASSAGE = "Extract the person: Tom Baker, 52, teaches history in Leeds."


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=150)


def test_instructor_tools_and_json_schema_modes(base_url):
    instructor = pytest.importorskip("instructor", reason=CLIENTS_EXTRA)
    import openai

    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0), mode=mode)
        person = client.chat.completions.create(model="smollm2", response_model=Person, max_retries=0,
                                                messages=[{"role": "user", "content": PASSAGE}], max_tokens=48)
        assert isinstance(person, Person), mode


def test_instructor_partial_streaming(base_url):
    """instructor's ``create_partial`` parses the streamed content itself; every partial it builds
    from our chunks agrees with the final Person (fields appear and grow, never change)."""
    instructor = pytest.importorskip("instructor", reason=CLIENTS_EXTRA)
    import openai

    client = instructor.from_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0),
                                    mode=instructor.Mode.JSON_SCHEMA)
    partials = list(client.chat.completions.create_partial(
        model="smollm2", response_model=Person, max_retries=0, max_tokens=48,
        messages=[{"role": "user", "content": PASSAGE}]))
    final = partials[-1]
    Person.model_validate(final.model_dump())
    assert len(partials) >= 3
    for partial in partials:  # instructor's own parser may show a number's first digits
        for name, value in partial.model_dump().items():
            assert value is None or str(getattr(final, name)).startswith(str(value)), (name, value)


def test_langchain_bind_tools_and_structured_output(base_url):
    pytest.importorskip("langchain_openai", reason=CLIENTS_EXTRA)
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str, unit: str = "celsius") -> str:
        """Current weather in a city."""
        return f"sunny in {city}"

    llm = ChatOpenAI(base_url=base_url, api_key="x", model="smollm2", temperature=0, max_tokens=48, max_retries=0)
    message = llm.bind_tools([get_weather], tool_choice="any").invoke("What is the weather in Paris?")
    (call,) = message.tool_calls[:1]
    assert call["name"] == "get_weather" and set(call["args"]) <= {"city", "unit"} and "city" in call["args"]
    assert message.invalid_tool_calls == []
    for method in ("function_calling", "json_schema"):
        person = llm.with_structured_output(Person, method=method).invoke(PASSAGE)
        assert isinstance(person, Person), method


def test_pydantic_ai_output_type_and_native_output_with_a_tool(base_url):
    pytest.importorskip("pydantic_ai", reason=CLIENTS_EXTRA)
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    model = OpenAIChatModel("smollm2", provider=OpenAIProvider(base_url=base_url, api_key="x"))
    settings = {"max_tokens": 48, "temperature": 0}
    limits = UsageLimits(request_limit=4)
    result = Agent(model, output_type=Person, model_settings=settings).run_sync(PASSAGE, usage_limits=limits)
    assert isinstance(result.output, Person)

    calls = []

    def lookup_age(name: str) -> int:
        """The age of a person, by name."""
        calls.append(name)
        return 52

    agent = Agent(model, output_type=NativeOutput(Person), tools=[lookup_age], model_settings=settings)
    result = agent.run_sync(PASSAGE, usage_limits=limits)
    assert isinstance(result.output, Person)


class City(BaseModel):
    """A city and the country it is in."""

    name: str
    country: str


def test_pydantic_ai_agent_answers_once_its_tool_has_answered(base_url):
    """Issue 21: with ``NativeOutput`` and a tool the model called the tool again and again, up to
    the request limit (vLLM's answer comes at once): the tools were described only at the top,
    and it copied its previous call. The instruction to answer or call now follows the results."""
    pytest.importorskip("pydantic_ai", reason=CLIENTS_EXTRA)
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    calls = []

    def lookup_population(city: str) -> int:
        """The population of a city, by name."""
        calls.append(city)
        return 3_300_000

    model = OpenAIChatModel("smollm2", provider=OpenAIProvider(base_url=base_url, api_key="x"))
    agent = Agent(model, output_type=NativeOutput(City), tools=[lookup_population],
                  model_settings={"max_tokens": 48, "temperature": 0})
    result = agent.run_sync("Name a city in Spain.", usage_limits=UsageLimits(request_limit=6))
    assert isinstance(result.output, City)
    assert len(calls) <= 2
