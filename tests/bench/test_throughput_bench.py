"""The throughput bench end to end on the embedded model: a tiny sweep through the CLI."""

import json

from cdsl_struct.bench.throughput import FAMILIES, build_workload
from cdsl_struct.cli import main


def test_workload_is_deterministic_and_mixed():
    items = build_workload(len(FAMILIES) * 2)
    assert items == build_workload(len(FAMILIES) * 2)
    assert {i.kind for i in items} == {"json", "regex", "choice", "free"}
    assert sum(i.draft == "lookup" for i in items) == 5  # every fourth: 0, 4, ..., 16
    assert len({i.prompt for i in items}) == len(items)  # facts vary within a family
    assert items[0].valid('{"name": "A", "age": 3, "city": "B"}') and not items[0].valid('{"name": "A"}')
    assert items[1].valid("2025-03-14") and not items[1].valid("14 March 2025")
    assert items[3].valid("neutral") and not items[3].valid("meh")


def test_cli_sweep_is_batch_invariant(tmp_path, one_torch_thread, capsys):
    out = tmp_path / "throughput.json"
    code = main(["bench", "throughput", "--batch", "1,2", "--requests", "4", "--max-tokens", "12",
                 "--no-unconstrained", "--no-progress", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert [b["batch"] for b in summary["batches"]] == [1, 2]
    for batch in summary["batches"]:
        assert batch["tokens"] > 0 and batch["tokens_per_s"] > 0
        assert batch["identical_rate"] == 1.0  # CPU fp32: a row decodes the same whatever shares its batch
    assert summary["b1_equals_decode"] == {"checked": 4, "equal": 4}
    assert len(report["requests"]) == 4 and report["machine"]["torch"]
    for row in report["requests"]:
        for run in row["runs"].values():
            assert run["valid"] == (run["finish_reason"] == "stop")  # every stopped output is valid
    assert summary["command"].startswith("cdsl-struct ") and "hf" not in summary
    table = capsys.readouterr().out
    assert "| B |" in table and "vs HF" not in table  # other libraries are the lab's: python -m benchmarks
