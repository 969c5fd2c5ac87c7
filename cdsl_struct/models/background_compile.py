"""A runner's compiled forward built off its path: ``Generator(torch_compile=...)`` answers at once, on
the eager forward, and steps run compiled from the step after the graphs are ready.

``BackgroundCompile`` works on a thread of its own. It loads the graphs an earlier process saved for
the model (``saved_graphs``: a second or two); where there are none, a child process (this module run
as ``python -m cdsl_struct.models.background_compile SPEC``) builds the model from its config with
random weights (the graphs hold no weights), compiles the graphs, checks them against the model's own
forward and saves them, and then this process loads them. The loaded ``SavedForward`` becomes the
runner's ``compiled`` forward, which the runner reads at the start of each step: the swap falls
between steps. Nothing is traced or compiled in the decoding process (compiling there stalls and can
break its steps: ``models.compiled``), and the child runs at the lowest CPU priority.

Any failure (no graphs and the child failed, a load error) leaves the runner eager, with the reason
in ``state``.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CHILD_NICENESS = 19
"""How much lower the compiling child's CPU priority is (``os.nice``)."""


@dataclass(frozen=True)
class CompileState:
    """Where a background compile stands. ``phase``: ``loading`` (reading saved graphs), ``compiling``
    (a child process compiles them), ``ready`` (steps run through them), ``failed`` (steps stay eager:
    ``reason``) or ``stopped``."""

    phase: str = "loading"
    source: str | None = None
    """``"saved"``: the graphs an earlier process saved; ``"compiled"``: compiled by this one's child."""
    reason: str | None = None
    seconds: float | None = None
    """From the start to the swap (``ready``) or the failure."""
    started: float = field(default_factory=time.monotonic)


class BackgroundCompile:
    """Load or compile ``runner``'s saved graphs (``saved_graphs``) on a thread of its own and make them
    the runner's forward once loaded. ``folder``: where the graphs live (default
    ``saved_graphs.graphs_folder``)."""

    def __init__(self, runner: Any, folder: Path | None = None) -> None:
        self.runner = runner
        self.folder = None if folder is None else Path(folder)
        """Where the graphs live (found on the thread where not given: the cache folder may fail)."""
        self.state = CompileState()
        self._done = threading.Event()
        self._stopped = False
        self._child: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._run, name="cdsl-compile", daemon=True)

    def start(self) -> BackgroundCompile:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the graphs run or the compile ended otherwise; whether they run."""
        self._done.wait(timeout)
        return self.state.phase == "ready"

    def stop(self) -> None:
        """Stop the child, if any; the runner keeps whichever forward it has."""
        self._stopped = True
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()
        if not self._done.is_set():
            self._end("stopped", reason="stopped")

    def _end(self, phase: str, **fields: Any) -> None:
        self.state = replace(self.state, phase=phase, seconds=time.monotonic() - self.state.started, **fields)
        self._done.set()

    def _run(self) -> None:
        from .saved_graphs import graphs_folder, load_graphs

        _lower_this_threads_priority()
        try:
            if self.folder is None:
                self.folder = graphs_folder(self.runner.model)
            saved, source = load_graphs(self.runner.model, self.folder), "saved"
            if saved is None and not self._stopped:
                self.state = replace(self.state, phase="compiling")
                problem = self._compile_in_child()
                if problem is not None:
                    if not self._stopped:
                        log.warning("torch_compile: running eagerly: %s", problem)
                        self._end("failed", reason=problem)
                    return
                saved, source = load_graphs(self.runner.model, self.folder), "compiled"
            if self._stopped:
                return
            if saved is None:
                self._end("failed", reason=f"the graphs in {self.folder} could not be loaded")
                return
            self.runner.compiled = saved  # read at each step's start: the swap falls between steps
            log.info("torch_compile: steps run through the %s graphs from now on (%.1f s after the start)",
                     source, time.monotonic() - self.state.started)
            self._end("ready", source=source)
        except Exception as exc:  # noqa: BLE001 - the runner stays eager; the reason is kept
            log.warning("torch_compile: running eagerly: %s: %s", type(exc).__name__, exc)
            self._end("failed", reason=f"{type(exc).__name__}: {exc}")

    def _compile_in_child(self) -> str | None:
        """Run the compiling child to its end; None where it published the graphs, else why not."""
        model = self.runner.model
        spec = {"module": type(model).__module__, "class": type(model).__qualname__,
                "config": model.config.to_dict(), "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                "folder": str(self.folder)}
        self._child = subprocess.Popen(  # noqa: S603 - our own module, with this interpreter
            [sys.executable, "-m", __name__, json.dumps(spec, default=str)], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, preexec_fn=lower_priority if os.name == "posix" else None)
        last: dict[str, Any] = {}
        for line in self._child.stdout or ():
            try:
                last = json.loads(line)
            except ValueError:
                continue
        code = self._child.wait()
        if self._stopped:
            return "stopped"
        if code == 0 and last.get("phase") == "saved":
            return None
        return str(last.get("reason") or f"the compiling process exited with {code}")


def compile_in_background(runner: Any, mode: bool | str | None) -> BackgroundCompile | None:
    """Start compiling ``runner``'s forward as ``mode`` (``options.COMPILE_MODES``) says; the compile under
    way, or None where there is none. ``"auto"`` leaves it eager where ``compiled.why_not_compiled``
    gives a reason (logged). The saved graphs are CPU graphs: ``"on"`` for a ragged runner elsewhere
    compiles in this process before returning (``compiled.compile_runner``; not measured), and a runner
    without ragged steps stays eager (a warning)."""
    import torch

    from .compiled import compile_mode, compile_runner, why_not_compiled

    mode = compile_mode(mode)
    if mode == "off":
        return None
    reason = why_not_compiled(runner)
    if reason is not None and mode == "auto":
        log.info("torch_compile auto: running eagerly: %s", reason)
        return None
    if not getattr(runner, "ragged", False) or torch.device(runner.device).type != "cpu":
        compile_runner(runner)
        return None
    prepare_loading()
    return BackgroundCompile(runner).start()


def prepare_loading() -> None:
    """Import what loading saved graphs imports, and probe the CPU's vector instruction sets (a few runs
    of the C++ compiler; torch keeps the answer), now, before the Generator answers anything. Done by
    the loading thread beside the first requests, they held the GIL ~2 s of a ~3.8 s load, and the
    eager steps meanwhile ran ~4x slower; done here they add ~2 s to the Generator's start."""
    try:
        import torch._dynamo.aot_compile  # noqa: F401
        import torch._functorch._aot_autograd.aot_autograd_result  # noqa: F401
        import torch._inductor.codecache  # noqa: F401
        import torch._inductor.lowering  # noqa: F401
        import torch._inductor.select_algorithm  # noqa: F401
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        pick_vec_isa()
    except Exception as exc:  # noqa: BLE001 - another torch's layout: the load imports what it needs itself
        log.debug("torch_compile: could not prepare the loading (%s: %s)", type(exc).__name__, exc)


