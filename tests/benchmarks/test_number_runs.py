"""``python -m benchmarks number-runs``: tasks split by their text, numbers' digits counted as written, a
small run."""

from benchmarks.number_runs import RUN_DIGITS, NumberRunsConfig, format_table, longest_number, run_number_runs, tasks


def test_the_splits_are_fixed_and_apart_and_hold_every_family():
    tune, report = tasks("tune", 100), tasks("report", 100)
    assert tune == tasks("tune", 100) and not {t.prompt for t in tune} & {t.prompt for t in report}
    assert len(tune) + len(report) == 80
    assert {t.family for t in tune} == {t.family for t in report} == {"city", "planet", "company", "product"}


def test_a_numbers_digits_are_counted_as_written_and_strings_are_not_numbers():
    assert longest_number('{"a": 12, "b": {"c": [1.50, 7]}}') == 3
    assert longest_number('{"a": 1111111100000000111}') == RUN_DIGITS
    assert longest_number('{"a": 2.14442714444444453e+5}') == 19  # as written: the mantissa's 18, the exponent's 1
    assert longest_number('{"a": "12345678901234567890", "b": true}') == 0
    assert longest_number('{"a": 123') == 0  # not JSON: cut


def test_a_small_run_reports_both_settings(smollm2):
    report = run_number_runs(NumberRunsConfig(tasks=2, max_tokens=40), loaded=smollm2)
    assert set(report["summary"]) == {"guard", "noguard"}
    assert all(s["tasks"] == 2 and s["finished"] + s["cut"] <= 2 for s in report["summary"].values())
    assert report["summary"]["guard"]["runs"] == 0  # the guard never lets one through
    assert "| guard | 2 |" in format_table(report)
