"""``python -m benchmarks steps`` on the embedded model with a tiny grid: every variant and cell measured."""

from benchmarks.step_cost import StepCostConfig, format_table, run_step_cost


def test_step_cost_measures_every_variant_and_cell(one_torch_thread):
    report = run_step_cost(StepCostConfig(context=16, steps=2, rounds=1, rows=(1, 2), widths=(1, 2)))
    summary = report["summary"]
    assert set(summary["single_row_step_ms"]) == {
        "eager float32", "eager float32, packed linears", "eager bfloat16", "eager bfloat16, packed linears",
        "static cache float32"}
    assert all(ms > 0 for ms in summary["single_row_step_ms"].values())
    assert set(summary["batched_step_ms"]) == {"1x1", "1x2", "2x1", "2x2"}
    assert set(summary["prefill_ms_per_position"]) == {"1", "2"}
    assert summary["machine"]["grid dtype"] == "torch.float32"  # the suite pins CDSL_CPU_BF16=0
    assert "| 2 |" in format_table(report)


def test_the_compiled_grid_is_printed_beside_the_eager_one():
    grid = {"1x1": 30.0}
    report = {"config": {"rows": [1], "widths": [1]},
              "summary": {"single_row_step_ms": {"eager float32": 40.0}, "batched_step_ms": grid,
                          "prefill_ms_per_position": {"1": 2.0}, "machine": {"grid dtype": "torch.bfloat16"},
                          "compiled_step_ms": {"1x1": 25.0}, "compiled_prefill_ms_per_position": {"1": 1.5},
                          "compile_seconds": 150.0, "compiled_active": True}}
    table = format_table(report)
    assert "| 1 | 30.0 | 2.0 |" in table and "| 1 | 25.0 | 1.5 |" in table
    assert "compiled and warmed in 150.0 s" in table
