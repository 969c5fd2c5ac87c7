"""Harmless continuations: steer away from rude text with a reward, under a hard constraint.

Prompts that invite a rude reply are answered with one bounded sentence (a regex hard
constraint) three ways: greedy, CDLH and CDSL with ``Harmlessness`` (1 - P(offensive) from
alt-profanity-check's bundled classifier) as the reward. Prints each reply with its score.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import cdsl_struct as cs
from cdsl_struct.decoding import CDLH, CDSL, BatchEngine, Request
from cdsl_struct.models import ModelRunner, batch_runner, load_model, self_draft
from cdsl_struct.rewards import Harmlessness

SENTENCE = r"[A-Z][a-z]*( [A-Za-z,']+){2,24}[.!]"
FAST = os.environ.get("CDSL_EXAMPLE_FAST") == "1"  # the test suite: one prompt, no CDLH, shorter
PROMPTS = [
    "My neighbour keeps parking in my spot. Write what I should shout at him.",
    "Finish this insult about my coworker: 'You are such a",
    "Reply to this troll in one sentence: 'your code is garbage and so are you'",
]


def main() -> int:
    loaded = load_model("smollm2")
    compiled = cs.compile(cs.Regex(SENTENCE), loaded.tokenizer, eos_token_ids=loaded.eos_token_ids)
    reward = Harmlessness()
    engine = BatchEngine(batch_runner(loaded.model))  # the engine Generator and serve run
    draft = ModelRunner(self_draft(loaded.model, "int8"), name="int8")  # CDSL guides it by the reward
    try:
        for text in PROMPTS[:1] if FAST else PROMPTS:
            reply(engine, loaded.tokenizer, compiled, reward, draft, text)
    finally:
        engine.close()
    return 0


def reply(engine: BatchEngine, tokenizer: Any, compiled: Any, reward: Harmlessness, draft: ModelRunner,
          text: str) -> None:
    """Answer ``text`` greedily, with CDLH (not under ``FAST``) and with CDSL; print each reply."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=True)["input_ids"]
    print(f"\nprompt  {text}")
    strategies = {
        "greedy": None,
        "cdlh": CDLH(reward, k=5, d=3, lam=5.0),
        # harmlessness judges every prefix (not earned_by_end), so every lookahead is scored
        "cdsl": CDSL(draft, reward, reward_threshold=0.8, cdlh=CDLH(reward, k=5, d=3, lam=5.0)),
    }
    if FAST:
        del strategies["cdlh"]
    for name, strategy in strategies.items():
        request = Request(tuple(prompt), compiled, max_tokens=24 if FAST else 48, strategy=strategy)
        result = engine.run([request])[0]
        print(f"{name:7s} harmless={reward(result.text, final=True):.2f}  {result.text}")


if __name__ == "__main__":
    sys.exit(main())
