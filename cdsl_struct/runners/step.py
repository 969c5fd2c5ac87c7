"""``StaticStep``: the static buffers of a step and the step function itself.

The host packs a step (``plan.pack``) into one pinned buffer and copies it to the device buffer
with one non-blocking transfer; ``run(bucket)`` then runs the model's decoder over the bucket's
views of that buffer, the attention reading only device tensors (``runners.attention``), and
returns the final hidden states ``[rows * width, hidden]``. The LM head is not part of the step:
the runner applies it to the kept positions only. ``run`` has no host read and no branch on a
tensor's value, so it can be compiled with ``fullgraph=True`` and captured in a CUDA graph; the
buffers' addresses never change.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from .attention import STEP_KEYWORD, StaticAttention, step_mask
from .cache import StaticCache
from .plan import Bucket, FedRow, pack


class StaticStep:
    """The device and pinned host buffers of static steps up to ``largest`` int64 values, and the
    step function over ``model``'s decoder and ``cache``."""

    def __init__(self, model: Any, cache: StaticCache, largest: int) -> None:
        self.model = model
        self.decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.cache = cache
        device = cache.keys[0].device
        self.device = device
        config = getattr(model.config, "get_text_config", lambda: model.config)()
        self.group = config.num_attention_heads // (getattr(config, "num_key_value_heads", None)
                                                    or config.num_attention_heads)
        self.inputs = torch.zeros(largest, dtype=torch.long, device=device)
        pinned = device.type == "cuda"
        # two host buffers used in turn: a step's second pack must not overwrite the first's copy in flight
        self.host = [torch.zeros(largest, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self.copied: list[Any] = [None, None]  # the event of each host buffer's last copy (CUDA)
        self.turn = 0
        self.no_mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
        self._views: dict[Bucket, dict[str, torch.Tensor]] = {}
        self.fused: dict[Bucket, Any] = {}  # a bucket's step compiled for its shape (``fuse``)

    def views(self, bucket: Bucket) -> dict[str, torch.Tensor]:
        """The bucket's inputs as views of the device buffer (the same tensors every time)."""
        views = self._views.get(bucket)
        if views is None:
            n, rows, width = bucket.tokens, bucket.rows, bucket.width
            flat = self.inputs
            views = {"ids": flat[:n].view(rows, width), "positions": flat[n:2 * n].view(rows, width),
                     "write_slots": flat[2 * n:3 * n], "write_positions": flat[3 * n:4 * n],
                     "kept": flat[4 * n:5 * n], "row_slots": flat[5 * n:5 * n + rows]}
            self._views[bucket] = views
        return views

    def load(self, bucket: Bucket, rows: Sequence[FedRow]) -> torch.Tensor:
        """Pack ``rows`` for ``bucket`` and copy them to the device in one transfer; the device indices
        of the kept positions (``[kept]``, into the step's ``[rows * width]`` outputs)."""
        host = self.host[self.turn]
        if self.copied[self.turn] is not None:
            self.copied[self.turn].synchronize()  # long done: the copy of two packs ago
        _, kept = pack(bucket, rows, self.cache.spare, out=host.numpy())
        self.inputs[:bucket.size].copy_(host[:bucket.size], non_blocking=True)
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self.copied[self.turn] = event
        self.turn = 1 - self.turn
        return self.views(bucket)["kept"][:kept]

    def load_padding(self, bucket: Bucket) -> None:
        """Every row of ``bucket`` padded (what warm-up and capture run on: it writes the spare slot only)."""
        self.load(bucket, [])

    def run(self, bucket: Bucket) -> torch.Tensor:
        """The step function: the decoder over ``bucket``'s inputs; hidden states ``[rows * width, hidden]``
        (through the bucket's compiled step where ``fuse`` made one)."""
        fused = self.fused.get(bucket)
        return fused() if fused is not None else self.run_eagerly(bucket)

    def fuse(self, bucket: Bucket, backend: Any) -> None:
        """Compile ``bucket``'s step for its one shape (``torch.compile``, ``fullgraph=True``,
        ``dynamic=False``) with ``backend``: ``"inductor"`` (its kernels fused), ``"max-autotune"``
        (inductor autotuning them too, slower to compile; no CUDA graphs of its own either way: the
        capture makes them) or any ``torch.compile`` backend. Compiled at the first run, which
        ``StepGraphs.capture``'s warm-up is."""
        options = {"mode": "max-autotune-no-cudagraphs"} if backend == "max-autotune" else {"backend": backend}
        # the views handed in: traced, a lookup in ``_views`` would guard on how many buckets it holds
        self.fused[bucket] = torch.compile(functools.partial(self._decode, bucket, self.views(bucket)),
                                           fullgraph=True, dynamic=False, **options)

    def run_eagerly(self, bucket: Bucket) -> torch.Tensor:
        """``run`` without any compiled step."""
        return self._decode(bucket, self.views(bucket))

    def _decode(self, bucket: Bucket, views: dict[str, torch.Tensor]) -> torch.Tensor:
        step = StaticAttention(self.cache.keys, self.cache.values, views["write_slots"], views["write_positions"],
                               views["row_slots"] if bucket.gather else None,
                               step_mask(views["positions"], bucket.length, self.group), bucket.length,
                               views["positions"], self.group)
        out = self.decoder(input_ids=views["ids"], position_ids=views["positions"], attention_mask=self.no_mask,
                           use_cache=False, **{STEP_KEYWORD: step})
        return out.last_hidden_state.reshape(bucket.tokens, -1)


def packed_size(buckets: Sequence[Bucket]) -> int:
    """The int64 values the largest packed step of ``buckets`` takes."""
    return max(bucket.size for bucket in buckets)

