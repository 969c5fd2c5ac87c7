"""Count the engine's reads of device tensors back to the host (each one a GPU sync).

``HostReads`` is a ``TorchFunctionMode`` that follows the logits of every target forward and
everything computed from them (slices, masked copies, argmaxes: any torch function with such a
tensor among its inputs) and counts each time one of them is read by the host (``tolist``,
``item``, ``float(t)``, ``int(t)``, ``bool(t)``, ``numpy``, ``cpu``). It works on the CPU too,
where "device" tensors are ordinary ones: what it counts is what would cross from a GPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

#: tensor methods that hand a tensor's values to the host
READS = frozenset({torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__,
                   torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu})


class HostReads(TorchFunctionMode):
    """Inside ``with HostReads() as reads`` (and ``reads.follow(runner)``), ``reads.count`` counts
    host reads of the runner's logits and of every tensor computed from them."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self._device: dict[int, weakref.ref[torch.Tensor]] = {}  # by id: tensors compare elementwise

    def follow(self, runner: Any) -> Callable[[], object]:
        """Mark what ``runner.run`` returns (and its ``last_flat``), and what its ``run_ahead`` returns,
        from now on; returns the function that stops it."""
        originals = {name: getattr(runner, name) for name in ("run", "run_ahead") if hasattr(runner, name)}
        def marking(method: Callable[..., Any]) -> Callable[..., Any]:
            def marked(*args: Any, **kwargs: Any) -> Any:
                out = method(*args, **kwargs)
                self._mark((out, getattr(runner, "last_flat", None)))  # the views it returns, and their base
                return out
            return marked
        for name, method in originals.items():
            setattr(runner, name, marking(method))
        return lambda: [delattr(runner, name) for name in originals]

    def _mark(self, value: Any) -> None:
        for leaf in tree_flatten(value)[0]:
            if isinstance(leaf, torch.Tensor) and not self._from_device(leaf):
                key = id(leaf)
                self._device[key] = weakref.ref(leaf, lambda _ref, key=key: self._device.pop(key, None))

    def _from_device(self, tensor: torch.Tensor) -> bool:
        ref = self._device.get(id(tensor))
        return ref is not None and ref() is tensor

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inputs = [leaf for leaf in tree_flatten((args, kwargs))[0] if isinstance(leaf, torch.Tensor)]
        from_device = any(self._from_device(leaf) for leaf in inputs)
        if from_device and func in READS:
            self.count += 1
        out = func(*args, **kwargs)
        if from_device and func not in READS:
            self._mark(out)
        return out
