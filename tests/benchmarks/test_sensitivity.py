"""The CDSL sweep: one point per (variant, parameter, value), the base point run once, speedups
against the CDLH reference, the tune split only, and the plot."""

import pytest

from benchmarks import sensitivity
from benchmarks.commongen import CommonGenConfig
from benchmarks.sensitivity import SweepConfig, format_table, plot_sweep, run_sweep


class FakeBench:
    """Stands in for the model: a CDSL run's passes follow from its settings."""

    runs: list = []

    def __init__(self, cases, config):
        self.cases = cases

    def run(self, config, progress=False):
        FakeBench.runs.append(config)

        def row(passes, hard):
            return {"hard_coverage": hard, "hard_coverage_ci95": [0.0, 1.0], "soft_coverage": hard, "complete": 1.0,
                    "nll": 1.0, "real_words": 1.0, "wall_s": passes / 10, "target_passes": passes,
                    "draft_passes": 0, "states": {}}

        if "cdsl" not in config.methods:
            return {"methods": {"greedy": row(100, 0.25), "cdlh": row(600, 0.75)}}
        passes = int(60 / config.cdsl_d + 100 * config.acceptance_threshold + 50 * config.steer_ratio)
        return {"methods": {"cdsl": row(passes, 0.5 + config.draft_lam / 100)}}


@pytest.fixture
def fake(monkeypatch):
    FakeBench.runs = []
    monkeypatch.setattr(sensitivity, "CommonGenBench", FakeBench)
    monkeypatch.setattr(sensitivity, "load_cases", lambda *a: [{"concepts": ["dog"]}] * 4)
    return FakeBench


def test_each_parameter_varies_alone_around_the_base_and_the_base_runs_once(fake, tmp_path):
    config = SweepConfig(base=CommonGenConfig(split="tune", limit=4), a_t=(0.25, 0.5), r_t=(0.99,), d=(3, 6),
                         steer=(0.0, 0.2), lam=(5.0, 20.0), temperature=0.7)
    report = run_sweep("unused.jsonl", config)
    per_variant = 2 + 1 + 2 + 2 + 2
    assert len(report["points"]) == 2 * per_variant
    # distinct settings only: the base (a_t 0.5, r_t 0.99, d 6, steer 0, lam 20) is shared by every curve
    assert len(fake.runs) == 1 + 2 * (1 + 1 + 1 + 1 + 1)
    base = next(p for p in report["points"] if p["variant"] == "greedy" and p["parameter"] == "d" and p["value"] == 6)
    assert base["target_passes"] == 60 // 6 + 50 and base["pass_speedup"] == pytest.approx(600 / 60, abs=1e-3)
    steer = next(p for p in report["points"] if p["parameter"] == "steer" and p["value"] == 0.2)
    assert steer["target_passes"] == 60 // 6 + 50 + 10
    lam = next(p for p in report["points"] if p["parameter"] == "lam" and p["value"] == 5.0)
    assert lam["hard_coverage"] == pytest.approx(0.55)
    sampled = [c for c in fake.runs if "cdsl" in c.methods and c.cdsl_temperature == 0.7]
    assert len(sampled) == 5
    table = format_table(report)
    assert "steer" in table and "lam" in table and table.count("\n") == 1 + len(report["points"])
    plot_sweep(report, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_the_sweep_tunes_on_the_tune_split_only():
    with pytest.raises(ValueError, match="tune"):
        SweepConfig(base=CommonGenConfig(split="report"))
