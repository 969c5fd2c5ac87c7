"""The job's files: input rows, and the output file written once per row, append and flush.

Resuming reads the ids already in the output; a last line cut short by a crash (no newline, or
not JSON) is dropped from the file so that its row is decoded again and written whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import InputError


def read_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """The input rows: one JSON object per non-blank line, each with an ``id``."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            yield parse_row(line, number)


def parse_row(line: str, number: int | None = None) -> dict[str, Any]:
    """One input line as a row; ``InputError`` if it is not a JSON object with an ``id``."""
    where = f"line {number}" if number is not None else "a line"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where} of the input is not JSON: {exc.msg}") from None
    if not isinstance(row, dict):
        raise InputError(f"{where} of the input is not a JSON object")
    if row.get("id") is None:
        raise InputError(f"{where} of the input has no \"id\" (ids make the job resumable)")
    return row


def id_key(value: Any) -> str:
    """A row id as a comparable key (``1`` and ``"1"`` stay different ids)."""
    return json.dumps(value, sort_keys=True)


def repair_and_read_done(path: str | Path) -> set[str]:
    """Keys of the ids already written to ``path``; a torn last line is cut off the file first."""
    path = Path(path)
    if not path.exists():
        return set()
    done: set[str] = set()
    with open(path, "rb+") as handle:
        data = handle.read()
        keep = len(data)
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        offset = 0
        for i, raw in enumerate(lines):
            end = offset + len(raw) + 1
            complete = end <= len(data) and data[end - 1:end] == b"\n"
            row = _loads(raw) if complete else None
            if row is None or "id" not in row:
                if i == len(lines) - 1:  # torn last line: written again on this run
                    keep = offset
                    break
                raise InputError(f"line {i + 1} of the output {path} is not a row; fix or remove it")
            done.add(id_key(row["id"]))
            offset = end
        if keep < len(data):
            handle.truncate(keep)
    return done


def _loads(raw: bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return row if isinstance(row, dict) else None


class RowWriter:
    """Appends output rows, one ``write`` and ``flush`` per row (``fsync`` too with ``durable``)."""

    def __init__(self, path: str | Path, *, durable: bool = False) -> None:
        self.path = Path(path)
        self.durable = durable
        self._handle: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, row: dict[str, Any]) -> None:
        """Write one row as one line."""
        self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._handle.flush()
        if self.durable:
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
