"""``python -m benchmarks vllm``: our logits processor against vLLM's own XGrammar backend, in one
vLLM engine, on the same json_schema requests (run it where vLLM is installed: ``.venv-vllm``).

One offline ``LLM`` on the embedded SmolLM2 with ``CdslLogitsProcessor`` loaded. Each round sends
the requests (``bench serve``'s name/age/city prompts, greedy, ``max_tokens``) under XGrammar
(``StructuredOutputsParams(json=...)``) and under ours (``constraint_args(schema=...)``), the
order flipped every round, both one at a time and all at once. Ours runs twice: at this library's
default whitespace (what users get) and at ``"any"`` whitespace, the policy of XGrammar's default
(any run of whitespace, ours bounded to 16 characters), so the same model answers the same
grammar under both processors and the difference is the processors' cost, not the answers'
lengths. Reported per backend and mode: wall summed over the rounds, completion tokens, the
longest output (all at once, the batch lasts as long as its longest row), valid JSON, and ours /
XGrammar in tokens per second and in wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from cdsl_struct.bench import write_report
from cdsl_struct.bench.serving import PERSON_SCHEMA, prompts

#: backend name -> our processor's compile options (None: vLLM's XGrammar)
BACKENDS: dict[str, dict[str, str] | None] = {"xgrammar": None, "cdsl": {}, "cdsl_any_ws": {"whitespace": "any"}}
MODES = ("one_at_a_time", "all_at_once")


@dataclass
class VllmBenchConfig:
    """What to run: requests per round, rounds, and the output budget."""

    requests: int = 16
    rounds: int = 2
    max_tokens: int = 60
    model: str = "smollm2"
    dtype: str = "float32"
    """vLLM's ``dtype`` (``"auto"``: its default, bf16 on this CPU)."""


def run_vllm_bench(config: VllmBenchConfig) -> dict[str, Any]:
    """Every backend, alternating, one at a time and all at once; summed per (backend, mode)."""
    from vllm import LLM

    from cdsl_struct.integrations.vllm import CdslLogitsProcessor, vllm_model_dir

    llm = LLM(model=str(vllm_model_dir(config.model)), logits_processors=[CdslLogitsProcessor], dtype=config.dtype,
              max_model_len=2048, seed=0)
    messages = [[{"role": "user", "content": p}] for p in prompts(config.requests)]
    for backend in BACKENDS:  # warm-up: compiles and caches, not timed
        _generate(llm, messages[:1], backend, config.max_tokens)
    totals = {(b, m): {"wall_s": 0.0, "tokens": 0, "longest": 0, "length": 0, "valid": 0, "requests": 0,
                       "same_as_xgrammar": 0} for b in BACKENDS for m in MODES}
    last: dict[tuple[str, str], list[str]] = {}  # each (backend, mode)'s texts in the latest round
    for round_index in range(config.rounds):
        for backend in list(BACKENDS) if round_index % 2 == 0 else list(BACKENDS)[::-1]:
            for mode, groups in (("one_at_a_time", [[m] for m in messages]), ("all_at_once", [messages])):
                started = time.perf_counter()
                texts = [text for group in groups for text in _generate(llm, group, backend, config.max_tokens)]
                total = totals[(backend, mode)]
                total["wall_s"] += time.perf_counter() - started
                total["tokens"] += sum(tokens for _, tokens, _ in texts)
                total["longest"] = max(total["longest"], *(tokens for _, tokens, _ in texts))
                total["length"] += sum(finish == "length" for _, _, finish in texts)
                total["valid"] += sum(_valid(text) for text, _, _ in texts)
                total["requests"] += len(texts)
                last[(backend, mode)] = [text for text, _, _ in texts]
        for (backend, mode), total in totals.items():  # outputs identical to XGrammar's this round
            total["same_as_xgrammar"] += sum(a == x for a, x in zip(last[(backend, mode)], last[("xgrammar", mode)],
                                                                    strict=True))
    rows = [{"backend": b, "mode": m, **{k: round(v, 3) if isinstance(v, float) else v for k, v in t.items()},
             "tokens_per_s": round(t["tokens"] / t["wall_s"], 2)} for (b, m), t in totals.items()]
    ours = [b for b in BACKENDS if BACKENDS[b] is not None]
    ratios = {b: {mode: round(_row(rows, b, mode)["tokens_per_s"] / _row(rows, "xgrammar", mode)["tokens_per_s"], 3)
                  for mode in MODES} for b in ours}
    walls = {b: {mode: round(_row(rows, "xgrammar", mode)["wall_s"] / _row(rows, b, mode)["wall_s"], 3)
                 for mode in MODES} for b in ours}
    return {"config": asdict(config), "summary": {"rows": rows, "throughput_ratio": ratios, "wall_ratio": walls}}


def _generate(llm: Any, messages: list[Any], backend: str, max_tokens: int) -> list[tuple[str, int, str]]:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from cdsl_struct.integrations.vllm import constraint_args

    options = BACKENDS[backend]
    if options is None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0,
                                structured_outputs=StructuredOutputsParams(json=PERSON_SCHEMA))
    else:
        params = SamplingParams(max_tokens=max_tokens, temperature=0,
                                extra_args=constraint_args(schema=PERSON_SCHEMA, **options))
    outputs = llm.chat(messages, params, use_tqdm=False)
    return [(o.outputs[0].text, len(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outputs]


def _valid(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), PERSON_SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _row(rows: list[dict[str, Any]], backend: str, mode: str) -> dict[str, Any]:
    return next(r for r in rows if r["backend"] == backend and r["mode"] == mode)


def format_vllm_table(report: dict[str, Any]) -> str:
    """The rows as a markdown table, after ours / XGrammar per backend of ours and mode."""
    summary = report["summary"]
    lines = [f"{backend} / xgrammar: tokens/s one at a time {ratio['one_at_a_time']}, all at once "
             f"{ratio['all_at_once']}; wall (xgrammar / ours) one at a time {wall['one_at_a_time']}, all at once "
             f"{wall['all_at_once']}" for backend, ratio in summary["throughput_ratio"].items()
             for wall in (summary["wall_ratio"][backend],)]
    lines += ["", "| backend | mode | wall s | tokens | longest | cut by max_tokens | tok/s | valid "
                  "| same text as XGrammar |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["summary"]["rows"]:
        lines.append(f"| {r['backend']} | {r['mode']} | {r['wall_s']} | {r['tokens']} | {r['longest']} | "
                     f"{r['length']} | {r['tokens_per_s']} | {r['valid']}/{r['requests']} | "
                     f"{r.get('same_as_xgrammar', '')}/{r['requests']} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks vllm``'s options."""
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both backends, order flipped (default 2)")
    parser.add_argument("--max-tokens", type=int, default=60)
    parser.add_argument("--model", default="smollm2", help="smollm2, gemma3-270m or a .gguf (default smollm2)")
    parser.add_argument("--dtype", default="float32", help="vLLM's dtype (default float32; auto: vLLM's default)")
    parser.add_argument("--json", dest="json_out", help="write the report here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    report = run_vllm_bench(VllmBenchConfig(requests=args.requests, rounds=args.rounds, max_tokens=args.max_tokens,
                                            model=args.model, dtype=args.dtype))
    return write_report(report, format_vllm_table(report), args)
