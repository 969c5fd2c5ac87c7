"""Engine host time per step, this checkout against another commit, side by side in one run.

    python benchmarks/engine_ab.py --base 00ab479 --rows 1,16,64 --rounds 3

Checks ``--base`` out into a temporary git worktree and runs the same measurement in a fresh
process per (tree, rows, round), alternating the trees: ``rows`` JSON requests (SmolLM2's
tokenizer, the person schema of ``cdsl_struct.bench.serving``) at once on a 1-layer, 64-wide
Llama with SmolLM2's whole vocabulary, draft off, greedy, one torch thread (``--threads``).
``--free``: the same prompts as free text (``Regex("[\\s\\S]*")``, what a request without a
constraint decodes under) instead. ``--mask-workers 0`` fills masks on the engine's thread after the
forward, so host time counts all of the host's work (on a GPU it cannot hide behind a CPU forward).
Per step after the prefilling one: wall time and the engine's own forward time
(``EngineStats.forward_seconds``, in both trees); host = wall - forward. Only names both trees
have are used, so the base may be any commit since the ragged runner landed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = r'''
import json, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
from cdsl_struct.bench.serving import PERSON_SCHEMA, prompts
from cdsl_struct.constraints import JsonSchema, Regex, compile
from cdsl_struct.decoding import BatchEngine, Request
from cdsl_struct.models import batch_runner, load_tokenizer
from cdsl_struct.prompts import prompt_ids
rows, max_tokens, threads, free, workers = (int(a) for a in sys.argv[1:6])
torch.set_num_threads(threads)
tokenizer = load_tokenizer("smollm2")
torch.manual_seed(0)
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
model = LlamaForCausalLM(config).eval()
spec = Regex(r"[\s\S]*") if free else JsonSchema(PERSON_SCHEMA)
compiled = compile(spec, tokenizer, eos_token_ids=[tokenizer.eos_token_id])
def run(count, tokens):
    engine = BatchEngine(batch_runner(model, pad_token_id=0), max_batch_size=count, kv_budget_bytes=float("inf"),
                         mask_workers=workers)
    running = [engine.submit(Request(tuple(prompt_ids(tokenizer, p)), compiled, max_tokens=tokens, loop_guard=True))
               for p in prompts(count)]
    engine.step()
    steps, forward, start = engine.stats.steps, engine.stats.forward_seconds, time.perf_counter()
    while not all(r.done for r in running):
        engine.step()
    wall = time.perf_counter() - start
    count = engine.stats.steps - steps
    out = {"steps": count, "backend": compiled.backend, "wall_ms": 1000 * wall / count,
           "forward_ms": 1000 * (engine.stats.forward_seconds - forward) / count}
    engine.close()
    return out
run(2, 4)
import cdsl_struct
print(json.dumps({**run(rows, max_tokens), "package": cdsl_struct.__file__}))
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (e.g. 00ab479)")
    parser.add_argument("--rows", default="1,16,64")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--free", action="store_true", help="free text instead of JSON")
    parser.add_argument("--mask-workers", type=int, default=2, help="the engine's mask threads (0: none)")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdsl-ab-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base], check=True,
                       capture_output=True)
        try:
            results = _compare({"base": base, "head": ROOT}, args)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    print(f"{'rows':>5} {'tree':>5} {'wall ms':>9} {'forward ms':>11} {'host ms':>9}")
    for rows, trees in results.items():
        for tree, runs in trees.items():
            wall = statistics.median(r["wall_ms"] for r in runs)
            forward = statistics.median(r["forward_ms"] for r in runs)
            host = statistics.median(r["wall_ms"] - r["forward_ms"] for r in runs)
            print(f"{rows:>5} {tree:>5} {wall:9.2f} {forward:11.2f} {host:9.2f}")
        base_host = statistics.median(r["wall_ms"] - r["forward_ms"] for r in trees["base"])
        head_host = statistics.median(r["wall_ms"] - r["forward_ms"] for r in trees["head"])
        print(f"{rows:>5} host time base/head: {base_host / head_host:.2f}x")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


def _compare(trees: dict[str, Path], args: argparse.Namespace) -> dict[int, dict[str, list[dict]]]:
    results: dict[int, dict[str, list[dict]]] = {}
    for rows in (int(r) for r in args.rows.split(",")):
        results[rows] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                proc = subprocess.run([sys.executable, "-c", MEASURE, str(rows), str(args.max_tokens),
                                       str(args.threads), str(int(args.free)),
                                       str(args.mask_workers)], env=env, cwd=tree, capture_output=True, text=True,
                                      check=True)
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                if not result["package"].startswith(str(tree)):
                    raise RuntimeError(f"the {name} run imported {result['package']}, not the tree at {tree}")
                results[rows][name].append(result)
    return results


if __name__ == "__main__":
    sys.exit(main())
