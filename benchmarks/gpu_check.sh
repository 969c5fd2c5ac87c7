#!/usr/bin/env bash
# One bounded pass of the GPU checks (issues 38, 53), run on a lent GPU machine through the recipe in
# ../shared/gpu/README.md:  bash .gpu/run.sh bash benchmarks/gpu_check.sh
# Each step has its own time limit and appends its log to $OUT/steps.log (at most 8 files come back
# from a device call), so a step that runs long costs only itself; the most wanted figures come
# first, for a call that runs out of device time. About 8 minutes on an H100; SPECULATIVE=1 adds the
# speculative bench in float32 and bfloat16, OVERHEAD=1 the host-time bench, FUSED=1 the graph runner with
# its steps compiled by inductor against without, BUDGET=1 budget closing
# on the card; ONLY="throughput tests" runs only the steps named.
set -u
OUT="${OUT:-/tmp/gpu_out}"; mkdir -p "$OUT"
CLI="python3 -m cdsl_struct.cli"
LAB="python3 -m benchmarks"  # the research harnesses, from the repository root
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  local started=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout "$limit" "$@" >/tmp/step.log 2>&1
  local rc=$?
  { echo "== $name: rc=$rc in $((SECONDS - started))s"; cat /tmp/step.log; } >>"$OUT/steps.log"
  echo "rc=$rc in $((SECONDS - started))s"; grep -v "it/s]" /tmp/step.log | tail -n 14
}
# the static-shape runner (issue 53): capture, replay check, the engine with the batch kept full, and
# transformers' static-cache compiled generate in the same process; free and no-draft runs also with every
# step waiting for the read of the one before (`*_in_turn`: steps launched ahead against none)
step graphs 300 $LAB graphs --device cuda --rows 64 --requests 512 --max-tokens 96 --check-steps 8 \
  --one-row-requests 6 --ragged-requests 48 --profile mix_served --json "$OUT/graphs.json"
# the same with each bucket's step compiled by inductor before its capture (FUSED=1; issue 53): how long
# the compiles take at start and what fusing buys a step, 8 rows so that 88 buckets compile, not 168
if [ -n "${FUSED:-}" ]; then
  step fused 300 env CDSL_FUSE_STEPS=inductor $LAB graphs --device cuda --rows 8 --requests 64 --max-tokens 96 \
    --check-steps 8 --one-row-requests 6 --ragged-requests 0 --no-hf --json "$OUT/graphs_fused.json"
  step unfused 200 $LAB graphs --device cuda --rows 8 --requests 64 --max-tokens 96 \
    --check-steps 8 --one-row-requests 6 --ragged-requests 0 --no-hf --json "$OUT/graphs_unfused.json"
fi
step cudatests 90 python3 -m pytest -q -p no:cacheprovider tests/runners/test_cuda.py
step throughput 150 $LAB throughput --device cuda --batch 1,16,64 --requests 64 --max-tokens 48 --no-hf --no-hf-static \
  --json "$OUT/throughput.json"
# the server on the GPU, 64 clients at once (and a few one at a time)
if [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" serve64 "* ]]; then
$CLI serve --device cuda --port 8011 --max-batch-size 64 >"$OUT/server.log" 2>&1 &
server=$!
up() { python3 -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:8011/health').status_code != 200)" 2>/dev/null; }
for _ in $(seq 150); do up && break; sleep 1; done  # the graph runner captures its buckets first (~40 s)
step serve64 60 $CLI bench serve --url http://127.0.0.1:8011/v1 --requests 256 --concurrency 64 --max-tokens 96 \
  --json "$OUT/serve64.json"
step serve1 30 $CLI bench serve --url http://127.0.0.1:8011/v1 --requests 6 --concurrency 1 --max-tokens 48 \
  --json "$OUT/serve1.json"
python3 -c "import httpx; print(httpx.get('http://127.0.0.1:8011/metrics').text)" >"$OUT/metrics.txt" 2>&1
kill "$server"; wait "$server" 2>/dev/null
fi
step tests 120 python3 -m pytest -q -p no:cacheprovider tests/models/test_compat.py \
  tests/decoding/test_strings.py::test_the_move_on_a_gpu_equals_the_cpus_and_never_waits_for_it \
  tests/models/test_device.py tests/decoding/test_host_reads.py
# what a structural tag and the budget check cost per token at 16 rows, beside plain JSON (issues 39, 40)
step feature 240 $LAB feature-cost --device cuda --rounds 4 --rows 16 --requests 48 --max-tokens 96 \
  --warm-rounds 1 --settings json,json+close,stream+partials,tag,text --json "$OUT/feature_cost.json"
if [ -n "${OVERHEAD:-}" ]; then
  step overhead 70 $CLI bench overhead --device cuda --rows 1,16,64,256 --threads 0 --json "$OUT/overhead.json"
fi
if [ -n "${SPECULATIVE:-}" ]; then
  step speculative_fp32 120 $LAB speculative --device cuda --dtype float32 --no-hf --repeat 1 \
    --json "$OUT/spec_fp32.json" --no-progress
  step speculative_bf16 120 $LAB speculative --device cuda --dtype bfloat16 --no-hf --repeat 1 \
    --json "$OUT/spec_bf16.json" --no-progress
fi
if [ -n "${BUDGET:-}" ]; then
  step budget 150 python3 -m benchmarks.budget_close --device cuda --split report --cases 28 --json "$OUT/budget_close.json"
fi
echo "done in ${SECONDS}s"
