"""``python -m benchmarks serve --against``: both servers get the same bench, alternating round by round; the
side-by-side summary sums each case over the rounds and divides their wall by ours."""

import json

import pytest

from benchmarks.__main__ import main
from benchmarks.serve_compare import Server, compare_servers, format_comparison

from ..server.conftest import SERVER_EXTRA, running_server

OURS, THEIRS = Server("ours", "http://a/v1", "m"), Server("vllm", "http://b/v1", "other-name")


def _level(concurrency, wall, tokens):
    return {"concurrency": concurrency, "wall_s": wall, "completion_tokens": tokens, "retokenised_tokens": tokens - 1,
            "valid": 4, "requests": 4, "p50_s": wall / 4}


def test_rounds_alternate_and_the_walls_are_summed_per_case():
    calls = []

    def run(server):
        calls.append(server.label)
        wall = 1.0 if server is OURS else 3.0
        return {"summary": {"levels": [_level(1, 4 * wall, 40), _level(16, wall, 40)]}}

    report = compare_servers(run, OURS, THEIRS, rounds=3)
    assert calls == ["ours", "vllm", "vllm", "ours", "ours", "vllm"]
    assert report["order"] == [["ours", "vllm"], ["vllm", "ours"], ["ours", "vllm"]]
    rows = {row["case"]: row for row in report["summary"]["comparison"]}
    assert set(rows) == {"1 at once", "16 at once"}
    assert rows["16 at once"]["ours"]["wall_s"] == 3.0 and rows["16 at once"]["theirs"]["wall_s"] == 9.0
    assert rows["16 at once"]["speedup"] == 3.0 and rows["1 at once"]["ours"]["completion_tokens"] == 120
    assert "| 16 at once | 3.0 / 9.0 | 3.0 |" in format_comparison(report)


def test_mixed_load_cases_and_bad_settings():
    def run(server):
        case = {"wall_s": 2.0 if server is OURS else 1.0, "completion_tokens": 10, "valid": 3, "well_formed": 3,
                "ttft_p50_s": 0.5, "latency_p50_s": 1.0, "requests": 4}
        return {"summary": {"mixed": case, "one_at_a_time": case}}

    report = compare_servers(run, OURS, THEIRS, rounds=1)
    assert [row["speedup"] for row in report["summary"]["comparison"]] == [0.5, 0.5]
    assert "3/3 / 3/3" in format_comparison(report)
    with pytest.raises(ValueError, match="rounds"):
        compare_servers(run, OURS, THEIRS, rounds=0)
    with pytest.raises(ValueError, match="labels"):
        compare_servers(run, OURS, Server("ours", "http://b/v1", "m"))


def test_against_a_real_server_from_the_command_line(smollm2, one_torch_thread, tmp_path, capsys):
    pytest.importorskip("fastapi", reason=SERVER_EXTRA)
    pytest.importorskip("openai", reason=SERVER_EXTRA)
    from cdsl_struct.api import Generator
    from cdsl_struct.server import create_app

    generator = Generator(smollm2, max_batch_size=2)
    out = tmp_path / "compare.json"
    with running_server(create_app(generator)) as url:  # the same server on both sides: the same answers
        code = main(["serve", "--url", url, "--against", url, "--against-label", "again", "--rounds", "2",
                     "--requests", "2", "--concurrency", "1,2", "--max-tokens", "12", "--json", str(out)])
    generator.close()
    assert code == 0 and "| 2 at once |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["order"] == [["ours", "again"], ["again", "ours"]]
    for row in report["summary"]["comparison"]:
        assert row["ours"]["requests"] == row["theirs"]["requests"] == 4  # 2 requests x 2 rounds
        assert row["ours"]["completion_tokens"] == row["theirs"]["completion_tokens"] > 0  # greedy, same server
        assert row["speedup"] > 0
