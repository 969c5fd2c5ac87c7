"""Models: loading (``load_model``), tokenizers, the runners that feed them (one sequence:
``ModelRunner``; many rows, one forward a step: ``RaggedRunner``, or the padded ``BatchRunner`` for
models it does not support, ``batch_runner`` picks) and the self-drafts CDSL uses."""

from .batch import BatchRunner, Feed
from .device import cpu_has_native_bf16, model_device
from .loading import LoadedModel, load_model
from .ragged import RaggedRunner
from .runner import ModelRunner, self_draft
from .self_check import batch_runner
from .tokenizers import NAMED_TOKENIZERS, load_tokenizer

__all__ = ["NAMED_TOKENIZERS", "BatchRunner", "Feed", "LoadedModel", "ModelRunner", "RaggedRunner", "batch_runner",
           "cpu_has_native_bf16", "load_model", "load_tokenizer", "model_device", "self_draft"]
