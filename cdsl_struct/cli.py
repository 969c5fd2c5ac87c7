"""``cdsl-struct`` command line: ``generate``, ``batch``, ``serve``, ``bench`` harnesses, ``models``, ``tokenizers``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .bulk.cli import add_batch_parser, run_batch
from .generate_cli import add_generate_parser, run_generate
from .options import BACKENDS
from .server.cli import add_serve_parser, run_serve


def main(argv: list[str] | None = None) -> int:
    """Run ``cdsl-struct`` with ``argv`` (default: the process's arguments); the exit code."""
    parser = argparse.ArgumentParser(prog="cdsl-struct", description="Structured output for Hugging Face LMs.")
    commands = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(commands)
    add_batch_parser(commands)
    _add_bench_parsers(commands)

    models = commands.add_parser("models", help="fetch and prepare models, or list them")
    models.add_argument("action", choices=["pull", "list"])
    models.add_argument("names", nargs="*", help="models to pull (default: smollm2)")

    tokenizers = commands.add_parser("tokenizers", help="fetch or list the named test tokenizers")
    tokenizers.add_argument("action", choices=["fetch", "list"])
    tokenizers.add_argument("names", nargs="*", help="names to fetch (default: all)")
    tokenizers.add_argument("--engines", action="store_true",
                            help="also time building each engine's view of the vocabulary")

    add_serve_parser(commands)

    args = parser.parse_args(argv)
    handler = _HANDLERS.get((args.command, getattr(args, "bench", None)))
    if handler is None:
        parser.error("unknown command")
    return handler(args)


def _add_bench_parsers(commands: Any) -> None:
    """``cdsl-struct bench ...``: the argument tables of every harness."""
    bench = commands.add_parser("bench", help="run a benchmark harness").add_subparsers(dest="bench", required=True)
    mask = bench.add_parser("maskbench", help="JSONSchemaBench/MaskBench: compile + mask correctness and speed")
    mask.add_argument("--data", required=True, help="a .jsonl(.gz) file or a folder of them")
    mask.add_argument("--tokenizer", default="llama3", help="tokenizer name, path or HF id (default llama3)")
    mask.add_argument("--backend", default="auto", choices=BACKENDS)
    mask.add_argument("--limit", type=int, default=None, help="sample this many cases across all files")
    mask.add_argument("--seed", type=int, default=0, help="seed of the --limit sample")
    mask.add_argument("--timeout", type=float, default=30.0, help="compile time budget per case, seconds")
    mask.add_argument("--tests-timeout", type=float, default=120.0, help="time budget for a case's tests")
    mask.add_argument("--memory-mb", type=int, default=3000, help="worker memory budget, MB")
    mask.add_argument("--json", dest="json_out", help="write summary and per-case results here")
    mask.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    spec = bench.add_parser("speculative", help="constrained speculative decoding vs target-only and HF baselines")
    spec.add_argument("--draft", default="lookup",
                      help="draft source: lookup, bf16, layers:N, none, or a combination like lookup+bf16")
    spec.add_argument("--k", type=int, default=6, help="tokens proposed per step (default 6)")
    spec.add_argument("--max-tokens", type=int, default=96)
    spec.add_argument("--repeat", type=int, default=1, help="rounds over all tasks (interleaved)")
    spec.add_argument("--prompts", help="JSON lines {prompt, schema|regex|grammar}; default: built-in tasks")
    spec.add_argument("--model", default="smollm2", help="target model (default: the embedded SmolLM2)")
    spec.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    spec.add_argument("--dtype", default="auto", help="auto, float32 or bfloat16 (float32: batch-invariant checks)")
    spec.add_argument("--no-hf", action="store_true", help="skip the transformers baselines (c) and (d)")
    spec.add_argument("--json", dest="json_out", help="write runs and summary here")
    spec.add_argument("--no-progress", action="store_true")

    ovh = bench.add_parser("overhead", help="the engine's host time per step, by phase, with a near-zero-cost model")
    ovh.add_argument("--rows", default="1,16,64,256", help="comma-separated rows decoding at once")
    ovh.add_argument("--max-tokens", type=int, default=32)
    ovh.add_argument("--tokenizer", default="smollm2", help="whose vocabulary the model has (default smollm2)")
    ovh.add_argument("--threads", type=int, default=1, help="torch threads (0: leave torch's default)")
    ovh.add_argument("--mask-workers", type=int, default=2, help="the engine's mask threads (default 2)")
    ovh.add_argument("--neighbour", action="store_true", help="also run each size beside a process busy on one core")
    ovh.add_argument("--device", default="cpu", help="where the near-zero model runs: cpu, cuda, cuda:N or mps")
    ovh.add_argument("--json", dest="json_out", help="write the report here")

    thr = bench.add_parser("throughput", help="batched engine: tokens/s, latency and batch invariance by batch size")
    thr.add_argument("--batch", default="1,4,8,16", help="comma-separated batch sizes (1 is always run, first)")
    thr.add_argument("--requests", type=int, default=32, help="requests in the mixed workload (default 32)")
    thr.add_argument("--max-tokens", type=int, default=64)
    thr.add_argument("--k", type=int, default=6, help="tokens proposed per step by the prompt-lookup rows")
    thr.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); HF stays greedy")
    thr.add_argument("--model", default="smollm2", help="target model (default: the embedded SmolLM2)")
    thr.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    thr.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    thr.add_argument("--hf-requests", type=int, default=16, help="HF baseline over the first N requests")
    thr.add_argument("--no-hf", action="store_true", help="skip the transformers generate baseline")
    thr.add_argument("--no-unconstrained", action="store_true", help="skip the unconstrained run")
    thr.add_argument("--json", dest="json_out", help="write config, per-request rows and summary here")
    thr.add_argument("--no-progress", action="store_true")

    served = bench.add_parser("serve", help="json_schema chat requests against any OpenAI-compatible server")
    served.add_argument("--url", "--base-url", default="http://127.0.0.1:8000/v1", help="the server's base URL")
    served.add_argument("--mix", action="store_true",
                        help="a mixed load (json_schema, tools, plain, streaming, disconnecting clients, malformed "
                             "requests) from --clients threads, against the same requests one at a time")
    served.add_argument("--clients", type=int, default=32, help="--mix: concurrent clients (default 32)")
    served.add_argument("--serial-requests", type=int, default=40,
                        help="--mix: well-formed requests sent one at a time for the baseline (default 40)")
    served.add_argument("--model", default="smollm2", help="model name the server serves (default smollm2)")
    served.add_argument("--requests", type=int, default=16,
                        help="requests per concurrency level, or of the --mix load (default 16)")
    served.add_argument("--concurrency", default="1,16", help="comma-separated levels (default 1,16)")
    served.add_argument("--max-tokens", type=int, default=60)
    served.add_argument("--tokenizer", default="smollm2", help="re-tokenises the answers for a fair token count")
    served.add_argument("--label", default="", help="name of the server in the table")
    served.add_argument("--json", dest="json_out", help="write rows and summary here")
    served.add_argument("--against", metavar="URL", default=None,
                        help="also send the same requests to this OpenAI-compatible server (e.g. vLLM), "
                             "alternating with --url round by round, and report the side-by-side ratio")
    served.add_argument("--against-model", default=None, help="--against: the model name it serves (default --model)")
    served.add_argument("--against-label", default="", help="--against: its name in the table")
    served.add_argument("--rounds", type=int, default=2,
                        help="--against: rounds of both servers, order flipped each round (default 2)")

    soak = bench.add_parser("soak", help="many clients for many minutes mixing well-formed, hostile and "
                                         "disconnecting requests: exactly-once answers, no 5xx, flat memory")
    soak.add_argument("--minutes", type=float, default=10.0, help="length of the load (default 10)")
    soak.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    soak.add_argument("--url", default=None, help="soak this running server (default: start cdsl-struct serve)")
    soak.add_argument("--pid", type=int, default=None, help="--url: the server's process, for its resource figures")
    soak.add_argument("--model", default="smollm2", help="model of the server started here (default smollm2)")
    soak.add_argument("--server-arg", action="append", default=[],
                      help="an argument for the server started here (repeatable, e.g. --server-arg=--max-batch-size=8)")
    soak.add_argument("--sample-s", type=float, default=5.0, help="seconds between resource samples (default 5)")
    soak.add_argument("--json", dest="json_out", help="write rows, samples and summary here")
    soak.add_argument("--no-progress", action="store_true")

    load = bench.add_parser("keyword-load", help="keyword-constrained requests one at a time vs all at once")
    load.add_argument("--data", required=True, help="CommonGen jsonl (concept_set per line)")
    load.add_argument("--model", default="smollm2")
    load.add_argument("--draft", default="auto", help="the Generator's draft (default auto)")
    load.add_argument("--method", default="cdlh", choices=["cdlh", "cdsl"])
    load.add_argument("--requests", type=int, default=16)
    load.add_argument("--max-tokens", type=int, default=32)
    load.add_argument("--split", default="report", choices=["tune", "report", "all"])
    load.add_argument("--json", dest="json_out", help="write the report here")

    in_vllm = bench.add_parser("vllm", help="our logits processor against vLLM's own XGrammar in one vLLM engine "
                                            "(needs vLLM: run from .venv-vllm, see make test-vllm)")
    in_vllm.add_argument("--requests", type=int, default=16)
    in_vllm.add_argument("--rounds", type=int, default=2, help="rounds of both backends, order flipped (default 2)")
    in_vllm.add_argument("--max-tokens", type=int, default=60)
    in_vllm.add_argument("--model", default="smollm2", help="smollm2, gemma3-270m or a .gguf (default smollm2)")
    in_vllm.add_argument("--dtype", default="float32", help="vLLM's dtype (default float32; auto: vLLM's default)")
    in_vllm.add_argument("--json", dest="json_out", help="write the report here")

    tools = bench.add_parser("tools", help="tool calls with client-style schemas: objects closed (default) "
                                           "vs decoded as given")
    tools.add_argument("--model", default="smollm2")
    tools.add_argument("--requests", type=int, default=8)
    tools.add_argument("--max-tokens", type=int, default=64)
    tools.add_argument("--json", dest="json_out", help="write rows and summary here")

    steps = bench.add_parser("steps", help="what one forward pass costs: single-row variants, rows x positions grid")
    steps.add_argument("--model", default="smollm2")
    steps.add_argument("--device", default="auto")
    steps.add_argument("--steps", type=int, default=20, help="decode steps per single-row measurement")
    steps.add_argument("--rounds", type=int, default=2, help="interleaved rounds (best kept)")
    steps.add_argument("--compile", action="store_true", help="also torch.compile the static-cache step (slow)")
    steps.add_argument("--torch-compile", action="store_true",
                       help="the grid again through the engine's compiled runner (models.compiled; minutes)")
    steps.add_argument("--json", dest="json_out", help="write the measurements here")

    gen = bench.add_parser("commongen", help="CommonGen keyword coverage: greedy vs CDLH vs CDSL")
    _commongen_arguments(gen)
    sweep = bench.add_parser("commongen-sweep", help="CDSL sensitivity on the tune split: a_t, r_t, d vs speedup")
    _commongen_arguments(sweep)
    sweep.set_defaults(split="tune", limit=12)
    sweep.add_argument("--a-t-values", default="0,0.25,0.5,0.75,1", help="acceptance thresholds to try")
    sweep.add_argument("--r-t-values", default="0,0.5,0.99", help="reward thresholds to try")
    sweep.add_argument("--d-values", default="2,4,6,8", help="lookahead lengths to try")
    sweep.add_argument("--steer-values", default="0,0.1,0.3", help="steer ratios to try")
    sweep.add_argument("--lam-values", default="5,20", help="guided-draft reward weights to try")
    sweep.add_argument("--temperature", type=float, default=0.7,
                       help="the speculative-sampling variant's temperature (0: greedy matching only)")
    sweep.add_argument("--plot", help="write the curves here (PNG)")
    merge = bench.add_parser("commongen-merge", help="one CommonGen report from the JSON reports of its shards")
    merge.add_argument("reports", nargs="+")
    merge.add_argument("--json", dest="json_out")
    keywords_json = bench.add_parser("json-keywords",
                                     help="hard + soft: JSON-schema outputs whose strings must cover keywords")
    _json_keywords_arguments(keywords_json)
    fuzz = bench.add_parser("fuzz-rewrite", help="fuzz the schema rewriter: original vs rewrite, judged by jsonschema")
    _fuzz_rewrite_arguments(fuzz)
    quality = bench.add_parser("quality", help="constrained vs free answers: accuracy, whitespace, token boundaries")
    _quality_arguments(quality)
    profile = bench.add_parser("profile", help="torch.profiler table of a serve-bench case run in-process")
    _profile_arguments(profile)


