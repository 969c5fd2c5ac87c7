"""cdsl_struct: structured output from Hugging Face causal LMs.

Hard constraints (JSON Schema, regex, choices, Lark grammars) mask the logits so every output
is valid; ``generate()`` (or a reusable ``Generator``) decodes under them, with speculative
decoding and reward-steered strategies; ``compile()`` a spec once for a tokenizer to drive one
``ConstraintState`` per sequence yourself.
"""

from .api import Generator, generate
from .constraints import (
    Choice,
    CompiledConstraint,
    ConstraintState,
    Grammar,
    JsonSchema,
    Regex,
    TokenVocabulary,
    WhitespacePolicy,
    allocate_bitmask,
    apply_bitmask,
    compile,
)
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
from .models.tokenizers import NAMED_TOKENIZERS, load_tokenizer
from .options import Method
from .params import GenerationParams
from .result import Result
from .tools import ToolCall, tool_from_function

__version__ = "0.1.0"

__all__ = [
    "NAMED_TOKENIZERS",
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
    "InvalidToken",
    "InvalidToolCall",
    "JsonSchema",
    "MatcherError",
    "Method",
    "ModelNotFound",
    "OutputInvalid",
    "PromptTooLong",
    "Regex",
    "RequestCancelled",
    "Result",
    "RewardError",
    "RollbackError",
    "TokenVocabulary",
    "TokenizerNotFound",
    "ToolCall",
    "UnknownGrammar",
    "UnsatisfiableSchema",
    "UnsupportedFeature",
    "UnsupportedTokenizer",
    "WhitespacePolicy",
    "allocate_bitmask",
    "apply_bitmask",
    "compile",
    "generate",
    "load_tokenizer",
    "tool_from_function",
]
