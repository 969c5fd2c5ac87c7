"""cdsl_struct: structured output from Hugging Face causal LMs.

Hard constraints (JSON Schema, regex, choices, Lark grammars) mask the logits so every output
is valid; ``generate()`` (or a reusable ``Generator``) decodes under them, with speculative
decoding and reward-steered strategies; ``compile()`` a spec once for a tokenizer to drive one
``ConstraintState`` per sequence yourself.

Importing the package loads the constraint layer, the errors and the plain data types only:
``Generator``, the verbs (``generate``, ``generate_batch``, ``stream`` and their async forms
``agenerate``, ``agenerate_batch``, ``astream``), ``load_tokenizer`` and ``NAMED_TOKENIZERS`` (and
the submodules behind them, which need torch and transformers) are imported on first use (PEP 562).
"""

from typing import TYPE_CHECKING, Any

from .constraints import (
    Choice,
    CompiledConstraint,
    ConstraintState,
    Grammar,
    JsonSchema,
    Regex,
    StructuralTag,
    Tag,
    TokenVocabulary,
    WhitespacePolicy,
    allocate_bitmask,
    apply_bitmask,
    compile,
)
from .constraints.reasoning import Reasoning
from .errors import (
    CdslError,
    CompileError,
    CompileTimeout,
    ConflictingConstraints,
    DeviceUnavailable,
    GrammarSyntaxError,
    IncompatibleTokenizers,
    InputError,
    InvalidArgument,
    InvalidSchema,
    InvalidStructuralTag,
    InvalidToken,
    InvalidToolCall,
    MatcherError,
    ModelNotFound,
    OutputInvalid,
    PromptTooLong,
    RequestCancelled,
    RewardError,
    RollbackError,
    TokenizerNotFound,
    UnknownGrammar,
    UnsatisfiableSchema,
    UnsupportedFeature,
    UnsupportedTokenizer,
)
from .integrations import outlines_types as _outlines_types  # noqa: F401 - registers its converter with as_spec
from .keywords import KeywordReport, Keywords
from .options import Method
from .params import GenerationParams
from .result import Result
from .streaming import AsyncTextStream, TextStream, Thought
from .tools import ToolCall, tool_from_function

if TYPE_CHECKING:
    from .api import Generator
    from .models.tokenizers import NAMED_TOKENIZERS, load_tokenizer
    from .verbs import agenerate, agenerate_batch, astream, generate, generate_batch, stream

__version__ = "0.1.0"

__all__ = [
    "NAMED_TOKENIZERS",
    "AsyncTextStream",
    "CdslError",
    "Choice",
    "CompileError",
    "CompileTimeout",
    "CompiledConstraint",
    "ConflictingConstraints",
    "ConstraintState",
    "DeviceUnavailable",
    "GenerationParams",
    "Generator",
    "Grammar",
    "GrammarSyntaxError",
    "IncompatibleTokenizers",
    "InputError",
    "InvalidArgument",
    "InvalidSchema",
    "InvalidStructuralTag",
    "InvalidToken",
    "InvalidToolCall",
    "JsonSchema",
    "KeywordReport",
    "Keywords",
    "MatcherError",
    "Method",
    "ModelNotFound",
    "OutputInvalid",
    "PromptTooLong",
    "Reasoning",
    "Regex",
    "RequestCancelled",
    "Result",
    "RewardError",
    "RollbackError",
    "StructuralTag",
    "Tag",
    "TextStream",
    "Thought",
    "TokenVocabulary",
    "TokenizerNotFound",
    "ToolCall",
    "UnknownGrammar",
    "UnsatisfiableSchema",
    "UnsupportedFeature",
    "UnsupportedTokenizer",
    "WhitespacePolicy",
    "agenerate",
    "agenerate_batch",
    "allocate_bitmask",
    "apply_bitmask",
    "astream",
    "compile",
    "generate",
    "generate_batch",
    "load_tokenizer",
    "stream",
    "tool_from_function",
]

# Submodules that ``import cdsl_struct`` used to load (so were attributes of the package); they
# are imported when first read as one, e.g. ``cdsl_struct.decoding``.
_LAZY_SUBMODULES = frozenset({"api", "calls", "decoding", "models", "paths", "prompts", "rewards", "verbs"})


_API_NAMES = frozenset({"Generator", "generate", "generate_batch", "stream", "agenerate", "agenerate_batch",
                        "astream"})


def __getattr__(name: str) -> Any:
    """The names that need torch or transformers, imported on first access."""
    if name == "Generator":
        from . import api as home
    elif name in _API_NAMES:
        from . import verbs as home
    elif name in ("NAMED_TOKENIZERS", "load_tokenizer"):
        from .models import tokenizers as home
    elif name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(home, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _LAZY_SUBMODULES)
