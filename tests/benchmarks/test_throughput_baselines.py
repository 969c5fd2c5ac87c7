"""``python -m benchmarks throughput``: the engine's sweep of ``cdsl-struct bench throughput`` with the
transformers ``generate`` baseline beside it, on the same workload and model object."""

import json

from benchmarks.__main__ import main


def test_hf_baseline_runs_beside_the_sweep(tmp_path, one_torch_thread, capsys, monkeypatch):
    # the outlines package baseline (its own torch.compile warm-up) is run by the bench command, not here
    monkeypatch.setattr("benchmarks.throughput_baselines._outlines_baseline", lambda *args: None)
    out = tmp_path / "throughput.json"
    code = main(["throughput", "--batch", "1", "--requests", "2", "--max-tokens", "8", "--hf-requests", "2",
                 "--no-unconstrained", "--no-progress", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["hf"]["requests"] == 2 and summary["hf"]["tokens"] > 0
    assert summary["batches"][0]["speedup_vs_hf"] > 0
    assert report["config"]["with_hf"] and report["config"]["hf_requests"] == 2
    assert all("hf" in row["runs"] for row in report["requests"])
    table = capsys.readouterr().out
    assert "vs HF" in table and "HF generate, one at a time, first 2 of 2 requests" in table
