"""``python -m benchmarks keyword-prompts``: keywords from the prompts users write, through ``generate``.

Each CommonGen concept set of ``--split`` gets one instruction that does not name its words
(``INSTRUCTIONS``, in turn: "Write a sentence.", "Describe a scene.", a question ...) and is decoded
with ``Generator.generate(instruction, keywords=words, max_tokens=...)`` at the library's defaults
(CDSL with the embedded model), under three conditions:

- ``named``: the user names the words, in CommonGen's task wording (``commongen.PROMPT`` after the
  instruction): the yardstick;
- ``unnamed``: the instruction as written, the library naming the words (``Keywords(name=True)``,
  the default);
- ``off``: the instruction as written and ``Keywords(name=False)``: what the reward alone reaches.

``--end-early`` sets ``Keywords(hold_ending=False)`` in every condition: a sentence may then end while
a word is missing (the library's default holds its ending below ``HOLD_ENDING_WORDS`` words).
``--optimism X`` sets ``Keywords(optimism=X)`` (the library's default: ``keywords.OPTIMISM``).

Per condition: hard coverage (every word, inflections count), finished sentences (ended, or closed
to fit the budget), word lists (``commongen.comma_list`` and the reward's ``list_shaped``), terse
answers (under six words), fluency (the target's loss a token on the answer's tokens that are not
keywords, after the condition's prompt as the user wrote it: ``nll_other``), answers about the assistant
(``commongen.about_assistant``: "I'm a helpful AI named SmolLM, ..."), wall time. The figure
of issue 54 is ``unnamed`` hard coverage over ``named``'s on the same sets.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from cdsl_struct.bench import write_report
from cdsl_struct.keywords import OPTIMISM, Keywords
from cdsl_struct.rewards import KeywordCoverage, list_shaped

from . import quality
from .commongen import PROMPT, about_assistant, about_words, comma_list, keyword_tokens, load_cases

INSTRUCTIONS = (
    "Write a sentence.",
    "Describe a scene.",
    "Tell me what happened.",
    "What did you see on your walk today?",
    "Write one line for a story.",
    "Give me an example sentence.",
    "Describe what someone is doing.",
    "What happened at the weekend?",
    "Write a caption for a photo.",
    "Tell me something about your day.",
)
"""Instructions that name no keyword, as users write them; concept set ``i`` gets ``INSTRUCTIONS[i % 10]``."""
CONDITIONS = ("named", "unnamed", "off")
TERSE_WORDS = 6
"""An answer of fewer words is counted terse ("Lane swims swimmers.")."""


@dataclass(frozen=True)
class KeywordPromptsConfig:
    data: str
    limit: int = 100
    seed: int = 0
    split: str = "tune"
    conditions: tuple[str, ...] = CONDITIONS
    max_tokens: int = 48
    model: str = "smollm2"
    draft: str | None = "auto"
    naming: str | None = None
    """The library's naming sentence (``Keywords.instruction``; None: its default), for choosing it."""
    hold_ending: bool = True
    """``Keywords.hold_ending``: a sentence of fewer than ``HOLD_ENDING_WORDS`` words does not end while a
    word is missing, where it may write on."""
    optimism: float = OPTIMISM
    """``Keywords.optimism``: the credit an unfinished answer gets for the words it may still write."""


def request(condition: str, instruction: str, words: list[str], naming: str | None = None,
            hold_ending: bool = True, optimism: float = OPTIMISM) -> tuple[str, Keywords]:
    """The prompt and keyword request of one concept set under ``condition`` (``naming``: the
    library's naming sentence, None for its default)."""
    steering = {"hold_ending": hold_ending, "optimism": optimism}
    if condition == "named":
        return f"{instruction}\n\n{PROMPT.format(words=', '.join(words))}", Keywords(tuple(words), **steering)
    return instruction, Keywords(tuple(words), name=condition == "unnamed", instruction=naming, **steering)


def nll_other(gen: Any, prompt: str, text: str, words: list[str]) -> float | None:
    """The target's mean loss (nats) on the tokens of ``text`` that are not keywords, as the reply to
    ``prompt``; None when every token is a keyword's."""
    tokenizer = gen.tokenizer
    context = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)["input_ids"]
    output = tokenizer.encode(text, add_special_tokens=False)
    with torch.inference_mode():
        losses = quality.token_nlls(gen.loaded.model, context, output)
    on_keyword = keyword_tokens([tokenizer.decode([t]) for t in output], KeywordCoverage(words))
    other = [loss for loss, keyword in zip(losses, on_keyword, strict=True) if not keyword]
    return sum(other) / len(other) if other else None


