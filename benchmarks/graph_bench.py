"""``python -m benchmarks graphs``: the static-shape runner (``cdsl_struct.runners``) on a GPU, with
transformers' static-cache compiled ``generate`` in the same run as the baseline (issue 53).

One process, one model, one runner (captured once, then reused by every engine run; each run starts
with an empty prefix cache): start-up (capture and self-check), replay against the runner's eager
static steps over a random engine-like script (rows joining, leaving, drafts accepted and
rejected) with ``torch.cuda.set_sync_debug_mode("error")`` around the steps, then the engine at
``--rows`` with the batch kept full (``--requests`` through it): the mix as served, the same prompts
as free text (by the table backend, and by llguidance as before it), JSON rows as served against the
same prompts as free text, prompt lookup against target-only, one row; the ragged runner on a few
requests; and transformers' ``generate(..., cache_implementation="static")`` over the same prompts
(free text, and with our ``constrained(...)`` processor), warmed at the very lengths it is timed at.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from cdsl_struct.bench import write_report
from cdsl_struct.bench.throughput import FREE_TEXT, build_workload
from cdsl_struct.constraints import Regex, compile
from cdsl_struct.decoding import BatchEngine, Request, build_proposers
from cdsl_struct.models import Feed, batch_runner, load_model
from cdsl_struct.prompts import prompt_ids


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=64, help="rows of the batch (default 64)")
    parser.add_argument("--requests", type=int, default=256, help="requests through it (default 256)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--one-row-requests", type=int, default=8, help="requests of the one-row runs")
    parser.add_argument("--ragged-requests", type=int, default=64, help="requests of the ragged runner's run (0: none)")
    parser.add_argument("--k", type=int, default=6, help="prompt lookup's tokens a step")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' static-cache generate")
    parser.add_argument("--check-steps", type=int, default=24, help="steps of the replay check (0: none)")
    parser.add_argument("--profile", default="", help="comma-separated engine runs to profile (cProfile, tottime)")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--no-progress", action="store_true")


def _say(args: argparse.Namespace, line: str) -> None:
    if not args.no_progress:
        print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    model, tokenizer, eos = loaded.model, loaded.tokenizer, loaded.eos_token_ids
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    cuda = loaded.device.type == "cuda"
    report: dict[str, Any] = {"machine": {"device": str(loaded.device), "torch": torch.__version__,
                                          "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
                                          "gpu": torch.cuda.get_device_name(loaded.device) if cuda else None},
                              "config": {k: v for k, v in vars(args).items() if k not in ("run", "prog")},
                              "summary": {"engine": {}, "errors": {}}}
    summary = report["summary"]

    def section(name: str, work: Any) -> Any:
        """Run one part; an error is recorded and the rest go on; the report so far is written."""
        try:
            value = work()
        except Exception as exc:  # noqa: BLE001 - a GPU run must bring back what it can
            summary["errors"][name] = "".join(traceback.format_exception(exc))[-3000:]
            _say(args, f"{name} FAILED: {exc!r}")
            value = None
        if args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_out).write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
        return value

    started = time.perf_counter()
    runner = section("start", lambda: batch_runner(model, pad_token_id=pad, max_rows=args.rows))
    if runner is None:
        return 1
    graphs = getattr(runner, "graphs", None)
    summary["start"] = {"seconds": round(time.perf_counter() - started, 2), "runner": type(runner).__name__,
                        "graphs": len(graphs.graphs) if graphs else 0,
                        "capture_s": round(graphs.capture_seconds, 2) if graphs else None,
                        "capacity": getattr(getattr(runner, "buckets", None), "capacity", None),
                        "graphs_off": getattr(runner, "graphs_off", None),
                        "fused": getattr(runner, "fused", False), "fuse_off": getattr(runner, "fuse_off", None),
                        "fallback": getattr(runner, "fallback_reason", None)}
    _say(args, f"start: {summary['start']}")
    if args.check_steps and hasattr(runner, "graphs"):
        summary["replay_check"] = section("replay_check", lambda: _replay_check(runner, model, pad, args.check_steps,
                                                                               cuda))
        _say(args, f"replay check: {summary['replay_check']}")

    if cuda and getattr(runner, "graphs", None) is not None:
        summary["replay_ms"] = section("replay_ms", lambda: _replay_ms(runner))
        _say(args, f"replay ms: {summary['replay_ms']}")

    items = build_workload(args.requests)
    free = compile(Regex(FREE_TEXT), tokenizer, eos_token_ids=eos)
    free_llguidance = compile(Regex(FREE_TEXT), tokenizer, eos_token_ids=eos, backend="llguidance")
    lookup, plain = build_proposers("lookup", model), build_proposers("none", model)
    compiled: dict[str, Any] = {}
    jobs = []
    for item in items:
        key = repr(item.spec)
        if key not in compiled:
            compiled[key] = compile(item.spec, tokenizer, eos_token_ids=eos)
        jobs.append((item, prompt_ids(tokenizer, item.prompt, chat=True), compiled[key]))

    def requests(chosen: list[Any], *, free_text: Any = None, drafts: str = "served") -> list[Request]:
        made = []
        for item, prompt, spec in chosen:
            proposers = {"served": lookup if item.draft == "lookup" else plain, "all": lookup, "none": plain}[drafts]
            made.append(Request(list(prompt), free_text or spec, max_tokens=args.max_tokens,
                                proposers=tuple(proposers), k=args.k))
        return made

    section("warm_up", lambda: _engine(runner, requests(jobs[:4]), args.rows))
    json_jobs = [j for j in jobs if j[0].kind == "json"]
    one = jobs[:args.one_row_requests]
    runs = {
        "mix_served": (jobs, {}, args.rows),
        "mix_free": (jobs, {"free_text": free, "drafts": "none"}, args.rows),
        "mix_free_llguidance": (jobs, {"free_text": free_llguidance, "drafts": "none"}, args.rows),
        "json_served": (json_jobs, {}, args.rows),
        "json_free": (json_jobs, {"free_text": free, "drafts": "none"}, args.rows),
        "one_row_served": (one, {}, 1),
        "one_row_free": (one, {"free_text": free, "drafts": "none"}, 1),
        "one_row_no_drafts": (one, {"drafts": "none"}, 1),
        "one_row_lookup_all": (one, {"drafts": "all"}, 1),
        "mix_no_drafts": (jobs, {"drafts": "none"}, args.rows),
        "mix_lookup_all": (jobs, {"drafts": "all"}, args.rows),
    }
    # the same runs with every step waiting for the read of the one before (no step launched ahead)
    in_turn = {f"{name}_in_turn": runs[name] for name in ("mix_free", "mix_no_drafts", "one_row_free")}
    for name, (chosen, options, rows) in {**runs, **in_turn}.items():
        outcome = section(name, lambda chosen=chosen, options=options, rows=rows, name=name: _engine(
            runner, requests(chosen, **options), rows, [j[0] for j in chosen], check=not options.get("free_text"),
            profile=name in args.profile.split(","), run_ahead=False if name.endswith("_in_turn") else None))
        if outcome is not None:
            summary["engine"][name] = outcome
            _say(args, f"{name}: {outcome}")
    if args.ragged_requests:
        chosen = jobs[:args.ragged_requests]
        for name, chosen_runner in (("graph_mix_served_same", lambda: runner),
                                    ("ragged_mix_served", lambda: _ragged_runner(model, pad))):
            outcome = section(name, lambda chosen_runner=chosen_runner: _engine(
                chosen_runner(), requests(chosen), args.rows, [j[0] for j in chosen]))
            if outcome is not None:
                summary["engine"][name] = outcome
                _say(args, f"{name}: {outcome}")
    if not args.no_hf:
        summary["hf_static"] = section("hf_static", lambda: hf_static_generate(
            loaded, jobs, args.rows, args.max_tokens, pad, cuda))
        _say(args, f"hf static: {summary['hf_static']}")
    summary["ratios"] = _ratios(summary)
    return write_report(report, _table(summary), args)


def _engine(runner: Any, made: list[Request], rows: int, items: list[Any] | None = None,
            check: bool = True, profile: bool = False, run_ahead: bool | None = None) -> dict[str, Any]:
    """``made`` through a fresh engine of ``rows`` rows on ``runner`` (its prefix cache emptied
    first); with ``profile``, cProfile's top functions of the engine's thread under ``profile``;
    ``run_ahead``: the engine's (None: its default)."""
    if runner.prefixes is not None:
        runner.prefixes.clear()
    replays, eager = getattr(runner, "replays", 0), getattr(runner, "eager_steps", 0)
    engine = BatchEngine(runner, max_batch_size=rows, run_ahead=run_ahead)
    profiler = cProfile.Profile() if profile else None
    try:
        if profiler is not None:
            profiler.enable()
        start = time.perf_counter()
        ended = engine.run_rows(made)
        wall = time.perf_counter() - start
    finally:
        if profiler is not None:
            profiler.disable()
        engine.close()
    results = [row.result for row in ended if row.result is not None]
    tokens = sum(len(r.tokens) for r in results)
    out = {"requests": len(made), "errors": len(made) - len(results), "tokens": tokens, "wall_s": round(wall, 3),
           "tokens_per_s": round(tokens / wall, 1), "steps": engine.stats.steps,
           "step_ms": round(1000 * wall / max(engine.stats.steps, 1), 2),
           "mean_rows": round(engine.stats.rows_stepped / max(engine.stats.steps, 1), 1),
           "ahead_steps": engine.ahead_steps,
           "replays": getattr(runner, "replays", 0) - replays, "eager_steps": getattr(runner, "eager_steps", 0) - eager,
           "phases_ms_per_step": {k: round(1000 * v / max(engine.stats.steps, 1), 2)
                                  for k, v in engine.stats.phase_seconds.items()}}
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(45)
        out["profile"] = text.getvalue()[-9000:]
    if items is not None and check:
        out["valid"] = sum(row.result is not None and row.result.finish_reason == "stop" and item.valid(row.result.text)
                           for row, item in zip(ended, items, strict=True))
    return out


