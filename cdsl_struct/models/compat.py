"""What the installed transformers calls things, where the versions the pin admits differ.

transformers 5.2x renamed the forward's ``past_key_values`` to ``cache`` (the old name still works,
with a warning); 5.17, which a GPU image may carry, knows only ``past_key_values`` and silently takes
an unknown ``cache=`` into ``**kwargs``, so a runner that passed it got a fresh cache of the model's
own: on the CPU an ``IndexError``, on CUDA a device-side assert that ends every later CUDA call of the
process. Each runner asks here once per model.
"""

from __future__ import annotations

import inspect
from typing import Any


def cache_keyword(model: Any) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``"cache"`` or ``"past_key_values"``."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned (``output.cache`` where it is called that, else
    ``output.past_key_values``; reading the old name on 5.2x only warns)."""
    try:
        return output["cache"]
    except KeyError:
        return output.past_key_values
