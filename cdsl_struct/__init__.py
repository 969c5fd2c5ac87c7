"""cdsl_struct: structured output from Hugging Face causal LMs.

Hard constraints (JSON Schema, regex, choices, Lark grammars) mask the logits so every output
is valid; ``compile()`` a spec once for a tokenizer, then drive one ``ConstraintState`` per
sequence.
"""

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
    GrammarSyntaxError,
    IncompatibleTokenizers,
    InvalidSchema,
    InvalidToken,
    RollbackError,
    TokenizerNotFound,
    UnsatisfiableSchema,
    UnsupportedFeature,
)
from .models.tokenizers import NAMED_TOKENIZERS, load_tokenizer

__version__ = "0.1.0"

__all__ = [
    "NAMED_TOKENIZERS",
    "CdslError",
    "Choice",
    "CompileError",
    "CompileTimeout",
    "CompiledConstraint",
    "ConstraintState",
    "Grammar",
    "GrammarSyntaxError",
    "IncompatibleTokenizers",
    "InvalidSchema",
    "InvalidToken",
    "JsonSchema",
    "Regex",
    "RollbackError",
    "TokenVocabulary",
    "TokenizerNotFound",
    "UnsatisfiableSchema",
    "UnsupportedFeature",
    "WhitespacePolicy",
    "allocate_bitmask",
    "apply_bitmask",
    "compile",
    "load_tokenizer",
]
