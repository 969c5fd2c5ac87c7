"""``cdsl-struct bench speculative``: constrained speculative decoding against its baselines.

For every task, interleaved in one process: (a) our ``target`` decoder, (b) our speculative
decoder with the chosen draft, (c) what users do today, ``transformers`` ``generate()`` with an
outlines-core logits processor for the same constraint, and (d) HF assisted generation with a
bf16 self-draft, unconstrained (reference only). Constraints are compiled before timing starts.
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..constraints import Grammar, JsonSchema, Regex, compile
from ..constraints.mask import allocate_bitmask, apply_bitmask
from ..decoding import build_proposers, decode
from ..models.loading import load_model
from ..models.runner import ModelRunner, self_draft
from .maskbench import read_jsonl

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


def run_speculative_bench(tasks: list[dict[str, Any]], config: SpeculativeConfig,
                          progress: bool = True) -> dict[str, Any]:
    """Run (a)-(d) for every task, interleaved; return ``{"runs": [...], "summary": {...}}``."""
    import tqdm

    loaded = load_model(config.model)
    tokenizer, model = loaded.tokenizer, loaded.model
    target = ModelRunner(model)
    proposers = build_proposers(config.draft, model, target_tokenizer=tokenizer)
    assistant = self_draft(model, "bf16") if config.with_hf else None
    prepared = []
    for task in tasks:
        spec = spec_of(task)
        compiled = compile(spec, tokenizer, eos_token_ids=loaded.eos_token_ids)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": task["prompt"]}],
                                               add_generation_prompt=True, tokenize=True)["input_ids"]
        index = _outlines_index(spec, compiled) if config.with_hf else None
        prepared.append((task, compiled, prompt, index))
    vocab_size = prepared[0][1].vocab_size if prepared else 0

    runs = []
    for round_number in tqdm.trange(config.repeat, disable=not progress, desc="rounds"):
        for number, (task, compiled, prompt, index) in enumerate(prepared):
            row: dict[str, Any] = {"task": number, "round": round_number, "kind": _kind(task)}
            plain = _timed(lambda: decode(target, compiled, prompt, max_tokens=config.max_tokens))  # noqa: B023
            spec_result = _timed(lambda: decode(target, compiled, prompt, proposers=proposers,  # noqa: B023
                                                k=config.k, max_tokens=config.max_tokens))
            row["target"] = _describe(*plain)
            row["speculative"] = _describe(*spec_result)
            row["identical"] = plain[0].tokens == spec_result[0].tokens
            if config.with_hf:
                row["hf_outlines"] = _hf_generate(model, tokenizer, prompt, config.max_tokens, index, None, vocab_size)
                row["hf_assisted"] = _hf_generate(model, tokenizer, prompt, config.max_tokens, None, assistant,
                                                  vocab_size)
            runs.append(row)
    return {"runs": runs, "summary": summarise(runs, config)}


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
    hf_runs = [r for r in runs if r.get("hf_outlines")]
    hf_outlines_s = sum(r["hf_outlines"]["wall_s"] for r in hf_runs)
    spec_on_hf = sum(r["speculative"]["wall_s"] for r in hf_runs)
    return {
        "draft": config.draft,
        "k": config.k,
        "identical": all(r["identical"] for r in runs),
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
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _kind(task: dict[str, Any]) -> str:
    return "schema" if "schema" in task else ("regex" if "regex" in task else "grammar")


def _timed(work: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start


def _describe(result: Any, wall: float) -> dict[str, Any]:
    stats = result.stats
    return {
        "text": result.text, "finish_reason": result.finish_reason, "tokens": stats.tokens,
        "wall_s": round(wall, 4), "target_s": round(stats.target_seconds, 4), "draft_s": round(stats.draft_seconds, 4),
        "decode_passes": stats.target_passes - 1, "target_positions": stats.target_positions,
        "draft_passes": stats.draft_passes, "proposed": stats.proposed, "accepted": stats.accepted,
        "forced": stats.forced,
    }


def _outlines_index(spec: Any, compiled: Any) -> Any:
    """outlines-core's own index for (c), or None where it cannot express the spec."""
    from ..constraints.backends.outlines_core_backend import BACKEND as OUTLINES
    from ..errors import CompileError

    try:
        program = OUTLINES.compile(spec, compiled.vocabulary, compiled.whitespace)
    except CompileError:
        return None
    return program.index


def _hf_generate(model: Any, tokenizer: Any, prompt: list[int], max_tokens: int, index: Any,
                 assistant: Any, vocab_size: int) -> dict[str, Any] | None:
    if assistant is None and index is None:
        return None
    from transformers import LogitsProcessorList

    ids = torch.tensor([prompt])
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
