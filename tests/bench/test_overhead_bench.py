"""``cdsl-struct bench overhead`` end to end: every size gets its per-phase host time and its count
of host reads per step, which is one."""

import json

from cdsl_struct.cli import main
from cdsl_struct.decoding.engine import PHASES


def test_cli_reports_every_size_and_phase(tmp_path, capsys):
    out = tmp_path / "overhead.json"
    assert main(["bench", "overhead", "--rows", "1,3", "--max-tokens", "6", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [entry["rows"] for entry in report["sizes"]] == [1, 3]
    for entry in report["sizes"]:
        assert entry["steps"] >= 4 and entry["mean_rows"] <= entry["rows"]
        assert set(entry["phases_ms"]) == set(PHASES)
        assert entry["wall_ms"] >= entry["forward_ms"] > 0 and entry["host_ms"] > 0
        assert entry["host_reads_per_step"] == 1
    assert report["summary"]["command"].startswith("cdsl-struct")
    assert "avx" in " ".join(report["machine"]["cpu_flags"]) or report["machine"]["machine"] != "x86_64"
    assert "reads" in capsys.readouterr().out
