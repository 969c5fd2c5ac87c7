"""``python -m benchmarks vllm``'s report: the shape the CLI writes (a ``summary``) and its table. The bench
itself runs a vLLM engine and is exercised where vLLM is installed (``.venv-vllm``)."""

from argparse import Namespace

from benchmarks.vllm_processor import format_vllm_table
from cdsl_struct.bench import write_report


def test_report_has_a_summary_the_cli_can_write(tmp_path, capsys):
    rows = [{"backend": b, "mode": m, "wall_s": 2.0, "tokens": 100, "longest": 9, "length": 1,
             "valid": 16, "requests": 16, "tokens_per_s": 50.0, "same_as_xgrammar": 12}
            for b in ("xgrammar", "cdsl", "cdsl_any_ws") for m in ("one_at_a_time", "all_at_once")]
    ratios = {b: {"one_at_a_time": 1.0, "all_at_once": 0.9} for b in ("cdsl", "cdsl_any_ws")}
    report = {"config": {}, "summary": {"rows": rows, "throughput_ratio": ratios, "wall_ratio": ratios}}
    args = Namespace(json_out=str(tmp_path / "out.json"), prog="python -m benchmarks")
    assert write_report(report, format_vllm_table(report), args) == 0
    out = capsys.readouterr().out
    assert "| cdsl_any_ws | all_at_once | 2.0 | 100 | 9 | 1 | 50.0 | 16/16 | 12/16 |" in out
    assert "cdsl_any_ws / xgrammar: tokens/s one at a time 1.0, all at once 0.9" in out
