"""``python -m benchmarks commongen``: keyword-constrained sentences, greedy vs CDLH vs CDSL.

Each CommonGen concept set (``field_N#look_V#stand_V``) becomes an instruction to the embedded
model; the output is hard-constrained to one real sentence (``sentence="words"``: listed whole
words, see ``benchmarks/sentence.py``; ``"loose"``: the old letters-and-spaces regex), and the reward
is keyword coverage (inflections count) with each keyword worth at most ``max_repeats``
occurrences (stuffing scores less).

Protocol: ``split_of`` puts every concept set in ``tune`` or ``report`` by a hash of its text
(about half each, fixed forever); settings are chosen on ``tune`` and figures are reported on
``report`` (DESIGN.md, "Evaluation protocol"). Metrics per method: hard and soft coverage with
bootstrap intervals, complete sentences, fluency (the target's unconstrained mean NLL per token),
real-word share, keyword repetition, BLEU and ROUGE-L against the references, wall time and the
target / draft pass counters.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdsl_struct.bench import write_report
from cdsl_struct.bench.maskbench import read_jsonl
from cdsl_struct.constraints import Grammar, Regex, compile
from cdsl_struct.decoding import (
    CDLH,
    CDSL,
    CDSL_STATES,
    SENTENCE_GUARD,
    BatchEngine,
    GuidedDraft,
    Request,
    SamplingParams,
    WordLoopGuard,
)
from cdsl_struct.models import ModelRunner, batch_runner, check_ragged_once, load_model, self_draft
from cdsl_struct.prompts import chat_header
from cdsl_struct.rewards import TALK_ABOUT_WORDS, KeywordCoverage, list_shaped

from . import quality
from .sentence import LOOSE_SENTENCE, WORD_LIST_SIZE, real_word_share, repeated_block, sentence_grammar

PROMPT = "Write one short, natural sentence that uses all of these words: {words}."
METHODS = ("greedy", "cdlh", "cdsl")
SPLITS = ("tune", "report", "all")


@dataclass
class CommonGenConfig:
    limit: int | None = 30
    seed: int = 0
    split: str = "tune"
    shard: str = "0/1"
    """``"i/n"``: only the sampled concept sets at positions i, i + n, ... (parallel runs; merge
    their reports with ``merge_reports``)."""
    methods: tuple[str, ...] = METHODS
    sentence: str = "words"
    word_list_size: int = WORD_LIST_SIZE
    """How many of ``wordfreq``'s most frequent words the ``"words"`` sentence allows (plus the keywords)."""
    max_repeats: int = 2
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
    steer_ratio: float = 0.0
    draft_lam: float = 20.0
    suggest: bool = True
    stop_below: float = 0.5
    draft: str = "int8"
    loop_guard: bool = True
    """CDLH's and CDSL's guard against writing a block a third time in a row (``decoding.loops``)."""
    word_guard: bool = True
    """The guard on words too (``WordLoopGuard``: case, punctuation and token splits aside), as
    ``Generator`` guards keyword sentences; off: on tokens only."""
    talk: bool = False
    """With ``no_lists``: let text about the words ("... are all words that ...") earn reward too;
    off, as ``generate(keywords=...)``'s reward, it earns nothing (``TALK_ABOUT_WORDS``)."""
    list_guard: bool = True
    """CDSL's draft, target and fallback (its candidates and roll-outs) write no token that makes the
    sentence a list of the words, where the reward says so (``no_lists``; ``decoding.guards``)."""
    cdsl_temperature: float = 0.0
    """0: CDSL accepts by greedy matching; > 0: by speculative sampling at this temperature
    (seeded per concept set), the target's own tokens sampled too."""
    model: str = "smollm2"
    no_lists: bool = False
    """The reward pays nothing for a list of the words (``KeywordCoverage(no_lists=True)``), as
    ``generate(keywords=...)``'s does."""
    hold_ending: int = 0
    """``KeywordCoverage(hold_ending=N)``: a sentence of fewer than N words does not end while a word is
    missing, where it may write on (``generate(keywords=...)`` holds 20). It acts through the reward
    guard, so CDLH then guards its candidates and roll-outs too (the paper's CDLH does not); 0: off."""

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if self.sentence not in ("words", "loose"):
            raise ValueError(f"sentence must be 'words' or 'loose', got {self.sentence!r}")
        index, _, count = self.shard.partition("/")
        if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
            raise ValueError(f"shard must be 'i/n' with 0 <= i < n, got {self.shard!r}")
        unknown = set(self.methods) - set(METHODS)
        if unknown:
            raise ValueError(f"unknown method(s) {sorted(unknown)}; choose from {', '.join(METHODS)}")


