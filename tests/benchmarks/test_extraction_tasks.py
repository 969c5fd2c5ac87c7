"""``python -m benchmarks quality --source families``: the seven families, their split, and one real run."""

from __future__ import annotations

import json
import re
from collections import Counter

import jsonschema
import pytest

from benchmarks.__main__ import main
from benchmarks.answer_quality import score
from benchmarks.extraction_tasks import FAMILIES, family_task, family_tasks
from benchmarks.quality_tasks import split_of


@pytest.fixture(scope="module")
def tune():
    return family_tasks("tune", 210)


def test_tasks_are_the_same_every_time_and_split_by_id(tune):
    assert [t.prompt for t in tune] == [t.prompt for t in family_tasks("tune", 210)]
    assert all(split_of(t.id) == "tune" for t in tune)
    report_ids = {t.id for t in family_tasks("report", 210)}
    assert len(report_ids) == 210 and not report_ids & {t.id for t in tune}
    assert family_task("person-0003").prompt == family_task("person-0003").prompt


def test_every_family_and_both_prompt_styles_are_covered(tune):
    families = Counter(t.source.split("/")[0] for t in tune)
    assert set(families) == set(FAMILIES) and min(families.values()) == 30
    styles = Counter(t.source.split("/")[1] for t in tune)
    assert styles["named"] > 50 and styles["schema"] > 50


def test_every_answer_is_stated_in_the_prose_and_valid_under_its_schema(tune):
    for task in tune:
        record: dict = {}
        for path, value in task.fields.items():
            node = record
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value
        jsonschema.validate(record, task.constraint)
        for value in task.fields.values():
            if isinstance(value, bool):
                continue
            if task.id.startswith("event") and isinstance(value, str) and re.fullmatch(r"\d{4}-\d\d-\d\d", value):
                year = value[:4]
                assert year in task.prompt  # the date is stated, ISO or in words
                continue
            stated = [value] if not isinstance(value, list) else value
            for item in stated:
                shown = f"{item:.2f}" if isinstance(item, float) else str(item)
                assert shown in task.prompt, (task.id, shown, task.prompt)


def test_named_prompts_name_every_key_and_schema_prompts_name_none():
    named = next(t for t in family_tasks("tune", 70) if t.source == "person/named")
    assert all(key in named.prompt for key in ("name", "age", "city"))
    schema_only = next(t for t in family_tasks("tune", 70) if t.source == "product/schema")
    assert "in_stock" not in schema_only.prompt


def test_terse_prompts_ask_for_the_same_passage_without_saying_json(tune):
    terse = family_tasks("tune", 210, terse=True)
    assert [t.id for t in terse] == [t.id for t in tune] and [t.fields for t in terse] == [t.fields for t in tune]
    for plain, short in zip(tune, terse, strict=True):
        assert "JSON" not in short.prompt and short.source.endswith("/schema")
        passage = short.prompt.split("\n\n")[0].rsplit(" Extract", 1)[0].rsplit(" Give me", 1)[0]
        assert passage in plain.prompt  # the same passage, asked otherwise


def test_scoring_a_family_answer(tune):
    task = next(t for t in tune if t.id.startswith("list"))
    record = {"owner": task.fields[("owner",)], "items": task.fields[("items",)]}
    assert score(task, json.dumps(record), constrained=True) == (True, {("owner",): True, ("items",): True})
    shuffled = {**record, "items": list(reversed(record["items"]))}
    assert score(task, json.dumps(shuffled), constrained=True)[1][("items",)] is False


def test_quality_cli_on_the_families_with_the_real_model(tmp_path, capsys, one_torch_thread):
    out = tmp_path / "quality.json"
    assert main(["quality", "--split", "report", "--cases", "7", "--settings", "compact,spaced",
                 "--max-tokens", "64", "--threads", "1", "--no-progress", "--json", str(out)]) == 0
    report = json.loads(out.read_text())["report"]
    assert report["source"] == "families"
    for name in ("compact", "spaced"):
        row = report["settings"][name]
        assert {f"family:{f}" for f in FAMILIES} <= set(row)
        assert row["all"]["tasks"] == 7 and row["all"]["fields"] == sum(row["fields"][f][1] for f in row["fields"])
        for answer in report["answers"][name]:
            if answer["finish_reason"] == "stop":
                assert answer["valid"]  # a finished constrained output is valid
    printed = capsys.readouterr().out
    assert "worst fields, spaced" in printed and "chosen default whitespace" in printed
