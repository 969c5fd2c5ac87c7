"""The OpenAI-compatible server, queried with the official ``openai`` client, offline.

Starts ``cdsl-struct serve`` in-process (the embedded SmolLM2, on a free localhost port), then
asks it for JSON matching a schema (``response_format``), a tool call (``tools``), a date by
regex on ``/v1/completions`` (the ``regex`` extension field), and a streamed answer. Needs the
server extra: ``pip install 'cdsl_struct[server]'``.

To query a server you started yourself (``cdsl-struct serve --port 8000``), pass its URL:
``python examples/server_openai_client.py --url http://127.0.0.1:8000/v1``.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "maximum": 150}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}


@contextmanager
def local_server() -> Iterator[str]:
    """``cdsl-struct serve`` on a free localhost port, in a background thread; yields its base URL."""
    import uvicorn

    from cdsl_struct.api import Generator
    from cdsl_struct.server import create_app

    start = time.perf_counter()
    app = create_app(Generator("smollm2"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    print(f"server     {url} ready in {time.perf_counter() - start:.1f}s")
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join()


def query(url: str) -> None:
    """Ask the server for JSON, a tool call, a regex-shaped completion and a streamed answer."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="unused")
    model = client.models.list().data[0].id
    print(f"model      {model}")

    answer = client.chat.completions.create(
        model=model, max_tokens=40,
        messages=[{"role": "user", "content": "Extract the person as JSON: Grace Hopper, 85, admiral."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    print(f"json       {json.loads(answer.choices[0].message.content)}  ({answer.usage.completion_tokens} tokens)")

    answer = client.chat.completions.create(
        model=model, max_tokens=40, tools=[WEATHER_TOOL], tool_choice="required",
        messages=[{"role": "user", "content": "What is the weather in Lisbon?"}])
    choice = answer.choices[0]
    call = choice.message.tool_calls[0]
    print(f"tool call  {call.function.name}({call.function.arguments})  finish_reason={choice.finish_reason}")

    answer = client.completions.create(model=model, prompt="The Moon landing (20 July 1969) as YYYY-MM-DD:",
                                       max_tokens=16, extra_body={"regex": r" \d{4}-\d{2}-\d{2}"})
    print(f"regex      {answer.choices[0].text.strip()!r}")

    print("stream     ", end="", flush=True)
    for chunk in client.chat.completions.create(
            model=model, max_tokens=40, stream=True, response_format={"type": "json_object"},
            messages=[{"role": "user", "content": "Describe a cat as a JSON object with a name and a colour."}]):
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.choices and chunk.choices[0].finish_reason:
            print(f"  (finish_reason={chunk.choices[0].finish_reason})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="base URL of a running server (default: start one in-process)")
    args = parser.parse_args()
    try:
        import fastapi  # noqa: F401
        import openai  # noqa: F401
    except ImportError:
        print("this example needs the server extra: pip install 'cdsl_struct[server]'", file=sys.stderr)
        return 2
    if args.url:
        query(args.url)
        return 0
    with local_server() as url:
        query(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
