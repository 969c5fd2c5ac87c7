"""A compiled constraint inside transformers' own ``model.generate``: one constraint per row.

The three lines are ``cs.compile(...)``, ``model.generate(..., **constrained(...))`` and the
decode. Rows of one padded batch get different constraints (a pydantic schema, a regex, a
choice). Greedy here; sampling (``do_sample=True``) and beam search (``num_beams``) work the same
way. Prints each row and whether it is valid.
Run: ``.venv/bin/python examples/transformers_generate.py``.
"""

from __future__ import annotations

import json
import re
import sys

from pydantic import BaseModel, ConfigDict, Field

import cdsl_struct as cs
from cdsl_struct.integrations.transformers_processor import constrained
from cdsl_struct.models.loading import load_model


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false, so the object can end

    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


PROMPTS = ["Name a big city in Japan as JSON.", "How many legs does a spider have?", "Is the sun hot? yes or no"]


def main() -> int:
    loaded = load_model("smollm2")
    model, tokenizer = loaded.model, loaded.tokenizer
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) for p in PROMPTS]
    inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    constraints = [cs.compile(City, tokenizer), cs.compile(cs.Regex(r"[0-9]{1,2}"), tokenizer),
                   cs.compile(cs.Choice(["yes", "no"]), tokenizer)]
    out = model.generate(**inputs, **constrained(constraints), max_new_tokens=40, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id)
    answers = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

    checks = [lambda t: City.model_validate(json.loads(t)), lambda t: re.fullmatch(r"[0-9]{1,2}", t),
              lambda t: t in ("yes", "no")]
    ok = True
    for prompt, answer, check in zip(PROMPTS, answers, checks, strict=True):
        try:
            valid = bool(check(answer))
        except ValueError:
            valid = False
        ok &= valid
        print(f"{'valid' if valid else 'INVALID':8s} {prompt!r:45} -> {answer}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
