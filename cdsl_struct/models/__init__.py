"""Models: loading (``load_model``), tokenizers, the runners that feed them (one sequence:
``ModelRunner``; a padded batch: ``BatchRunner``) and the self-drafts CDSL uses."""

from .batch import BatchRunner, Feed
from .loading import LoadedModel, load_model
from .runner import ModelRunner, self_draft
from .tokenizers import NAMED_TOKENIZERS, load_tokenizer

__all__ = ["NAMED_TOKENIZERS", "BatchRunner", "Feed", "LoadedModel", "ModelRunner", "load_model", "load_tokenizer",
           "self_draft"]
