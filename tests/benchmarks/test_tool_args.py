"""``python -m benchmarks tool-args``: tasks split by their text, the leak test, and a small run."""

from types import SimpleNamespace

from benchmarks.tool_args import ToolArgsConfig, format_table, judge, leaked, run_tool_args, tasks


def test_the_splits_are_fixed_and_apart():
    tune, report = tasks("tune", 40), tasks("report", 40)
    assert tune == tasks("tune", 40) and not {t.prompt for t in tune} & {t.prompt for t in report}
    assert {t.tool for t in tune} == {"get_weather", "send_email", "search_flights", "create_event"}
    for task in tune:
        for value in task.expected.values():  # every known argument is in the request's words
            assert all(item in task.prompt for item in (value if isinstance(value, list) else [value])), task


def test_a_string_that_holds_the_calls_syntax_is_a_leak():
    assert leaked("Hi,</tool_call>x.com") and leaked("London } Ada") and leaked("] }}")
    assert not leaked("see [team_name] {x}") and not leaked("a < b")
    call = SimpleNamespace(name="send_email", arguments={"to": "tom@x.org", "subject": "Hi"})
    task = tasks("tune", 40)[3]
    row = judge(task, SimpleNamespace(tool_calls=[call], finish_reason="stop", text="", tokens=[1, 2]))
    assert row["complete"] and not row["leaked"] and row["right_tool"] == (task.tool == "send_email")
    cut = SimpleNamespace(tool_calls=[], finish_reason="length", tokens=[1],
                          text='<tool_call>{"name": "create_event", "arguments": {"attendees": ["a", "a", "] }}</')
    assert judge(task, cut)["leaked"] and judge(task, cut)["cut"]


def test_a_small_run_reports_both_settings(smollm2):
    report = run_tool_args(ToolArgsConfig(tasks=2, max_tokens=48, rows=2), loaded=smollm2)
    assert set(report["summary"]) == {"guard", "noguard"}
    assert all(s["tasks"] == 2 and s["complete"] + s["cut"] <= 2 for s in report["summary"].values())
    assert "| guard | 2 |" in format_table(report)
