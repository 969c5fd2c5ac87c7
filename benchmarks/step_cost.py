"""``python -m benchmarks steps``: what one forward pass costs, the numbers the engine's choices rest on.

Two measurements, rounds interleaved, the best of each kept (the machine is shared):

- single-row decode step variants: eager float32 and bfloat16 with HF's dynamic cache, each with
  stock linear layers and (on the CPU) prepacked oneDNN weights (``models.packed``, what
  ``load_model`` gives), a static KV cache, and optionally ``torch.compile`` of the static-cache
  step;
- the batched step grid: rows B x fed positions per row T through the engine's runner
  (``batch_runner``: ragged where the model supports it) at the default dtype, as the engine
  loads it (the cost model behind ``StepWidth``: a pass costs about ``a + b * B * T``), and the
  prefill cost per position; with ``torch_compile`` the same grid again through a compiled
  runner (``models.compiled``, compiled and warmed once before), cell by cell beside the eager one.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from cdsl_struct.bench import write_report
from cdsl_struct.models import Feed, batch_runner, load_model


@dataclass
class StepCostConfig:
    """What to measure."""

    model: str = "smollm2"
    device: str = "auto"
    context: int = 120
    steps: int = 20
    rounds: int = 2
    rows: tuple[int, ...] = (1, 4, 8, 16, 32)
    widths: tuple[int, ...] = (1, 2, 4, 8)
    compile: bool = False
    torch_compile: bool = False


@torch.inference_mode()
def _single_row(model: Any, context: list[int], steps: int, static: Any = None) -> float:
    """Mean milliseconds of a one-token decode step after ``context``."""
    from transformers import StaticCache

    device = next(model.parameters()).device
    if static is None:
        cache = model(input_ids=torch.tensor([context], device=device)).past_key_values
    else:
        cache = StaticCache(config=model.config, max_cache_len=len(context) + steps + 1)
        model(input_ids=torch.tensor([context], device=device), past_key_values=cache,
              cache_position=torch.arange(len(context), device=device))
    started = time.perf_counter()
    for i in range(steps):
        ids = torch.tensor([[context[i % len(context)]]], device=device)
        if static is None:
            cache = model(input_ids=ids, past_key_values=cache, logits_to_keep=1).past_key_values
        else:
            static(input_ids=ids, past_key_values=cache, logits_to_keep=1,
                   cache_position=torch.tensor([len(context) + i], device=device))
    return (time.perf_counter() - started) / steps * 1000


def _grid_cell(model: Any, rows: int, width: int, context: int, rng: random.Random,
               compiled: Any = None) -> tuple[float, float]:
    """(ms of a step feeding ``width`` positions to each of ``rows`` rows, ms per prefilled position);
    ``compiled``: a warmed ``CompiledForward`` of ``model`` the runner steps through."""
    runner = batch_runner(model, prefix_cache_bytes=0)
    runner.compiled = compiled
    sequences = {i: [rng.randrange(100, 40000) for _ in range(context)] for i in range(rows)}
    started = time.perf_counter()
    runner.run([Feed(i, s, 1) for i, s in sequences.items()])
    prefill = (time.perf_counter() - started) / (rows * context) * 1000
    best = float("inf")
    for _ in range(3):
        feeds = []
        for i in range(rows):
            sequences[i] = sequences[i] + [rng.randrange(100, 40000) for _ in range(width)]
            feeds.append(Feed(i, sequences[i], width))
        started = time.perf_counter()
        runner.run(feeds)
        best = min(best, time.perf_counter() - started)
        for i in range(rows):  # the speculation is rejected but its first token, as in decoding
            sequences[i] = sequences[i][:len(sequences[i]) - width + 1]
    return best * 1000, prefill


def run_step_cost(config: StepCostConfig) -> dict[str, Any]:
    """Both measurements; a summary of the best round of each."""
    loaded = load_model(config.model, device=config.device)  # the default dtype, as the engine loads it
    model = loaded.model
    context = list(range(100, 100 + config.context))
    variants: dict[str, Any] = {}
    for dtype in ("float32", "bfloat16"):
        for pack in (False, True) if loaded.device.type == "cpu" else (False,):
            variant = load_model(config.model, device=config.device, dtype=dtype, pack=pack).model
            name = f"eager {dtype}" + (", packed linears" if pack else "")
            variants[name] = lambda m=variant: _single_row(m, context, config.steps)
    stock = load_model(config.model, device=config.device, dtype="float32", pack=False).model
    variants["static cache float32"] = lambda: _single_row(stock, context, config.steps, static=stock)
    if config.compile:
        compiled = torch.compile(stock.forward, dynamic=False)
        _single_row(stock, context, 2, static=compiled)  # compiles
        variants["static cache float32, torch.compile"] = lambda: _single_row(stock, context, config.steps,
                                                                               static=compiled)
    single: dict[str, float] = {}
    for _ in range(config.rounds):
        for name, measure in variants.items():
            single[name] = round(min(single.get(name, float("inf")), measure()), 1)
    compiled = None
    warm_seconds = None
    if config.torch_compile:
        warmer = batch_runner(model, prefix_cache_bytes=0)
        warm_seconds = round(warmer.compile(), 1)
        compiled = warmer.compiled
    grids: dict[str, dict[str, float]] = {"eager": {}, "compiled": {}} if compiled is not None else {"eager": {}}
    prefills: dict[str, dict[str, float]] = {name: {} for name in grids}
    for rows in config.rows:
        for width in config.widths:
            for name in grids:
                step, per_position = _grid_cell(model, rows, width, config.context, random.Random(rows * 100 + width),
                                                compiled if name == "compiled" else None)
                grids[name][f"{rows}x{width}"] = round(step, 1)
                prefills[name][str(rows)] = round(min(prefills[name].get(str(rows), float("inf")), per_position), 2)
    machine = {"threads": torch.get_num_threads(), "torch": torch.__version__, "device": str(loaded.device),
               "grid dtype": str(next(model.parameters()).dtype)}
    summary = {"single_row_step_ms": single, "batched_step_ms": grids["eager"],
               "prefill_ms_per_position": prefills["eager"], "machine": machine}
    if compiled is not None:
        summary.update(compiled_step_ms=grids["compiled"], compiled_prefill_ms_per_position=prefills["compiled"],
                       compile_seconds=warm_seconds, compiled_active=compiled.active)
    return {"config": asdict(config), "summary": summary}


def format_table(report: dict[str, Any]) -> str:
    """The single-row variants, then the B x T grid."""
    summary, config = report["summary"], report["config"]
    lines = ["| single-row decode step | ms |", "|---|---:|"]
    lines += [f"| {name} | {ms} |" for name, ms in summary["single_row_step_ms"].items()]
    grids = [("", "batched_step_ms", "prefill_ms_per_position")]
    if "compiled_step_ms" in summary:
        grids.append((f"torch.compile'd (compiled and warmed in {summary['compile_seconds']} s; "
                      f"still compiled at the end: {summary['compiled_active']}) ",
                      "compiled_step_ms", "compiled_prefill_ms_per_position"))
    for title, steps, prefill in grids:
        lines += ["", f"{title}grid at {summary['machine'].get('grid dtype', 'the default dtype')}:",
                  "", "| rows / positions per row | " + " | ".join(str(w) for w in config["widths"])
                  + " | prefill ms / position |", "|---:|" + "---:|" * (len(config["widths"]) + 1)]
        for rows in config["rows"]:
            cells = [str(summary[steps][f"{rows}x{w}"]) for w in config["widths"]]
            lines.append(f"| {rows} | " + " | ".join(cells) + f" | {summary[prefill][str(rows)]} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks steps``'s options."""
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=20, help="decode steps per single-row measurement")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (best kept)")
    parser.add_argument("--compile", action="store_true", help="also torch.compile the static-cache step (slow)")
    parser.add_argument("--torch-compile", action="store_true",
                        help="the grid again through the engine's compiled runner (models.compiled; minutes)")
    parser.add_argument("--json", dest="json_out", help="write the measurements here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    report = run_step_cost(StepCostConfig(model=args.model, device=args.device, steps=args.steps,
                                          rounds=args.rounds, compile=args.compile,
                                          torch_compile=args.torch_compile))
    return write_report(report, format_table(report), args)
