"""The compiling child of ``serve`` (``handoff``): load the model, compile and warm its forward, check it
against the model's own forward, then serve the same app on a Unix socket.

Run as ``python -m cdsl_struct.server.compiled_child SPEC``, SPEC a JSON object ``{"socket": path,
"options": {...}}`` (``handoff.child_options``). Progress goes to stdout as one JSON object a line:
``{"phase": "loading"}``, ``{"phase": "compiling"}``, ``{"phase": "checking"}``, ``{"phase": "compiled",
"seconds": s}`` (then it starts listening) or
``{"phase": "failed", "reason": "..."}``. On exit it remembers the shapes its sealed forward missed,
for the next start's warm-up (``models.compiled.remember_shapes``).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from .protocol import ServerLimits


def report(phase: str, **fields: Any) -> None:
    print(json.dumps({"phase": phase, **fields}), flush=True)


def run(socket: str, options: dict[str, Any]) -> int:
    """Load, compile, check, then serve on ``socket`` until stopped; the exit status."""
    import uvicorn

    from ..api import Generator, on_own_thread
    from ..models.compiled import compile_runner, remember_shapes
    from ..models.self_check import check_ragged
    from .app import ServerConfig, create_app

    report("loading")
    server = dict(options["server"])
    server["limits"] = ServerLimits(**server.get("limits", {}))
    config = ServerConfig(**server)
    generator = Generator(**options["generator"], torch_compile="off")
    runner = generator.engine.runner
    report("compiling")
    started = time.perf_counter()
    if not on_own_thread(lambda: compile_runner(runner)):
        failure = getattr(runner.compiled, "failure", None) if getattr(runner, "compiled", None) else None
        report("failed", reason=f"the forward did not compile: {failure or type(runner).__name__}")
        return 1
    report("checking")
    problem = on_own_thread(lambda: check_ragged(runner.model, compiled=runner.compiled))
    if problem is not None:
        report("failed", reason=f"the compiled forward disagrees with the model's own: {problem}")
        return 1
    report("compiled", seconds=round(time.perf_counter() - started, 1))
    app = create_app(generator, config)
    try:
        uvicorn.run(app, uds=socket, log_level="warning", timeout_graceful_shutdown=max(1, int(config.shutdown_grace)))
    finally:
        remember_shapes(runner.compiled)
    return 0


def main(argv: list[str] | None = None) -> int:
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    try:
        return run(spec["socket"], spec["options"])
    except Exception as exc:  # noqa: BLE001 - the parent reads the reason and serves eagerly
        report("failed", reason=f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
