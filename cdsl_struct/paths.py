"""Where cdsl_struct keeps downloaded and derived files."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import platformdirs


def cache_dir(*parts: str) -> Path:
    """Return (and create) a folder under the cache root.

    The root is ``$CDSL_STRUCT_CACHE`` when set, else the user cache dir of ``cdsl_struct``.
    """
    root = os.environ.get("CDSL_STRUCT_CACHE") or platformdirs.user_cache_dir("cdsl_struct")
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution`` (``"unknown"`` where it is not installed): part of the
    keys of what is cached on disk."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"
