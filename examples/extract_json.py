"""The main job: extract JSON for a schema from a passage with the embedded default model.

Loads SmolLM2-135M-Instruct (dequantised from its GGUF file once, then cached), compiles the
JSON Schema in ``examples/schemas/person.json``, and decodes twice under it: target-only and
speculative (the grammar's forced tokens plus prompt lookup as the draft). Prints the value,
whether the two outputs are identical (they must be), and the counters. Run with ``make demo``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import cdsl_struct as cs
from cdsl_struct.decoding import build_proposers, decode
from cdsl_struct.models.loading import load_model
from cdsl_struct.models.runner import ModelRunner

SCHEMA_FILE = Path(__file__).parent / "schemas" / "person.json"
PASSAGE = (
    "Ada Lovelace was 36 years old when she died. She wrote in English and French, "
    "and could be reached at ada@analytical-engine.org."
)


def main() -> int:
    start = time.perf_counter()
    loaded = load_model("smollm2")
    print(f"model      {loaded.name} loaded in {time.perf_counter() - start:.1f}s")
    schema = json.loads(SCHEMA_FILE.read_text())
    compiled = cs.compile(cs.JsonSchema(schema), loaded.tokenizer, eos_token_ids=loaded.eos_token_ids)
    print(f"schema     {SCHEMA_FILE.name} compiled by {compiled.backend} in {1e3 * compiled.compile_seconds:.0f} ms")
    request = f"Extract the person as JSON with keys {', '.join(schema['properties'])}.\n\n{PASSAGE}"
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": request}],
        add_generation_prompt=True, tokenize=True,
    )["input_ids"]

    runner = ModelRunner(loaded.model)
    plain = decode(runner, compiled, prompt, max_tokens=128)
    fast = decode(runner, compiled, prompt, proposers=build_proposers("lookup", loaded.model), k=6, max_tokens=128)
    print(f"value      {fast.value}")
    print(f"finish     {fast.finish_reason} (complete: {fast.complete}); identical to target-only: "
          f"{fast.tokens == plain.tokens}")
    for name, result in (("target", plain), ("speculative", fast)):
        stats = result.stats
        print(f"{name:12s}{stats.tokens} tokens, {stats.target_passes} target passes "
              f"({stats.target_passes_per_token:.2f} per token), accepted {stats.accepted}/{stats.proposed} "
              f"proposed ({stats.forced} forced), decode {stats.decode_seconds:.2f}s")
    return 0 if fast.complete and fast.tokens == plain.tokens else 1


if __name__ == "__main__":
    sys.exit(main())
