"""The static-shape runner (``GraphRunner``): every decode and verify step of a fixed shape per
bucket, replayed from a CUDA graph on a GPU and run eagerly elsewhere.

Modules import one way: ``plan`` (buckets and the host's packing of a step, pure data) ->
``cache`` (the preallocated keys and values) -> ``attention`` (attention driven by device
tensors only) -> ``step`` (the static buffers and the step function) -> ``graphs`` (capture and
replay per bucket) -> ``runner`` (the ``RaggedRunner`` interface over all of it).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plan import Bucket, Buckets
    from .runner import GraphRunner

__all__ = ["Bucket", "Buckets", "GraphRunner"]


def __getattr__(name: str) -> Any:
    if name in ("Bucket", "Buckets"):
        from . import plan as home
    elif name == "GraphRunner":
        from . import runner as home
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(home, name)
