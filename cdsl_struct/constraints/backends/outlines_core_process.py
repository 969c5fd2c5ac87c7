"""outlines-core indexes built in worker processes, so that a compile past its timeout can be stopped.

Building an ``outlines_core.Index`` has no limit of its own (``Regex(r"\\w{1,200}", unicode=True)``
takes about 50 s on GPT-2's vocabulary) and cannot be interrupted from Python. A compile with a
timeout therefore runs in a worker process (``outlines_core_worker``), which is killed when the
timeout passes; the ``Index`` pickles back to the parent in well under a millisecond per 30 kB.

Workers are kept between compiles (at most ``MAX_IDLE_WORKERS`` idle), each holding the
vocabularies it was sent, so a warm compile costs one round trip, about 4 ms (and the
index build is faster there than in a long-lived parent: 0.15 s vs 0.61 s for a date regex on
Llama-3, as the unpickled vocabulary is laid out afresh). A fresh worker costs 36 ms (GPT-2) to
0.22 s (Gemma-3) to start and receive the pickled ``outlines_core.Vocabulary`` (1.6 MB for
Llama-3); a compile that times out loses its worker, so the next one pays that again.
Concurrent compiles each take a worker of their own, at most ``MAX_WORKERS`` at once (more
wait for one within their timeout). Each worker's address space is capped at
``CDSL_STRUCT_COMPILE_MEMORY_MB`` (default ``DEFAULT_MEMORY_MB``; 0 lifts the cap): an index
that needs more makes its worker die, and the compile is refused as ``UnsupportedFeature``
naming the limit. POSIX only (``select`` on pipes, ``RLIMIT_AS``).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import outlines_core

from ...errors import CompileTimeout, UnsupportedFeature
from ..vocabulary import TokenVocabulary
from .outlines_core_worker import HEADER, MEMORY_ENV, frame

WORKER_SCRIPT = Path(__file__).with_name("outlines_core_worker.py")
MAX_IDLE_WORKERS = 2
MAX_WORKERS = 4
DEFAULT_MEMORY_MB = 4096
_PICKLED = "outlines-core/pickled"


class EngineRejected(Exception):
    """outlines-core rejected the regex in a worker; the message is the engine's."""


class WorkerCrashed(Exception):
    """A worker died or failed in an unexpected way (not a verdict on the regex, so not a
    ``CompileError``: it is not a reason to try another engine)."""


class _Expired(Exception):
    """The deadline passed while waiting for a worker's reply."""


class Worker:
    """One worker process and the vocabularies it holds."""

    def __init__(self) -> None:
        env = {**os.environ, MEMORY_ENV: os.environ.get(MEMORY_ENV, str(DEFAULT_MEMORY_MB))}
        self.memory_mb = int(env[MEMORY_ENV] or 0)
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
            env=env,
        )
        self.vocabularies: set[str] = set()

    @property
    def pid(self) -> int:
        return self.process.pid

    def build_index(self, regex: str, vocabulary: TokenVocabulary, oc_vocabulary: Any,
                    deadline: float) -> outlines_core.Index:
        """Send one request and wait for its reply until ``deadline`` (``time.monotonic()``)."""
        fingerprint = vocabulary.fingerprint
        payload = None
        if fingerprint not in self.vocabularies:
            payload = vocabulary.engine_object(_PICKLED, lambda _: pickle.dumps(oc_vocabulary))
        try:
            self.process.stdin.write(frame((fingerprint, payload, regex)))
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerCrashed(f"outlines-core worker {self.pid} is gone ({exc})") from None
        self.vocabularies.add(fingerprint)
        (length,) = HEADER.unpack(self._read(HEADER.size, deadline))
        status, value = pickle.loads(self._read(length, deadline))
        if status == "ok":
            return value
        if status == "error":
            raise EngineRejected(value)
        raise WorkerCrashed(f"outlines-core worker failed:\n{value}")

    def _read(self, size: int, deadline: float) -> bytes:
        fd, chunks = self.process.stdout.fileno(), []
        while size:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise _Expired
            chunk = os.read(fd, min(size, 1 << 20))
            if not chunk:
                raise WorkerCrashed(f"outlines-core worker {self.pid} exited ({self.process.wait()})")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        """Stop the worker now, whatever it is doing, and reap it."""
        self.process.kill()
        self.process.wait()
        self._close_pipes()

    def close(self) -> None:
        """Let an idle worker exit (end of its input), killing it if it lingers."""
        try:
            self.process.stdin.close()
            self.process.wait(timeout=1)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class WorkerPool:
    """Idle workers to reuse; a worker is taken for one compile and returned or killed after."""

    def __init__(self, max_idle: int = MAX_IDLE_WORKERS, max_workers: int = MAX_WORKERS) -> None:
        self.max_idle = max_idle
        self._slots = threading.BoundedSemaphore(max_workers)
        self._idle: list[Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def build_index(self, regex: str, vocabulary: TokenVocabulary, oc_vocabulary: Any,
                    timeout: float) -> outlines_core.Index:
        """Build the index in a worker; ``CompileTimeout`` (worker killed) after ``timeout`` s.

        ``EngineRejected`` when outlines-core refuses the regex; ``UnsupportedFeature`` when the
        index needs more than the worker's memory cap; ``WorkerCrashed`` otherwise.
        """
        deadline = time.monotonic() + timeout
        if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise CompileTimeout(f"outlines-core: no worker was free within {timeout:.3g} s "
                                 f"(at most {MAX_WORKERS} compile at once)")
        try:
            return self._build(regex, vocabulary, oc_vocabulary, deadline, timeout)
        finally:
            self._slots.release()

    def _build(self, regex: str, vocabulary: TokenVocabulary, oc_vocabulary: Any, deadline: float,
               timeout: float) -> outlines_core.Index:
        worker = self._take()
        try:
            index = worker.build_index(regex, vocabulary, oc_vocabulary, deadline)
        except EngineRejected:
            self._give_back(worker)
            raise
        except _Expired:
            worker.kill()
            raise CompileTimeout(
                f"outlines-core: compile took longer than {timeout:.3g} s (its worker process was stopped)"
            ) from None
        except WorkerCrashed:
            worker.kill()
            if worker.memory_mb and (worker.process.returncode == -signal.SIGABRT):
                raise UnsupportedFeature(
                    f"outlines-core: the index needs more than {worker.memory_mb} MiB to build "
                    f"({MEMORY_ENV}); use a smaller constraint or backend='llguidance'",
                    feature="index size", backend="outlines-core") from None
            raise
        except BaseException:
            worker.kill()
            raise
        self._give_back(worker)
        return index

    def idle_pids(self) -> list[int]:
        """Process ids of the idle workers (for tests and diagnostics)."""
        with self._lock:
            return [worker.pid for worker in self._idle]

    def close(self) -> None:
        """Stop every idle worker."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()

    def _take(self) -> Worker:
        with self._lock:
            if os.getpid() != self._pid:  # forked: the idle workers belong to the parent
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                worker = self._idle.pop()
                if worker.process.poll() is None:
                    return worker
                worker.kill()  # died while idle: reap it and close its pipes
        return Worker()

    def _give_back(self, worker: Worker) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle and os.getpid() == self._pid:
                self._idle.append(worker)
                return
        worker.close()


WORKERS = WorkerPool()
atexit.register(WORKERS.close)
