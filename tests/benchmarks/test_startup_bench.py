"""``python -m benchmarks startup``'s figures from scripted requests: when the compiled forward took
over, eager and compiled medians, and the slowest eager request over the ``off`` start's median."""

from __future__ import annotations

from benchmarks.startup import compare, format_startup_table, summarise_start


def _rows(*pairs):
    return [{"at": float(i), "seconds": seconds, "valid": True, "answered": who} for i, (seconds, who) in
            enumerate(pairs)]


def test_a_start_is_summarised_against_the_off_start():
    auto = summarise_start("auto", 9.5, _rows((1.2, "eager"), (3.0, "eager"), (1.4, "eager"), (0.8, "compiled"),
                                              (0.9, "compiled")), {"forward": {"compile_seconds": 120.0}})
    off = summarise_start("off", 8.0, _rows((1.0, "eager"), (1.5, "eager"), (1.6, "eager")), {"forward": {}})
    report = compare([auto, off])
    first = report["summary"]["starts"][0]
    assert first["first_answer_at_s"] == 10.7 and first["compiled_from_s"] == 3.0
    assert first["eager_median_s"] == 1.4 and first["eager_max_s"] == 3.0 and first["compiled_median_s"] == 0.85
    assert first["eager_max_over_off_median"] == 2.0 and first["compiled_median_over_off_median"] == 0.57
    assert "rows" not in first and report["starts"][0]["rows"]
    table = format_startup_table(report)
    assert "| auto | 9.50 s | 10.7 s | 3.00 s | 1.40 s / 3.00 s | 0.85 s | 2.0 | 5/5 |" in table
    assert "| off |" in table and table.count("\n") == 3
