"""The worker process that builds outlines-core indexes (run as a script by ``outlines_core_process``).

It imports only the standard library and ``outlines_core`` (not ``cdsl_struct``, whose import
pulls in torch), so it starts in well under a second. Requests and replies are pickles, each
framed by an 8-byte little-endian length, on stdin and stdout:

- request ``(fingerprint, vocabulary_pickle_or_None, regex)``: the vocabulary is sent the first
  time a worker sees that fingerprint and kept for the worker's life;
- reply ``("ok", Index)``, ``("error", message)`` when outlines-core rejects the regex (its
  ``ValueError`` / ``RuntimeError``), or ``("crash", traceback)`` for anything else.

The parent kills the worker when a compile outlives its timeout, which is the point: a Rust
``Index`` build cannot be interrupted from Python, but a process can.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import traceback
from typing import IO, Any

import outlines_core

HEADER = struct.Struct("<Q")
MEMORY_ENV = "CDSL_STRUCT_COMPILE_MEMORY_MB"


def read_message(stream: IO[bytes]) -> Any:
    """The next framed pickle on ``stream``, or ``None`` at end of file."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (length,) = HEADER.unpack(header)
    body = stream.read(length)
    if len(body) < length:
        return None
    return pickle.loads(body)


def frame(message: Any) -> bytes:
    """``message`` pickled and prefixed with its length."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def handle(request: tuple[str, bytes | None, str], vocabularies: dict[str, Any]) -> tuple[str, Any]:
    """Build the index one request asks for; the reply to send back."""
    try:
        fingerprint, vocabulary, regex = request
        if vocabulary is not None:
            vocabularies[fingerprint] = pickle.loads(vocabulary)
        try:
            index = outlines_core.Index(regex, vocabularies[fingerprint])
        except (ValueError, RuntimeError) as exc:
            return ("error", str(exc))
        return ("ok", index)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it there
        return ("crash", traceback.format_exc())


def limit_memory() -> None:
    """Cap this process's address space at ``MEMORY_ENV`` MiB (when set), so that one explosive
    index cannot take the machine's memory: past it the build fails and the worker dies."""
    megabytes = int(os.environ.get(MEMORY_ENV) or 0)
    if megabytes > 0:
        import resource

        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> None:
    """Serve requests until stdin closes."""
    limit_memory()
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the replies
    sys.stdout = sys.stderr
    vocabularies: dict[str, Any] = {}
    while (request := read_message(requests)) is not None:
        replies.write(frame(handle(request, vocabularies)))
        replies.flush()


if __name__ == "__main__":
    main()
