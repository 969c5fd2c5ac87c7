"""``python -m benchmarks tools`` on the embedded model: both settings over the same requests, and
closed objects never produce a key the tool's schema does not declare."""

from benchmarks.tool_calls import ToolBenchConfig, format_tool_table, run_tool_bench


def test_closed_objects_give_only_declared_keys(smollm2):
    report = run_tool_bench(ToolBenchConfig(requests=2, max_tokens=40), loaded=smollm2)
    assert len(report["summary"]) == 4 and all(s["requests"] == 2 for s in report["summary"].values())
    for name, setting in report["summary"].items():
        if name.startswith("closed"):
            assert setting["calls_with_undeclared_keys"] == 0, name
    one_call = [r for r in report["rows"] if r["setting"].endswith("one call")]
    assert all(len(r["calls"]) <= 1 for r in one_call)
    assert "| closed (default), one call | 2 |" in format_tool_table(report)
