"""The main job: extract JSON for a schema from a passage with the embedded default model.

Loads SmolLM2-135M-Instruct (dequantised from its GGUF file once, then cached) into a
``Generator`` (the batched engine on the ragged runner, the path ``serve`` takes too), compiles
the JSON Schema in ``examples/schemas/person.json``, and decodes twice under it: target-only and
speculative (the grammar's forced tokens plus prompt lookup as the draft). Prints the value,
whether the two outputs are identical (they must be), and the counters. Run with ``make demo``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import cdsl_struct as cs
from cdsl_struct.models.loading import load_model

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
    generator = cs.Generator(loaded, draft="lookup", k=6)
    try:
        compiled = generator.compile(cs.JsonSchema(schema))
        print(f"schema     {SCHEMA_FILE.name} compiled by {compiled.backend} in "
              f"{1e3 * compiled.compile_seconds:.0f} ms")
        request = f"Extract the person as JSON with keys {', '.join(schema['properties'])}.\n\n{PASSAGE}"
        plain = generator.generate(request, schema=schema, method="target", max_tokens=128)
        fast = generator.generate(request, schema=schema, method="speculative", max_tokens=128)
        # a padded runner prefills in a target pass of its own; the ragged one within the first step
        prefill_passes = 0 if generator.load().ragged_runner else 1
    finally:
        generator.close()
    print(f"value      {fast.value}")
    print(f"finish     {fast.finish_reason} (complete: {fast.complete}); identical to target-only: "
          f"{fast.tokens == plain.tokens}")
    for name, result in (("target", plain), ("speculative", fast)):
        stats = result.stats
        per_token = (stats.target_passes - prefill_passes) / max(stats.tokens, 1)
        print(f"{name:12s}{stats.tokens} tokens, {stats.target_passes} target passes "
              f"({per_token:.2f} per token), accepted {stats.accepted}/{stats.proposed} "
              f"proposed ({stats.forced} forced), decode {stats.decode_seconds:.2f}s")
    return 0 if fast.complete and fast.tokens == plain.tokens else 1


if __name__ == "__main__":
    sys.exit(main())
