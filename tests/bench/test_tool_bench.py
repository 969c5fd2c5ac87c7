"""``cdsl-struct bench tools`` on the embedded model: both settings over the same requests, and
closed objects never produce a key the tool's schema does not declare."""

from cdsl_struct.bench.tool_calls import ToolBenchConfig, format_tool_table, run_tool_bench


def test_closed_objects_give_only_declared_keys(smollm2):
    report = run_tool_bench(ToolBenchConfig(requests=2, max_tokens=40), loaded=smollm2)
    closed, given = report["summary"]["closed (default)"], report["summary"]["as given"]
    assert closed["requests"] == given["requests"] == 2
    assert closed["calls_with_undeclared_keys"] == 0
    assert closed["complete"] + closed["lost_to_max_tokens"] == 2
    assert "| closed (default) | 2 |" in format_tool_table(report)
