"""The keyword-load bench: the same keyword requests one at a time and all at once, through the
public API on the embedded model, via the CLI."""

import json

from benchmarks.__main__ import main
from tests.benchmarks.test_commongen_bench import write_data


def test_keyword_load_reports_both_runs_and_their_ratio(tmp_path, smollm2, monkeypatch, capsys, one_torch_thread):
    from cdsl_struct import api

    monkeypatch.setattr(api, "load_model", lambda name, **options: smollm2)
    data = write_data(tmp_path / "dev.jsonl")
    out = tmp_path / "load.json"
    assert main(["keyword-load", "--data", str(data), "--requests", "3", "--max-tokens", "6",
                 "--split", "all", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert summary["requests"] == 3
    assert summary["one_at_a_time_tokens"] == summary["concurrent_tokens"] > 0
    assert summary["identical_outputs"] == 3  # greedy CDLH rows decode alike alone and together
    # together the rows shared forwards: fewer target forwards than one at a time
    assert 0 < summary["concurrent_steps"] < summary["one_at_a_time_steps"]
    assert summary["speedup"] == round(summary["one_at_a_time_wall_s"] / summary["concurrent_wall_s"], 3)
    assert "speedup" in capsys.readouterr().out
