"""The CommonGen bench through the CLI on the real embedded model: two concept sets, every method."""

import json
import re

from cdsl_struct.bench.commongen import SENTENCE
from cdsl_struct.cli import main
from cdsl_struct.decoding.lookahead import CDSL_STATES
from cdsl_struct.rewards import KeywordCoverage


def test_commongen_cli_writes_the_report(tmp_path, capsys):
    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps({"concept_set": s}) + "\n"
                            for s in ("dog_N#frisbee_N#catch_V", "field_N#look_V#stand_V")))
    out = tmp_path / "report.json"
    assert main(["bench", "commongen", "--data", str(data), "--limit", "2", "--max-tokens", "24", "--d", "1",
                 "--no-progress", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["methods"]) == {"greedy", "cdlh", "cdsl"}
    for name, row in report["methods"].items():
        assert {"hard_coverage", "soft_coverage", "wall_s", "target_passes", "target_positions", "draft_passes",
                "states", "complete", "hard_coverage_complete"} <= set(row)
        assert len(row["sentences"]) == 2
        soft = 0.0
        for sentence in row["sentences"]:
            reward = KeywordCoverage(sentence["concepts"])
            assert sentence["covered"] == reward.covered(sentence["text"])  # the metric is what the text holds
            soft += len(sentence["covered"]) / 3
            if sentence["finish_reason"] == "stop":
                assert re.fullmatch(SENTENCE, sentence["text"])  # the hard constraint held
        assert abs(row["soft_coverage"] - soft / 2) < 1e-3
        assert row["hard_coverage_complete"] <= row["hard_coverage"] <= row["soft_coverage"]
        assert (row["draft_passes"] > 0) == (name == "cdsl")
    cdsl = report["methods"]["cdsl"]
    assert set(cdsl["states"]) == set(CDSL_STATES) and sum(cdsl["states"].values()) >= 1
    assert report["methods"]["cdlh"]["target_passes"] > report["methods"]["greedy"]["target_passes"]
    assert report["speedup_cdsl_vs_cdlh"] > 0 and report["config"]["max_tokens"] == 24
    assert "speedup_cdsl_vs_cdlh" in capsys.readouterr().out
