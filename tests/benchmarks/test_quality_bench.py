"""``python -m benchmarks quality``: tasks built from MaskBench, scoring, the choice rule, and one real run."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from benchmarks.__main__ import main
from benchmarks.answer_quality import (
    bootstrap_ci,
    choose_default,
    first_json_object,
    paired_delta_ci,
    parse_setting,
    same_value,
    score,
    thinking_of,
)
from benchmarks.quality_tasks import (
    DATE,
    INTEGER,
    build_tasks,
    key_phrase,
    leaves,
    render_value,
    schema_for_prompt,
    split_of,
)
from cdsl_struct.errors import CompileError

from ..conftest import MASKBENCH_DIR

pytestmark = pytest.mark.skipif(not MASKBENCH_DIR.exists(), reason="needs ../shared/data/maskbench")


@pytest.fixture(scope="module")
def tune_tasks():
    return build_tasks(MASKBENCH_DIR, "tune", 12)


def test_tasks_are_reproducible_and_the_halves_disjoint(tune_tasks):
    again = build_tasks(MASKBENCH_DIR, "tune", 12)
    assert [(t.id, t.prompt, t.fields) for t in again] == [(t.id, t.prompt, t.fields) for t in tune_tasks]
    report = build_tasks(MASKBENCH_DIR, "report", 12)
    cases = {t.id.split("#")[0] for t in tune_tasks}
    assert len(cases) == 12 and not cases & {t.id.split("#")[0] for t in report}
    assert all(split_of(c) == "tune" for c in cases)
    assert {t.kind for t in tune_tasks} == {"extract", "choice", "regex"}


def test_every_answer_is_stated_in_the_prompt_and_valid(tune_tasks):
    for task in tune_tasks:
        for path, value in task.fields.items():
            assert f"{key_phrase(path)} is {value if task.kind != 'extract' else render_value(value)}." in task.prompt
        if task.kind == "extract":
            instance: dict = {}
            for path, value in task.fields.items():
                node = instance
                for key in path[:-1]:
                    node = node.setdefault(key, {})
                node[path[-1]] = value
            jsonschema.validate(instance, task.constraint)  # the gold answer satisfies the constraint
            assert "\"description\": \"" not in json.dumps(schema_for_prompt(task.constraint))
        elif task.kind == "choice":
            assert next(iter(task.fields.values())) in task.constraint
        else:
            assert task.constraint in (INTEGER, DATE)
            assert re.fullmatch(task.constraint, next(iter(task.fields.values())))


def test_scoring_of_free_and_constrained_answers(tune_tasks):
    extract = next(t for t in tune_tasks if t.kind == "extract")
    gold = {}
    for path, value in extract.fields.items():
        node = gold
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    text = json.dumps(gold)
    all_right = {p: True for p in extract.fields}
    assert score(extract, text, constrained=True) == (True, all_right)
    assert score(extract, f"Sure! ```json\n{text}\n``` Done.", constrained=False)[1] == all_right
    assert score(extract, "I cannot help with that.", constrained=False) == (False, {p: False for p in all_right})
    first = next(iter(extract.fields))
    wrong = json.loads(text)
    node = wrong
    for key in first[:-1]:
        node = node[key]
    node[first[-1]] = [node[first[-1]]]  # right value, wrong type
    valid, correct = score(extract, json.dumps(wrong), constrained=False)
    assert valid and not correct[first] and sum(correct.values()) == len(extract.fields) - 1
    choice = next(t for t in tune_tasks if t.kind == "choice")
    answer = next(iter(choice.fields.values()))
    assert score(choice, f"The answer is {answer}.", constrained=False)[1] == {next(iter(choice.fields)): True}
    regex = next(t for t in tune_tasks if t.kind == "regex")
    answer = next(iter(regex.fields.values()))
    assert score(regex, answer, constrained=True)[1] == {next(iter(regex.fields)): True}
    assert score(regex, answer + ".", constrained=True)[1] == {next(iter(regex.fields)): True}  # period not scored
    assert score(regex, "no idea", constrained=False)[0] is False


def test_helpers():
    assert leaves({"a": 1, "b": {"c": "x", "d": True}}) == {("a",): 1, ("b", "c"): "x", ("b", "d"): True}
    assert first_json_object('text {"a": [1, {"b": 2}]} more {"c": 3}') == {"a": [1, {"b": 2}]}
    assert same_value(1, 1.0) and not same_value(True, 1) and not same_value("1", 1)
    assert parse_setting("free") == (None, True)
    assert parse_setting("newlines") == ("newlines", True) and parse_setting("[ ]{0,2}") == ("[ ]{0,2}", True)
    assert parse_setting("flexible+noguard") == ("flexible", False)
    assert parse_setting("flexible+nostrings") == ("flexible", True)  # the string guard off, read where it is set
    assert parse_setting("flexible+think64") == ("flexible", True) and thinking_of("flexible+think64") == 64
    assert thinking_of("flexible+noguard") is None and parse_setting("free+think8+noguard") == (None, False)
    with pytest.raises(ValueError):
        parse_setting("flexible+canonical")
    with pytest.raises(ValueError):
        parse_setting("flexible+thinklots")
    with pytest.raises(CompileError):
        parse_setting("[ ]*")  # unbounded whitespace is never a candidate
    rows = [(random.Random(i).randint(0, 3), 3) for i in range(50)]
    low, high = bootstrap_ci(rows, 300, 0)
    accuracy = sum(c for c, _ in rows) / 150
    assert low <= accuracy <= high and high - low < 0.4
    assert paired_delta_ci(rows, rows, 100, 0) == (0.0, 0.0, 0.0)


def test_the_default_is_the_most_accurate_policy_within_the_token_and_length_budgets():
    def row(accuracy, tokens_vs_compact, cut=0.0):
        return {"extract": {"accuracy": accuracy, "tokens_vs_compact_form": tokens_vs_compact,
                            "length_cut_share": cut}}

    table = {"free": row(0.9, 1.0), "compact": row(0.5, 1.0), "spaced": row(0.7, 1.08),
             "newlines": row(0.8, 1.45), "any": row(0.85, 1.2, cut=0.02), "spaced+noguard": row(0.9, 1.0)}
    assert choose_default(table) == "spaced"  # newlines is 45% longer, any loops too often, free is no policy
    table["flexible"] = row(0.7, 1.05)
    assert choose_default(table) == "flexible"  # a tie goes to fewer tokens


def test_quality_cli_on_the_real_model(tmp_path, capsys, one_torch_thread):
    out = tmp_path / "quality.json"  # --threads 1 below; the fixture restores the thread count after
    assert main(["quality", "--source", "maskbench", "--data", str(MASKBENCH_DIR), "--split", "tune",
                 "--cases", "1", "--settings", "free,compact", "--kinds", "extract,choice", "--max-tokens", "32",
                 "--threads", "1", "--no-progress", "--json", str(out)]) == 0
    report = json.loads(out.read_text())["tune"]
    assert set(report["settings"]) == {"free", "compact"}
    for name, answers in report["answers"].items():
        assert {a["id"].split("#")[1] for a in answers} <= {"extract", "choice", "regex"}
        for answer in answers:
            if name != "free" and answer["finish_reason"] == "stop":
                assert answer["valid"]  # a constrained output that ended is valid
    compact = report["settings"]["compact"]["all"]
    assert 0.0 <= compact["accuracy"] <= 1.0 and compact["ci95"][0] <= compact["accuracy"] <= compact["ci95"][1]
    assert "delta_vs_free" in compact
    assert "chosen default whitespace" in capsys.readouterr().out
