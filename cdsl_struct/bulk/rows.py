"""One chunk of rows through a ``Generator``: requests in, output rows out, a bad row isolated.

Shared by the local engine and the Ray actors, so both produce the same rows.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..api import Generator
    from ..result import Result
    from .settings import BatchJob

OUTPUT_FIELDS = ("output", "text", "finish_reason", "closed_by_budget", "error")


def prompt_of(row: dict[str, Any], chat: bool = True) -> Any:
    """The row's prompt: its ``messages`` as given, or its ``prompt`` as one user message (with
    ``chat=False``: the ``prompt`` text as it is, for base models without a chat template)."""
    if "messages" in row:
        messages = row["messages"]
        if not chat:
            raise ValueError("\"messages\" need the chat template; this job runs with chat off")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ValueError("\"messages\" must be a non-empty list of {\"role\", \"content\"} objects")
        return messages
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the row needs a non-empty \"prompt\" string or a \"messages\" list")
    return [{"role": "user", "content": prompt}] if chat else prompt


def decode_chunk(generator: Generator, job: BatchJob, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output rows for ``rows``, in order: decoded together as one batch; if the batch call fails,
    row by row, so that only the failing rows carry an ``error``."""
    prompts: list[Any] = []
    out: list[dict[str, Any] | None] = []
    for row in rows:
        try:
            prompts.append(prompt_of(row, job.chat))
            out.append(None)
        except ValueError as exc:
            prompts.append(None)
            out.append(error_row(row, exc))
    todo = [i for i, p in enumerate(prompts) if p is not None]
    if todo:
        try:
            results = generator.generate_batch([prompts[i] for i in todo], **job.generate_kwargs())
            for i, result in zip(todo, results, strict=True):
                out[i] = result_row(rows[i], result)
        except Exception:  # noqa: BLE001 - isolate the row(s) at fault below
            for i in todo:
                out[i] = decode_one(generator, job, rows[i], prompts[i])
    return [row for row in out if row is not None]


def decode_one(generator: Generator, job: BatchJob, row: dict[str, Any], prompt: Any) -> dict[str, Any]:
    """One row alone; its error recorded in the row instead of raised."""
    try:
        return result_row(row, generator.generate(prompt, **job.generate_kwargs()))
    except Exception as exc:  # noqa: BLE001 - a failing row must not end the job
        return error_row(row, exc)


def result_row(row: dict[str, Any], result: Result) -> dict[str, Any]:
    """The input row plus ``output`` (the parsed value; null unless complete), ``text``, ``finish_reason``
    (and ``closed_by_budget: true`` where the answer was closed early to fit ``max_tokens``)."""
    out = {k: v for k, v in row.items() if k not in OUTPUT_FIELDS}
    if result.tool_calls:
        output: Any = [{"name": call.name, "arguments": call.arguments} for call in result.tool_calls]
    elif hasattr(result.value, "pretty"):  # a grammar's lark.Tree: the output is the text it parses
        output = result.text
    else:
        output = jsonable(result.value) if result.complete else None
    out.update(output=output, text=result.text, finish_reason=result.finish_reason)
    if result.closed_by_budget:  # closed early to fit max_tokens: valid, possibly short
        out["closed_by_budget"] = True
    return out


def error_row(row: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    """The input row plus ``error`` (the exception's type and message)."""
    out = {k: v for k, v in row.items() if k not in OUTPUT_FIELDS}
    out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def jsonable(value: Any) -> Any:
    """A JSON-serialisable form of a Result value (pydantic instances dumped, parse trees as text)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)
