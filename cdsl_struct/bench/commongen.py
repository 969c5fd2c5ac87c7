"""``cdsl-struct bench commongen``: keyword-constrained sentences, greedy vs CDLH vs CDSL.

Each CommonGen concept set (``field_N#look_V#stand_V``) becomes an instruction to the embedded
model; the output is hard-constrained to one bounded sentence, and the reward is keyword
coverage (inflections count). Metrics: hard coverage (all concepts present) and soft coverage
(fraction present), wall time and the target / draft pass counters.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..constraints import Regex, compile
from ..decoding import decode
from ..decoding.lookahead import CDLH, CDSL, CDSL_STATES, GuidedDraft
from ..models.loading import load_model
from ..models.runner import ModelRunner, self_draft
from ..rewards import KeywordCoverage
from .maskbench import read_jsonl

SENTENCE = r"[A-Z][a-z]*( [A-Za-z,']+){2,24}\."
PROMPT = "Write one short, natural sentence that uses all of these words: {words}."
METHODS = ("greedy", "cdlh", "cdsl")


@dataclass
class CommonGenConfig:
    limit: int = 30
    seed: int = 0
    methods: tuple[str, ...] = METHODS
    max_tokens: int = 48
    k: int = 5
    d: int = 3
    lam: float = 5.0
    optimism: float = 0.5
    cdsl_d: int = 6
    acceptance_threshold: float = 0.5
    reward_threshold: float = 0.99
    fallback: str = "cdlh"
    reward_on: str = "ending"
    commit: str = "steered"
    draft_lam: float = 20.0
    suggest: bool = True
    stop_below: float = 0.5
    draft: str = "int8"
    model: str = "smollm2"


def load_concept_sets(path: str | Path, limit: int | None, seed: int) -> list[list[str]]:
    rows = [row["concept_set"].split("#") for row in read_jsonl(Path(path))]
    if limit is not None and limit < len(rows):
        rows = [rows[i] for i in sorted(random.Random(seed).sample(range(len(rows)), limit))]
    return rows


def run_commongen(data: str | Path, config: CommonGenConfig, progress: bool = True) -> dict[str, Any]:
    """Decode every concept set with each method; return per-method metrics and sentences."""
    import tqdm

    loaded = load_model(config.model)
    tokenizer = loaded.tokenizer
    target = ModelRunner(loaded.model)
    draft_runner = ModelRunner(self_draft(loaded.model, config.draft), name=config.draft)
    compiled = compile(Regex(SENTENCE), tokenizer, eos_token_ids=loaded.eos_token_ids)
    concept_sets = load_concept_sets(data, config.limit, config.seed)
    results: dict[str, dict[str, Any]] = {
        m: {"sentences": [], "hard": 0, "soft": 0.0, "wall_s": 0.0, "target_passes": 0, "target_positions": 0,
            "draft_passes": 0, "complete": 0, "hard_complete": 0, "states": Counter()} for m in config.methods}
    for concepts in tqdm.tqdm(concept_sets, disable=not progress, unit="set"):
        words = [c.split("_")[0] for c in concepts]
        reward = KeywordCoverage(concepts)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT.format(words=", ".join(words))}],
                                               add_generation_prompt=True, tokenize=True)["input_ids"]
        for method in config.methods:  # interleaved per concept set
            strategy = _strategy(method, reward, draft_runner, config)
            start = time.perf_counter()
            result = decode(target, compiled, prompt, max_tokens=config.max_tokens, strategy=strategy)
            wall = time.perf_counter() - start
            row = results[method]
            covered = reward.covered(result.text)
            row["sentences"].append({"concepts": concepts, "text": result.text, "covered": covered,
                                     "finish_reason": result.finish_reason})
            row["hard"] += len(covered) == len(concepts)
            row["complete"] += result.complete
            row["hard_complete"] += result.complete and len(covered) == len(concepts)
            row["soft"] += len(covered) / len(concepts)
            row["wall_s"] += wall
            row["target_passes"] += result.stats.target_passes
            row["target_positions"] += result.stats.target_positions
            row["draft_passes"] += result.stats.draft_passes
            if isinstance(strategy, CDSL):
                row["states"].update(strategy.states)
    return _report(results, len(concept_sets), config)


def _strategy(method: str, reward: KeywordCoverage, draft_runner: ModelRunner, config: CommonGenConfig) -> Any:
    if method == "greedy":
        return None
    cdlh = CDLH(reward, k=config.k, d=config.d, lam=config.lam, optimism=config.optimism)
    if method == "cdlh":
        return cdlh
    if method == "cdsl":
        draft = GuidedDraft(draft_runner, reward, k=config.k, lam=config.draft_lam, optimism=config.optimism,
                            suggest=config.suggest, stop_below=config.stop_below)
        return CDSL(draft, reward, d=config.cdsl_d, acceptance_threshold=config.acceptance_threshold,
                    reward_threshold=config.reward_threshold, fallback=config.fallback, cdlh=cdlh,
                    reward_on=config.reward_on, commit=config.commit)
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def _report(results: dict[str, dict[str, Any]], count: int, config: CommonGenConfig) -> dict[str, Any]:
    methods = {}
    for method, row in results.items():
        states = {s: row["states"].get(s, 0) for s in CDSL_STATES} if method == "cdsl" else {}
        methods[method] = {
            "hard_coverage": round(row["hard"] / max(count, 1), 4),
            "soft_coverage": round(row["soft"] / max(count, 1), 4),
            "complete": round(row["complete"] / max(count, 1), 4),
            "hard_coverage_complete": round(row["hard_complete"] / max(count, 1), 4),
            "wall_s": round(row["wall_s"], 2),
            "target_passes": row["target_passes"],
            "target_positions": row["target_positions"],
            "draft_passes": row["draft_passes"],
            "states": states,
            "sentences": row["sentences"],
        }
    report: dict[str, Any] = {"methods": methods, "config": {k: v for k, v in vars(config).items()}}
    if "cdsl" in methods and "cdlh" in methods:
        report["speedup_cdsl_vs_cdlh"] = round(methods["cdlh"]["wall_s"] / max(methods["cdsl"]["wall_s"], 1e-9), 3)
        report["target_pass_ratio_cdlh_vs_cdsl"] = round(
            methods["cdlh"]["target_passes"] / max(methods["cdsl"]["target_passes"], 1), 3)
        report["cdsl_hard_coverage_vs_cdlh"] = round(
            methods["cdsl"]["hard_coverage"] / max(methods["cdlh"]["hard_coverage"], 1e-9), 3)
    return report


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'method':8s} {'hard':>6s} {'soft':>6s} {'complete':>8s} {'wall s':>8s} {'passes':>7s} "
             f"{'draft':>6s}  states"]
    for method, row in report["methods"].items():
        lines.append(f"{method:8s} {row['hard_coverage']:6.3f} {row['soft_coverage']:6.3f} {row['complete']:8.3f} "
                     f"{row['wall_s']:8.1f} "
                     f"{row['target_passes']:7d} {row['draft_passes']:6d}  {row['states'] or ''}")
    for key in ("speedup_cdsl_vs_cdlh", "target_pass_ratio_cdlh_vs_cdsl", "cdsl_hard_coverage_vs_cdlh"):
        if key in report:
            lines.append(f"{key}: {report[key]}")
    return "\n".join(lines)