def _commongen_merge(args: argparse.Namespace) -> int:
    from .bench.commongen import format_table as commongen_table
    from .bench.commongen import merge_reports

    merged = merge_reports([json.loads(Path(p).read_text(encoding="utf-8")) for p in args.reports])
    merged["summary"] = {}
    return _report(merged, commongen_table(merged), args.json_out)


def _soak(args: argparse.Namespace) -> int:
    from .bench.soak import SoakConfig, format_soak_table, run_soak

    config = SoakConfig(minutes=args.minutes, clients=args.clients, url=args.url, pid=args.pid, model=args.model,
                        server_args=tuple(args.server_arg), sample_s=args.sample_s)
    report = run_soak(config, progress=not args.no_progress)
    return _report(report, format_soak_table(report), args.json_out)


def _vllm_bench(args: argparse.Namespace) -> int:
    from .bench.vllm_processor import VllmBenchConfig, format_vllm_table, run_vllm_bench

    report = run_vllm_bench(VllmBenchConfig(requests=args.requests, rounds=args.rounds, max_tokens=args.max_tokens,
                                            model=args.model, dtype=args.dtype))
    return _report(report, format_vllm_table(report), args.json_out)


def _keyword_load(args: argparse.Namespace) -> int:
    from .bench.keyword_load import KeywordLoadConfig, format_keyword_table, run_keyword_load

    config = KeywordLoadConfig(data=args.data, model=args.model, draft=None if args.draft == "none" else args.draft,
                               method=args.method, requests=args.requests, max_tokens=args.max_tokens,
                               split=args.split)
    report = run_keyword_load(config)
    return _report(report, format_keyword_table(report), args.json_out)


