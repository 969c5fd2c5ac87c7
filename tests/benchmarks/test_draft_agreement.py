"""``python -m benchmarks draft-agreement``: a draft's argmax against the target's, teacher-forced on a
CommonGen report's sentences; the target's own weights as the draft agree everywhere, the int8
self-draft does not."""

import json

from benchmarks.__main__ import main


def test_a_draft_of_the_targets_own_weights_agrees_everywhere_and_int8_less(tmp_path, capsys, one_torch_thread):
    sentences = [{"concepts": ["dog_N", "ball_N", "throw_V"], "text": "The dog catches the ball I throw."},
                 {"concepts": ["river_N", "boat_N"], "text": "A boat drifts down the river at dawn."}]
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"methods": {"cdsl": {"sentences": sentences}}}), encoding="utf-8")
    results = {}
    for draft in ("layers:30", "int8"):  # all 30 of SmolLM2's layers: the target itself
        out = tmp_path / f"{draft.replace(':', '')}.json"
        assert main(["draft-agreement", "--sentences", str(report), "--draft", draft, "--json", str(out)]) == 0
        results[draft] = json.loads(out.read_text(encoding="utf-8"))
    same, int8 = results["layers:30"]["summary"], results["int8"]["summary"]
    assert same["sentences"] == 2 and same["tokens"] == sum(r["tokens"] for r in results["layers:30"]["sentences"])
    assert same["agreement"] == 1.0
    assert 0.3 < int8["agreement"] < 1.0 and int8["tokens"] == same["tokens"]
    assert "agreement 1.0 over" in capsys.readouterr().out
    out = tmp_path / "shared.json"  # the engine's path: the int8 draft's own step, the chat header shared
    args = ["draft-agreement", "--sentences", str(report), "--draft-path", "shared-header", "--json", str(out)]
    assert main(args) == 0
    shared = json.loads(out.read_text(encoding="utf-8"))["summary"]
    assert shared["draft_path"] == "shared-header" and shared["tokens"] == same["tokens"]
    assert abs(shared["agreement"] - int8["agreement"]) < 0.25
