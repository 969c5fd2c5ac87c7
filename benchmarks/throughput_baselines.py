"""``python -m benchmarks throughput``: ``cdsl-struct bench throughput`` with other libraries beside it.

On the same workload, prompts and model object, after the engine's runs: ``transformers``
``generate`` one request at a time with an outlines-core logits processor (the first
``hf_requests``), and the ``outlines`` package itself (extra ``outlines``): ``outlines.Generator(...).batch``
over all requests that share a constraint, one padded ``generate`` per constraint. Constraints
compile (and Outlines' generators are built and warmed up) before timing.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import torch

from cdsl_struct.bench import write_report
from cdsl_struct.bench.throughput import (
    Job,
    ThroughputConfig,
    ThroughputRun,
    WorkItem,
    config_from,
    format_table,
    run_throughput_bench,
    say,
)
from cdsl_struct.bench.throughput import add_arguments as add_engine_arguments
from cdsl_struct.models import resolve_device

from .speculative import OutlinesCoreLogitsProcessor, outlines_index


@dataclass
class BaselinesConfig(ThroughputConfig):
    """``ThroughputConfig`` and the baselines' own settings."""

    with_hf: bool = True
    hf_requests: int = 16
    with_hf_static: bool = False
    with_outlines: bool | None = None  # None: when the outlines package is installed


def hf_baseline(run: ThroughputRun) -> None:
    """``summary["hf"]``: ``model.generate`` over the first ``hf_requests``, and each batch size's speedup on it."""
    config = run.config
    if not getattr(config, "with_hf", True):
        return
    jobs = run.jobs[:min(getattr(config, "hf_requests", 16), len(run.jobs))]
    hf = _hf_baseline(run.loaded, jobs, config, run.rows, run.pad)
    run.summary["hf"] = hf
    for entry in run.summary["batches"]:
        rate = hf["tokens_per_s"]
        entry["speedup_vs_hf"] = round(entry["tokens_per_s"] / rate, 3) if rate else None
    say(run.progress, f"HF generate: {hf['tokens_per_s']:.1f} tok/s")


def hf_static_baseline(run: ThroughputRun) -> None:
    """``summary["hf_static"]``: transformers' static-cache compiled ``generate`` over every request
    in batches of the largest B (free text, and each row under its own constraint through our
    processor), with our free text and our mix as served at that B against it (``--hf-static``;
    on by default on a CUDA device)."""
    if not getattr(run.config, "with_hf_static", False):
        return
    from .graph_bench import hf_static_generate

    largest = run.summary["batches"][-1]
    jobs = [(job.item, job.prompt, job.compiled) for job in run.jobs]
    hf = hf_static_generate(run.loaded, jobs, largest["batch"], run.config.max_tokens, run.pad,
                            run.loaded.device.type == "cuda")
    free = run.summary.get("unconstrained", {}).get("tokens_per_s")
    hf["ours_served_vs_with_processor"] = round(largest["tokens_per_s"] / hf["with_our_processor"]["tokens_per_s"], 3)
    hf["ours_free_vs_free"] = round(free / hf["free"]["tokens_per_s"], 3) if free else None
    run.summary["hf_static"] = hf
    say(run.progress, f"HF static compiled generate: free {hf['free']['tokens_per_s']:.1f} tok/s, with our "
                      f"processor {hf['with_our_processor']['tokens_per_s']:.1f} tok/s")


def outlines_baseline(run: ThroughputRun) -> None:
    """``summary["outlines"]``: the outlines package against the largest batch size, where installed."""
    outlines = _outlines_baseline(run.loaded, run.items, run.config, run.rows)
    if outlines is None:
        return
    run.summary["outlines"] = outlines
    largest = run.summary["batches"][-1]
    rate = outlines["tokens_per_s"]
    outlines["our_tokens_per_s"] = largest["tokens_per_s"]
    outlines["our_batch"] = largest["batch"]
    outlines["speedup_ours_vs_outlines"] = round(largest["tokens_per_s"] / rate, 3) if rate else None
    say(run.progress, f"outlines batch: {rate:.1f} tok/s")


def _hf_baseline(loaded: Any, jobs: list[Job], config: ThroughputConfig, rows: list[dict[str, Any]],
                 pad: int) -> dict[str, Any]:
    """``model.generate`` one request at a time, greedy, outlines-core processor where it compiles
    the constraint (free text runs unconstrained)."""
    from transformers import LogitsProcessorList

    model, eos = loaded.model, set(loaded.eos_token_ids)
    indexes: dict[str, Any] = {}
    for job in jobs:  # outlines-core indexes, built before timing
        key = job.compiled.spec.key
        if job.item.kind != "free" and key not in indexes:
            indexes[key] = outlines_index(job.compiled.spec, job.compiled)
    total_wall, tokens, valid, processed, failed = 0.0, 0, 0, 0, []
    for job in jobs:
        index = indexes.get(job.compiled.spec.key) if job.item.kind != "free" else None
        ids = torch.tensor([job.prompt], device=loaded.device)
        # every EOS of ours stops it too (a model's generation config may name only one)
        kwargs: dict[str, Any] = {"max_new_tokens": config.max_tokens, "do_sample": False, "pad_token_id": pad,
                                  "eos_token_id": sorted(eos), "attention_mask": torch.ones_like(ids)}
        if index is not None:
            processed += 1
            kwargs["logits_processor"] = LogitsProcessorList(
                [OutlinesCoreLogitsProcessor(index, job.compiled.vocab_size, len(job.prompt))])
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                out = model.generate(ids, **kwargs)
        except ValueError as exc:  # the outlines-core guide refused the token generate chose
            failed.append({"request": job.item.index, "error": str(exc)})
            rows[job.item.index]["runs"]["hf"] = {"error": str(exc)}
            continue
        wall = time.perf_counter() - start
        new = out[0, len(job.prompt):].tolist()
        stopped = bool(new) and new[-1] in eos
        text = loaded.tokenizer.decode([t for t in new if t not in eos], skip_special_tokens=True)
        ok = stopped and job.item.valid(text)
        total_wall, tokens, valid = total_wall + wall, tokens + len(new), valid + ok
        rows[job.item.index]["runs"]["hf"] = {"tokens": len(new), "stopped": stopped, "valid": ok, "text": text,
                                              "wall_s": round(wall, 4), "outlines_processor": index is not None}
    return {"requests": len(jobs), "of": config.requests, "with_outlines_processor": processed,
            "failed": failed, "wall_s": round(total_wall, 3), "tokens": tokens,
            "tokens_per_s": round(tokens / total_wall, 2) if total_wall else 0.0, "valid": valid}


