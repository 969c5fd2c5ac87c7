"""Hard constraints: specs, ``compile()``, per-sequence ``ConstraintState`` and token masks."""

from .compiler import CompiledConstraint, clear_cache, compile
from .mask import allocate_bitmask, allowed_tokens, apply_bitmask, is_allowed
from .specs import Choice, ConstraintSpec, Grammar, JsonSchema, Regex
from .state import ConstraintState
from .structural_tag import StructuralTag, Tag, TagSegment
from .vocabulary import TokenVocabulary
from .whitespace import WhitespacePolicy

__all__ = [
    "Choice",
    "CompiledConstraint",
    "ConstraintSpec",
    "ConstraintState",
    "Grammar",
    "JsonSchema",
    "Regex",
    "StructuralTag",
    "Tag",
    "TagSegment",
    "TokenVocabulary",
    "WhitespacePolicy",
    "allocate_bitmask",
    "allowed_tokens",
    "apply_bitmask",
    "clear_cache",
    "compile",
    "is_allowed",
]
