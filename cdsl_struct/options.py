"""Names users choose from, kept in one light module (the CLI builds its parsers without importing torch)."""

from enum import Enum
from typing import Any

from .errors import ConflictingConstraints  # noqa: F401 - its home before errors.py held them all


class Method(str, Enum):
    """The decoders of ``Generator.generate(method=...)`` (a string equal to its value is accepted too)."""

    AUTO = "auto"
    TARGET = "target"
    SPECULATIVE = "speculative"
    CDLH = "cdlh"
    CDSL = "cdsl"

    @property
    def steered(self) -> bool:
        """Steered by a reward through lookaheads (CDLH, CDSL)."""
        return self in (Method.CDLH, Method.CDSL)

    @classmethod
    def parse(cls, name: Any) -> "Method":
        """The method called ``name``; ``ValueError`` naming the choices otherwise."""
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}") from None


METHODS = tuple(method.value for method in Method)
"""The names of ``Method``, for argument parsers."""
ENGINES = ("llguidance", "outlines-core")
"""Constraint engines, the order ``backend="auto"`` tries them in for most specs."""
BACKENDS = ("auto", *ENGINES)
"""What ``compile(backend=...)`` and the CLI's ``--backend`` accept."""
WHITESPACE_POLICIES = ("compact", "spaced", "flexible", "newlines", "any")
"""Named JSON whitespace policies (``constraints.whitespace``); a bounded regex is accepted too."""
COMPILE_MODES = ("auto", "on", "off")
"""``torch_compile`` settings (``models.compiled``): ``"auto"`` compiles where it is measured to pay (a
ragged runner on the CPU with a C++ compiler), ``"on"`` tries wherever it can, ``"off"`` stays eager."""
SERVE_TORCH_COMPILE = "auto"
"""``cdsl-struct serve``'s ``--torch-compile``: a server runs long, so it compiles for 1.2x the eager rate,
in a second process while it answers eagerly (``server.handoff``); ``Generator`` and the other commands
default to off (there the compile runs before the first answer)."""
DEFAULT_WHITESPACE = "flexible"
"""The JSON whitespace of every entry point that is not told otherwise: ``compile()``, ``Generator``,
``generate()``, tools, the server, ``cdsl-struct generate`` and ``cdsl-struct batch`` (and through
``compile()`` the transformers processor). Chosen by ``python -m benchmarks quality`` on its tune split:
the model's own spacing after ``:`` and ``,`` keeps its answers right (BENCHMARKS.md)."""


def one_constraint(given: dict[str, Any]) -> tuple[str, Any] | None:
    """The one hard constraint among ``given`` (name -> value, ``None`` for unset) as ``(name,
    value)``; ``None`` when none is set; ``ConflictingConstraints`` when several are. The one
    place that rule lives: ``generate()``, ``cdsl-struct batch`` and the server use it."""
    named = [(name, value) for name, value in given.items() if value is not None]
    if len(named) > 1:
        names = [name for name, _ in named]
        raise ConflictingConstraints(f"pass at most one of {'/'.join(given)}, got {', '.join(names)}", names)
    return named[0] if named else None


def add_output_options(parser: Any) -> None:
    """``--whitespace``, ``--no-loop-guard`` and ``--no-string-guard``: the same options with the same
    defaults for every command that decodes (``generate``, ``batch``, ``serve``)."""
    parser.add_argument("--whitespace", default=DEFAULT_WHITESPACE,
                        help=f"JSON whitespace: {', '.join(WHITESPACE_POLICIES)} or a bounded regex "
                             f"(default {DEFAULT_WHITESPACE}, chosen by bench quality)")
    parser.add_argument("--no-loop-guard", dest="loop_guard", action="store_false",
                        help="let an output that repeats one block of tokens run on to max_tokens "
                             "(by default the block's next repeat is steered away from)")
    parser.add_argument("--no-string-guard", dest="string_guard", action="store_false",
                        help="let a JSON string value the model leaves open swallow the closing bracket it "
                             "writes instead (by default the value ends there)")


def add_torch_compile_option(parser: Any, default: str) -> None:
    """``--torch-compile [auto|on|off]`` (a bare flag is ``on``) for the commands that run the engine
    long enough to pay for compiling: ``serve`` (default auto) and ``batch`` (default off)."""
    parser.add_argument("--torch-compile", nargs="?", const="on", default=default, choices=COMPILE_MODES,
                        help="run the batched forward through torch.compile (inductor): auto (on the CPU where a "
                             "C++ compiler is found), on (a bare --torch-compile: wherever it can), off "
                             f"(default {default}). Compiling takes minutes on two cores: serve answers eagerly "
                             "meanwhile and a second process compiles, then takes the requests; batch compiles "
                             "before it starts. Where it fails, decoding runs eagerly with a warning")
