"""Compiled engine programs kept on disk, so a restarted process does not build them again.

An outlines-core ``Index`` can take from a fraction of a second to tens of seconds to build
(``backends/outlines_core_process.py``), and a server meets the same schemas after every restart.
``ProgramCache`` stores such a program as one file per key under ``cache_dir("programs")``
(``$CDSL_STRUCT_PROGRAM_CACHE`` overrides the folder; ``off`` turns the cache off).

The key hashes what was compiled (the engine's input text), the vocabulary's fingerprint and the
versions of this library and of the engine, so a program from another version is never read: its
key differs. Each file also carries those versions and a SHA-256 of its payload in a header, read
back before anything is unpickled; an entry whose header or checksum does not match (a torn or
foreign file) is ignored, and the rebuilt program replaces it. Writes go to a temporary file in
the same folder and are renamed into place (``os.replace`` is atomic on POSIX and Windows), so two
processes sharing the folder each see a whole entry or none, and the last writer wins with an
identical program. Files are only read from a folder the user owns (or chose), since they are pickles.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

from ..paths import cache_dir, installed_version

log = logging.getLogger(__name__)

FOLDER_ENV = "CDSL_STRUCT_PROGRAM_CACHE"
"""The cache's folder; ``off`` (or ``0``) keeps programs in memory only."""
MAGIC = b"cdsl-struct-program\n"


class ProgramCache:
    """Pickled programs by key in ``folder`` (None: a cache that keeps nothing)."""

    def __init__(self, folder: Path | None, versions: dict[str, str]) -> None:
        self.folder = folder
        self.versions = dict(sorted(versions.items()))
        self.hits = 0
        self.misses = 0
        self.ignored = 0
        """Entries found but not used: a header of other versions, a torn or altered payload."""

    @classmethod
    def for_engine(cls, engine: str) -> ProgramCache:
        """A cache of ``engine``'s programs (``engine``: the engine's distribution name) in the folder
        ``FOLDER_ENV`` names, else the user cache."""
        setting = os.environ.get(FOLDER_ENV, "")
        folder = None if setting.lower() in ("off", "0", "false") else \
            (Path(setting) if setting else cache_dir("programs"))
        return cls(folder, {"cdsl_struct": installed_version("cdsl_struct"), engine: installed_version(engine)})

    def key(self, *parts: str) -> str:
        """The entry name for a program compiled from ``parts`` under this cache's versions."""
        digest = hashlib.sha256(json.dumps([self.versions, *parts]).encode())
        return digest.hexdigest()

    def load(self, key: str) -> Any | None:
        """The program stored under ``key``, or None (absent, unreadable, or not this version's)."""
        if self.folder is None:
            return None
        try:
            data = (self.folder / key).read_bytes()
        except OSError:
            self.misses += 1
            return None
        payload = self._payload(data)
        if payload is None:
            self.ignored += 1
            log.info("program cache: ignoring entry %s (another version's, or torn); it is rebuilt", key[:12])
            return None
        try:
            value = pickle.loads(payload)  # noqa: S301 - our own folder, checked against its header
        except Exception:  # noqa: BLE001 - an entry that does not unpickle is rebuilt like a torn one
            self.ignored += 1
            return None
        self.hits += 1
        return value

    def store(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key`` atomically; a failure (full disk, read-only folder) only logs."""
        if self.folder is None:
            return
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        header = json.dumps({"versions": self.versions, "sha256": hashlib.sha256(payload).hexdigest(),
                             "bytes": len(payload)}).encode()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=f".{key[:12]}-", suffix=".part")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(MAGIC + header + b"\n" + payload)
                os.replace(temporary, self.folder / key)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError as exc:
            log.warning("program cache: could not store %s in %s (%s)", key[:12], self.folder, exc)

    def _payload(self, data: bytes) -> bytes | None:
        """The payload of an entry whose header matches this cache's versions and its checksum."""
        if not data.startswith(MAGIC):
            return None
        header, _, payload = data[len(MAGIC):].partition(b"\n")
        try:
            fields = json.loads(header)
        except ValueError:
            return None
        if not isinstance(fields, dict) or fields.get("versions") != self.versions \
                or fields.get("bytes") != len(payload) or fields.get("sha256") != hashlib.sha256(payload).hexdigest():
            return None
        return payload


_caches: dict[tuple[str, str], ProgramCache] = {}


def program_cache(engine: str) -> ProgramCache:
    """The ``ProgramCache`` of ``engine``'s programs for the current ``FOLDER_ENV`` setting (one per setting)."""
    setting = (engine, os.environ.get(FOLDER_ENV, ""))
    if setting not in _caches:
        _caches[setting] = ProgramCache.for_engine(engine)
    return _caches[setting]
