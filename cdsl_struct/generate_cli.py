"""``cdsl-struct generate``: one constrained generation from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .errors import CdslError
from .options import BACKENDS, add_output_options
from .params import add_param_arguments, params_from_args

EXIT_ERROR = 2
EXIT_INCOMPLETE = 3


def add_generate_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``generate`` to the ``cdsl-struct`` subcommands."""
    gen = commands.add_parser(
        "generate", help="generate one output under a constraint (JSON Schema, regex, choices, grammar, keywords)",
        description="Generate an answer to PROMPT with the model, under at most one hard constraint (--schema, "
                    "--regex, --choices, --grammar; none: free text), optionally steered towards --keywords. "
                    "Prints the value: JSON for --schema, the text otherwise (--tree: the grammar's parse tree). "
                    f"Exit status {EXIT_ERROR} on a bad input (one line on stderr), {EXIT_INCOMPLETE} when the "
                    "output hit --max-tokens or a dead end (the partial text is printed, marked incomplete).")
    gen.add_argument("prompt", nargs="?", default=None,
                     help="the prompt, sent as one user message through the chat template (default or '-': stdin)")
    constraint = gen.add_mutually_exclusive_group()
    constraint.add_argument("--schema", metavar="FILE", help="JSON Schema file: the output is JSON valid under it")
    constraint.add_argument("--regex", help="the output fully matches this regular expression")
    constraint.add_argument("--choices", action="append", metavar="A,B,C",
                            help="the output is one of these comma-separated strings (repeatable)")
    constraint.add_argument("--grammar", metavar="FILE_OR_NAME",
                            help="Lark grammar: a .lark file or a shipped name (json, arithmetic, sql_select, "
                                 "function_call)")
    constraint.add_argument("--structural-tag", metavar="FILE",
                            help="structural tag (JSON, as the server's response_format of that type: vLLM's "
                                 "structures/triggers or XGrammar's format): free text whose tags follow their schemas")
    gen.add_argument("--keywords", metavar="W1,W2",
                     help="comma-separated words the output should use (reward-steered: CDSL or CDLH); the words "
                          "the prompt lacks are named in it, and stderr says which the answer holds")
    gen.add_argument("--keyword-form", choices=("sentence", "paragraph", "text"), default="sentence",
                     help="with --keywords and no other constraint: one sentence (default), sentences on one "
                          "line, or free text")
    gen.add_argument("--no-name-keywords", dest="name_keywords", action="store_false",
                     help="with --keywords: leave the prompt as written (do not name the words in it)")
    gen.add_argument("--keywords-may-end-early", dest="hold_ending", action="store_false",
                     help="with --keywords: let a short sentence end while a word is missing (by default it "
                          "writes on where it may, below 20 words)")
    gen.add_argument("--keyword-optimism", type=float, default=None, metavar="X",
                     help="with --keywords: the credit in [0, 1] an unfinished answer gets for the words it may "
                          "still write (default 0.1; the paper's 0.5 steers more gently, in longer sentences)")
    gen.add_argument("--reasoning", action="store_true",
                     help="think first (between the model's markers), then answer under the constraint; the "
                          "thinking goes to stderr")
    gen.add_argument("--reasoning-budget", type=int, default=None, metavar="TOKENS",
                     help="with --reasoning (implied): at most this many thinking tokens (default half of "
                          "--max-tokens)")
    gen.add_argument("--model", default="smollm2",
                     help="model: smollm2 (embedded default), gemma3-270m, an HF id, a folder or a .gguf file")
    gen.add_argument("--draft", default="auto",
                     help="draft: auto (prompt lookup), none, lookup, bf16, layers:N or a model (default auto)")
    gen.add_argument("--backend", default="auto", choices=BACKENDS,
                     help="constraint engine (default auto)")
    add_output_options(gen)
    add_device_arguments(gen)
    add_param_arguments(gen)
    gen.add_argument("--stream", action="store_true", help="print the text as it is generated")
    gen.add_argument("--tree", action="store_true", help="with --grammar: print the parse tree, not the text")
    gen.add_argument("--stats", action="store_true",
                     help="print the method, finish reason and decoding counters to stderr as JSON")
    return gen


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--dtype`` and ``--max-batch-size``, shared by ``generate`` and ``serve``."""
    parser.add_argument("--device", default="auto",
                        help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps (default auto)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="weights' precision (default auto: bfloat16 on a GPU that supports it and on a "
                             "CPU with native bfloat16, else float32)")
    parser.add_argument("--max-batch-size", type=int, default=32,
                        help="rows decoded together in one forward pass (default 32)")


def run_generate(args: argparse.Namespace) -> int:
    """Run ``generate`` from parsed arguments; a one-line message and exit 2 on bad input."""
    from .arguments import read_arguments
    from .streaming import Thought
    from .verbs import cached_generator

    try:
        if args.tree and not args.grammar:
            raise ValueError("--tree needs --grammar")
        prompt = _prompt(args.prompt)
        kwargs = _constraint_kwargs(args)
        read_arguments(params=params_from_args(args), **kwargs)  # a bad spec fails before the model loads
        generator = cached_generator(args.model, None if args.draft == "none" else args.draft, backend=args.backend,
                                     whitespace=args.whitespace, loop_guard=args.loop_guard,
                                     string_guard=args.string_guard, device=args.device,
                                     dtype=args.dtype, max_batch_size=args.max_batch_size)
        if args.stream:
            with generator.stream(prompt, params=params_from_args(args), **kwargs) as stream:
                for delta in stream:
                    print(delta, end="", flush=True, file=sys.stderr if isinstance(delta, Thought) else sys.stdout)
                result = stream.result
            print()
        else:
            result = generator.generate(prompt, params=params_from_args(args), **kwargs)
            if result.reasoning is not None:
                print(f"[thinking] {result.reasoning.strip()}", file=sys.stderr)
            print(_shown(result, args) if result.complete else result.text)
    except (CdslError, ValueError, OSError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"cdsl-struct generate: error: {first_line}", file=sys.stderr)
        return EXIT_ERROR
    if result.keywords is not None:
        missing = f"; missing: {', '.join(result.keywords.missing)}" if result.keywords.missing else ""
        print(f"cdsl-struct generate: keywords covered: {', '.join(result.keywords.covered) or 'none'}{missing}",
              file=sys.stderr)
    if args.stats:
        print(json.dumps({"method": result.method, "finish_reason": result.finish_reason,
                          "complete": result.complete, **result.stats.as_dict()}), file=sys.stderr)
    if result.closed_by_budget:
        print("cdsl-struct generate: the answer was closed early to fit --max-tokens (valid; strings may be short, "
              "optional fields missing)", file=sys.stderr)
    if not result.complete:
        print(f"cdsl-struct generate: incomplete output (finish_reason {result.finish_reason}); "
              "raise --max-tokens", file=sys.stderr)
        return EXIT_INCOMPLETE
    return 0


def _prompt(argument: str | None) -> str:
    text = sys.stdin.read() if argument in (None, "-") else argument
    if not text.strip():
        raise ValueError("the prompt is empty: pass it as an argument or on stdin")
    return text


def _constraint_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``generate``'s constraint arguments; files and grammar names are read here, before any model loads
    (``read_arguments`` then parses and checks them)."""
    kwargs: dict[str, Any] = {}
    if args.schema:
        kwargs["schema"] = Path(args.schema).read_text(encoding="utf-8")
    if args.regex is not None:
        kwargs["regex"] = args.regex
    if args.choices:
        kwargs["choices"] = [c.strip() for group in args.choices for c in group.split(",") if c.strip()]
    if args.grammar:
        from .constraints.specs import Grammar

        kwargs["grammar"] = Grammar(args.grammar)  # read (and any unknown name refused) before the model loads
    if args.structural_tag:
        from .constraints.structural_tag import from_response_format

        try:
            given = json.loads(Path(args.structural_tag).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"--structural-tag {args.structural_tag}: not JSON ({exc})") from None
        kwargs["grammar"] = from_response_format(given)
    if args.keywords:
        kwargs["keywords"] = {"words": [w.strip() for w in args.keywords.split(",") if w.strip()],
                              "form": args.keyword_form, "name": args.name_keywords, "hold_ending": args.hold_ending}
        if args.keyword_optimism is not None:
            kwargs["keywords"]["optimism"] = args.keyword_optimism
    if args.reasoning_budget is not None:
        if args.reasoning_budget < 0:
            raise ValueError("--reasoning-budget takes a count of thinking tokens >= 0")
        kwargs["reasoning"] = args.reasoning_budget
    elif args.reasoning:
        kwargs["reasoning"] = True
    return kwargs


def _shown(result: Any, args: argparse.Namespace) -> str:
    """JSON for --schema, the parse tree with --tree, else the text."""
    if args.schema:
        return json.dumps(result.value, ensure_ascii=False)
    if args.tree:
        return result.value.pretty().rstrip("\n")
    return result.text
