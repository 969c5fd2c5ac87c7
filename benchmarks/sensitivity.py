"""``python -m benchmarks commongen-sweep``: CDSL's speed against hard coverage as a_t, r_t, d, the
steer ratio and the guided draft's reward weight vary.

On the ``tune`` split only. Greedy and CDLH run once on the same concept sets as references; then
CDSL runs once per setting, one parameter varied at a time around the base config, for both
acceptance variants (greedy matching, and speculative sampling at a temperature). Each point
has CDSL's hard coverage and its speedup over CDLH, in target passes (machine-independent) and
in wall time (same process, same sets; noisy on a shared machine). ``plot_sweep`` draws the
curves (matplotlib PNG).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cdsl_struct.bench import write_report

from . import commongen
from .commongen import CommonGenBench, CommonGenConfig, load_cases

PARAMETERS = {"a_t": "acceptance_threshold", "r_t": "reward_threshold", "d": "cdsl_d", "steer": "steer_ratio",
              "lam": "draft_lam"}


@dataclass
class SweepConfig:
    base: CommonGenConfig = field(default_factory=lambda: CommonGenConfig(split="tune", limit=12))
    a_t: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    r_t: tuple[float, ...] = (0.0, 0.5, 0.99)
    d: tuple[int, ...] = (2, 4, 6, 8)
    steer: tuple[float, ...] = (0.0, 0.1, 0.3)
    """``steer_ratio`` values: how plausible to the target a reward-steered token must be to stay."""
    lam: tuple[float, ...] = (5.0, 20.0)
    """The guided draft's reward weight (``draft_lam``)."""
    temperature: float = 0.7
    """The speculative-sampling variant's temperature (0 leaves that variant out)."""

    def __post_init__(self) -> None:
        if self.base.split != "tune":
            raise ValueError("the sweep tunes: it runs on the 'tune' split only")


def run_sweep(data: str | Path, config: SweepConfig, progress: bool = False,
              checkpoint: str | Path | None = None) -> dict[str, Any]:
    """The references (greedy, CDLH) and one CDSL point per (variant, parameter, value)."""
    base = config.base
    cases = load_cases(data, base.limit, base.seed, base.split)
    bench = CommonGenBench(cases, base)
    reference = bench.run(replace(base, methods=("greedy", "cdlh")), progress=progress)
    refs = {m: _summary(row) for m, row in reference["methods"].items()}
    variants = [("greedy", 0.0)] + ([("sampling", config.temperature)] if config.temperature > 0 else [])
    points: list[dict[str, Any]] = []
    report = {"references": refs, "points": points, "cases": len(cases),
              "base": dict(vars(base)), "temperature": config.temperature}
    done: dict[tuple, dict[str, Any]] = {}
    for variant, temperature in variants:
        for name, attribute in PARAMETERS.items():
            for value in getattr(config, name):
                settings = replace(base, methods=("cdsl",), cdsl_temperature=temperature, **{attribute: value})
                key = (variant, settings.acceptance_threshold, settings.reward_threshold, settings.cdsl_d,
                       settings.steer_ratio, settings.draft_lam)
                if key not in done:  # the base point is shared by every curve
                    done[key] = _summary(bench.run(settings, progress=progress)["methods"]["cdsl"])
                row = done[key]
                points.append({"variant": variant, "parameter": name, "value": value, **row,
                               "pass_speedup": round(refs["cdlh"]["target_passes"] / max(row["target_passes"], 1), 3),
                               "wall_speedup": round(refs["cdlh"]["wall_s"] / max(row["wall_s"], 1e-9), 3)})
                if checkpoint is not None:
                    Path(checkpoint).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    keys = ("hard_coverage", "hard_coverage_ci95", "soft_coverage", "complete", "nll", "real_words", "wall_s",
            "target_passes", "draft_passes", "states")
    return {k: row[k] for k in keys if k in row}


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{report['cases']} tune concept sets; references: " + ", ".join(
        f"{m} hard {r['hard_coverage']:.3f} nll {r.get('nll', float('nan')):.3f} passes {r['target_passes']} "
        f"wall {r['wall_s']:.1f} s"
        for m, r in report["references"].items())]
    lines.append(f"{'variant':9s} {'param':5s} {'value':>6s} {'hard':>6s} {'soft':>6s} {'complete':>8s} "
                 f"{'nll':>6s} {'passes':>7s} {'x pass':>7s} {'x wall':>7s}")
    for p in report["points"]:
        lines.append(f"{p['variant']:9s} {p['parameter']:5s} {p['value']:6.2f} {p['hard_coverage']:6.3f} "
                     f"{p['soft_coverage']:6.3f} {p['complete']:8.3f} {p.get('nll', float('nan')):6.3f} "
                     f"{p['target_passes']:7d} "
                     f"{p['pass_speedup']:7.2f} {p['wall_speedup']:7.2f}")
    return "\n".join(lines)


