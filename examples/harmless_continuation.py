"""Harmless continuations: steer away from rude text with a reward, under a hard constraint.

Prompts that invite a rude reply are answered with one bounded sentence (a regex hard
constraint) three ways: greedy, CDLH and CDSL with ``Harmlessness`` (1 - P(offensive) from
alt-profanity-check's bundled classifier) as the reward. Prints each reply with its score.
"""

from __future__ import annotations

import os
import sys

import cdsl_struct as cs
from cdsl_struct.decoding import decode
from cdsl_struct.decoding.lookahead import CDLH, CDSL
from cdsl_struct.models.loading import load_model
from cdsl_struct.models.runner import ModelRunner, self_draft
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
    target = ModelRunner(loaded.model)
    draft = ModelRunner(self_draft(loaded.model, "int8"), name="int8")  # CDSL guides it by the reward
    for text in PROMPTS[:1] if FAST else PROMPTS:
        prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                      add_generation_prompt=True, tokenize=True)["input_ids"]
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
            result = decode(target, compiled, prompt, max_tokens=24 if FAST else 48, strategy=strategy)
            print(f"{name:7s} harmless={reward(result.text, final=True):.2f}  {result.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