def run_keyword_prompts(config: KeywordPromptsConfig, progress: bool = True) -> dict[str, Any]:
    """Every concept set under every condition on one Generator; the report (rows and summary)."""
    from cdsl_struct.api import Generator

    cases = load_cases(config.data, config.limit, config.seed, config.split)
    gen = Generator(config.model, draft=config.draft)
    rows: dict[str, list[dict[str, Any]]] = {c: [] for c in config.conditions}
    try:
        for index, case in enumerate(cases):
            words = [c.split("_")[0] for c in case["concepts"]]
            instruction = INSTRUCTIONS[index % len(INSTRUCTIONS)]
            for condition in config.conditions:
                prompt, keywords = request(condition, instruction, words, config.naming, config.hold_ending,
                                           config.optimism)
                started = time.perf_counter()
                result = gen.generate(prompt, keywords=keywords, max_tokens=config.max_tokens)
                wall = time.perf_counter() - started
                rows[condition].append({
                    "words": words, "instruction": instruction, "text": result.text,
                    "covered": list(result.keywords.covered), "finish_reason": result.finish_reason,
                    "finished": result.finish_reason == "stop" or result.closed_by_budget,
                    "method": result.method, "wall_s": round(wall, 3),
                    "nll_other": nll_other(gen, prompt, result.text, words)})
            if progress:
                print(f"{index + 1}/{len(cases)} " + " | ".join(
                    f"{c}: {rows[c][-1]['text']!r}" for c in config.conditions), flush=True)
    finally:
        gen.close()
    return {"config": asdict(config), "summary": summarise(rows), "rows": rows}


def summarise(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per condition: hard coverage (with its bootstrap interval), finished share, word lists, terse
    answers, the loss on other tokens, wall."""
    summary: dict[str, Any] = {}
    hard: dict[str, list[float]] = {}
    for condition, records in rows.items():
        hard[condition] = [float(len(r["covered"]) == len(r["words"])) for r in records]
        summary[condition] = {
            "sets": len(records),
            "hard_coverage": round(sum(hard[condition]) / max(len(records), 1), 4),
            "hard_coverage_ci95": quality.bootstrap_ci(hard[condition]),
            "finished": round(sum(r["finished"] for r in records) / max(len(records), 1), 4),
            "word_lists": sum(comma_list(r["text"]) for r in records),
            "list_shaped": sum(list_shaped(r["text"], final=True) for r in records),
            "about_words": sum(about_words(r["text"], r["words"]) for r in records),
            "about_assistant": sum(about_assistant(r["text"], r["words"]) for r in records),
            "terse": sum(len(r["text"].split()) < TERSE_WORDS for r in records),
            "nll_other": _mean([r["nll_other"] for r in records if r.get("nll_other") is not None]),
            "wall_s": round(sum(r["wall_s"] for r in records), 2)}
    if "named" in hard and "unnamed" in hard and any(hard["named"]):
        summary["unnamed_vs_named"] = round(sum(hard["unnamed"]) / sum(hard["named"]), 3)
        summary["unnamed_vs_named_ci95"] = quality.paired_ratio_ci(hard["unnamed"], hard["named"])
    return summary


def format_table(report: dict[str, Any]) -> str:
    s, c = report["summary"], report["config"]
    lines = [f"split {c['split']}, {c['limit']} sets (seed {c['seed']}), max_tokens {c['max_tokens']}, "
             f"model {c['model']}, draft {c['draft']}",
             "| condition | hard coverage | 95% CI | finished | word lists | list-shaped | about the words | "
             "about the assistant | terse | loss on other tokens | wall s |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for condition in c["conditions"]:
        row = s[condition]
        low, high = row["hard_coverage_ci95"]
        lines.append(f"| {condition} | {row['hard_coverage']:.3f} | [{low:.3f}, {high:.3f}] | {row['finished']:.3f} | "
                     f"{row['word_lists']} | {row['list_shaped']} | {row.get('about_words', '-')} | "
                     f"{row.get('about_assistant', '-')} | {row.get('terse', '-')} | {row.get('nll_other', '-')} | "
                     f"{row['wall_s']} |")
    if "unnamed_vs_named" in s:
        lines.append(f"unnamed / named hard coverage: {s['unnamed_vs_named']}x "
                     f"(95% CI {s['unnamed_vs_named_ci95']})")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks keyword-prompts``' options."""
    parser.add_argument("--data", required=True, help="CommonGen jsonl (concept_set per line)")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="tune", choices=["tune", "report", "all"])
    parser.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated: named, unnamed, off")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--draft", default="auto", help="the Generator's draft (default auto)")
    parser.add_argument("--naming", default=None, metavar="TEXT",
                        help="the library's naming sentence, {words} where the words go (default: its own)")
    parser.add_argument("--end-early", action="store_true",
                        help="Keywords(hold_ending=False): a sentence may end while a word is missing")
    parser.add_argument("--optimism", type=float, default=OPTIMISM,
                        help=f"Keywords(optimism=X): an unfinished answer's credit for the words it may still write "
                             f"(default {OPTIMISM})")
    parser.add_argument("--json", dest="json_out", help="write the report here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report."""
    conditions = tuple(args.conditions.split(","))
    unknown = set(conditions) - set(CONDITIONS)
    if unknown:
        raise SystemExit(f"unknown condition(s) {sorted(unknown)}; choose from {', '.join(CONDITIONS)}")
    config = KeywordPromptsConfig(data=args.data, limit=args.limit, seed=args.seed, split=args.split,
                                  conditions=conditions, max_tokens=args.max_tokens, model=args.model,
                                  draft=None if args.draft == "none" else args.draft, naming=args.naming,
                                  hold_ending=not args.end_early, optimism=args.optimism)
    report = run_keyword_prompts(config)
    return write_report(report, format_table(report), args)


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None