def _outlines_baseline(loaded: Any, items: list[WorkItem], config: ThroughputConfig,
                       rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The outlines package: one ``Generator.batch`` per distinct constraint over its requests
    (free text: no output type). Greedy, ``max_tokens`` each; validity checked like ours."""
    with_outlines = getattr(config, "with_outlines", None)
    if with_outlines is False:
        return None
    try:
        from .outlines_baseline import OutlinesBaseline, chat_text

        baseline = OutlinesBaseline(loaded.model, loaded.tokenizer)
    except ImportError:
        if with_outlines:
            raise
        return None
    groups: dict[str, list[WorkItem]] = {}
    for item in items:
        groups.setdefault("free" if item.kind == "free" else item.spec.key, []).append(item)
    specs = {key: (None if group[0].kind == "free" else group[0].spec) for key, group in groups.items()}
    for spec in specs.values():
        baseline.prepare(spec)
    first = next(iter(specs.values()))
    baseline.warm_up(first, chat_text(loaded.tokenizer, items[0].prompt))
    wall, tokens, valid, ran, unsupported = 0.0, 0, 0, 0, {}
    for key, group in groups.items():
        out = baseline.generate_batch(specs[key], [chat_text(loaded.tokenizer, i.prompt) for i in group],
                                      config.max_tokens)
        if out is None:
            unsupported[group[0].family] = baseline.reason(specs[key])
            continue
        wall, tokens, ran = wall + out["wall_s"], tokens + out["tokens"], ran + len(group)
        for item, text in zip(group, out["texts"], strict=True):
            ok = item.valid(text)
            valid += ok
            rows[item.index]["runs"]["outlines"] = {"text": text, "valid": ok}
    return {"requests": ran, "of": len(items), "batches": len(groups) - len(unsupported), "wall_s": round(wall, 3),
            "tokens": tokens, "tokens_per_s": round(tokens / wall, 2) if wall else 0.0, "valid": valid,
            "unsupported": unsupported}


def format_baselines(report: dict[str, Any]) -> str:
    """``cdsl-struct bench throughput``'s table, then the HF and outlines lines."""
    summary = report["summary"]
    lines = [format_table(report)]
    if "hf" in summary:
        hf = summary["hf"]
        lines.append(f"HF generate, one at a time, first {hf['requests']} of {hf['of']} requests "
                     f"({hf['with_outlines_processor']} with the outlines-core processor, the rest unconstrained): "
                     f"{hf['tokens_per_s']:.1f} tok/s, {hf['tokens']} tokens in {hf['wall_s']:.2f} s, "
                     f"valid {hf['valid']}/{hf['requests']}")
    if "hf_static" in summary:
        h = summary["hf_static"]
        lines.append(f"transformers' static-cache compiled generate at {h['rows']} rows: free text "
                     f"{h['free']['tokens_per_s']:.1f} tok/s (ours {h['ours_free_vs_free']}x), with our processor "
                     f"{h['with_our_processor']['tokens_per_s']:.1f} tok/s (ours as served "
                     f"{h['ours_served_vs_with_processor']}x)")
    if "outlines" in summary:
        o = summary["outlines"]
        missing = "; ".join(f"{k}: {v}" for k, v in o["unsupported"].items()) or "none"
        lines.append(f"outlines package, Generator.batch per constraint ({o['batches']} batches, {o['requests']} of "
                     f"{o['of']} requests): {o['tokens_per_s']:.1f} tok/s, {o['tokens']} tokens in "
                     f"{o['wall_s']:.2f} s, "
                     f"valid {o['valid']}/{o['requests']}; ours at B={o['our_batch']}: {o['our_tokens_per_s']:.1f} "
                     f"tok/s ({o['speedup_ours_vs_outlines']}x); cannot express: {missing}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``cdsl-struct bench throughput``'s options and the HF baseline's."""
    add_engine_arguments(parser)
    parser.add_argument("--hf-requests", type=int, default=16, help="HF baseline over the first N requests")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers generate baseline")
    parser.add_argument("--hf-static", action=argparse.BooleanOptionalAction, default=None,
                        help="transformers' static-cache compiled generate over every request at the largest B "
                             "(default: on a CUDA device)")


def run(args: argparse.Namespace) -> int:
    """The engine's sweep, then the baselines; print the table, write the report."""
    hf_static = args.hf_static if args.hf_static is not None else resolve_device(args.device).type == "cuda"
    config = BaselinesConfig(**vars(config_from(args)), with_hf=not args.no_hf, hf_requests=args.hf_requests,
                             with_hf_static=hf_static)
    report = run_throughput_bench(config, progress=not args.no_progress,
                                  baselines=(hf_baseline, hf_static_baseline, outlines_baseline))
    return write_report(report, format_baselines(report), args)