def split_of(concept_set: str) -> str:
    """``"tune"`` or ``"report"``: the parity of the SHA-256 of the concept set's text (stable
    across runs, machines and Python versions; about half each)."""
    return "tune" if hashlib.sha256(concept_set.encode("utf-8")).digest()[0] % 2 == 0 else "report"


def load_cases(path: str | Path, limit: int | None = None, seed: int = 0,
               split: str = "all") -> list[dict[str, Any]]:
    """The concept sets of ``path`` in ``split`` (``"all"``: every one; ``"report"`` leaves out the
    sets swept on before the split, ``_presplit_sweep``), a seeded sample of ``limit`` of them in
    sampled order (so any prefix of a run is itself a random sample), or all in file order:
    ``{"concept_set", "concepts", "references"}`` each."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    rows = list(read_jsonl(Path(path)))
    swept = _presplit_sweep(rows) if split == "report" else set()
    cases = [{"concept_set": row["concept_set"], "concepts": row["concept_set"].split("#"),
              "references": list(row.get("scene") or [])}
             for row in rows if (split == "all" or split_of(row["concept_set"]) == split)
             and row["concept_set"] not in swept]
    if limit is not None and limit < len(cases):
        cases = [cases[i] for i in random.Random(seed).sample(range(len(cases)), limit)]
    return cases


def _presplit_sweep(rows: list[dict[str, Any]]) -> set[str]:
    """The 30 concept sets the defaults were swept on before the split existed (``--limit 30
    --seed 0`` over the whole file, the old sampling): ``report`` leaves them out."""
    return {rows[i]["concept_set"] for i in random.Random(0).sample(range(len(rows)), min(30, len(rows)))}


def load_concept_sets(path: str | Path, limit: int | None, seed: int, split: str = "all") -> list[list[str]]:
    """The concepts of ``load_cases``."""
    return [case["concepts"] for case in load_cases(path, limit, seed, split)]


def sentence_constraint(config: CommonGenConfig, tokenizer: Any, eos_token_ids: Any,
                        keywords: list[str]) -> Any:
    """The compiled hard constraint of a run: one grammar for all its concept sets (the word list
    holds every keyword's inflections), or the loose regex."""
    if config.sentence == "loose":
        return compile(Regex(LOOSE_SENTENCE), tokenizer, eos_token_ids=eos_token_ids)
    return compile(Grammar(sentence_grammar(keywords, config.word_list_size)), tokenizer, backend="llguidance",
                   eos_token_ids=eos_token_ids, timeout=120.0)


class CommonGenBench:
    """The loaded pieces of a run over fixed ``cases``: the model, its draft, the compiled sentence
    constraint (built for these cases' keywords), so that several settings can be run on them.

    Each sentence is one request alone on the batched engine, on the runner ``Generator`` and
    ``serve`` use (``batch_runner``: ragged where the model supports it), with no prefix cache, so
    that the method run second on a prompt does not find it computed."""

    def __init__(self, cases: list[dict[str, Any]], config: CommonGenConfig) -> None:
        self.cases, self.config = cases, config
        self.loaded = load_model(config.model)
        self.draft_runner = ModelRunner(self_draft(self.loaded.model, config.draft), name=config.draft)
        self.compiled = sentence_constraint(config, self.loaded.tokenizer, self.loaded.eos_token_ids,
                                            sorted({c for case in cases for c in case["concepts"]}))
        self.word_guard = WordLoopGuard(self.compiled.vocabulary.token_bytes)
        # once-a-process work out of the first sentence's wall, as the draft's quantisation is: the
        # check the draft's batched passes need, and the parser of finished outputs
        check_ragged_once(self.draft_runner.model)
        if isinstance(self.compiled.spec, Grammar):
            self.compiled.spec.prepare_parser()

    def run(self, config: CommonGenConfig | None = None, progress: bool = True,
            checkpoint: str | Path | None = None) -> dict[str, Any]:
        """Decode every case with each of ``config.methods`` (interleaved per case); the report.
        ``config`` may change any decoding setting, not the model, draft or sentence constraint."""
        config = config or self.config
        tokenizer = self.loaded.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.loaded.eos_token_ids[0]
        engine = BatchEngine(batch_runner(self.loaded.model, pad_token_id=pad, prefix_cache_bytes=0))
        engine.programs.share_prefix(chat_header(tokenizer))  # as Generator does: CDSL's draft prefills it once
        try:
            return self._run(engine, config, progress, checkpoint)
        finally:
            engine.close()

    def _run(self, engine: BatchEngine, config: CommonGenConfig, progress: bool,
             checkpoint: str | Path | None) -> dict[str, Any]:
        """``run`` on ``engine``."""
        import tqdm

        tokenizer, eos = self.loaded.tokenizer, set(self.loaded.eos_token_ids)
        rows: dict[str, list[dict[str, Any]]] = {m: [] for m in config.methods}
        states: dict[str, Counter] = {m: Counter() for m in config.methods}
        for index, case in enumerate(tqdm.tqdm(self.cases, disable=not progress, unit="set")):
            concepts = case["concepts"]
            words = [c.split("_")[0] for c in concepts]
            reward = KeywordCoverage(concepts, max_repeats=config.max_repeats, no_lists=config.no_lists,
                                     off_topic=TALK_ABOUT_WORDS if config.no_lists and not config.talk else (),
                                     hold_ending=config.hold_ending)
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": PROMPT.format(words=", ".join(words))}],
                add_generation_prompt=True, tokenize=True)["input_ids"]
            for method in config.methods:
                strategy = make_strategy(method, reward, self.draft_runner, config, self.word_guard)
                params = SamplingParams(temperature=config.cdsl_temperature, seed=config.seed * 100003 + index) \
                    if method == "cdsl" and config.cdsl_temperature > 0 else None
                start = time.perf_counter()
                result = engine.run([Request(tuple(prompt), self.compiled, params or SamplingParams(),
                                             config.max_tokens, strategy=strategy)])[0]
                wall = time.perf_counter() - start
                output = [t for t in result.tokens if t not in eos]
                nlls = quality.token_nlls(self.loaded.model, prompt, output)
                on_keyword = keyword_tokens([tokenizer.decode([t]) for t in output], reward)
                rows[method].append({
                    "concepts": concepts, "text": result.text, "covered": reward.covered(result.text),
                    "counts": reward.counts(result.text), "finish_reason": result.finish_reason,
                    "complete": result.complete, "wall_s": round(wall, 3),
                    "target_passes": result.stats.target_passes, "target_positions": result.stats.target_positions,
                    "draft_passes": result.stats.draft_passes,
                    "target_s": round(result.stats.target_seconds, 3), "draft_s": round(result.stats.draft_seconds, 3),
                    "nll": round(_mean_or_nan(nlls), 4),
                    "nll_keyword": round(_mean_or_nan([v for v, k in zip(nlls, on_keyword, strict=True) if k]), 4),
                    "nll_other": round(_mean_or_nan([v for v, k in zip(nlls, on_keyword, strict=True) if not k]), 4),
                    "keyword_tokens": sum(on_keyword), "output_tokens": len(output),
                    "real_words": round(real_word_share(result.text, concepts), 4),
                    "references": case["references"]})
                if isinstance(strategy, CDSL):
                    states[method].update(strategy.states)
            if checkpoint is not None:
                Path(checkpoint).write_text(json.dumps(_report(rows, states, config), indent=1), encoding="utf-8")
        return _report(rows, states, config)