def _tools_bench(args: argparse.Namespace) -> int:
    from .bench.tool_calls import ToolBenchConfig, format_tool_table, run_tool_bench

    report = run_tool_bench(ToolBenchConfig(model=args.model, requests=args.requests, max_tokens=args.max_tokens))
    return _report(report, format_tool_table(report), args.json_out)


def _steps(args: argparse.Namespace) -> int:
    from .bench.step_cost import StepCostConfig, format_table, run_step_cost

    report = run_step_cost(StepCostConfig(model=args.model, device=args.device, steps=args.steps,
                                          rounds=args.rounds, compile=args.compile,
                                          torch_compile=args.torch_compile))
    return _report(report, format_table(report), args.json_out)


def _quality(args: argparse.Namespace) -> int:
    from .bench.answer_quality import run_from_args

    return _report(*run_from_args(args), args.json_out)


def _profile(args: argparse.Namespace) -> int:
    from .bench.profile import run_from_args

    return _report(*run_from_args(args), args.json_out)


def _fuzz_rewrite(args: argparse.Namespace) -> int:
    from .bench.fuzz_rewrite import run_from_args as run_fuzz_rewrite

    return _report(*run_fuzz_rewrite(args), args.json_out)


def _maskbench(args: argparse.Namespace) -> int:
    from .bench.maskbench import MaskBenchConfig, format_table, load_cases, run_maskbench

    cases = load_cases(args.data, limit=args.limit, seed=args.seed)
    config = MaskBenchConfig(
        backend=args.backend, compile_timeout_s=args.timeout,
        tests_timeout_s=args.tests_timeout, memory_limit_mb=args.memory_mb,
    )
    report = run_maskbench(cases, args.tokenizer, config, progress=not args.no_progress)
    return _report(report, format_table(report["summary"]), args.json_out)


