"""``python -m benchmarks speculative``: constrained speculative decoding against its baselines.

For every task, interleaved in one process: (a) our ``target`` decoder, (b) our speculative
decoder with the chosen draft (both one request at a time through the batched engine on the
runner ``Generator`` and ``serve`` use, ``BatchEngine(batch_runner(...))``, with no prefix cache
so that (b) computes the prompt it shares with (a) as (a) did), (c) what users do today,
``transformers`` ``generate()`` with an outlines-core logits processor for the same constraint,
(d) HF assisted generation with a bf16 self-draft, unconstrained (reference only), and (e) the
``outlines`` package itself (``outlines.from_transformers`` + ``outlines.Generator`` with the same
constraint as an output type, on the same model object and prompt), when the extra ``outlines`` is
installed. Every output's validity is checked independently of the engines. Constraints are
compiled (and Outlines' generators built and warmed up) before timing starts.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cdsl_struct.bench import write_report
from cdsl_struct.bench.maskbench import read_jsonl
from cdsl_struct.constraints import Grammar, JsonSchema, Regex, allocate_bitmask, apply_bitmask, compile
from cdsl_struct.decoding import BatchEngine, Request, build_proposers
from cdsl_struct.models import batch_runner, cpu_has_native_bf16, load_model, model_device, self_draft
from cdsl_struct.options import DEFAULT_WHITESPACE

DEFAULT_TASKS: list[dict[str, Any]] = [
    {"prompt": "Extract the person as JSON with keys name, age, city.\n\n"
               "Maria Gonzalez, 34, works as a software engineer in Madrid.",
     "schema": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                  "city": {"type": "string"}},
                "required": ["name", "age", "city"], "additionalProperties": False}},
    {"prompt": "Extract the order as JSON with keys order_id, customer, total.\n\n"
               "Order A-1043 was placed by Jonathan Pryce for a total of 259.99 dollars.",
     "schema": {"type": "object", "properties": {"order_id": {"type": "string"}, "customer": {"type": "string"},
                                                  "total": {"type": "number"}},
                "required": ["order_id", "customer", "total"], "additionalProperties": False}},
    {"prompt": "Extract the event as JSON with keys title, date, location.\n\n"
               "The Annual Robotics Summit takes place on 2025-03-14 at the Berlin Congress Center.",
     "schema": {"type": "object", "properties": {"title": {"type": "string"}, "date": {"type": "string"},
                                                  "location": {"type": "string"}},
                "required": ["title", "date", "location"], "additionalProperties": False}},
    {"prompt": "Extract the book as JSON with keys title, author, year.\n\n"
               "Pride and Prejudice was written by Jane Austen and published in 1813.",
     "schema": {"type": "object", "properties": {"title": {"type": "string"}, "author": {"type": "string"},
                                                  "year": {"type": "integer"}},
                "required": ["title", "author", "year"], "additionalProperties": False}},
    {"prompt": "Extract the contact as JSON with keys name, email, phone.\n\n"
               "You can reach Priya Natarajan at priya.natarajan@example.org or on +44 20 7946 0958.",
     "schema": {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"},
                                                  "phone": {"type": "string"}},
                "required": ["name", "email", "phone"], "additionalProperties": False}},
    {"prompt": "Extract the product as JSON with keys product, brand, price, in_stock.\n\n"
               "The Aurora X2 headphones from SoundWave cost 149 dollars and are currently in stock.",
     "schema": {"type": "object", "properties": {"product": {"type": "string"}, "brand": {"type": "string"},
                                                  "price": {"type": "number"}, "in_stock": {"type": "boolean"}},
                "required": ["product", "brand", "price", "in_stock"], "additionalProperties": False}},
    {"prompt": "List the cities mentioned as JSON with key cities.\n\n"
               "Our tour visits Lisbon, Porto, Seville and Granada before ending in Valencia.",
     "schema": {"type": "object", "properties": {"cities": {"type": "array", "items": {"type": "string"},
                                                             "maxItems": 8}},
                "required": ["cities"], "additionalProperties": False}},
    {"prompt": "What is the phone number in this text? Answer with the number only.\n\n"
               "For support call 555-867-5309 between 9am and 5pm.",
     "regex": r"\d{3}-\d{3}-\d{4}"},
    {"prompt": "Write the date 14 March 2025 in ISO format (YYYY-MM-DD).", "regex": r"\d{4}-\d{2}-\d{2}"},
    {"prompt": "Write an arithmetic expression that computes the total cost of 3 items at 4.5 each "
               "plus 2 items at 7.",
     "grammar": "arithmetic"},
]


@dataclass
class SpeculativeConfig:
    draft: str = "lookup"
    k: int = 6
    max_tokens: int = 96
    repeat: int = 1
    model: str = "smollm2"
    with_hf: bool = True
    with_outlines: bool | None = None  # None: when the outlines package is installed
    device: str = "auto"
    dtype: str = "auto"


def load_tasks(path: str | Path | None) -> list[dict[str, Any]]:
    """Tasks from a JSON-lines file (``prompt`` + ``schema`` | ``regex`` | ``grammar``), or the defaults."""
    if path is None:
        return DEFAULT_TASKS
    tasks = list(read_jsonl(Path(path)))
    for number, task in enumerate(tasks):
        if "prompt" not in task or not any(key in task for key in ("schema", "regex", "grammar")):
            raise ValueError(f"task {number}: needs 'prompt' and one of 'schema', 'regex', 'grammar'")
    return tasks


def spec_of(task: dict[str, Any]) -> Any:
    if "schema" in task:
        return JsonSchema(task["schema"])
    if "regex" in task:
        return Regex(task["regex"])
    return Grammar(task["grammar"])


class OutlinesCoreLogitsProcessor:
    """A ``transformers`` logits processor driving an outlines-core ``Guide``, as Outlines does."""

    def __init__(self, index: Any, vocab_size: int, prompt_length: int) -> None:
        import outlines_core

        self.guide = outlines_core.Guide(index)
        self.mask = allocate_bitmask(vocab_size)
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.prompt_length:
            token = int(input_ids[0, -1])
            if not self.guide.is_finished() or token in self.guide.get_tokens():
                self.guide.advance(token, return_tokens=False)
        self.guide.write_mask_into(self.mask.data_ptr(), self.mask.numel(), 4)
        return apply_bitmask(scores, self.mask)


def hf_assistant_kind(model: Any) -> str:
    """The self-draft transformers' assisted generation gets as its assistant: the target's weights
    in bfloat16 where bfloat16 is native (a GPU, a CPU with AVX-512 BF16 or AMX), else in int8,
    the self-draft CDSL uses on a CPU (a converted bfloat16 one prefills at several times float32's
    cost there, and its reorder crashed the bench on AVX2-only CPUs before ``models.packed`` knew)."""
    if model_device(model).type != "cpu" or cpu_has_native_bf16():
        return "bf16"
    return "int8"


def run_speculative_bench(tasks: list[dict[str, Any]], config: SpeculativeConfig,
                          progress: bool = True) -> dict[str, Any]:
    """Run (a)-(d) for every task, interleaved; return ``{"runs": [...], "summary": {...}}``."""
    import tqdm

    loaded = load_model(config.model, device=config.device, dtype=config.dtype)
    tokenizer, model = loaded.tokenizer, loaded.model
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else loaded.eos_token_ids[0]
    engine = BatchEngine(batch_runner(model, pad_token_id=pad, prefix_cache_bytes=0))
    proposers = build_proposers(config.draft, model, target_tokenizer=tokenizer)
    assistant = self_draft(model, hf_assistant_kind(model)) if config.with_hf else None
    prepared = []
    for task in tasks:
        spec = spec_of(task)
        compiled = compile(spec, tokenizer, eos_token_ids=loaded.eos_token_ids)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": task["prompt"]}],
                                               add_generation_prompt=True, tokenize=True)["input_ids"]
        index = outlines_index(spec, compiled) if config.with_hf else None
        prepared.append((task, compiled, prompt, index))
    vocab_size = prepared[0][1].vocab_size if prepared else 0
    outlines_baseline = _outlines_baseline(config, model, tokenizer, prepared)

    # a padded runner prefills a row in a pass of its own, a ragged one within its first step
    prefill_passes = 0 if getattr(engine.runner, "ragged", False) else 1
    threads = torch.get_num_threads()

    def ours(request: Request) -> tuple[Any, float]:
        """One request alone on the engine, timed; torch's thread count then back to what the
        baselines run with (the engine's ``ThreadGovernor`` may have cut it for its steps)."""
        timed = _timed(lambda: engine.run([request])[0])
        torch.set_num_threads(threads)
        return timed

    runs = []
    try:
        for round_number in tqdm.trange(config.repeat, disable=not progress, desc="rounds"):
            for number, (task, compiled, prompt, index) in enumerate(prepared):
                row: dict[str, Any] = {"task": number, "round": round_number, "kind": _kind(task)}
                plain = ours(Request(tuple(prompt), compiled, max_tokens=config.max_tokens))
                own = tuple(getattr(p, "fork", lambda p=p: p)() for p in proposers)  # per request, as Generator
                spec_result = ours(Request(tuple(prompt), compiled, max_tokens=config.max_tokens, proposers=own,
                                           k=config.k))
                row["target"] = _describe(*plain, prefill_passes)
                row["speculative"] = _describe(*spec_result, prefill_passes)
                row["identical"] = plain[0].tokens == spec_result[0].tokens
                for key, result in (("target", plain[0]), ("speculative", spec_result[0])):
                    row[key]["valid"] = result.finish_reason == "stop" and output_valid(task, result.text)
                if outlines_baseline is not None:
                    row["outlines"] = _outlines_run(outlines_baseline, task, compiled.spec, tokenizer,
                                                    config.max_tokens)
                    if row["outlines"] is not None:
                        row["outlines"]["identical_text"] = row["outlines"]["text"] == plain[0].text
                if config.with_hf:
                    row["hf_outlines"] = _hf_generate(model, tokenizer, prompt, config.max_tokens, index, None,
                                                      vocab_size)
                    row["hf_assisted"] = _hf_generate(model, tokenizer, prompt, config.max_tokens, None, assistant,
                                                      vocab_size)
                runs.append(row)
    finally:
        engine.close()
    summary = summarise(runs, config)
    if config.with_hf:
        summary["hf_assistant"] = hf_assistant_kind(model)
    return {"runs": runs, "summary": summary}


def summarise(runs: list[dict[str, Any]], config: SpeculativeConfig) -> dict[str, Any]:
    """Ratios over all runs, and the speedup bound that the measured model costs allow."""
    def total(key: str, field: str) -> float:
        return sum(r[key][field] for r in runs if r.get(key) and r[key].get(field) is not None)

    target_s, spec_s = total("target", "wall_s"), total("speculative", "wall_s")
    tokens_a, tokens_b = total("target", "tokens"), total("speculative", "tokens")
    # Bound from measured step costs: the speculative run's own target and draft forward time,
    # plus the non-model time per target pass that the target-only run shows, times its passes.
    overhead_per_pass = (target_s - total("target", "target_s")) / max(total("target", "decode_passes"), 1)
    modelled = (total("speculative", "target_s") + total("speculative", "draft_s")
                + overhead_per_pass * total("speculative", "decode_passes"))
    bound = target_s / max(modelled, 1e-9)
    speedup = target_s / spec_s if spec_s else 0.0
    outlines_part = _outlines_summary(runs)
    hf_runs = [r for r in runs if r.get("hf_outlines")]
    hf_outlines_s = sum(r["hf_outlines"]["wall_s"] for r in hf_runs)
    spec_on_hf = sum(r["speculative"]["wall_s"] for r in hf_runs)
    return {
        "draft": config.draft,
        "k": config.k,
        "identical": all(r["identical"] for r in runs),
        "identical_rate": round(sum(r["identical"] for r in runs) / len(runs), 4) if runs else None,
        "speedup_vs_target": round(speedup, 3),
        "speedup_vs_hf_outlines": round(hf_outlines_s / spec_on_hf, 3) if spec_on_hf else None,
        "speedup_bound": round(bound, 3),
        "speedup_over_bound": round(speedup / bound, 3) if bound else None,
        "acceptance_rate": round(total("speculative", "accepted") / max(total("speculative", "proposed"), 1), 4),
        "target_passes_per_token": {
            "target": round(total("target", "decode_passes") / max(tokens_a, 1), 4),
            "speculative": round(total("speculative", "decode_passes") / max(tokens_b, 1), 4),
        },
        "wall_s": {"target": round(target_s, 3), "speculative": round(spec_s, 3),
                   "hf_outlines": round(hf_outlines_s, 3) if hf_runs else None,
                   "hf_assisted": round(total("hf_assisted", "wall_s"), 3) if hf_runs else None},
        "valid": {key: sum(bool(r[key].get("valid")) for r in runs) for key in ("target", "speculative")},
        **outlines_part,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def output_valid(task: dict[str, Any], text: str) -> bool:
    """Whether ``text`` satisfies the task's constraint, checked without any constraint engine."""
    import jsonschema
    import lark

    if "schema" in task:
        try:
            jsonschema.validate(json.loads(text), task["schema"])
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    if "regex" in task:
        return re.fullmatch(task["regex"], text) is not None
    try:
        Grammar(task["grammar"]).parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


def _outlines_baseline(config: SpeculativeConfig, model: Any, tokenizer: Any, prepared: list[Any]) -> Any:
    """(e): the outlines package on the same model, generators built and warmed up; None if off or absent."""
    if config.with_outlines is False:
        return None
    try:
        from .outlines_baseline import OutlinesBaseline, chat_text
    except ImportError:
        return None
    try:
        baseline = OutlinesBaseline(model, tokenizer, whitespace=DEFAULT_WHITESPACE)  # the same JSON layout as ours
    except ImportError:
        if config.with_outlines:
            raise
        return None
    for _task, compiled, _prompt, _index in prepared:
        baseline.prepare(compiled.spec)
    if prepared:
        baseline.warm_up(prepared[0][1].spec, chat_text(tokenizer, prepared[0][0]["prompt"]))
    return baseline


def _outlines_run(baseline: Any, task: dict[str, Any], spec: Any, tokenizer: Any,
                  max_tokens: int) -> dict[str, Any] | None:
    from .outlines_baseline import chat_text

    run = baseline.generate(spec, chat_text(tokenizer, task["prompt"]), max_tokens)
    if run is None:
        return {"unsupported": baseline.reason(spec) or "cannot express"}
    run["valid"] = output_valid(task, run["text"])
    return run


def _outlines_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """(e) against (a) and (b) on the tasks Outlines could express; the ones it could not, by task."""
    done = [r for r in runs if r.get("outlines") and "wall_s" in r["outlines"]]
    if not any("outlines" in r for r in runs):
        return {}
    outlines_s = sum(r["outlines"]["wall_s"] for r in done)
    ours = {key: sum(r[key]["wall_s"] for r in done) for key in ("target", "speculative")}
    return {"outlines": {
        "tasks": len(done), "wall_s": round(outlines_s, 3),
        "tokens": sum(r["outlines"]["tokens"] for r in done),
        "valid": sum(bool(r["outlines"]["valid"]) for r in done),
        "our_valid_on_same": {k: sum(bool(r[k]["valid"]) for r in done) for k in ours},
        "our_wall_s_on_same": {k: round(v, 3) for k, v in ours.items()},
        "speedup_target_vs_outlines": round(outlines_s / ours["target"], 3) if ours["target"] else None,
        "speedup_speculative_vs_outlines": round(outlines_s / ours["speculative"], 3) if ours["speculative"] else None,
        "identical_text_to_target": sum(bool(r["outlines"].get("identical_text")) for r in done),
        "unsupported": {str(r["task"]): r["outlines"]["unsupported"] for r in runs
                        if r.get("outlines") and "unsupported" in r["outlines"]},
    }}


def _kind(task: dict[str, Any]) -> str:
    return "schema" if "schema" in task else ("regex" if "regex" in task else "grammar")


def _timed(work: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start


def _describe(result: Any, wall: float, prefill_passes: int = 1) -> dict[str, Any]:
    """A run's figures; ``prefill_passes``: target passes that only prefilled the prompt (a padded
    runner's first; none on a ragged runner, whose first step prefills and decodes at once)."""
    stats = result.stats
    return {
        "text": result.text, "finish_reason": result.finish_reason, "tokens": stats.tokens,
        "wall_s": round(wall, 4), "target_s": round(stats.target_seconds, 4), "draft_s": round(stats.draft_seconds, 4),
        "decode_passes": stats.target_passes - prefill_passes, "target_positions": stats.target_positions,
        "draft_passes": stats.draft_passes, "proposed": stats.proposed, "accepted": stats.accepted,
        "forced": stats.forced,
    }


def outlines_index(spec: Any, compiled: Any) -> Any:
    """outlines-core's own index for (c), or None where it cannot express the spec."""
    from cdsl_struct.constraints.backends import get_backend
    from cdsl_struct.errors import CompileError

    try:
        program = get_backend("outlines-core").compile(spec, compiled.vocabulary, compiled.whitespace)
    except CompileError:
        return None
    return program.index


def _hf_generate(model: Any, tokenizer: Any, prompt: list[int], max_tokens: int, index: Any,
                 assistant: Any, vocab_size: int) -> dict[str, Any] | None:
    if assistant is None and index is None:
        return None
    from transformers import LogitsProcessorList

    ids = torch.tensor([prompt], device=model_device(model))
    kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": False}
    if index is not None:
        kwargs["logits_processor"] = LogitsProcessorList([OutlinesCoreLogitsProcessor(index, vocab_size, len(prompt))])
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    wall = time.perf_counter() - start
    new = out[0, len(prompt):].tolist()
    return {"text": tokenizer.decode(new, skip_special_tokens=True), "tokens": len(new), "wall_s": round(wall, 4)}


def format_table(summary: dict[str, Any]) -> str:
    rows = [(key, json.dumps(value) if isinstance(value, dict) else value) for key, value in summary.items()]
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks speculative``'s options."""
    parser.add_argument("--draft", default="lookup",
                        help="draft source: lookup, bf16, layers:N, none, or a combination like lookup+bf16")
    parser.add_argument("--k", type=int, default=6, help="tokens proposed per step (default 6)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=1, help="rounds over all tasks (interleaved)")
    parser.add_argument("--prompts", help="JSON lines {prompt, schema|regex|grammar}; default: built-in tasks")
    parser.add_argument("--model", default="smollm2", help="target model (default: the embedded SmolLM2)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", default="auto",
                        help="auto, float32 or bfloat16 (float32: batch-invariant checks)")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baselines (c) and (d)")
    parser.add_argument("--json", dest="json_out", help="write runs and summary here")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    config = SpeculativeConfig(draft=args.draft, k=args.k, max_tokens=args.max_tokens, repeat=args.repeat,
                               model=args.model, with_hf=not args.no_hf, device=args.device, dtype=args.dtype)
    report = run_speculative_bench(load_tasks(args.prompts), config, progress=not args.no_progress)
    return write_report(report, format_table(report["summary"]), args)
