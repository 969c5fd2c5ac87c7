"""``ModelRunner``: one model, one KV cache, and counters of what it cost.

A decoder feeds a runner the tokens not yet in its cache and gets back the logits of every
position it fed; after a rejected speculation it crops the cache back to the accepted prefix.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from ..errors import CdslError, IncompatibleTokenizers
from .compat import cache_keyword, returned_cache
from .device import model_device, note_emulated_bf16
from .int8 import quantise_linears


class ModelRunner:
    """Forward passes over a growing sequence with a KV cache.

    ``length`` is how many tokens the cache holds. Counters: ``passes`` (forward calls),
    ``positions`` (tokens processed), ``seconds`` (time in forward). Inputs go to the model's
    device and the logits stay there.
    """

    def __init__(self, model: Any, name: str = "target") -> None:
        self.model = model
        self.cache_keyword = cache_keyword(model)
        self.name = name
        self.device = model_device(model)
        self.cache: Any = None
        self.tokens: list[int] = []
        self.passes = 0
        self.positions = 0
        self.seconds = 0.0

    def reset(self) -> None:
        """Forget the sequence (the counters keep running)."""
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.tokens = []

    @property
    def length(self) -> int:
        """How many tokens the cache holds."""
        return len(self.tokens)

    def run(self, sequence: list[int], keep: int = 1) -> torch.Tensor:
        """Logits of the last ``keep`` positions of ``sequence``, reusing the cached prefix.

        The cache is cropped to the longest prefix it shares with ``sequence`` (speculated
        tokens that were rejected fall away), and at least the last ``keep`` tokens are fed.
        """
        if self.cache is None:
            self.reset()
        common = 0
        limit = min(len(self.tokens), len(sequence) - max(keep, 1))  # feed every kept position
        while common < limit and self.tokens[common] == sequence[common]:
            common += 1
        self.crop(common)
        return self.forward(sequence[common:], keep=keep)

    @torch.inference_mode()
    def forward(self, tokens: list[int], keep: int | None = None) -> torch.Tensor:
        """Feed ``tokens``; return float32 logits ``[keep or len(tokens), vocab]`` of the last positions."""
        if not tokens:
            raise CdslError("forward needs at least one token")
        if self.cache is None:
            self.reset()
        start = time.perf_counter()
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, **{self.cache_keyword: self.cache}, use_cache=True,
                         logits_to_keep=keep or len(tokens))
        self.cache = returned_cache(out)
        self.tokens.extend(tokens)
        self.passes += 1
        self.positions += len(tokens)
        self.seconds += time.perf_counter() - start
        return out.logits[0].float()

    def hold(self, sequence: list[int]) -> bool:
        """Crop the cache to exactly ``sequence`` if it holds it as a prefix (no forward pass)."""
        if self.cache is None or len(sequence) > len(self.tokens) or self.tokens[:len(sequence)] != sequence:
            return False
        self.crop(len(sequence))
        return True

    def crop(self, length: int) -> None:
        """Drop cached positions past ``length``."""
        if length < self.length:
            self.cache.crop(length - self.length)  # transformers 5: a negative count to remove
            del self.tokens[length:]


def self_draft(model: Any, kind: str) -> Any:
    """A draft built from the target's own weights.

    ``"bf16"``: the same weights in bfloat16. ``"int8"``: linear layers on int8 weights with each
    token's activations quantised on its own scale (``models.int8``: a row's logits do not depend on
    its batch; fbgemm's kernels run on the CPU only: on another device this raises ``CdslError``;
    use ``"bf16"`` or ``"layers:N"`` there). ``"layers:N"``: the first N decoder layers plus
    the final norm and LM head (weights shared with the target, nothing copied).
    """
    if kind == "bf16":
        note_emulated_bf16(torch.bfloat16, model_device(model), "the bf16 self-draft")
        return copy.deepcopy(model).to(torch.bfloat16).eval()
    if kind == "int8":
        if model_device(model).type != "cpu":
            raise CdslError(f"the int8 self-draft runs on the CPU only (fbgemm's int8 kernels); the target "
                            f"is on {model_device(model)}: use draft 'bf16' or 'layers:N' there")
        return quantise_linears(model)
    if kind.startswith("layers:"):
        count = int(kind.split(":", 1)[1])
        layers = model.model.layers
        if not 1 <= count <= len(layers):
            raise CdslError(f"layers:N needs 1 <= N <= {len(layers)}, got {count}")
        return first_layers(model, count).eval()
    raise CdslError(f"unknown self-draft {kind!r}; use 'bf16', 'int8' or 'layers:N'")


def first_layers(model: Any, count: int) -> Any:
    """``model`` with only its first ``count`` decoder layers, then its final norm and LM head: a
    view sharing every weight (nothing copied), the config's layer count and types cut to match."""
    # Shallow copies with their own module tables: assigning a submodule on a plain
    # copy.copy would write into the table it shares with the target.
    view, inner = copy.copy(model), copy.copy(model.model)
    view._modules = dict(model._modules)
    inner._modules = dict(model.model._modules)
    inner.layers = torch.nn.ModuleList(list(model.model.layers)[:count])
    view.model = inner
    view.config = copy.deepcopy(model.config)
    view.config.num_hidden_layers = count
    view.model.config = view.config
    if hasattr(view.config, "layer_types") and view.config.layer_types:
        view.config.layer_types = view.config.layer_types[:count]
    return view


def check_same_vocabulary(target_vocab: Any, draft_vocab: Any) -> None:
    """Raise ``IncompatibleTokenizers`` naming the first token id the two map differently."""
    if target_vocab.fingerprint == draft_vocab.fingerprint:
        return
    size = min(target_vocab.size, draft_vocab.size)
    for token_id in range(size):
        if target_vocab.token_bytes[token_id] != draft_vocab.token_bytes[token_id]:
            raise IncompatibleTokenizers(
                f"draft and target tokenizers differ first at token {token_id}: "
                f"{target_vocab.token_bytes[token_id]!r} vs {draft_vocab.token_bytes[token_id]!r}"
            )
    if target_vocab.size != draft_vocab.size:
        raise IncompatibleTokenizers(f"vocabulary sizes differ: {target_vocab.size} vs {draft_vocab.size}")
    raise IncompatibleTokenizers("draft and target tokenizers differ in special or EOS tokens")
