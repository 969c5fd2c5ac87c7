"""``python -m benchmarks graphs`` end to end on the CPU (the graph runner's steps eager, a few
requests), as a GPU run would call it: every part reports, nothing fails."""

import json

from benchmarks.__main__ import main


def test_the_graph_bench_reports_every_part(tmp_path, one_torch_thread, monkeypatch, capsys):
    monkeypatch.setenv("CDSL_RUNNER", "static")  # the graph runner off a GPU: its static steps, eager
    out = tmp_path / "graphs.json"
    code = main(["graphs", "--device", "cpu", "--dtype", "float32", "--rows", "2", "--requests", "3",
                 "--max-tokens", "4", "--one-row-requests", "1", "--ragged-requests", "2", "--check-steps", "3",
                 "--profile", "json_free", "--no-progress", "--json", str(out)])
    assert code == 0
    summary = json.loads(out.read_text())["summary"]
    assert summary["errors"] == {} and summary["start"]["runner"] == "GraphRunner"
    check = summary["replay_check"]
    assert check["max_abs_diff"] < 1e-3 and check["sync_errors"] == [] and check["eager_steps"] > 0
    same, total = map(int, check["same_argmax"].split("/"))
    assert same == total > 0
    engine = summary["engine"]
    assert {"mix_served", "mix_free", "one_row_served", "ragged_mix_served", "graph_mix_served_same"} <= set(engine)
    assert engine["mix_free"]["tokens"] == engine["mix_free_llguidance"]["tokens"]  # the same masks: the same text
    assert summary["ratios"]["free_text_table_vs_llguidance"] > 0
    assert engine["mix_served"]["eager_steps"] > 0 and engine["ragged_mix_served"]["eager_steps"] == 0
    assert "tottime" in engine["json_free"]["profile"]
    assert engine["mix_free_in_turn"]["ahead_steps"] == 0 and summary["ratios"]["mix_free_ahead_vs_in_turn"] > 0
    hf = summary["hf_static"]
    assert hf["free"]["tokens"] > 0 and hf["with_our_processor"]["tokens"] > 0
    assert summary["ratios"]["our_free_vs_hf_static_free"] > 0
    assert "transformers static compiled generate" in capsys.readouterr().out


def test_throughput_runs_the_static_cache_baseline_when_asked(tmp_path, one_torch_thread, monkeypatch):
    monkeypatch.setattr("benchmarks.throughput_baselines._outlines_baseline", lambda *args: None)
    out = tmp_path / "throughput.json"
    code = main(["throughput", "--device", "cpu", "--batch", "1", "--requests", "2", "--max-tokens", "4", "--no-hf",
                 "--hf-static", "--no-progress", "--json", str(out)])
    assert code == 0
    hf = json.loads(out.read_text())["summary"]["hf_static"]
    assert hf["rows"] == 1 and hf["free"]["tokens"] > 0 and hf["ours_served_vs_with_processor"] > 0
