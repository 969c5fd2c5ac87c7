"""``cdsl-struct`` command line: ``generate``, ``batch``, ``serve``, ``bench`` harnesses, ``models``, ``tokenizers``.

The ``bench`` harnesses (``cdsl_struct.bench``) hold their own options; this module only registers them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .bench import HARNESSES, register
from .bulk.cli import add_batch_parser, run_batch
from .generate_cli import add_generate_parser, run_generate
from .server.cli import add_serve_parser, run_serve


def main(argv: list[str] | None = None) -> int:
    """Run ``cdsl-struct`` with ``argv`` (default: the process's arguments); the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="cdsl-struct", description="Structured output for Hugging Face LMs.")
    commands = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(commands)
    add_batch_parser(commands)
    bench = commands.add_parser("bench", help="run a benchmark harness").add_subparsers(dest="bench", required=True)
    register(bench, HARNESSES, argv[1:] if argv[:1] == ["bench"] else [], prog="cdsl-struct")

    models = commands.add_parser("models", help="fetch and prepare models, or list them")
    models.add_argument("action", choices=["pull", "list"])
    models.add_argument("names", nargs="*", help="models to pull (default: smollm2)")

    tokenizers = commands.add_parser("tokenizers", help="fetch or list the named test tokenizers")
    tokenizers.add_argument("action", choices=["fetch", "list"])
    tokenizers.add_argument("names", nargs="*", help="names to fetch (default: all)")
    tokenizers.add_argument("--engines", action="store_true",
                            help="also time building each engine's view of the vocabulary")

    add_serve_parser(commands)

    args = parser.parse_args(argv)
    if args.command == "bench":
        return args.run(args)
    handler = _HANDLERS.get(args.command)
    if handler is None:
        parser.error("unknown command")
    return handler(args)


def _models(args: argparse.Namespace) -> int:
    import time

    from .models.loading import KNOWN_MODELS, load_model

    if args.action == "list":
        for name, description in KNOWN_MODELS.items():
            print(f"{name:10s} {description}")
        return 0
    for name in args.names or ["smollm2"]:
        start = time.perf_counter()
        loaded = load_model(name)
        print(f"{name}: ready in {time.perf_counter() - start:.1f}s "
              f"({sum(p.numel() for p in loaded.model.parameters()) / 1e6:.0f}M parameters)")
    return 0


def _tokenizers(args: argparse.Namespace) -> int:
    import time

    from .constraints import Regex, TokenVocabulary, compile
    from .constraints.backends import BACKEND_NAMES
    from .models.tokenizers import NAMED_TOKENIZERS, load_tokenizer, named_tokenizer_dir

    names = args.names or list(NAMED_TOKENIZERS)
    for name in names:
        if args.action == "list":
            print(name)
            continue
        start = time.perf_counter()
        folder = named_tokenizer_dir(name)
        fetched = time.perf_counter() - start
        vocabulary = TokenVocabulary.from_tokenizer(load_tokenizer(name))
        engines = ""
        if args.engines:
            for engine in BACKEND_NAMES:
                tick = time.perf_counter()
                compile(Regex("x"), vocabulary, backend=engine, cache=False)
                engines += f"  {engine} view {time.perf_counter() - tick:5.2f}s"
        print(f"{name:8s} {vocabulary.size:7d} tokens  {vocabulary.scheme:13s} fetch {fetched:5.1f}s  "
              f"vocabulary {vocabulary.build_seconds:5.2f}s{engines}  {folder}")
    return 0


_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "generate": run_generate, "batch": run_batch, "serve": run_serve, "models": _models, "tokenizers": _tokenizers,
}
"""What each command but ``bench`` runs."""


if __name__ == "__main__":
    sys.exit(main())