def _speculative(args: argparse.Namespace) -> int:
    from .bench.speculative import SpeculativeConfig, format_table, load_tasks, run_speculative_bench

    config = SpeculativeConfig(draft=args.draft, k=args.k, max_tokens=args.max_tokens, repeat=args.repeat,
                               model=args.model, with_hf=not args.no_hf, device=args.device, dtype=args.dtype)
    report = run_speculative_bench(load_tasks(args.prompts), config, progress=not args.no_progress)
    return _report(report, format_table(report["summary"]), args.json_out)


def _overhead(args: argparse.Namespace) -> int:
    from .bench.overhead import OverheadConfig, format_table, run_overhead_bench

    config = OverheadConfig(rows=tuple(int(r) for r in args.rows.split(",") if r.strip()), max_tokens=args.max_tokens,
                            tokenizer=args.tokenizer, threads=args.threads or None, mask_workers=args.mask_workers,
                            neighbour=args.neighbour, device=args.device)
    report = run_overhead_bench(config)
    return _report(report, format_table(report), args.json_out)


def _throughput(args: argparse.Namespace) -> int:
    from .bench.throughput import ThroughputConfig, format_table, run_throughput_bench

    config = ThroughputConfig(
        batch_sizes=tuple(int(b) for b in args.batch.split(",") if b.strip()), requests=args.requests,
        max_tokens=args.max_tokens, k=args.k, temperature=args.temperature, model=args.model, device=args.device,
        threads=args.threads, with_hf=not args.no_hf, hf_requests=args.hf_requests,
        with_unconstrained=not args.no_unconstrained,
    )
    report = run_throughput_bench(config, progress=not args.no_progress)
    return _report(report, format_table(report), args.json_out)