def _replay_ms(runner: Any, repeats: int = 20) -> dict[str, float]:
    """GPU milliseconds a replay of a few buckets takes (all rows padded), back to back."""
    times = {}
    for rows, width, length in ((1, 1, 512), (16, 1, 512), (64, 1, 512), (64, 8, 512), (64, 1, 2048), (8, 256, 512)):
        bucket = (runner.buckets.prefill if width > runner.buckets.max_width else runner.buckets.decode)(
            rows, width, length)
        if bucket is None or bucket not in runner.graphs.graphs:
            continue
        runner.step.load_padding(bucket)
        runner.graphs.replay(bucket)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            runner.graphs.replay(bucket)
        torch.cuda.synchronize()
        times[f"{bucket.rows}x{bucket.width}@{bucket.length}{'p' if bucket.gather else ''}"] = round(
            1000 * (time.perf_counter() - start) / repeats, 3)
    runner.reset_counters()
    return times


def _ragged_runner(model: Any, pad: int) -> Any:
    from cdsl_struct.models import RaggedRunner

    return RaggedRunner(model, pad_token_id=pad)


def _replay_check(runner: Any, model: Any, pad: int, steps: int, cuda: bool) -> dict[str, Any]:
    """A random engine-like script through ``runner`` (its graphs) and an eager static runner:
    the largest logit difference, the share of kept positions with the same argmax, and any error
    the sync debug mode raised inside a step."""
    from cdsl_struct.runners import GraphRunner

    eager = GraphRunner(model, pad_token_id=pad, prefix_cache_bytes=0, buckets=runner.buckets, graphs=False)
    prefixes, runner.prefixes = runner.prefixes, None
    rng = random.Random(0)
    vocab = model.config.vocab_size
    held: dict[str, list[int]] = {}
    worst, same, total, sync_errors = 0.0, 0, 0, []
    replays = runner.replays
    for step in range(steps):
        room = min(40, runner.buckets.max_rows) - len(held)  # more rows than the buckets hold leave the graphs
        if room > 0 and (not held or rng.random() < 0.6):
            for _ in range(rng.randint(1, min(6, room))):
                held[f"r{step}_{len(held)}"] = [rng.randrange(vocab) for _ in range(rng.randint(4, 300))]
        if len(held) > 2 and rng.random() < 0.3:
            gone = rng.sample(sorted(held), rng.randint(1, 2))
            for row in gone:
                del held[row]
            runner.release(*gone)
            eager.release(*gone)
        feeds = []
        for row, tokens in held.items():
            if len(tokens) > 8 and rng.random() < 0.3:
                del tokens[len(tokens) - rng.randint(1, 5):]  # drafts rejected
            tokens += [rng.randrange(vocab) for _ in range(rng.choice([1, 1, 1, 4, 7, 12]))]
            feeds.append(Feed(row, list(tokens), rng.randint(1, 3)))
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            got = runner.run(feeds)
        except RuntimeError as exc:
            sync_errors.append(f"step {step}: {exc}")
            torch.cuda.set_sync_debug_mode(0) if cuda else None
            break
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
        want = eager.run(feeds)
        for a, b in zip(got, want, strict=True):
            worst = max(worst, float((a - b).abs().max()))
            same += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += a.shape[0]
    runner.release(*held)
    runner.prefixes = prefixes
    replayed, eager_steps = runner.replays - replays, runner.eager_steps
    runner.reset_counters()
    return {"steps": steps, "replays": replayed, "eager_steps": eager_steps, "max_abs_diff": worst,
            "same_argmax": f"{same}/{total}", "sync_errors": sync_errors, "static_off": runner.static_off}