def _lower_this_threads_priority() -> None:
    """Run this thread, and the processes it starts (inductor builds the kernels of loaded graphs that its
    cache lacks: seconds of a C++ compiler each), at the child's low priority; Linux only, where a
    thread has a priority of its own."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), CHILD_NICENESS)
        except OSError:
            pass


def lower_priority() -> None:
    """In a compiling child before it runs: a lower CPU priority, and (Linux) a SIGTERM when its parent dies."""
    os.nice(CHILD_NICENESS)
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def report(phase: str, **fields: Any) -> None:
    """One line of the child's progress, as JSON on stdout."""
    print(json.dumps({"phase": phase, **fields}), flush=True)


def build_model(spec: dict[str, Any]) -> Any:
    """A model of ``spec``'s class, config and dtype, with random weights, for compiling (the graphs hold
    no weights)."""
    import torch

    try:
        model_class: Any = importlib.import_module(spec["module"])
        for name in spec["class"].split("."):
            model_class = getattr(model_class, name)
    except (ImportError, AttributeError) as exc:
        raise TypeError(f"cannot build the model class {spec['module']}.{spec['class']} in another process "
                        f"({type(exc).__name__}: {exc})") from exc
    config = model_class.config_class.from_dict(
        {k: v for k, v in spec["config"].items() if not k.startswith("_attn_implementation")})
    torch.manual_seed(0)
    return model_class(config).to(getattr(torch, spec["dtype"])).eval()


def main(argv: list[str] | None = None) -> int:
    """The child: build the model, compile, check and save its graphs; 0 once saved."""
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    try:
        from .saved_graphs import compile_graphs

        report("building")
        model = build_model(spec)
        report("compiling")
        started = time.perf_counter()
        compile_graphs(model, Path(spec["folder"]))
        report("saved", seconds=round(time.perf_counter() - started, 1))
        return 0
    except Exception as exc:  # noqa: BLE001 - the parent reads the reason and stays eager
        report("failed", reason=f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