def _serve_bench(args: argparse.Namespace) -> int:
    from .bench.serving import ServeBenchConfig, format_table, run_serve_bench
    from .bench.serving_mix import MixConfig, format_mix_table, run_mix_bench

    def run(url: str, model: str, label: str) -> dict[str, Any]:
        if args.mix:
            return run_mix_bench(MixConfig(base_url=url, model=model, requests=args.requests, clients=args.clients,
                                           serial_requests=args.serial_requests, max_tokens=args.max_tokens,
                                           label=label))
        return run_serve_bench(ServeBenchConfig(
            base_url=url, model=model, requests=args.requests, max_tokens=args.max_tokens, tokenizer=args.tokenizer,
            concurrency=tuple(int(c) for c in args.concurrency.split(",") if c.strip()), label=label))

    if args.against:
        from .bench.serve_compare import Server, compare_servers, format_comparison

        ours = Server(args.label or "ours", args.url, args.model)
        theirs = Server(args.against_label or "theirs", args.against, args.against_model or args.model)
        report = compare_servers(lambda server: run(server.base_url, server.model, server.label), ours, theirs,
                                 rounds=args.rounds)
        return _report(report, format_comparison(report), args.json_out)
    report = run(args.url, args.model, args.label)
    return _report(report, format_mix_table(report) if args.mix else format_table(report), args.json_out)


