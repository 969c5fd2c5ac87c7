"""Names users choose from, kept in one light module (the CLI builds its parsers without importing torch)."""

from typing import Any

METHODS = ("auto", "target", "speculative", "cdlh", "cdsl")
"""Decoders of ``Generator.generate(method=...)``."""
ENGINES = ("llguidance", "outlines-core")
"""Constraint engines, the order ``backend="auto"`` tries them in for most specs."""
BACKENDS = ("auto", *ENGINES)
"""What ``compile(backend=...)`` and the CLI's ``--backend`` accept."""
WHITESPACE_POLICIES = ("compact", "spaced", "flexible", "newlines", "any")
"""Named JSON whitespace policies (``constraints.whitespace``); a bounded regex is accepted too."""
DEFAULT_WHITESPACE = "spaced"
"""The JSON whitespace of every entry point that is not told otherwise: ``compile()``, ``Generator``,
``generate()``, tools, the server, ``cdsl-struct generate`` and ``cdsl-struct batch`` (and through
``compile()`` the transformers processor). Chosen by ``cdsl-struct bench quality`` on its tune split:
the model's own spacing after ``:`` and ``,`` keeps its answers right (BENCHMARKS.md)."""


def add_whitespace_option(parser: Any) -> None:
    """``--whitespace``, the same option with the same default for every command that decodes JSON."""
    parser.add_argument("--whitespace", default=DEFAULT_WHITESPACE,
                        help=f"JSON whitespace: {', '.join(WHITESPACE_POLICIES)} or a bounded regex "
                             f"(default {DEFAULT_WHITESPACE}, chosen by bench quality)")
