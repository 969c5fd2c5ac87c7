"""``cdsl-struct serve``'s process setup: the malloc arena cap and the ways to leave it off; inductor's
caches in the user cache unless the user named a folder."""

import sys

import pytest

from cdsl_struct.server.cli import INDUCTOR_CACHE_ENV, MALLOC_ARENAS_ENV, bound_malloc_arenas, keep_compiled_graphs

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


@linux_only
def test_arenas_are_capped_by_default_and_by_the_variable(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv(MALLOC_ARENAS_ENV, raising=False)
    assert bound_malloc_arenas() == 2
    monkeypatch.setenv(MALLOC_ARENAS_ENV, "4")
    assert bound_malloc_arenas() == 4


@pytest.mark.parametrize(("name", "value"), [(MALLOC_ARENAS_ENV, "0"), ("MALLOC_ARENA_MAX", "8")])
def test_no_cap_when_switched_off_or_set_by_glibcs_own_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert bound_malloc_arenas() is None


def test_serve_freezes_what_loading_made_before_it_listens(monkeypatch):
    """A full collection over a loaded, compiled model's ~1M objects held the GIL for 0.5-1.2 s
    under load (BENCHMARKS.md): serve freezes them once the model is loaded, before uvicorn starts."""
    import gc
    from types import SimpleNamespace

    from cdsl_struct.server import app

    events = []

    class LoadedGenerator:
        def __init__(self, *args, **kwargs):
            events.append("load")

        def load(self):
            return SimpleNamespace(compiled_active=False, ragged_runner=True, runner_fallback=None)

    monkeypatch.setattr("cdsl_struct.api.Generator", LoadedGenerator)
    monkeypatch.setattr(app, "create_app", lambda generator, config, **kwargs: generator)
    monkeypatch.setattr("uvicorn.run", lambda *args, **kwargs: events.append(("listen", gc.get_freeze_count())))
    try:
        app.serve(port=0, torch_compile="off")
    finally:
        gc.unfreeze()
    assert events[0] == "load" and events[1][0] == "listen" and events[1][1] > 0


def test_every_other_command_starts_without_the_server_extra():
    """``cdsl-struct bench ...`` on a GPU box without fastapi failed at start: the CLI imported the
    server. Here fastapi, starlette and uvicorn cannot be imported; the bench and generate
    commands still parse, and nothing of the server's web stack gets loaded."""
    import subprocess

    code = (
        "import sys\n"
        "for name in ('fastapi', 'starlette', 'uvicorn', 'sse_starlette', 'opentelemetry'):\n"
        "    sys.modules[name] = None\n"
        "from cdsl_struct.cli import main\n"
        "for argv in (['bench', 'throughput', '--help'], ['bench', 'serve', '--help'], ['generate', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, (argv, exc.code)\n"
        "print('started')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("started")


def test_inductor_keeps_its_caches_in_the_user_cache_unless_told_otherwise(monkeypatch, tmp_path):
    monkeypatch.setenv("CDSL_STRUCT_CACHE", str(tmp_path / "ours"))
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    assert keep_compiled_graphs() == str(tmp_path / "ours" / "inductor")
    assert (tmp_path / "ours" / "inductor").is_dir()
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "theirs"))
    assert keep_compiled_graphs() == str(tmp_path / "theirs")