def _commongen_arguments(gen: argparse.ArgumentParser) -> None:
    """The CommonGen options; their defaults are ``CommonGenConfig``'s (chosen by the sweep in BENCHMARKS.md)."""
    from .bench.commongen import CommonGenConfig

    c = CommonGenConfig()
    gen.add_argument("--data", required=True, help="CommonGen jsonl (concept_set per line)")
    gen.add_argument("--limit", type=int, default=c.limit, help=f"concept sets, a seeded sample (default {c.limit})")
    gen.add_argument("--seed", type=int, default=c.seed)
    gen.add_argument("--split", default=c.split, choices=["tune", "report", "all"],
                     help=f"concept sets by a hash of their text: tune on 'tune', report on 'report' "
                          f"(default {c.split})")
    gen.add_argument("--shard", default=c.shard,
                     help="I/N: every N-th sampled concept set from the I-th (merge: 'bench commongen-merge')")
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
    gen.add_argument("--stop-below", type=float, default=c.stop_below,
                     help=f"CDSL draft: end a lookahead after an unsure own token (default p < {c.stop_below})")
    gen.add_argument("--no-suggest", dest="suggest", action="store_false",
                     help="CDSL draft: weigh only its own top-k, not the reward's suggested words")
    gen.add_argument("--json", dest="json_out")
    gen.add_argument("--no-progress", action="store_true")


def _commongen_config(args: argparse.Namespace) -> object:
    from .bench.commongen import CommonGenConfig

    return CommonGenConfig(
        limit=args.limit, seed=args.seed, split=args.split, shard=args.shard, sentence=args.sentence,
        word_list_size=args.word_list_size, max_repeats=args.max_repeats,
        cdsl_temperature=args.cdsl_temperature, methods=tuple(args.methods.split(",")), max_tokens=args.max_tokens,
        k=args.k, d=args.d, lam=args.lam, optimism=args.optimism, cdsl_d=args.cdsl_d,
        acceptance_threshold=args.a_t, reward_threshold=args.r_t, fallback=args.fallback,
        reward_on=args.reward_on, commit=args.commit, steer_ratio=args.steer_ratio, draft=args.draft,
        draft_lam=args.draft_lam, suggest=args.suggest, stop_below=args.stop_below, loop_guard=args.loop_guard,
    )


def _commongen(args: argparse.Namespace) -> int:
    from .bench.commongen import format_table, run_commongen

    report = run_commongen(args.data, _commongen_config(args), progress=not args.no_progress,
                           checkpoint=args.json_out)
    report["summary"] = {}
    return _report(report, format_table(report), args.json_out)


def _commongen_sweep(args: argparse.Namespace) -> int:
    from .bench.sensitivity import SweepConfig, format_table, plot_sweep, run_sweep

    def values(text: str, kind: type) -> tuple:
        return tuple(kind(v) for v in text.split(",") if v.strip())

    config = SweepConfig(base=_commongen_config(args), a_t=values(args.a_t_values, float),
                         r_t=values(args.r_t_values, float), d=values(args.d_values, int),
                         steer=values(args.steer_values, float), lam=values(args.lam_values, float),
                         temperature=args.temperature)
    report = run_sweep(args.data, config, progress=not args.no_progress, checkpoint=args.json_out)
    if args.plot:
        plot_sweep(report, args.plot)
    report["summary"] = {}
    return _report(report, format_table(report), args.json_out)


def _json_keywords_arguments(parser: argparse.ArgumentParser) -> None:
    """The hard + soft JSON bench's options; defaults are ``JsonKeywordsConfig``'s."""
    from .bench.json_keywords import JsonKeywordsConfig

    c = JsonKeywordsConfig()
    parser.add_argument("--data", required=True, help="CommonGen jsonl (concept_set per line)")
    parser.add_argument("--limit", type=int, default=c.limit)
    parser.add_argument("--seed", type=int, default=c.seed)
    parser.add_argument("--split", default=c.split, choices=["tune", "report", "all"])
    parser.add_argument("--methods", default=",".join(c.methods), help="comma-separated: greedy, cdlh, cdsl")
    parser.add_argument("--max-tokens", type=int, default=c.max_tokens)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--no-progress", action="store_true")


