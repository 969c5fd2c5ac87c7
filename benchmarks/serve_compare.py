"""``python -m benchmarks serve --against URL``: the same requests against two OpenAI-compatible
servers in one run, alternating, with their ratio.

Each round runs the whole bench (``cdsl-struct bench serve``'s concurrency levels, or ``--mix``'s load and its
one-at-a-time baseline) against one server and then the other; the order flips every round
(A B, B A, ...), so a drift of the machine's speed during the run falls on both. Per case (a
concurrency level, or the mixed / one-at-a-time load) the walls are summed over the rounds and
reported side by side with ``speedup`` = the other server's wall / ours (above 1: we are faster
on the same requests), both servers' completion tokens (as reported, and re-tokenised by one
tokenizer where the bench counts them), time to first token where measured, and validity.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdsl_struct.bench import serve, write_report


@dataclass(frozen=True)
class Server:
    """One server under test: its label, base URL and the model name it serves."""

    label: str
    base_url: str
    model: str


_SUMMED = ("wall_s", "completion_tokens", "retokenised_tokens", "valid", "requests", "well_formed")


def cases_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A bench report's cases by name: ``"1 at once"``, ``"16 at once"``, or ``mixed`` / ``one_at_a_time``."""
    summary = report["summary"]
    if "levels" in summary:
        return {f"{level['concurrency']} at once": level for level in summary["levels"]}
    return {name: summary[name] for name in ("mixed", "one_at_a_time")}


def compare_servers(run: Callable[[Server], dict[str, Any]], ours: Server, theirs: Server,
                    rounds: int = 2) -> dict[str, Any]:
    """``run`` (one whole bench against one server) for both servers, ``rounds`` times, alternating."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if ours.label == theirs.label:
        raise ValueError(f"the two servers need different labels, both are {ours.label!r}")
    reports: dict[str, list[dict[str, Any]]] = {ours.label: [], theirs.label: []}
    orders = []
    for round_index in range(rounds):
        order = (ours, theirs) if round_index % 2 == 0 else (theirs, ours)
        orders.append([server.label for server in order])
        for server in order:
            reports[server.label].append(run(server))
    totals = {label: _summed([cases_of(report) for report in runs]) for label, runs in reports.items()}
    comparison = []
    for case, mine in totals[ours.label].items():
        other = totals[theirs.label].get(case)
        if other is None:
            continue
        comparison.append({"case": case, "ours": mine, "theirs": other,
                           "speedup": round(other["wall_s"] / mine["wall_s"], 3) if mine["wall_s"] else None})
    return {"servers": {"ours": vars(ours), "theirs": vars(theirs)}, "rounds": rounds, "order": orders,
            "summary": {"comparison": comparison}, "runs": reports}


def _summed(runs: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per case: the counts and walls summed over the rounds, the medians of the rounds' p50s."""
    totals: dict[str, dict[str, Any]] = {}
    for case in runs[0]:
        rows = [run[case] for run in runs]
        total = {key: round(sum(row[key] for row in rows), 3) for key in _SUMMED if key in rows[0]}
        for key in ("ttft_p50_s", "p50_s", "latency_p50_s"):
            if key in rows[0]:
                total[key] = sorted(row[key] for row in rows)[len(rows) // 2]
        totals[case] = total
    return totals


def format_comparison(report: dict[str, Any]) -> str:
    """The side-by-side table (markdown)."""
    ours, theirs = report["servers"]["ours"], report["servers"]["theirs"]
    lines = [f"ours: {ours['label']} ({ours['base_url']}); theirs: {theirs['label']} ({theirs['base_url']}); "
             f"{report['rounds']} alternating rounds, walls summed; speedup = their wall / ours", "",
             "| case | wall s (ours / theirs) | speedup | tokens reported (ours / theirs) | re-tokenised "
             "(ours / theirs) | p50 s (ours / theirs) | TTFT p50 s (ours / theirs) | valid (ours / theirs) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in report["summary"]["comparison"]:
        a, b = row["ours"], row["theirs"]

        def pair(key: str, a: dict[str, Any] = a, b: dict[str, Any] = b) -> str:
            return f"{a[key]} / {b[key]}" if key in a and key in b else "-"

        count = "requests" if "requests" in a and "well_formed" not in a else "well_formed"
        lines.append(f"| {row['case']} | {pair('wall_s')} | {row['speedup']} | {pair('completion_tokens')} | "
                     f"{pair('retokenised_tokens')} | {pair('p50_s') if 'p50_s' in a else pair('latency_p50_s')} | "
                     f"{pair('ttft_p50_s')} | {a['valid']}/{a[count]} / {b['valid']}/{b[count]} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``cdsl-struct bench serve``'s options and ``--against``'s."""
    serve.add_arguments(parser)
    parser.add_argument("--against", metavar="URL", default=None,
                        help="also send the same requests to this OpenAI-compatible server (e.g. vLLM), "
                             "alternating with --url round by round, and report the side-by-side ratio")
    parser.add_argument("--against-model", default=None, help="--against: the model name it serves (default --model)")
    parser.add_argument("--against-label", default="", help="--against: its name in the table")
    parser.add_argument("--rounds", type=int, default=2,
                        help="--against: rounds of both servers, order flipped each round (default 2)")


def run(args: argparse.Namespace) -> int:
    """Both servers side by side with ``--against``, else ``cdsl-struct bench serve``'s run."""
    if not args.against:
        return serve.run(args)
    ours = Server(args.label or "ours", args.url, args.model)
    theirs = Server(args.against_label or "theirs", args.against, args.against_model or args.model)
    report = compare_servers(lambda server: serve.run_once(args, server.base_url, server.model, server.label), ours,
                             theirs, rounds=args.rounds)
    return write_report(report, format_comparison(report), args)
