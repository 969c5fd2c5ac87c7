"""``cdsl-struct bench serve`` against the real server on the embedded model: both concurrency
levels answered, every answer counted and checked, concurrent requests shared forward passes."""

import json

import pytest

from cdsl_struct.cli import main

from ..server.conftest import SERVER_EXTRA, running_server

pytest.importorskip("fastapi", reason=SERVER_EXTRA)
pytest.importorskip("openai", reason=SERVER_EXTRA)


def test_serve_bench_against_our_server(smollm2, one_torch_thread, tmp_path, capsys):
    from cdsl_struct.api import Generator
    from cdsl_struct.server import create_app

    generator = Generator(smollm2, max_batch_size=4)
    out = tmp_path / "serve.json"
    with running_server(create_app(generator)) as url:
        code = main(["bench", "serve", "--url", url, "--requests", "4", "--concurrency", "1,4", "--max-tokens", "16",
                     "--label", "ours", "--json", str(out)])
    assert code == 0 and "| 4 |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    levels = {level["concurrency"]: level for level in report["summary"]["levels"]}
    assert set(levels) == {1, 4}
    for level in levels.values():
        assert level["requests"] == 4 and level["completion_tokens"] > 0 and level["retokenised_tokens"] > 0
        rows = [r for r in report["rows"] if r["concurrency"] == level["concurrency"]]
        assert all(r["valid"] for r in rows if r["finish_reason"] == "stop")
    assert generator.engine.stats.as_dict()["mean_rows"] > 1  # the concurrent level batched
    generator.close()


def test_mixed_load_is_answered_exactly_once_and_malformed_requests_get_4xx(smollm2, one_torch_thread, tmp_path,
                                                                            capsys):
    from cdsl_struct.api import Generator
    from cdsl_struct.bench.serving_mix import KINDS
    from cdsl_struct.server import create_app

    generator = Generator(smollm2, max_batch_size=8)
    out = tmp_path / "mix.json"
    with running_server(create_app(generator)) as url:
        code = main(["bench", "serve", "--mix", "--url", url, "--requests", str(3 * len(KINDS)), "--clients", "8",
                     "--serial-requests", "2", "--max-tokens", "16", "--json", str(out)])
        health = __import__("httpx").get(url.removesuffix("/v1") + "/health").json()
    assert code == 0 and "| mixed |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    rows, mixed = report["rows"], report["summary"]["mixed"]
    assert sorted(r["index"] for r in rows) == list(range(3 * len(KINDS)))  # each request once
    assert mixed["server_errors"] == 0 and report["summary"]["malformed_not_4xx"] == 0
    assert {r["status"] for r in rows if r["kind"].startswith("malformed")} == {400, 404, 422}
    assert mixed["valid"] == mixed["well_formed"]  # every well-formed answer valid (or cut by length)
    assert health["active_requests"] == 0  # the disconnected clients' rows did not linger
    generator.close()