def _json_keywords(args: argparse.Namespace) -> int:
    from .bench.json_keywords import JsonKeywordsConfig, format_table, run_json_keywords

    config = JsonKeywordsConfig(limit=args.limit, seed=args.seed, split=args.split,
                                methods=tuple(args.methods.split(",")), max_tokens=args.max_tokens)
    report = run_json_keywords(args.data, config, progress=not args.no_progress)
    report["summary"] = {}
    return _report(report, format_table(report), args.json_out)


def _quality_arguments(parser: argparse.ArgumentParser) -> None:
    from .bench.answer_quality import add_arguments

    add_arguments(parser)


def _profile_arguments(parser: argparse.ArgumentParser) -> None:
    from .bench.profile import add_arguments

    add_arguments(parser)


def _fuzz_rewrite_arguments(parser: argparse.ArgumentParser) -> None:
    from .bench.fuzz_rewrite import add_arguments

    add_arguments(parser)


def _report(report: dict, table: str, json_out: str | None) -> int:
    """Print a bench's table; write its report (with the command that made it) as JSON."""
    report["summary"]["command"] = "cdsl-struct " + " ".join(sys.argv[1:])
    print(table)
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


def _models(args: argparse.Namespace) -> int:
    import time

    from .models.loading import KNOWN_MODELS, load_model

    if args.action == "list":
        for name, description in KNOWN_MODELS.items():
            print(f"{name:10s} {description}")
        return 0
    for name in args.names or ["smollm2"]:
        start = time.perf_counter()
        loaded = load_model(name)
        print(f"{name}: ready in {time.perf_counter() - start:.1f}s "
              f"({sum(p.numel() for p in loaded.model.parameters()) / 1e6:.0f}M parameters)")
    return 0


def _tokenizers(args: argparse.Namespace) -> int:
    import time

    from .constraints import Regex, TokenVocabulary, compile
    from .constraints.backends import BACKEND_NAMES
    from .models.tokenizers import NAMED_TOKENIZERS, load_tokenizer, named_tokenizer_dir

    names = args.names or list(NAMED_TOKENIZERS)
    for name in names:
        if args.action == "list":
            print(name)
            continue
        start = time.perf_counter()
        folder = named_tokenizer_dir(name)
        fetched = time.perf_counter() - start
        vocabulary = TokenVocabulary.from_tokenizer(load_tokenizer(name))
        engines = ""
        if args.engines:
            for engine in BACKEND_NAMES:
                tick = time.perf_counter()
                compile(Regex("x"), vocabulary, backend=engine, cache=False)
                engines += f"  {engine} view {time.perf_counter() - tick:5.2f}s"
        print(f"{name:8s} {vocabulary.size:7d} tokens  {vocabulary.scheme:13s} fetch {fetched:5.1f}s  "
              f"vocabulary {vocabulary.build_seconds:5.2f}s{engines}  {folder}")
    return 0


_HANDLERS: dict[tuple[str, str | None], Callable[[argparse.Namespace], int]] = {
    ("generate", None): run_generate, ("batch", None): run_batch, ("serve", None): run_serve,
    ("models", None): _models, ("tokenizers", None): _tokenizers,
    ("bench", "maskbench"): _maskbench, ("bench", "speculative"): _speculative, ("bench", "throughput"): _throughput,
    ("bench", "overhead"): _overhead,
    ("bench", "commongen"): _commongen, ("bench", "commongen-sweep"): _commongen_sweep,
    ("bench", "commongen-merge"): _commongen_merge, ("bench", "json-keywords"): _json_keywords,
    ("bench", "serve"): _serve_bench, ("bench", "soak"): _soak, ("bench", "tools"): _tools_bench,
    ("bench", "keyword-load"): _keyword_load,
    ("bench", "vllm"): _vllm_bench,
    ("bench", "steps"): _steps, ("bench", "quality"): _quality, ("bench", "fuzz-rewrite"): _fuzz_rewrite,
    ("bench", "profile"): _profile,
}
"""What each command (and bench harness) runs."""


if __name__ == "__main__":
    sys.exit(main())