def hf_static_generate(loaded: Any, jobs: list[Any], rows: int, max_tokens: int, pad: int,
                       cuda: bool) -> dict[str, Any]:
    """transformers' static-cache compiled ``generate`` over the same prompts in batches of ``rows``
    (left-padded to one length, so one compiled shape serves every batch; the last batch filled with
    repeats, not counted): free text, and each row under its own constraint through our processor."""
    from cdsl_struct.integrations.transformers_processor import constrained

    model, eos = loaded.model, set(loaded.eos_token_ids)
    ours = model.config._attn_implementation
    model.set_attn_implementation("sdpa")  # as loaded: our runners switched it to theirs
    try:
        return _hf_static_runs(loaded, jobs, rows, max_tokens, pad, cuda, constrained, eos)
    finally:
        model.set_attn_implementation(ours)


def _hf_static_runs(loaded: Any, jobs: list[Any], rows: int, max_tokens: int, pad: int, cuda: bool,
                    constrained: Any, eos: set[int]) -> dict[str, Any]:
    model = loaded.model
    width = max(len(prompt) for _, prompt, _ in jobs)
    batches = [jobs[i:i + rows] for i in range(0, len(jobs), rows)]

    def inputs(batch: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        filled = batch + [batch[0]] * (rows - len(batch))
        ids = torch.full((rows, width), pad, dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for i, (_, prompt, _) in enumerate(filled):
            ids[i, width - len(prompt):] = torch.tensor(prompt)
            mask[i, width - len(prompt):] = 1
        return ids.to(loaded.device), mask.to(loaded.device)

    def generate(batch: list[Any], processor: bool) -> tuple[float, torch.Tensor]:
        ids, mask = inputs(batch)
        kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": False, "pad_token_id": pad,
                                  "eos_token_id": sorted(eos), "attention_mask": mask,
                                  "cache_implementation": "static"}
        if processor:
            specs = [spec for _, _, spec in batch] + [batch[0][2]] * (rows - len(batch))
            kwargs.update(constrained(specs))
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, out[:, width:]

    result: dict[str, Any] = {"rows": rows, "prompt_width": width}
    warm_start = time.perf_counter()
    generate(batches[0], False)  # compiles, at the very shape timed
    generate(batches[0], False)
    result["warm_up_s"] = round(time.perf_counter() - warm_start, 1)
    for processor in (False, True):
        wall, tokens, valid = 0.0, 0, 0
        for batch in batches:
            seconds, new = generate(batch, processor)
            wall += seconds
            for (item, _, _), row in zip(batch, new.tolist(), strict=False):
                end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
                tokens += end
                if processor:
                    text = loaded.tokenizer.decode([t for t in row[:end] if t not in eos], skip_special_tokens=True)
                    valid += row[end - 1] in eos and item.valid(text)
        name = "with_our_processor" if processor else "free"
        result[name] = {"tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 1),
                        "step_ms": round(1000 * wall / (len(batches) * max_tokens), 2),
                        **({"valid": valid} if processor else {})}
    return result


def _ratios(summary: dict[str, Any]) -> dict[str, Any]:
    engine = summary["engine"]
    rate = lambda name: engine.get(name, {}).get("tokens_per_s") or 0.0  # noqa: E731
    per_token = lambda name: 1 / rate(name) if rate(name) else None  # noqa: E731
    ratios: dict[str, Any] = {
        "json_served_time_per_token_vs_free": round(per_token("json_served") / per_token("json_free"), 3)
        if rate("json_served") and rate("json_free") else None,
        "lookup_vs_target_only_one_row": round(rate("one_row_lookup_all") / rate("one_row_no_drafts"), 3)
        if rate("one_row_no_drafts") else None,
        "lookup_vs_target_only_rows": round(rate("mix_lookup_all") / rate("mix_no_drafts"), 3)
        if rate("mix_no_drafts") else None,
        "graph_vs_ragged_same_requests": round(rate("graph_mix_served_same") / rate("ragged_mix_served"), 2)
        if rate("ragged_mix_served") else None,
        "free_text_table_vs_llguidance": round(rate("mix_free") / rate("mix_free_llguidance"), 3)
        if rate("mix_free_llguidance") else None}
    for name in ("mix_free", "mix_no_drafts", "one_row_free"):  # steps launched ahead vs each in turn
        if rate(f"{name}_in_turn"):
            ratios[f"{name}_ahead_vs_in_turn"] = round(rate(name) / rate(f"{name}_in_turn"), 3)
    hf = summary.get("hf_static")
    if hf:
        ratios["our_free_vs_hf_static_free"] = round(rate("mix_free") / hf["free"]["tokens_per_s"], 3)
        ratios["our_served_vs_hf_static_with_processor"] = round(
            rate("mix_served") / hf["with_our_processor"]["tokens_per_s"], 3)
    return ratios


def _table(summary: dict[str, Any]) -> str:
    lines = [f"start: {summary['start']}"]
    if "replay_check" in summary:
        lines.append(f"replay check: {summary['replay_check']}")
    lines += ["| run | requests | tokens | tok/s | steps | ms/step | rows/step | replays | eager | ahead | valid |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, run in summary["engine"].items():
        lines.append(f"| {name} | {run['requests']} | {run['tokens']} | {run['tokens_per_s']} | {run['steps']} | "
                     f"{run['step_ms']} | {run['mean_rows']} | {run['replays']} | {run['eager_steps']} | "
                     f"{run.get('ahead_steps', '-')} | {run.get('valid', '-')} |")
    if "hf_static" in summary:
        lines.append(f"transformers static compiled generate: {summary['hf_static']}")
    lines.append(f"ratios: {summary['ratios']}")
    return "\n".join(lines)
