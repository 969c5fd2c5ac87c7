"""Models: loading (``load_model``), tokenizers, the runners that feed them (one sequence:
``ModelRunner``; many rows, one forward a step: ``RaggedRunner``, or the padded ``BatchRunner`` for
models it does not support, ``batch_runner`` picks) and the self-drafts CDSL uses.

Importing this package imports none of its modules (most need torch): each name is imported on
first access (PEP 562), so ``cdsl_struct.models.tokenizers`` loads without torch."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .batch import BatchRunner, Feed
    from .device import cpu_has_native_bf16, model_device, resolve_device
    from .loading import LoadedModel, load_model
    from .ragged import RaggedRunner
    from .runner import ModelRunner, self_draft
    from .self_check import batch_runner, check_ragged_once
    from .tokenizers import NAMED_TOKENIZERS, load_tokenizer

__all__ = ["NAMED_TOKENIZERS", "BatchRunner", "Feed", "LoadedModel", "ModelRunner", "RaggedRunner", "batch_runner",
           "check_ragged_once", "cpu_has_native_bf16", "load_model", "load_tokenizer", "model_device", "resolve_device",
           "self_draft"]

# Submodules that importing this package used to load (so were attributes of it); each is
# imported when first read as one.
_SUBMODULES = frozenset({"attention", "batch", "compiled", "device", "growing_cache", "loading", "names", "packed",
                         "prefix_cache", "ragged", "runner", "self_check", "tokenizers"})


def __getattr__(name: str) -> Any:
    if name in ("BatchRunner", "Feed"):
        from . import batch as home
    elif name in ("cpu_has_native_bf16", "model_device", "resolve_device"):
        from . import device as home
    elif name in ("LoadedModel", "load_model"):
        from . import loading as home
    elif name == "RaggedRunner":
        from . import ragged as home
    elif name in ("ModelRunner", "self_draft"):
        from . import runner as home
    elif name in ("batch_runner", "check_ragged_once"):
        from . import self_check as home
    elif name in ("NAMED_TOKENIZERS", "load_tokenizer"):
        from . import tokenizers as home
    elif name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(home, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)
