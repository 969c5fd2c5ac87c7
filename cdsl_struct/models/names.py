"""How a model or tokenizer name is read before anything is loaded.

A name is one of: a known short name (``KNOWN_MODELS``, ``NAMED_TOKENIZERS``), a local path that
exists, a Hugging Face hub id written ``org/name``, or a bare hub id (``gpt2``) already in the local
Hugging Face cache. Anything else (``"smolm2"``) is refused at once, with the known names and the
closest of them, instead of spending tens of seconds on hub retries for a name that was a typo.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
"""A Hugging Face hub id as ``org/name`` (the hub itself checks the finer rules when it is asked)."""
BARE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A hub id with no ``org/`` (``gpt2``): taken only when the local Hugging Face cache holds it."""


def is_hub_id(name: str) -> bool:
    """Whether ``name`` is written as a hub id ``org/name``."""
    return HUB_ID.fullmatch(name) is not None


def in_hub_cache(name: str) -> bool:
    """Whether the local Hugging Face cache holds a model repository called ``name`` (no network)."""
    if not (is_hub_id(name) or BARE_ID.fullmatch(name)):
        return False
    from huggingface_hub import constants

    return (Path(constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}").is_dir()


def looks_like_path(name: str) -> bool:
    """Whether ``name`` is written as a file system path rather than a name or a hub id."""
    if name.startswith((".", "~")) or "\\" in name or Path(name).is_absolute():
        return True
    return "/" in name and not is_hub_id(name)


def unresolvable(name: str, known: Iterable[str], what: str) -> str | None:
    """``None`` when ``name`` may be loaded: a known name, an existing path, a hub id ``org/name``
    or a bare hub id in the local cache. Else why not, in one line, for the message ``could not
    load {what} {name!r}: ...``: the known names, the closest of them, and the forms a name may
    take. ``what`` is ``"model"`` or ``"tokenizer"``. Nothing here touches the network."""
    known = tuple(known)
    if not name.strip():
        return f"the name is empty; known {what}s: {', '.join(known)}"
    if name in known or Path(name).exists() or is_hub_id(name) or in_hub_cache(name):
        return None
    if looks_like_path(name):
        return (f"no such file or directory (give an existing local folder, a Hugging Face id as 'org/name', "
                f"or one of the known {what}s: {', '.join(known)})")
    close = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"not a known {what}, a local path or a Hugging Face id 'org/name'; {hint}known {what}s: "
            f"{', '.join(known)} (a bare id such as 'gpt2' is taken only when the local Hugging Face cache "
            "already holds it)")
