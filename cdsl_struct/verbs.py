"""The module-level verbs (``cdsl_struct.generate``, ``generate_batch``, ``stream`` and their async
forms): each runs on a ``Generator`` kept per (model, draft, options), so a model loads once per
process (``cached_generator``). Importing this module loads neither torch nor transformers: a bad
request is refused before they load (``arguments.read_arguments``)."""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .arguments import deprecated_shape, read_arguments, split_batch
from .constraints.whitespace import DEFAULT_WHITESPACE
from .models.loading import LoadedModel
from .result import Result
from .streaming import AsyncTextStream, PartialValues, TextStream

if TYPE_CHECKING:
    from .api import Emit, Generator

_generators: dict[tuple, Generator] = {}
_generators_lock = threading.Lock()


#: a verb's keyword arguments that are not the request's own (``read_arguments`` does not take them)
_CALL_OPTIONS = ("stream", "chat", "cancel", "compile_timeout")


def _key(model: str | LoadedModel, draft: str | None, options: dict[str, Any]) -> tuple:
    return model if isinstance(model, str) else id(model), draft, tuple(sorted(options.items()))


def cached_generator(model: str | LoadedModel = "smollm2", draft: str | None = "auto",
                     **options: Any) -> Generator:
    """The Generator for (model, draft, options), made once and kept for the process."""
    from .api import Generator

    key = _key(model, draft, options)
    with _generators_lock:
        if key not in _generators:
            _generators[key] = Generator(model, draft=draft, **options)
        return _generators[key]


def _module_generator(model: str | LoadedModel, draft: str | None, backend: str, whitespace: str,
                      compile_timeout: float, device: Any, dtype: Any, request: dict[str, Any]) -> Generator:
    """The kept Generator; before one is made (the model loaded), ``request`` (the verb's keyword
    arguments) is checked, so a bad spec or parameter raises its typed error at once."""
    options = {"backend": backend, "whitespace": whitespace, "compile_timeout": compile_timeout, "device": device,
               "dtype": dtype}
    with _generators_lock:
        loaded = _key(model, draft, options) in _generators
    if not loaded:
        read_arguments(**{name: value for name, value in request.items() if name not in _CALL_OPTIONS})
    return cached_generator(model, draft, **options)


def generate(prompt: str | Sequence[Any], *, model: str | LoadedModel = "smollm2", draft: str | None = "auto",
             backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE, compile_timeout: float = 30.0,
             device: Any = "auto", dtype: Any = "auto", **kwargs: Any) -> Result:
    """``Generator(model, draft=...).generate(prompt, **kwargs)`` with the Generator kept per
    (model, draft, backend, whitespace, compile_timeout, device, dtype), so the model loads once
    per process. A list of prompts and ``stream=True`` are deprecated here as on
    ``Generator.generate``: use ``generate_batch`` and ``stream``.
    """
    generator = _module_generator(model, draft, backend, whitespace, compile_timeout, device, dtype, kwargs)
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
    return _module_generator(model, draft, backend, whitespace, compile_timeout, device, dtype, kwargs) \
        .generate_batch(prompts, **kwargs)


def stream(prompt: str | Sequence[Any], *, model: str | LoadedModel = "smollm2", draft: str | None = "auto",
           backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE, compile_timeout: float = 30.0,
           device: Any = "auto", dtype: Any = "auto", **kwargs: Any) -> TextStream:
    """``Generator.stream`` (a ``TextStream``) on the Generator ``generate()`` keeps for these options."""
    return _module_generator(model, draft, backend, whitespace, compile_timeout, device, dtype, kwargs) \
        .stream(prompt, **kwargs)


async def agenerate(prompt: str | Sequence[Any], *, model: str | LoadedModel = "smollm2",
                    draft: str | None = "auto", backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE,
                    compile_timeout: float = 30.0, device: Any = "auto", dtype: Any = "auto",
                    **kwargs: Any) -> Result:
    """``Generator.agenerate`` on the Generator ``generate()`` keeps for these options (loaded off
    the event loop the first time)."""
    generator = await asyncio.to_thread(_module_generator, model, draft, backend, whitespace, compile_timeout,
                                        device, dtype, kwargs)
    return await generator.agenerate(prompt, **kwargs)


async def agenerate_batch(prompts: Sequence[str | Sequence[Any]], *, model: str | LoadedModel = "smollm2",
                          draft: str | None = "auto", backend: str = "auto", whitespace: str = DEFAULT_WHITESPACE,
                          compile_timeout: float = 30.0, device: Any = "auto", dtype: Any = "auto",
                          **kwargs: Any) -> list[Result]:
    """``Generator.agenerate_batch`` on the Generator ``generate()`` keeps for these options."""
    generator = await asyncio.to_thread(_module_generator, model, draft, backend, whitespace, compile_timeout,
                                        device, dtype, kwargs)
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
        from .calls import partial_reader_for

        generator = _module_generator(model, draft, backend, whitespace, compile_timeout, device, dtype, kwargs)
        call, encoded, _ = generator._prepare(prompt, **kwargs)
        partials.reader = partial_reader_for(call)
        return generator._run(call, encoded[0], emit, event)

    return AsyncTextStream(work, cancel, partials)