def run_commongen(data: str | Path, config: CommonGenConfig, progress: bool = True,
                  checkpoint: str | Path | None = None) -> dict[str, Any]:
    """Decode every concept set of ``config``'s split and sample with each method; return the report.
    ``checkpoint``: write the report so far there after every concept set."""
    cases = load_cases(data, config.limit, config.seed, config.split)
    index, count = (int(part) for part in config.shard.split("/"))
    return CommonGenBench(cases[index::count], config).run(progress=progress, checkpoint=checkpoint)


def keyword_tokens(pieces: list[str], reward: KeywordCoverage) -> list[bool]:
    """Whether each token (``pieces``: the text of each) overlaps a word that is a keyword form."""
    spans, offset = [], 0
    for piece in pieces:
        spans.append((offset, offset + len(piece)))
        offset += len(piece)
    text = "".join(pieces)
    words = [m.span() for m in re.finditer(r"[A-Za-z]+", text) if reward.covered(m.group())]
    return [any(start < end_w and start_w < end for start_w, end_w in words) for start, end in spans]


def _mean_or_nan(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from the reports of shards of one run (same config but the shard); the metrics
    that depend only on the text (real words) are computed afresh."""
    if not reports:
        raise ValueError("nothing to merge")
    config = CommonGenConfig(**{**reports[0]["config"], "methods": tuple(reports[0]["config"]["methods"]),
                                "shard": "0/1"})
    rows = {m: [s for r in reports for s in r["methods"][m]["sentences"]] for m in config.methods}
    for sentences in rows.values():  # the text-only metrics as the current code computes them
        for s in sentences:
            s["real_words"] = round(real_word_share(s["text"], s["concepts"]), 4)
    states = {m: sum((Counter(r["methods"][m]["states"]) for r in reports), Counter()) for m in config.methods}
    return _report(rows, states, config)


def make_strategy(method: str, reward: KeywordCoverage, draft_runner: ModelRunner, config: CommonGenConfig,
                  word_guard: WordLoopGuard | None = None) -> Any:
    """The strategy of ``method``; its loop guard ``word_guard`` where given and ``config`` guards
    words, else ``SENTENCE_GUARD`` (none with ``loop_guard`` off)."""
    if method == "greedy":
        return None
    guard = (word_guard if word_guard is not None and config.word_guard else SENTENCE_GUARD) \
        if config.loop_guard else None
    cdlh = CDLH(reward, k=config.k, d=config.d, lam=config.lam, optimism=config.optimism, loop_guard=guard,
                reward_guard=config.hold_ending > 0)
    if method == "cdlh":
        return cdlh
    if method == "cdsl":
        draft = GuidedDraft(draft_runner, reward, k=config.k, lam=config.draft_lam, optimism=config.optimism,
                            suggest=config.suggest, stop_below=config.stop_below, loop_guard=guard,
                            avoid_lost=config.list_guard)
        return CDSL(draft, reward, d=config.cdsl_d, acceptance_threshold=config.acceptance_threshold,
                    reward_threshold=config.reward_threshold, fallback=config.fallback,
                    cdlh=dataclasses.replace(cdlh, reward_guard=config.list_guard or config.hold_ending > 0),
                    reward_on=config.reward_on, commit=config.commit, steer_ratio=config.steer_ratio,
                    loop_guard=guard, avoid_lost=config.list_guard)
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def comma_list(text: str) -> bool:
    """Whether ``text`` reads as a word list by its commas: at least max(3, words / 4) of them (the
    count issue 54 measured lists by; ``list_shaped`` is the reward's own, stricter test)."""
    return text.count(",") >= max(3, len(text.split()) / 4)


def about_words(text: str, concepts: list[str]) -> bool:
    """Whether ``text`` talks about the words (one of ``TALK_ABOUT_WORDS`` that is no concept)."""
    return KeywordCoverage(concepts, off_topic=TALK_ABOUT_WORDS).failed(text)


ASSISTANT_WORDS = ("ai", "assistant", "chatbot", "smollm")
"""Words of an answer about the assistant itself, as SmolLM2's default system message has it ("I'm a
helpful AI named SmolLM, trained to ...")."""


def about_assistant(text: str, concepts: list[str]) -> bool:
    """Whether ``text`` talks about the assistant: one of ``ASSISTANT_WORDS`` that is no concept."""
    return KeywordCoverage(concepts, off_topic=ASSISTANT_WORDS).failed(text)


def keyword_opening(text: str, concepts: list[str]) -> bool:
    """Whether ``text`` opens with a keyword as an item of its own ("Jump, pool, stand are all ..."):
    its first piece, closed by its comma, has lost a ``no_lists`` reward."""
    head, comma, _ = text.partition(",")
    return bool(comma) and KeywordCoverage(concepts, no_lists=True).failed(head + comma)


def method_metrics(sentences: list[dict[str, Any]], max_repeats: int) -> dict[str, Any]:
    """The metrics of one method's ``sentences`` (records as ``run_commongen`` writes them)."""
    n = len(sentences)
    hard = [float(len(s["covered"]) == len(s["concepts"])) for s in sentences]
    soft = [len(s["covered"]) / len(s["concepts"]) for s in sentences]
    complete = [bool(s["complete"]) for s in sentences]
    nlls = [s["nll"] for s in sentences if not math.isnan(s["nll"])]
    return {
        "cases": n,
        "hard_coverage": _mean(hard), "hard_coverage_ci95": quality.bootstrap_ci(hard),
        "soft_coverage": _mean(soft), "soft_coverage_ci95": quality.bootstrap_ci(soft),
        "complete": _mean([float(c) for c in complete]),
        "cut_by_max_tokens": sum(s["finish_reason"] == "length" for s in sentences),
        "repeated_block": sum(repeated_block(s["text"]) for s in sentences),
        "word_lists": sum(comma_list(s["text"]) for s in sentences),
        "list_shaped": sum(list_shaped(s["text"], final=True) for s in sentences),
        "about_words": sum(about_words(s["text"], s["concepts"]) for s in sentences),
        "keyword_opening": sum(keyword_opening(s["text"], s["concepts"]) for s in sentences),
        "hard_coverage_complete": _mean([h * c for h, c in zip(hard, complete, strict=True)]),
        "nll": _mean(nlls),
        "nll_keyword_tokens": _pooled(sentences, "nll_keyword", lambda s: s["keyword_tokens"]),
        "nll_other_tokens": _pooled(sentences, "nll_other", lambda s: s.get("output_tokens", 0) - s["keyword_tokens"]),
        "real_words": _mean([s["real_words"] for s in sentences]),
        "repeated_keyword": _mean([float(max(s["counts"], default=0) > 1) for s in sentences]),
        "over_max_repeats": _mean([float(max(s["counts"], default=0) > max_repeats) for s in sentences]),
        "bleu": round(quality.bleu([s["text"] for s in sentences], [s["references"] for s in sentences]), 2)
        if any(s["references"] for s in sentences) else None,
        "rouge_l": round(quality.rouge_l([s["text"] for s in sentences], [s["references"] for s in sentences]), 4)
        if any(s["references"] for s in sentences) else None,
        "wall_s": round(sum(s["wall_s"] for s in sentences), 2),
        "target_passes": sum(s["target_passes"] for s in sentences),
        "target_positions": sum(s["target_positions"] for s in sentences),
        "draft_passes": sum(s["draft_passes"] for s in sentences),
    }


def _pooled(sentences: list[dict[str, Any]], key: str, weight: Any) -> float:
    """The token-weighted mean of a per-sentence mean ``key`` (NaN where no sentence has it)."""
    pairs = [(s[key], weight(s)) for s in sentences if key in s and not math.isnan(s[key]) and weight(s) > 0]
    total = sum(w for _, w in pairs)
    return round(sum(v * w for v, w in pairs) / total, 4) if total else math.nan


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else math.nan


def _report(rows: dict[str, list[dict[str, Any]]], states: dict[str, Counter],
            config: CommonGenConfig) -> dict[str, Any]:
    methods = {}
    for method, sentences in rows.items():
        methods[method] = method_metrics(sentences, config.max_repeats)
        methods[method]["states"] = {s: states[method].get(s, 0) for s in CDSL_STATES} if method == "cdsl" else {}
        methods[method]["sentences"] = sentences
    report: dict[str, Any] = {"methods": methods, "config": dict(vars(config))}
    if "cdsl" in methods and "cdlh" in methods and rows["cdsl"]:
        cdsl, cdlh = rows["cdsl"], rows["cdlh"]
        hard = [[float(len(s["covered"]) == len(s["concepts"])) for s in r] for r in (cdsl, cdlh)]
        report["speedup_cdsl_vs_cdlh"] = round(methods["cdlh"]["wall_s"] / max(methods["cdsl"]["wall_s"], 1e-9), 3)
        report["target_pass_ratio_cdlh_vs_cdsl"] = round(
            methods["cdlh"]["target_passes"] / max(methods["cdsl"]["target_passes"], 1), 3)
        report["cdsl_hard_coverage_vs_cdlh"] = round(
            methods["cdsl"]["hard_coverage"] / max(methods["cdlh"]["hard_coverage"], 1e-9), 3)
        report["cdsl_hard_coverage_vs_cdlh_ci95"] = quality.paired_ratio_ci(hard[0], hard[1])
    return report


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'method':8s} {'hard':>6s} {'hard 95% CI':>14s} {'soft':>6s} {'complete':>8s} {'nll':>6s} "
             f"{'real':>6s} {'>max':>5s} {'cut':>4s} {'loop':>4s} {'lists':>5s} {'about':>5s} {'opens':>5s} "
             f"{'bleu':>6s} {'rougeL':>6s} "
             f"{'wall s':>8s} {'passes':>7s} {'draft':>6s}"
             "  states"]
    for method, row in report["methods"].items():
        low, high = row["hard_coverage_ci95"]
        lines.append(f"{method:8s} {row['hard_coverage']:6.3f} {f'[{low:.3f}, {high:.3f}]':>14s} "
                     f"{row['soft_coverage']:6.3f} {row['complete']:8.3f} {row['nll']:6.3f} {row['real_words']:6.3f} "
                     f"{row['over_max_repeats']:5.3f} {row.get('cut_by_max_tokens', -1):4d} "
                     f"{row.get('repeated_block', -1):4d} {row.get('word_lists', -1):5d} "
                     f"{row.get('about_words', -1):5d} {row.get('keyword_opening', -1):5d} "
                     f"{row['bleu'] or 0:6.2f} {row['rouge_l'] or 0:6.3f} "
                     f"{row['wall_s']:8.1f} {row['target_passes']:7d} {row['draft_passes']:6d}  {row['states'] or ''}")
    lines.append("NLL per token on keyword tokens / the others: " + ", ".join(
        f"{method} {row.get('nll_keyword_tokens', math.nan):.3f} / {row.get('nll_other_tokens', math.nan):.3f}"
        for method, row in report["methods"].items()))
    for key in ("speedup_cdsl_vs_cdlh", "target_pass_ratio_cdlh_vs_cdsl", "cdsl_hard_coverage_vs_cdlh",
                "cdsl_hard_coverage_vs_cdlh_ci95"):
        if key in report:
            lines.append(f"{key}: {report[key]}")
    return "\n".join(lines)


