"""Which device and dtype a model runs on: ``"auto"`` resolved once, explicit choices checked."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from ..errors import DeviceUnavailable

logger = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def resolve_device(device: Any = "auto") -> Any:
    """A ``torch.device`` for ``device``: ``"auto"`` picks cuda, then mps, then cpu.

    Explicit names (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, or a ``torch.device``) are
    checked against what this torch build can reach; a missing one raises ``DeviceUnavailable``.
    """
    import torch

    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        chosen = device if isinstance(device, torch.device) else torch.device(str(device))
    except (RuntimeError, TypeError) as exc:
        raise DeviceUnavailable(f"unknown device {device!r}; use one of {', '.join(DEVICE_CHOICES)}") from exc
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(f"device {device!r} asked for, but this torch build sees no CUDA GPU")
        index = chosen.index if chosen.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise DeviceUnavailable(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
        return torch.device("cuda", index)
    if chosen.type == "mps" and not _mps_available():
        raise DeviceUnavailable(f"device {device!r} asked for, but MPS is not available here")
    if chosen.type not in ("cpu", "cuda", "mps"):
        raise DeviceUnavailable(f"unsupported device {device!r}; use one of {', '.join(DEVICE_CHOICES)}")
    return chosen


def resolve_dtype(dtype: Any, device: Any) -> Any:
    """A ``torch.dtype``: ``"auto"`` is bfloat16 on a GPU that supports it and on a CPU with native
    bfloat16 instructions (``cpu_has_native_bf16``), else float32."""
    import torch

    if dtype is None or dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        if device.type == "cpu" and cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if str(dtype) not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_CHOICES)}")
    return names[str(dtype)]


#: CPU feature flags (Linux ``/proc/cpuinfo``) of native bfloat16 arithmetic: x86 AVX-512 BF16 and
#: AMX, Arm's BF16 extension
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bfloat16 natively (a flag of ``NATIVE_BF16_FLAGS``).

    There a bfloat16 model's matmuls run at about twice the float32 rate and read half the bytes
    (measured on AVX-512 BF16 cores: prefill 1.8x, a one-row decode step 1.2x faster); without
    them torch emulates bfloat16 and gains little. Only Linux reports the flags; elsewhere False.
    ``CDSL_CPU_BF16=0`` or ``=1`` overrides the detection."""
    override = os.environ.get("CDSL_CPU_BF16")
    if override in ("0", "1"):
        return override == "1"
    return _cpu_flags_name_bf16(cpuinfo)


def note_emulated_bf16(dtype: Any, device: Any, what: str = "the model") -> bool:
    """Say once per process (a logged warning) that bfloat16 on this CPU is converted, not native.

    bfloat16 runs on every CPU (the linears take the stock kernels where oneDNN has no bfloat16
    path: ``models.packed``), but without native instructions only memory-bound work gains:
    measured on an AVX2-only EPYC with SmolLM2, a one-row decode step took 0.6x float32's time
    (half the bytes to read) and a 64-token prefill 4.7x. Whether it warned."""
    import torch

    if dtype != torch.bfloat16 or device.type != "cpu" or cpu_has_native_bf16() or _emulated_noted:
        return False
    _emulated_noted.append(what)
    logger.warning("%s runs in bfloat16 on a CPU without native bfloat16 (none of %s): it works, by conversion; "
                   "one-row decode steps gain (half the bytes), but prefill and batched steps take several times "
                   "float32's time: for serving use dtype='float32' (what dtype='auto' picks here)",
                   what, ", ".join(sorted(NATIVE_BF16_FLAGS)))
    return True


_emulated_noted: list[str] = []


@functools.cache
def _cpu_flags_name_bf16(cpuinfo: str) -> bool:
    try:
        with open(cpuinfo, encoding="utf-8") as file:
            for line in file:
                if line.startswith(("flags", "Features")):
                    return bool(NATIVE_BF16_FLAGS & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return False


def model_device(model: Any) -> Any:
    """The device a model's weights live on."""
    import torch

    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _mps_available() -> bool:
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())