def plot_sweep(report: dict[str, Any], path: str | Path) -> None:
    """Hard coverage against speedup over CDLH (target passes), one panel per acceptance variant,
    one curve per parameter, each point labelled with its value; CDLH and greedy as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(dict.fromkeys(p["variant"] for p in report["points"]))
    fig, axes = plt.subplots(1, len(variants), figsize=(6 * len(variants), 4.5), squeeze=False, sharey=True)
    titles = {"greedy": "greedy matching", "sampling": f"speculative sampling (T {report['temperature']})"}
    for ax, variant in zip(axes[0], variants, strict=True):
        for parameter, marker in zip(PARAMETERS, "osd^v", strict=False):
            pts = [p for p in report["points"] if p["variant"] == variant and p["parameter"] == parameter]
            xs, ys = [p["pass_speedup"] for p in pts], [p["hard_coverage"] for p in pts]
            ax.plot(xs, ys, marker=marker, label=parameter)
            for p in pts:
                ax.annotate(f"{p['value']:g}", (p["pass_speedup"], p["hard_coverage"]), fontsize=7,
                            textcoords="offset points", xytext=(3, 3))
        refs = report["references"]
        ax.axhline(refs["cdlh"]["hard_coverage"], linestyle="--", color="gray", label="CDLH (speedup 1)")
        ax.plot([refs["cdlh"]["target_passes"] / max(refs["greedy"]["target_passes"], 1)],
                [refs["greedy"]["hard_coverage"]], marker="x", color="black", linestyle="", label="greedy")
        ax.set_title(f"CDSL, {titles.get(variant, variant)}")
        ax.set_xlabel("speedup over CDLH (target passes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(f"hard coverage ({report['cases']} tune concept sets)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks commongen-sweep``'s options: CommonGen's, on the tune split, and the values to try."""
    commongen.add_arguments(parser)
    parser.set_defaults(split="tune", limit=12)
    parser.add_argument("--a-t-values", default="0,0.25,0.5,0.75,1", help="acceptance thresholds to try")
    parser.add_argument("--r-t-values", default="0,0.5,0.99", help="reward thresholds to try")
    parser.add_argument("--d-values", default="2,4,6,8", help="lookahead lengths to try")
    parser.add_argument("--steer-values", default="0,0.1,0.3", help="steer ratios to try")
    parser.add_argument("--lam-values", default="5,20", help="guided-draft reward weights to try")
    parser.add_argument("--temperature", type=float, default=0.7,
                        help="the speculative-sampling variant's temperature (0: greedy matching only)")
    parser.add_argument("--plot", help="write the curves here (PNG)")


def run(args: argparse.Namespace) -> int:
    """Run the sweep as ``args`` say; print the table, write the report and the plot."""

    def values(text: str, kind: type) -> tuple:
        return tuple(kind(v) for v in text.split(",") if v.strip())

    config = SweepConfig(base=commongen.config_from(args), a_t=values(args.a_t_values, float),
                         r_t=values(args.r_t_values, float), d=values(args.d_values, int),
                         steer=values(args.steer_values, float), lam=values(args.lam_values, float),
                         temperature=args.temperature)
    report = run_sweep(args.data, config, progress=not args.no_progress, checkpoint=args.json_out)
    if args.plot:
        plot_sweep(report, args.plot)
    report["summary"] = {}
    return write_report(report, format_table(report), args)
