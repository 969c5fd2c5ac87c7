"""The module-level verbs (``cdsl_struct.generate``, ``generate_batch``, ``stream`` and their async
forms): each runs on a ``Generator`` kept per (model, draft, options), so a model loads once per
process (``cached_generator``)."""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from .api import Emit, Generator
from .calls import deprecated_shape, partial_reader_for, split_batch
from .constraints.whitespace import DEFAULT_WHITESPACE
from .models.loading import LoadedModel
from .result import Result
from .streaming import AsyncTextStream, PartialValues, TextStream

_generators: dict[tuple, Generator] = {}
_generators_lock = threading.Lock()


def cached_generator(model: str | LoadedModel = "smollm2", draft: str | None = "auto",
                     **options: Any) -> Generator:
    """The Generator for (model, draft, options), made once and kept for the process."""
    key = (model if isinstance(model, str) else id(model), draft, tuple(sorted(options.items())))
    with _generators_lock:
        if key not in _generators:
            _generators[key] = Generator(model, draft=draft, **options)
        return _generators[key]


def _module_generator(model: str | LoadedModel, draft: str | None, backend: str, whitespace: str,
                      compile_timeout: float, device: Any, dtype: Any) -> Generator:
    return cached_generator(model, draft, backend=backend, whitespace=whitespace, compile_timeout=compile_timeout,
                            device=device, dtype=dtype)


def generate(prompt: str | Sequence[Any], *, model: str | LoadedModel = "smollm2", draft: str | None = "auto",
             backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE, compile_timeout: float = 30.0,
             device: Any = "auto", dtype: Any = "auto", **kwargs: Any) -> Result:
    """``Generator(model, draft=...).generate(prompt, **kwargs)`` with the Generator kept per
    (model, draft, backend, whitespace, compile_timeout, device, dtype), so the model loads once
    per process. A list of prompts and ``stream=True`` are deprecated here as on
    ``Generator.generate``: use ``generate_batch`` and ``stream``.
    """
    generator = _module_generator(model, draft, backend, whitespace, compile_timeout, device, dtype)
    message = deprecated_shape(prompt, bool(kwargs.get("stream")))
    if message is None:
        return generator.generate(prompt, **kwargs)
    warnings.warn(message, DeprecationWarning, stacklevel=2)  # at the caller's line, once
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return generator.generate(prompt, **kwargs)


def generate_batch(prompts: Sequence[str | Sequence[Any]], *, model: str | LoadedModel = "smollm2",
                   draft: str | None = "auto", backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE,
                   compile_timeout: float = 30.0, device: Any = "auto", dtype: Any = "auto",
                   **kwargs: Any) -> list[Result]:
    """``Generator.generate_batch`` on the Generator ``generate()`` keeps for these options."""
    return _module_generator(model, draft, backend, whitespace, compile_timeout, device, dtype) \
        .generate_batch(prompts, **kwargs)


def stream(prompt: str | Sequence[Any], *, model: str | LoadedModel = "smollm2", draft: str | None = "auto",
           backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE, compile_timeout: float = 30.0,
           device: Any = "auto", dtype: Any = "auto", **kwargs: Any) -> TextStream:
    """``Generator.stream`` (a ``TextStream``) on the Generator ``generate()`` keeps for these options."""
    return _module_generator(model, draft, backend, whitespace, compile_timeout, device, dtype) \
        .stream(prompt, **kwargs)


async def agenerate(prompt: str | Sequence[Any], *, model: str | LoadedModel = "smollm2",
                    draft: str | None = "auto", backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE,
                    compile_timeout: float = 30.0, device: Any = "auto", dtype: Any = "auto",
                    **kwargs: Any) -> Result:
    """``Generator.agenerate`` on the Generator ``generate()`` keeps for these options (loaded off
    the event loop the first time)."""
    generator = await asyncio.to_thread(_module_generator, model, draft, backend, whitespace, compile_timeout,
                                        device, dtype)
    return await generator.agenerate(prompt, **kwargs)


async def agenerate_batch(prompts: Sequence[str | Sequence[Any]], *, model: str | LoadedModel = "smollm2",
                          draft: str | None = "auto", backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE,
                          compile_timeout: float = 30.0, device: Any = "auto", dtype: Any = "auto",
                          **kwargs: Any) -> list[Result]:
    """``Generator.agenerate_batch`` on the Generator ``generate()`` keeps for these options."""
    generator = await asyncio.to_thread(_module_generator, model, draft, backend, whitespace, compile_timeout,
                                        device, dtype)
    return await generator.agenerate_batch(prompts, **kwargs)


def astream(prompt: str | Sequence[Any], *, model: str | LoadedModel = "smollm2", draft: str | None = "auto",
            backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE, compile_timeout: float = 30.0,
            device: Any = "auto", dtype: Any = "auto", cancel: threading.Event | None = None,
            **kwargs: Any) -> AsyncTextStream:
    """``Generator.astream`` (an ``AsyncTextStream``) on the Generator ``generate()`` keeps for
    these options; the Generator is made (the model loaded, the first time) on the stream's
    thread, so the event loop never waits for it."""
    if kwargs.get("stream") is not None:
        raise ValueError("astream() always streams; pass no stream= argument")
    if split_batch(prompt)[1]:
        raise ValueError("astream() takes one prompt; use agenerate_batch() for a list of prompts")

    partials = PartialValues()

    def work(emit: Emit, event: threading.Event) -> Result:
        generator = _module_generator(model, draft, backend, whitespace, compile_timeout, device, dtype)
        call, encoded, _ = generator._prepare(prompt, **kwargs)
        partials.reader = partial_reader_for(call)
        return generator._run(call, encoded[0], emit, event)

    return AsyncTextStream(work, cancel, partials)