def add_arguments(gen: argparse.ArgumentParser) -> None:
    """The CommonGen options; their defaults are ``CommonGenConfig``'s (chosen by the sweep in BENCHMARKS.md)."""
    c = CommonGenConfig()
    gen.add_argument("--data", required=True, help="CommonGen jsonl (concept_set per line)")
    gen.add_argument("--limit", type=int, default=c.limit, help=f"concept sets, a seeded sample (default {c.limit})")
    gen.add_argument("--seed", type=int, default=c.seed)
    gen.add_argument("--split", default=c.split, choices=["tune", "report", "all"],
                     help=f"concept sets by a hash of their text: tune on 'tune', report on 'report' "
                          f"(default {c.split})")
    gen.add_argument("--shard", default=c.shard,
                     help="I/N: every N-th sampled concept set from the I-th (merge: 'commongen-merge')")
    gen.add_argument("--sentence", default=c.sentence, choices=["words", "loose"],
                     help="hard constraint: a sentence of listed whole words, or the loose letters regex "
                          f"(default {c.sentence})")
    gen.add_argument("--word-list-size", type=int, default=c.word_list_size,
                     help=f"'words' sentence: the most frequent English words allowed (default {c.word_list_size})")
    gen.add_argument("--max-repeats", type=int, default=c.max_repeats,
                     help=f"reward: occurrences of a keyword beyond this count against it (default {c.max_repeats})")
    gen.add_argument("--cdsl-temperature", type=float, default=c.cdsl_temperature,
                     help="CDSL: 0 accepts by greedy matching, > 0 by speculative sampling at this temperature")
    gen.add_argument("--methods", default=",".join(c.methods), help="comma-separated: greedy, cdlh, cdsl")
    gen.add_argument("--max-tokens", type=int, default=c.max_tokens)
    gen.add_argument("--k", type=int, default=c.k, help=f"CDLH (and draft) candidates per step (default {c.k})")
    gen.add_argument("--d", type=int, default=c.d, help=f"CDLH roll-out length (default {c.d})")
    gen.add_argument("--lam", type=float, default=c.lam, help=f"CDLH reward weight (default {c.lam})")
    gen.add_argument("--optimism", type=float, default=c.optimism,
                     help=f"credit for unfinished roll-outs' unmet reward, in [0, 1] (default {c.optimism})")
    gen.add_argument("--cdsl-d", type=int, default=c.cdsl_d, help=f"CDSL lookahead length (default {c.cdsl_d})")
    gen.add_argument("--a-t", type=float, default=c.acceptance_threshold,
                     help=f"CDSL acceptance threshold in [0, 1] (default {c.acceptance_threshold})")
    gen.add_argument("--r-t", type=float, default=c.reward_threshold,
                     help=f"CDSL reward threshold in [0, 1] (default {c.reward_threshold})")
    gen.add_argument("--fallback", default=c.fallback, choices=["cdlh", "target"])
    gen.add_argument("--reward-on", default=c.reward_on, choices=["text", "ending"],
                     help=f"CDSL: score every lookahead, or only those that end the output (default {c.reward_on})")
    gen.add_argument("--commit", default=c.commit, choices=["lookahead", "steered", "prefix"],
                     help="CDSL accept: the whole lookahead, its agreed and reward-chosen tokens, or its agreed "
                          f"prefix (default {c.commit})")
    gen.add_argument("--steer-ratio", type=float, default=c.steer_ratio,
                     help="CDSL steered commit: keep a reward-chosen token only where the target gives it at least "
                          f"this share of its first choice's probability (default {c.steer_ratio})")
    gen.add_argument("--draft", default=c.draft, help=f"CDSL draft: bf16, int8 or layers:N (default {c.draft})")
    gen.add_argument("--draft-lam", type=float, default=c.draft_lam,
                     help=f"CDSL draft: reward weight among its candidates, 0 = plain greedy (default {c.draft_lam})")
    gen.add_argument("--no-loop-guard", dest="loop_guard", action="store_false",
                     help="CDLH and CDSL: let a sentence write a block a third time in a row")
    gen.add_argument("--no-word-guard", dest="word_guard", action="store_false",
                     help="CDLH and CDSL: guard against repeated blocks of tokens only, not of words")
    gen.add_argument("--talk-about-words", dest="talk", action="store_true",
                     help="with --no-lists: let text about the words ('... are all words that ...') earn reward")
    gen.add_argument("--no-list-guard", dest="list_guard", action="store_false",
                     help="CDSL: with --no-lists, let the draft, the target and the fallback's candidates and "
                          "roll-outs write the comma or stop that makes a list")
    gen.add_argument("--stop-below", type=float, default=c.stop_below,
                     help=f"CDSL draft: end a lookahead after an unsure own token (default p < {c.stop_below})")
    gen.add_argument("--no-suggest", dest="suggest", action="store_false",
                     help="CDSL draft: weigh only its own top-k, not the reward's suggested words")
    gen.add_argument("--no-lists", action="store_true",
                     help="reward: a list of the words instead of a sentence scores 0 (KeywordCoverage(no_lists=True))")
    gen.add_argument("--hold-ending", type=int, default=0, metavar="N",
                     help="reward: a sentence of fewer than N words does not end while a word is missing, CDLH "
                          "guarded too (generate(keywords=...) holds 20; default 0: off)")
    gen.add_argument("--json", dest="json_out")
    gen.add_argument("--no-progress", action="store_true")


