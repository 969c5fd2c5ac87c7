"""``python -m benchmarks draft-agreement``: how often a draft's argmax is the target's, teacher-forced.

CDSL's wall and passes move by 10-15% on 100 CommonGen sets when a draft's arithmetic changes by
one rounding (docs/benchmarks/2026-11-28-cpu-bf16-draft.md): its trajectories fork. Agreement does
not fork. Every sentence of a CommonGen report (``--sentences``, one method's) is fed after its
prompt to the target and to the draft, in one forward each, and at every position of the
sentence the two argmaxes are compared. The sentence is re-tokenised from its text, so its tokens
may differ from the ones first sampled where a text has several tokenisations.

``CDSL_INT8_BITS=7`` keeps the int8 draft's activations on 7 bits where 8 would be exact: run
the harness with and without it to compare the two. ``--draft-path`` feeds the draft as the engine
does: ``runner`` through a ``RaggedRunner`` (the int8 draft's own step), ``shared-header`` the same
with the chat template's header prefilled once in a pass of its own and copied into each row
(``RaggedRunner.share_prefix``); the default, ``forward``, calls the model's own forward.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from cdsl_struct.bench import write_report
from cdsl_struct.models import Feed, RaggedRunner, load_model, self_draft
from cdsl_struct.prompts import chat_header

from .commongen import PROMPT


def sentence_ids(tokenizer: Any, sentence: dict[str, Any]) -> tuple[list[int], list[int]]:
    """A report sentence's prompt (CommonGen's, with its concepts' words) and its text's tokens."""
    words = ", ".join(concept.split("_")[0] for concept in sentence["concepts"])
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT.format(words=words)}],
                                           add_generation_prompt=True, tokenize=True)["input_ids"]
    return list(prompt), tokenizer(sentence["text"], add_special_tokens=False)["input_ids"]


@torch.inference_mode()
def argmaxes(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The model's argmax at each position of ``tokens`` after ``prompt`` (teacher-forced)."""
    ids = torch.tensor([prompt + tokens], device=getattr(model, "device", "cpu"))
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:len(prompt) + len(tokens) - 1]
    return logits.float().argmax(-1).cpu()


def runner_argmaxes(runner: RaggedRunner, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """``argmaxes`` through ``runner``: the sentence after its prompt fed as one new row, released after."""
    logits = runner.run([Feed("sentence", prompt + tokens[:-1], len(tokens))])[0]
    runner.release("sentence")
    return logits.float().argmax(-1).cpu()


DRAFT_PATHS = ("forward", "runner", "shared-header")


def run_agreement(sentences: list[dict[str, Any]], model: str = "smollm2", draft: str = "int8",
                  draft_path: str = "forward") -> dict[str, Any]:
    """Agreement of ``draft`` (a ``self_draft`` kind, fed by ``draft_path``) with ``model`` over
    ``sentences``; the report."""
    loaded = load_model(model)
    drafted = self_draft(loaded.model, draft)
    if draft_path == "forward":
        draft_argmaxes = lambda prompt, tokens: argmaxes(drafted, prompt, tokens)  # noqa: E731
    else:
        runner = RaggedRunner(drafted, prefix_cache_bytes=0)
        if draft_path == "shared-header":
            runner.share_prefix(chat_header(loaded.tokenizer))
        draft_argmaxes = lambda prompt, tokens: runner_argmaxes(runner, prompt, tokens)  # noqa: E731
    rows, agreed, total = [], 0, 0
    for sentence in sentences:
        prompt, tokens = sentence_ids(loaded.tokenizer, sentence)
        if not tokens:
            continue
        same = int((argmaxes(loaded.model, prompt, tokens) == draft_argmaxes(prompt, tokens)).sum())
        rows.append({"text": sentence["text"], "tokens": len(tokens), "agreed": same})
        agreed, total = agreed + same, total + len(tokens)
    summary = {"sentences": len(rows), "tokens": total, "agreement": round(agreed / max(total, 1), 4),
               "model": model, "draft": draft, "draft_path": draft_path}
    return {"summary": summary, "sentences": rows}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m benchmarks draft-agreement``'s options."""
    parser.add_argument("--sentences", required=True, help="a CommonGen report (JSON) whose sentences to feed")
    parser.add_argument("--method", default="cdsl", help="whose sentences in it (default cdsl)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--draft", default="int8", help="the self-draft: int8, bf16 or layers:N (default int8)")
    parser.add_argument("--draft-path", default="forward", choices=DRAFT_PATHS,
                        help="how the draft is fed (module docstring; default forward)")
    parser.add_argument("--json", dest="json_out", help="write the report here")


def run(args: argparse.Namespace) -> int:
    """Run the bench as ``args`` say; print its line, write the report."""
    report = json.loads(Path(args.sentences).read_text(encoding="utf-8"))
    result = run_agreement(report["methods"][args.method]["sentences"], args.model, args.draft, args.draft_path)
    s = result["summary"]
    line = f"{args.draft} draft against {args.model}: agreement {s['agreement']} over {s['tokens']} tokens " \
           f"of {s['sentences']} sentences"
    return write_report(result, line, args)
