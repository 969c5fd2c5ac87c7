"""``cdsl-struct bench overhead``: the engine's host time per step, by phase, with a model that costs
almost nothing.

What a GPU user's step costs beyond the forward is host work: scheduling, proposing, masks,
choosing tokens, committing, streaming. On a GPU that work either hides behind the forward or
keeps the card waiting; to see it apart from any model, this bench runs the engine with a
1-layer, 64-wide Llama that keeps a real tokenizer's whole vocabulary (SmolLM2's 49,152 tokens
by default: the LM head, the masks and the argmax are full size), JSON requests that all arrive
at once (draft off), ``rows`` of them at a time. Per step (after the step that prefills them):
wall time, the forward's time, host time (wall minus forward) and each phase
(``decoding.engine.PHASES``); and, from a separate shorter run, host reads of device tensors
per step (``HostReads``). ``neighbour`` repeats each size beside a process that keeps one core
busy, as a noisy co-tenant would.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..constraints import JsonSchema, compile
from ..decoding import PHASES, BatchEngine, Request
from ..models import batch_runner, load_tokenizer, model_device, resolve_device
from ..prompts import prompt_ids
from . import write_report
from .host_reads import HostReads
from .serving import PERSON_SCHEMA, prompts


@dataclass(frozen=True)
class OverheadConfig:
    """What ``run_overhead_bench`` measures."""

    rows: tuple[int, ...] = (1, 16, 64, 256)
    max_tokens: int = 32
    tokenizer: str = "smollm2"
    threads: int | None = 1
    """torch threads during the runs (None: leave torch's setting)."""
    mask_workers: int = 2
    neighbour: bool = False
    """Also run each size beside a process spinning on one core."""
    read_steps: int = 6
    """Steps of the separate run that counts host reads."""
    device: str = "cpu"
    """Where the model runs. Off the CPU the forward is asynchronous: its phase times the launch,
    and wall per step is the figure to read."""


def near_zero_model(vocab_size: int, seed: int = 0) -> Any:
    """A 1-layer, 64-wide random Llama over ``vocab_size`` tokens: its forward costs little beside
    the full-vocabulary LM head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=1024)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    return model


def run_overhead_bench(config: OverheadConfig) -> dict[str, Any]:
    """Every size in ``config.rows`` (and beside a busy neighbour if asked); a report dict."""
    tokenizer = load_tokenizer(config.tokenizer)
    model = near_zero_model(len(tokenizer)).to(resolve_device(config.device))
    compiled = compile(JsonSchema(PERSON_SCHEMA), tokenizer, eos_token_ids=[tokenizer.eos_token_id])
    before = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        machine = {**machine_info(), "device": _device_name(model)}  # with the bench's thread count
        _measure(model, tokenizer, compiled, 2, config)  # warm-up, untimed
        sizes = []
        for rows in config.rows:
            entry = {"rows": rows, **_measure(model, tokenizer, compiled, rows, config),
                     "host_reads_per_step": _reads_per_step(model, tokenizer, compiled, rows, config)}
            if config.neighbour:
                with _BusyNeighbour():
                    beside = _measure(model, tokenizer, compiled, rows, config)
                entry["with_neighbour"] = beside
                entry["neighbour_cost"] = round(beside["host_ms"] / entry["host_ms"], 3) if entry["host_ms"] else None
            sizes.append(entry)
    finally:
        torch.set_num_threads(before)
    summary = {"host_ms": {entry["rows"]: entry["host_ms"] for entry in sizes},
               "wall_ms": {entry["rows"]: entry["wall_ms"] for entry in sizes},
               "host_reads_per_step": max(entry["host_reads_per_step"] for entry in sizes)}
    return {"config": asdict(config), "machine": machine, "sizes": sizes, "summary": summary}


def _requests(tokenizer: Any, compiled: Any, rows: int, max_tokens: int) -> list[Request]:
    return [Request(tuple(prompt_ids(tokenizer, text)), compiled, max_tokens=max_tokens, loop_guard=True,
                    string_guard=True) for text in prompts(rows)]


def _measure(model: Any, tokenizer: Any, compiled: Any, rows: int, config: OverheadConfig) -> dict[str, Any]:
    """One run of ``rows`` requests at once: per-step figures over the steps after the first."""
    engine = BatchEngine(batch_runner(model, pad_token_id=0), max_batch_size=rows, kv_budget_bytes=float("inf"),
                         mask_workers=config.mask_workers)
    try:
        running = [engine.submit(r) for r in _requests(tokenizer, compiled, rows, config.max_tokens)]
        engine.step()  # admits and prefills every row
        stats = engine.stats
        phases, steps, rows_stepped = dict(stats.phase_seconds), stats.steps, stats.rows_stepped
        started = time.perf_counter()
        while not all(row.done for row in running):
            engine.step()
        wall = time.perf_counter() - started
        failed = next((row.error for row in running if row.error is not None), None)
        if failed is not None:
            raise RuntimeError(f"a row of the {rows}-row run failed: {failed!r}") from failed
        count = stats.steps - steps
        spent = {name: stats.phase_seconds[name] - phases[name] for name in PHASES}
    finally:
        engine.close()
    per_step = {name: round(1000 * seconds / max(count, 1), 3) for name, seconds in spent.items()}
    wall_ms = 1000 * wall / max(count, 1)
    return {"steps": count, "mean_rows": round((stats.rows_stepped - rows_stepped) / max(count, 1), 2),
            "wall_ms": round(wall_ms, 3), "forward_ms": per_step["forward"],
            "host_ms": round(wall_ms - per_step["forward"], 3), "phases_ms": per_step}


def _reads_per_step(model: Any, tokenizer: Any, compiled: Any, rows: int, config: OverheadConfig) -> float:
    """Host reads of device tensors per step, the most of any step in a short counted run."""
    engine = BatchEngine(batch_runner(model, pad_token_id=0), max_batch_size=rows, kv_budget_bytes=float("inf"),
                         mask_workers=config.mask_workers)
    try:
        running = [engine.submit(r) for r in _requests(tokenizer, compiled, rows, config.read_steps)]
        most = 0
        with HostReads() as reads:
            reads.follow(engine.runner)
            while not all(row.done for row in running):
                before = reads.count
                engine.step()
                most = max(most, reads.count - before)
        return most
    finally:
        engine.close()


class _BusyNeighbour:
    """A process spinning on one core for the length of a ``with`` block."""

    def __enter__(self) -> None:
        self.process = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
        self.process.start()
        time.sleep(0.5)  # let it get going

    def __exit__(self, *exc: Any) -> None:
        self.process.terminate()
        self.process.join()


def _spin() -> None:
    while True:
        pass


def machine_info() -> dict[str, Any]:
    """This machine for a report: CPU count and architecture, its AVX/AMX flags, torch and its threads,
    and the GPUs torch sees (their names; none where CUDA is absent)."""
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            line = next(line for line in cpuinfo if line.startswith("flags"))
        flags = sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx")))
    except (OSError, StopIteration):
        pass
    return {"cpu_count": os.cpu_count(), "machine": platform.machine(), "cpu_flags": flags,
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available() else []}


def _device_name(model: Any) -> str:
    device = model_device(model)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def format_table(report: dict[str, Any]) -> str:
    """The report as a table: a line per size, host time and its phases per step."""
    header = f"{'rows':>5} {'steps':>5} {'wall':>8} {'forward':>8} {'host':>8}  " + " ".join(
        f"{name:>8}" for name in PHASES if name != "forward") + "  reads  neighbour"
    lines = [header]
    for entry in report["sizes"]:
        phases = " ".join(f"{entry['phases_ms'][name]:8.2f}" for name in PHASES if name != "forward")
        neighbour = f"{entry['neighbour_cost']:.2f}x" if entry.get("neighbour_cost") else "-"
        lines.append(f"{entry['rows']:>5} {entry['steps']:>5} {entry['wall_ms']:8.2f} {entry['forward_ms']:8.2f} "
                     f"{entry['host_ms']:8.2f}  {phases}  {entry['host_reads_per_step']:>5}  {neighbour}")
    lines.append(f"ms per step on {report['machine'].get('device', 'cpu')}; host = wall - forward; "
                 f"cpu flags: {' '.join(report['machine']['cpu_flags'])}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``cdsl-struct bench overhead``'s options."""
    parser.add_argument("--rows", default="1,16,64,256", help="comma-separated rows decoding at once")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--tokenizer", default="smollm2", help="whose vocabulary the model has (default smollm2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: leave torch's default)")
    parser.add_argument("--mask-workers", type=int, default=2, help="the engine's mask threads (default 2)")
    parser.add_argument("--neighbour", action="store_true",
                        help="also run each size beside a process busy on one core")
    parser.add_argument("--device", default="cpu", help="where the near-zero model runs: cpu, cuda, cuda:N or mps")
    parser.add_argument("--json", dest="json_out", help="write the report here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    config = OverheadConfig(rows=tuple(int(r) for r in args.rows.split(",") if r.strip()), max_tokens=args.max_tokens,
                            tokenizer=args.tokenizer, threads=args.threads or None, mask_workers=args.mask_workers,
                            neighbour=args.neighbour, device=args.device)
    report = run_overhead_bench(config)
    return write_report(report, format_table(report), args)