def config_from(args: argparse.Namespace) -> CommonGenConfig:
    """The ``CommonGenConfig`` the options in ``args`` describe."""
    return CommonGenConfig(
        limit=args.limit, seed=args.seed, split=args.split, shard=args.shard, sentence=args.sentence,
        word_list_size=args.word_list_size, max_repeats=args.max_repeats,
        cdsl_temperature=args.cdsl_temperature, methods=tuple(args.methods.split(",")), max_tokens=args.max_tokens,
        k=args.k, d=args.d, lam=args.lam, optimism=args.optimism, cdsl_d=args.cdsl_d,
        acceptance_threshold=args.a_t, reward_threshold=args.r_t, fallback=args.fallback,
        reward_on=args.reward_on, commit=args.commit, steer_ratio=args.steer_ratio, draft=args.draft,
        draft_lam=args.draft_lam, suggest=args.suggest, stop_below=args.stop_below, loop_guard=args.loop_guard,
        word_guard=args.word_guard, no_lists=args.no_lists, list_guard=args.list_guard,
        talk=args.talk, hold_ending=args.hold_ending,
    )


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print the table, write the report (also a checkpoint as it goes)."""
    report = run_commongen(args.data, config_from(args), progress=not args.no_progress, checkpoint=args.json_out)
    report["summary"] = {}
    return write_report(report, format_table(report), args)

