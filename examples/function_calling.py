"""Function calling: Python functions as tools, a constrained call, its result fed back.

Tools are plain functions with type hints and docstrings (``tool_from_function`` turns them into
OpenAI tool dicts; OpenAI dicts work too). The call is constrained to a known tool with
arguments valid under its parameters schema, parsed into ``ToolCall(name, arguments)``.
``tool_choice``: ``"auto"`` (text or a call), ``"required"``, ``"none"`` or a tool's name;
``parallel_tool_calls`` (default true, as in OpenAI) allows several calls.
Run: ``.venv/bin/python examples/function_calling.py``.
"""

from __future__ import annotations

import json
import sys
from typing import Literal

import cdsl_struct as cs


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name.
        unit: The temperature unit.
    """
    return json.dumps({"city": city, "temperature": 21 if unit == "celsius" else 70, "sky": "sunny"})


def convert_currency(amount: float, source: str, target: str) -> str:
    """Convert an amount of money between two currencies (ISO codes such as EUR, USD)."""
    return json.dumps({"amount": round(amount * 1.1, 2), "currency": target})


TOOLS = {"get_weather": get_weather, "convert_currency": convert_currency}


def main() -> int:
    generator = cs.Generator()
    print(json.dumps(cs.tool_from_function(get_weather), indent=1))

    # 1. The model must call a tool; the call always parses and validates.
    messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    result = generator.generate(messages, tools=list(TOOLS.values()), tool_choice="required", max_tokens=48)
    call = result.tool_calls[0]
    print(f"\ncall     {call.name}({call.arguments})  id={call.id}")

    # 2. Run it, hand the result back, and let the model answer in text.
    output = TOOLS[call.name](**call.arguments)
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.to_openai()]},
                 {"role": "tool", "tool_call_id": call.id, "content": output}]
    answer = generator.generate(messages, tools=list(TOOLS.values()), tool_choice="none", max_tokens=40)
    print(f"answer   {answer.text}")

    # 3. "auto": the model chooses between a call and plain text.
    for question in ("Thank you! Say goodbye.", "And what is the weather in Rome?"):
        messages += [{"role": "assistant", "content": answer.text}, {"role": "user", "content": question}]
        answer = generator.generate(messages, tools=list(TOOLS.values()), max_tokens=40)
        shown = [f"{c.name}({c.arguments})" for c in answer.tool_calls] or answer.text
        print(f"auto     {question!r} -> {shown}")
    return 0 if result.complete else 1


if __name__ == "__main__":
    sys.exit(main())
