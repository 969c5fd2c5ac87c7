"""``python -m benchmarks soak``: the request mix is deterministic and covers every kind; a short soak
against the real server on the embedded model finds every request answered as it should be; and
the checks catch what they exist to catch (a doubled stream, a response id seen twice, a 5xx)."""

import json
import os
from collections import Counter

import pytest

from benchmarks.__main__ import main
from benchmarks.soak import _MergedStream, summarise
from benchmarks.soak_requests import DISCONNECTS, HOSTILE, SLOTS, soak_request

from ..server.conftest import SERVER_EXTRA, running_server


def test_the_mix_is_deterministic_and_reaches_every_kind():
    first = [soak_request(i) for i in range(10 * len(SLOTS))]
    assert first == [soak_request(i) for i in range(10 * len(SLOTS))]
    kinds = Counter(r.kind for r in first)
    assert set(HOSTILE) | set(DISCONNECTS) <= set(kinds)
    groups = Counter(r.group for r in first)
    assert groups == {"well_formed": 150, "hostile": 30, "disconnect": 20}
    regexes = {r.body["regex"] for r in first if r.kind == "regex"}
    assert len(regexes) == kinds["regex"]  # each compiled anew


def stream_lines(*chunks: dict, done: int = 1) -> list[str]:
    return [f"data: {json.dumps(c)}" for c in chunks] + ["data: [DONE]"] * done


CHUNK = {"id": "a", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
END = {"id": "a", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


@pytest.mark.parametrize(("lines", "complete"), [
    (stream_lines(CHUNK, END), True),
    (stream_lines(CHUNK, END, done=2), False),
    (stream_lines(CHUNK, END, END), False),
    (stream_lines(CHUNK, {**END, "id": "b"}), False),
    (stream_lines(CHUNK, {"error": {"message": "x"}}, END), False),
    (stream_lines(CHUNK), False),
], ids=["once", "two DONE", "two finishes", "two ids", "error event", "no finish"])
def test_a_stream_is_complete_only_with_one_done_one_id_and_one_finish(lines, complete):
    merged = _MergedStream()
    for line in lines:
        merged.add(line)
    answer = merged.answer()
    assert answer["_complete"] is complete
    assert answer["choices"][0]["message"]["content"] == "hi"


def test_the_summary_counts_doubled_ids_and_server_errors():
    row = {"group": "well_formed", "kind": "json", "ok": True, "latency": 1.0, "finish": ["stop"]}
    rows = [{**row, "index": 0, "status": 200, "ids": ["x"]}, {**row, "index": 1, "status": 200, "ids": ["x"]},
            {**row, "index": 2, "status": 500, "ids": [], "ok": False}]
    summary = summarise(rows, [], 0.0, 1.0)
    assert (summary["doubled_ids"], summary["server_errors"], summary["not_ok_count"]) == (1, 1, 1)
    assert summary["by_group"]["well_formed"] == {"200": 2, "500": 1}


def test_a_short_soak_of_the_real_server(smollm2, one_torch_thread, tmp_path, capsys):
    pytest.importorskip("fastapi", reason=SERVER_EXTRA)
    from cdsl_struct.api import Generator
    from cdsl_struct.server import create_app

    generator = Generator(smollm2, max_batch_size=8)
    out = tmp_path / "soak.json"
    with running_server(create_app(generator, compile_timeout=10.0)) as url:
        code = main(["soak", "--url", url, "--pid", str(os.getpid()), "--minutes", "0.3", "--clients", "8",
                     "--sample-s", "1", "--warm-up", "4", "--json", str(out), "--no-progress"])
    assert code == 0 and "| 5xx | 0 |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    summary, rows = report["summary"], report["rows"]
    assert summary["warm_up_ok"] and summary["server_errors"] == 0 and summary["doubled_ids"] == 0
    assert summary["not_ok_count"] == 0, summary["not_ok"]
    assert summary["well_formed_ok"] == summary["well_formed"] >= 8
    assert {r["group"] for r in rows} == {"well_formed", "hostile", "disconnect"}
    assert sorted(r["index"] for r in rows) == list(range(len(rows)))  # each request sent once
    assert summary["active_after"] == 0 and len(report["samples"]) >= 5
    assert all(value is not None for value in summary["rss_start_mid_end_mb"])
    assert all(None not in values for values in summary["caches_before_after"].values())
    generator.close()
