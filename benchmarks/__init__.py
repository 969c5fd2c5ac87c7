"""The lab: research harnesses and comparisons with other libraries, run from a clone with
``python -m benchmarks <name> ...`` (see ``__main__``); not part of the ``cdsl_struct`` wheel.

What users run against their own deployment stays in the package (``cdsl-struct bench serve``,
``throughput``, ``maskbench``, ``overhead``); these harnesses import only its public surface.
"""

from __future__ import annotations

HARNESSES: dict[str, tuple[str, str]] = {
    "commongen": ("benchmarks.commongen", "CommonGen keyword coverage: greedy vs CDLH vs CDSL"),
    "commongen-sweep": ("benchmarks.sensitivity", "CDSL sensitivity on the tune split: a_t, r_t, d vs speedup"),
    "commongen-merge": ("benchmarks.commongen_merge", "one CommonGen report from the JSON reports of its shards"),
    "draft-agreement": ("benchmarks.draft_agreement",
                        "how often a self-draft's argmax is the target's, teacher-forced on a report's sentences"),
    "json-keywords": ("benchmarks.json_keywords", "hard + soft: JSON-schema outputs whose strings must cover keywords"),
    "keyword-load": ("benchmarks.keyword_load", "keyword-constrained requests one at a time vs all at once"),
    "keyword-prompts": ("benchmarks.keyword_prompts",
                        "keywords from prompts that do not name them: named vs unnamed vs naming off, via generate"),
    "keyword-captions": ("benchmarks.keyword_captions",
                         "keywords inside a schema's JSON via generate: captions that are sentences, not lists"),
    "request-latency": ("benchmarks.request_latency",
                        "one request at a time on a Generator at its defaults: keywords, JSON, free text"),
    "quality": ("benchmarks.answer_quality", "constrained vs free answers: accuracy, whitespace, token boundaries"),
    "fuzz-rewrite": ("benchmarks.fuzz_rewrite", "fuzz the schema rewriter: original vs rewrite, judged by jsonschema"),
    "speculative": ("benchmarks.speculative", "constrained speculative decoding vs target-only and HF baselines"),
    "steps": ("benchmarks.step_cost", "what one forward pass costs: single-row variants, rows x positions grid"),
    "tools": ("benchmarks.tool_calls",
              "tool calls with client-style schemas: objects closed (default) vs decoded as given"),
    "tool-args": ("benchmarks.tool_args",
                  "tool calls from everyday requests: arguments right, cut, or swallowing the call's syntax; "
                  "the string guard on and off"),
    "number-runs": ("benchmarks.number_runs",
                    "JSON facts with unbounded numbers: answers finished or cut in a run of digits; the guard on "
                    "and off"),
    "list-runs": ("benchmarks.list_runs",
                  "JSON lists of records: answers finished, cut, or going round the same records; the guard on "
                  "and off"),
    "profile": ("benchmarks.serve_profile", "torch.profiler table of a serve-bench case run in-process"),
    "soak": ("benchmarks.soak", "many clients for many minutes mixing well-formed, hostile and disconnecting "
                                "requests: exactly-once answers, no 5xx, flat memory"),
    "startup": ("benchmarks.startup", "how soon serve answers (/v1/models, the first json_schema request) and how "
                                      "fast later: eager while a second process compiles, then compiled"),
    "generator-startup": ("benchmarks.generator_startup", "how soon Generator(torch_compile=...) answers and how "
                                                          "fast later: eager while a second process compiles"),
    "serve": ("benchmarks.serve_compare",
              "cdsl-struct bench serve, and with --against another OpenAI-compatible server side by side"),
    "throughput": ("benchmarks.throughput_baselines",
                   "cdsl-struct bench throughput with the transformers generate and outlines baselines beside it"),
    "graphs": ("benchmarks.graph_bench", "the static-shape runner on a GPU (capture, replay check, engine runs) "
                                         "beside transformers' static-cache compiled generate, in one run"),
    "feature-cost": ("benchmarks.feature_cost", "time per token of the budget check, partial values, structural "
                                                "tags and reasoning, against plain JSON at 16 rows"),
    "vllm": ("benchmarks.vllm_processor", "our logits processor against vLLM's own XGrammar in one vLLM engine "
                                          "(needs vLLM: run from .venv-vllm, see make test-vllm)"),
}
"""``python -m benchmarks <name>``: what each name runs."""
