"""``python -m benchmarks list-runs``: tasks split by their text, records and their repeats counted, a small
run."""

from benchmarks.list_runs import ListRunsConfig, format_table, records, run_list_runs, tasks


def test_the_splits_are_fixed_and_apart():
    tune, report = tasks("tune", 100), tasks("report", 100)
    assert tune == tasks("tune", 100) and not {t.prompt for t in tune} & {t.prompt for t in report}
    assert len(tune) + len(report) == 60 and min(len(tune), len(report)) >= 25
    assert all(t.schema["properties"]["items"]["type"] == "array" for t in tune)


def test_records_and_the_most_repeated_in_one_array():
    text = ('{"items": [{"name": "Mars", "moons": 2}, {"moons": 2, "name": "MARS"}, {"name": "Mars", "moons": 3},'
            ' {"name": "mars", "moons": 2}], "other": [{"a": 1}, {"a": 1}]}')
    assert records(text) == (6, 2)  # key order and the names' case aside; per array
    assert records('{"items": [{"name": "a"}, {"name": "A"}, {"name": "a"}, {"name": "a') == (3, 2)  # cut short
    assert records('{"items": [{"name": "a"') == (0, 0)  # no record finished
    assert records('{"items": ["a", "a"]}') == (0, 0)  # strings are no records


def test_a_small_run_reports_both_settings(smollm2):
    report = run_list_runs(ListRunsConfig(tasks=1, max_tokens=48), loaded=smollm2)
    assert set(report["summary"]) == {"guard", "noguard"}
    assert all(s["tasks"] == 1 and s["finished"] + s["cut"] == 1 for s in report["summary"].values())
    assert "| guard | 1 |" in format_table(report)
