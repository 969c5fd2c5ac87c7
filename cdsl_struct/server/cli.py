"""``cdsl-struct serve``: its arguments and how it starts (no FastAPI import until it runs)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..generate_cli import add_device_arguments
from ..options import BACKENDS, SERVE_TORCH_COMPILE, add_output_options, add_torch_compile_option
from ..tools.formats import FORMAT_NAMES
from .auth import API_KEY_ENV

INSTALL_HINT = "cdsl-struct serve needs the server extra: pip install 'cdsl_struct[server]'"


def add_serve_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``cdsl-struct`` subcommands."""
    serve = commands.add_parser(
        "serve", help="run the OpenAI-compatible HTTP server (needs the 'server' extra)",
        description="Serve one model over an OpenAI-compatible API: GET /v1/models, POST /v1/chat/completions, "
                    "POST /v1/completions (response_format json_schema/json_object, tools, stream, n, stop, logprobs, "
                    "penalties, and the extension fields regex, grammar, choices, keywords, method), GET /metrics. "
                    "Concurrent requests decode together as rows of one batch (up to --max-batch-size); "
                    "more wait in a bounded queue.")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.add_argument("--model", default="smollm2",
                       help="model: smollm2 (embedded default), gemma3-270m, an HF id, a folder or a .gguf file")
    serve.add_argument("--draft", default="auto",
                       help="speculative-decoding draft: auto, none, lookup, bf16, layers:N or a model (default auto)")
    add_device_arguments(serve)
    serve.add_argument("--backend", default="auto", choices=BACKENDS,
                       help="constraint engine (default auto)")
    add_output_options(serve)
    add_torch_compile_option(serve, SERVE_TORCH_COMPILE)
    serve.add_argument("--compile-timeout", type=float, default=30.0,
                       help="seconds a constraint may take to compile; over it the request gets 400 (default 30)")
    serve.add_argument("--max-request-bytes", type=int, default=2 * 1024 * 1024,
                       help="largest request body accepted; larger ones get 413 (default 2 MiB)")
    serve.add_argument("--queue-limit", type=int, default=64,
                       help="requests that may wait behind the running batch; more get 429 (default 64)")
    serve.add_argument("--default-max-tokens", type=int, default=256,
                       help="max_tokens of a request that gives none (default 256)")
    serve.add_argument("--max-tokens-limit", type=int, default=4096,
                       help="largest max_tokens a request may ask; more gets 400 (default 4096)")
    serve.add_argument("--max-prompt-tokens", type=int, default=None,
                       help="longest prompt in tokens; longer gets 400 context_length_exceeded (default: the "
                            "model's context)")
    serve.add_argument("--max-constraint-bytes", type=int, default=64 * 1024,
                       help="largest schema, grammar, regex or tool parameters schema (default 64 KiB)")
    serve.add_argument("--max-schema-depth", type=int, default=48,
                       help="deepest nesting of a schema a request may send (default 48)")
    serve.add_argument("--max-n", type=int, default=8, help="largest n (choices per request) (default 8)")
    serve.add_argument("--max-rows-per-request", type=int, default=16,
                       help="most rows one request adds to the batch: completions prompts times n (default 16)")
    serve.add_argument("--request-timeout", type=float, default=600.0,
                       help="seconds a request may run before it is cancelled and answered 504 (default 600)")
    serve.add_argument("--shutdown-grace", type=float, default=30.0,
                       help="seconds running requests get to finish when the server stops (default 30)")
    serve.add_argument("--allow-extra-properties", action="store_true",
                       help="decode JSON schemas exactly as given; by default objects that list properties "
                            "get no undeclared keys (as in Outlines, XGrammar and vLLM)")
    serve.add_argument("--tool-format", default="auto", choices=FORMAT_NAMES,
                       help="how tool calls are written: auto (the format of the model's chat template), or "
                            "hermes, llama3, mistral, gemma, deepseek, generic (default auto)")
    serve.add_argument("--api-key", default=None,
                       help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV}, else none)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn log level (default info)")
    return serve


MALLOC_ARENAS_ENV = "CDSL_STRUCT_MALLOC_ARENAS"
DEFAULT_MALLOC_ARENAS = 2


def bound_malloc_arenas() -> int | None:
    """Cap glibc's malloc arenas for this process (``$CDSL_STRUCT_MALLOC_ARENAS``, default 2; 0 leaves
    glibc's default, as does ``$MALLOC_ARENA_MAX``); the cap set, or None.

    The server's many threads (HTTP, compiles, masks) each get an arena by default, and the
    engine's tensors of ever-changing shapes fragment them: a 10-minute soak grew the server by
    1 GB with glibc's default and by 0.19 GB with 2 arenas (docs/benchmarks/2026-11-25-soak.md)."""
    import ctypes
    import ctypes.util

    arenas = int(os.environ.get(MALLOC_ARENAS_ENV, DEFAULT_MALLOC_ARENAS))
    if arenas <= 0 or "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return arenas if libc.mallopt(-8, arenas) == 1 else None  # -8: M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc (musl has no mallopt arenas)
        return None


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def keep_compiled_graphs() -> str:
    """Point inductor's caches (kernels, compiled graphs: ``models.compiled``) at the user cache,
    ``cache_dir("inductor")``, unless ``$TORCHINDUCTOR_CACHE_DIR`` names a folder; the folder used.

    torch keeps them under the system's temporary folder, which many machines clear at boot: the
    first start after it compiled for a minute again. Set in the environment before inductor reads
    it, so the compiling process the server starts inherits it. The server owns its process; the
    library leaves the user's setting alone."""
    if not os.environ.get(INDUCTOR_CACHE_ENV):
        from ..paths import cache_dir

        os.environ[INDUCTOR_CACHE_ENV] = str(cache_dir("inductor"))
    return os.environ[INDUCTOR_CACHE_ENV]


def run_serve(args: argparse.Namespace) -> int:
    """Start the server from parsed ``serve`` arguments; a clear message if the extra is missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        print(f"{INSTALL_HINT} ({exc.name} is not installed)", file=sys.stderr)
        return 2
    from .app import serve
    from .protocol import ServerLimits

    bound_malloc_arenas()
    if args.torch_compile != "off":
        keep_compiled_graphs()
    compiling = "" if args.torch_compile == "off" else \
        f"; torch.compile {args.torch_compile}: a second process compiles while this one answers eagerly"
    print(f"loading {args.model} (draft {args.draft}{compiling}) ...", file=sys.stderr, flush=True)
    limits = ServerLimits(max_tokens=args.max_tokens_limit, max_n=args.max_n,
                          max_constraint_bytes=args.max_constraint_bytes, max_schema_depth=args.max_schema_depth,
                          max_rows=args.max_rows_per_request)
    serve(args.host, args.port, args.model, None if args.draft == "none" else args.draft, backend=args.backend,
          device=args.device, dtype=args.dtype, max_batch_size=args.max_batch_size,
          whitespace=args.whitespace, loop_guard=args.loop_guard, string_guard=args.string_guard,
          compile_timeout=args.compile_timeout,
          log_level=args.log_level,
          extra_properties=args.allow_extra_properties, max_prompt_tokens=args.max_prompt_tokens,
          torch_compile=args.torch_compile, tool_format=args.tool_format,
          max_request_bytes=args.max_request_bytes, queue_limit=args.queue_limit,
          default_max_tokens=args.default_max_tokens, limits=limits, request_timeout=args.request_timeout,
          api_key=args.api_key or os.environ.get(API_KEY_ENV) or None, shutdown_grace=args.shutdown_grace)
    return 0
