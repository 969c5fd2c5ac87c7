"""``cdsl-struct serve``: its arguments and how it starts (no FastAPI import until it runs)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..generate_cli import add_device_arguments
from ..options import BACKENDS

INSTALL_HINT = "cdsl-struct serve needs the server extra: pip install 'cdsl_struct[server]'"


def add_serve_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``cdsl-struct`` subcommands."""
    serve = commands.add_parser(
        "serve", help="run the OpenAI-compatible HTTP server (needs the 'server' extra)",
        description="Serve one model over an OpenAI-compatible API: GET /v1/models, POST /v1/chat/completions, "
                    "POST /v1/completions (response_format json_schema/json_object, tools, stream, and the extension "
                    "fields regex, grammar, choices, keywords, method). Concurrent requests decode together as rows "
                    "of one batch (up to --max-batch-size); more wait in a bounded queue.")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.add_argument("--model", default="smollm2",
                       help="model: smollm2 (embedded default), gemma3-270m, an HF id, a folder or a .gguf file")
    serve.add_argument("--draft", default="auto",
                       help="speculative-decoding draft: auto, none, lookup, bf16, layers:N or a model (default auto)")
    add_device_arguments(serve)
    serve.add_argument("--backend", default="auto", choices=BACKENDS,
                       help="constraint engine (default auto)")
    serve.add_argument("--whitespace", default="compact",
                       help="JSON whitespace: compact, spaced, flexible or a bounded regex (default compact)")
    serve.add_argument("--compile-timeout", type=float, default=30.0,
                       help="seconds a constraint may take to compile; over it the request gets 400 (default 30)")
    serve.add_argument("--max-request-bytes", type=int, default=2 * 1024 * 1024,
                       help="largest request body accepted; larger ones get 413 (default 2 MiB)")
    serve.add_argument("--queue-limit", type=int, default=64,
                       help="requests that may wait behind the running batch; more get 429 (default 64)")
    serve.add_argument("--default-max-tokens", type=int, default=256,
                       help="max_tokens of a request that gives none (default 256)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn log level (default info)")
    return serve


def run_serve(args: argparse.Namespace) -> int:
    """Start the server from parsed ``serve`` arguments; a clear message if the extra is missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        print(f"{INSTALL_HINT} ({exc.name} is not installed)", file=sys.stderr)
        return 2
    from .app import serve

    print(f"loading {args.model} (draft {args.draft}) ...", file=sys.stderr, flush=True)
    serve(args.host, args.port, args.model, None if args.draft == "none" else args.draft, backend=args.backend,
          device=args.device, dtype=args.dtype, max_batch_size=args.max_batch_size,
          whitespace=args.whitespace, compile_timeout=args.compile_timeout, max_request_bytes=args.max_request_bytes,
          queue_limit=args.queue_limit, default_max_tokens=args.default_max_tokens, log_level=args.log_level)
    return 0
