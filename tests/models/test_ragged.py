"""RaggedRunner mechanics on a tiny random Llama (and a tiny Gemma 3): every row's
logits equal a solo run's through ragged feeds, prompts joining a decode step, crops, leaves, forks
and reused prefixes, each in one forward pass per step."""

import pytest
import torch

from cdsl_struct.errors import CdslError
from cdsl_struct.models import ragged_attention
from cdsl_struct.models.attention import row_attention
from cdsl_struct.models.batch import BatchRunner, Feed
from cdsl_struct.models.ragged import GROUPED_QUERIES, RaggedRunner, supports_ragged
from cdsl_struct.models.self_check import batch_runner
from tests.models.solo import close, solo


def test_rows_of_different_lengths_join_in_one_pass_and_match_solo_runs(model):
    runner = RaggedRunner(model)
    seqs = {"a": [1, 2, 3, 4, 5, 6, 7], "b": [9, 8], "c": [4]}
    out = runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    for (row, seq), logits in zip(seqs.items(), out, strict=True):
        assert close(logits, solo(model, seq)), row
    assert runner.rows == 3 and runner.passes == 1  # prompts and all: one pass
    assert runner.positions == runner.padded_positions == 7 + 2 + 1  # nothing padded


def test_speculation_crops_and_a_prompt_riding_in_a_decode_step(model):
    runner = RaggedRunner(model)
    a, b = [1, 2, 3, 4], [7, 7, 8]
    runner.run([Feed("a", a, 1), Feed("b", b, 1)])
    out = runner.run([Feed("a", a + [5, 6, 7], 4), Feed("b", b + [9, 10], 3)])
    assert close(out[0], solo(model, a + [5, 6, 7], keep=4)) and close(out[1], solo(model, b + [9, 10], keep=3))
    a, b = a + [5, 11], b + [9, 10, 12]  # a keeps one of its three: cropped, no hole
    prompt = [3] * (GROUPED_QUERIES + 4)  # longer than the grouped attention takes: attends on its own
    passes = runner.passes
    out = runner.run([Feed("a", a, 1), Feed("b", b, 2), Feed("c", prompt, 1)])
    assert runner.passes == passes + 1
    assert close(out[0], solo(model, a)) and close(out[1], solo(model, b, keep=2))
    assert close(out[2], solo(model, prompt))
    assert runner.held("a") == a and runner.held("c") == prompt


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize(("count", "held"), [(1, 8), (6, 0), (5, 7)])
def test_row_attention_off_the_cpu_equals_the_masked_gqa_one(group, count, held):
    """The branch a GPU takes (no mask beside ``enable_gqa``: CUDA crashed on that pairing) gives
    what the CPU's branch and a by-hand attention give, for a decode query, a fresh prompt and
    queries after held positions."""
    generator = torch.Generator().manual_seed(count * 10 + held + group)
    length = held + count
    query = torch.randn(1, 2 * group, count, 8, generator=generator)
    keys, values = (torch.randn(1, 2, length, 8, generator=generator) for _ in range(2))
    causal = torch.ones((count, length), dtype=torch.bool).tril(held)
    cpu = row_attention(query, keys, values, causal, 0.3, group, masked_gqa=True)
    other = row_attention(query, keys, values, causal, 0.3, group, masked_gqa=False)
    scores = query @ keys.repeat_interleave(group, dim=1).transpose(-1, -2) * 0.3
    by_hand = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ values.repeat_interleave(group, dim=1)
    torch.testing.assert_close(cpu, by_hand, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(other, by_hand, atol=1e-5, rtol=1e-5)


def test_the_runner_on_the_gpus_attention_branch_matches_solo_runs(model, monkeypatch):
    """The whole ragged runner with the attention branches a GPU takes (forced here on the CPU: rows
    without a mask beside ``enable_gqa``, grouped rows through SDPA): joins, decode steps of one or
    two rows (attending row by row) and of many (grouped), speculation after held positions, rows
    leaving and forking, the cache growing."""
    monkeypatch.setattr(ragged_attention, "masked_gqa_safe", lambda device: False)
    monkeypatch.setattr(ragged_attention, "grouped_by_sdpa", lambda device: True)
    test_rows_of_different_lengths_join_in_one_pass_and_match_solo_runs(model)
    test_speculation_crops_and_a_prompt_riding_in_a_decode_step(model)
    test_leaving_forking_and_unfed_rows_keep_every_cache_right(model)
    test_many_rows_grow_the_slot_cache(model)


def test_leaving_forking_and_unfed_rows_keep_every_cache_right(model):
    runner = RaggedRunner(model)
    seqs = {"a": [1, 2, 3], "b": [4, 5, 6, 7, 8], "c": [9, 9]}
    runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    runner.release("a")  # the last slot ("c") moves into a's place
    assert runner.rows == 2 and runner.held("a") == []
    out = runner.run([Feed("c", [9, 9, 1], 1)])  # b sits this step out
    assert close(out[0], solo(model, [9, 9, 1]))
    out = runner.run([Feed("d", [4, 5, 6, 7, 8, 2, 3], 2, parent="b"), Feed("b", [4, 5, 6, 7, 8, 1], 1)])
    assert close(out[0], solo(model, [4, 5, 6, 7, 8, 2, 3], keep=2)) and close(out[1], solo(model, [4, 5, 6, 7, 8, 1]))
    with pytest.raises(CdslError):
        runner.fork([("b", "d")])
    runner.release("b", "c", "d", "unknown")
    assert runner.rows == 0


def test_bad_feeds_are_refused(model):
    runner = RaggedRunner(model)
    with pytest.raises(CdslError):
        runner.run([Feed("a", [1, 2], 3)])
    with pytest.raises(CdslError):
        runner.run([Feed("a", [1, 2], 1), Feed("a", [1, 2], 1)])


def test_rows_reuse_stored_and_shared_prefixes(model):
    runner = RaggedRunner(model)
    shared = [5, 6, 7, 8, 9, 10, 11]
    runner.run([Feed("a", shared + [1, 2], 1)])
    fed = runner.positions
    seqs = (shared + [1, 2, 3], shared + [4, 4, 4], [9, 9])
    out = runner.run([Feed(r, s, 1) for r, s in zip("abc", seqs, strict=True)])
    assert runner.prefixes.hits >= 1 and runner.positions - fed < 2 + 9 + 2  # b copied the shared prefix
    for logits, seq in zip(out, seqs, strict=True):
        assert close(logits, solo(model, seq))
    # rows joining together share a prefix nobody stored: computed once (a pass of its own), then copied
    fresh = RaggedRunner(model)
    common = [7, 3, 7, 3, 7, 3, 7, 3, 7, 3]
    out = fresh.run([Feed("x", common + [1], 1), Feed("y", common + [2, 2], 1)])
    assert fresh.passes == 2 and fresh.positions == len(common) + 1 + 2
    assert fresh.prefilled_positions == len(common) + 1  # the shared prefix, then y's one more prompt token
    assert close(out[0], solo(model, common + [1])) and close(out[1], solo(model, common + [2, 2]))
    assert fresh.rows == 2 and fresh.last_prefill_seconds > 0


def test_many_rows_grow_the_slot_cache(model):
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    seqs = {i: [(i * 7 + j) % 50 for j in range(3 + i)] for i in range(12)}
    runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    for step in range(70):  # past the cache's first capacity
        for row in seqs:
            seqs[row] = seqs[row] + [(row + step) % 50]
        out = runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    for row, logits in zip(seqs, out, strict=True):
        assert close(logits, solo(model, seqs[row])), row
    assert runner.attended_valid < runner.attended_slots  # rows of different lengths, spare positions


def test_the_engine_runner_is_ragged_where_supported(model, monkeypatch):
    assert supports_ragged(model) and isinstance(batch_runner(model), RaggedRunner)
    monkeypatch.setenv("CDSL_RUNNER", "padded")
    assert isinstance(batch_runner(model), BatchRunner)


def _tiny(family):
    """A tiny random model of ``family`` (two layers, grouped key/value heads)."""
    import transformers

    torch.manual_seed(5)
    common = dict(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256)
    if family == "gemma3_text":  # sliding and full layers, query/key norms, its own scaling
        config = transformers.Gemma3TextConfig(**common, head_dim=16, sliding_window=64,
                                               layer_types=["sliding_attention", "full_attention"])
        model = transformers.Gemma3ForCausalLM(config)
    else:
        config = transformers.AutoConfig.for_model(family, **common)
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.eval().set_attn_implementation("sdpa")
    return model


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3", "gemma3_text"])
def test_every_supported_family_matches_solo_runs(family):
    model = _tiny(family)
    assert model.config.model_type == family and supports_ragged(model)
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    seqs = {"a": list(range(10, 40)), "b": [5, 6, 7], "c": [8, 9]}
    runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    seqs = {"a": seqs["a"] + [7, 8], "b": seqs["b"] + [9], "c": seqs["c"] + [1, 2, 3]}
    out = runner.run([Feed("a", seqs["a"], 2), Feed("b", seqs["b"], 1), Feed("c", seqs["c"], 3)])  # grouped
    assert close(out[0], solo(model, seqs["a"], keep=2)) and close(out[1], solo(model, seqs["b"]))
    assert close(out[2], solo(model, seqs["c"], keep=3))
    runner.release("b", "c")
    out = runner.run([Feed("a", seqs["a"] + [4], 1)])  # one row: it attends on its own
    assert close(out[0], solo(model, seqs["a"] + [4]))


def test_other_families_keep_the_padded_runner():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=60, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    assert not supports_ragged(model) and isinstance(batch_runner(model), BatchRunner)
    with pytest.raises(CdslError):
        RaggedRunner(model)


def test_the_cache_shrinks_after_a_long_row_leaves_and_the_rest_stay_right(model):
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    short, long = [1, 2, 3], [(7 * j) % 50 for j in range(200)]
    runner.run([Feed("short", short, 1), Feed("long", long, 1)])
    grown = runner.cache.length
    runner.release("long")
    out = runner.run([Feed("short", short + [4], 1)])
    assert runner.cache.length < grown // 2 and close(out[0], solo(model, short + [4]))
    runner.release("short")
    assert runner.rows == 0 and all(k is None for k in runner.cache.keys)  # an idle runner holds nothing


def test_a_self_draft_sharing_the_targets_layers_runs_ragged_only_when_they_attend_through_us():
    from cdsl_struct.models.attention import use_decode_attention
    from cdsl_struct.models.runner import self_draft
    from tests.models.solo import tiny_llama

    target = tiny_llama()  # plain SDPA: a draft's layers would not call our attention
    assert not supports_ragged(self_draft(target, "layers:1"))
    use_decode_attention(target)  # what load_model does on the CPU
    draft = self_draft(target, "layers:1")
    assert supports_ragged(draft)
    runner = RaggedRunner(draft, prefix_cache_bytes=0)
    seqs = {"a": [1, 2, 3, 4], "b": [5, 6], "c": [7, 8, 9]}
    out = runner.run([Feed(r, s, 1) for r, s in seqs.items()])
    out = runner.run([Feed(r, s + [10], 1) for r, s in seqs.items()])  # grouped attention, three rows
    for (row, seq), logits in zip(seqs.items(), out, strict=True):
        assert close(logits, solo(draft, seq + [10])), row


def _windowed(family):
    """A tiny random ``family`` model whose sliding layers see 5 positions (Gemma 3: one sliding and
    one full layer; Mistral: every layer)."""
    import transformers

    torch.manual_seed(9)
    common = dict(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, sliding_window=5)
    if family == "gemma3_text":
        config = transformers.Gemma3TextConfig(**common, head_dim=16,
                                               layer_types=["sliding_attention", "full_attention"])
        model = transformers.Gemma3ForCausalLM(config)
    else:
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(family, **common))
    model.eval().set_attn_implementation("sdpa")
    return model


def windowed_script(model, runner):
    """Rows past a sliding window of 5 through ``runner``, each step's kept logits against the model's
    own forward over the whole sequence (no cache): a long prompt (attends alone), short feeds in
    the grouped attention, several kept positions, rows joining and leaving. Returns the steps run."""
    def reference(sequence, keep):
        with torch.inference_mode():
            return model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0, -keep:].float()

    seqs = {"a": list(range(3, 23)), "b": [7, 8, 9], "c": [11, 12, 13, 14, 15, 16, 17, 18]}
    steps = 0
    for step in range(6):
        keep = {"a": 1, "b": 2, "c": 3} if step % 2 else {"a": 2, "b": 1, "c": 1}
        feeds = [Feed(row, seq, min(keep.get(row, 1), len(seq))) for row, seq in seqs.items()]
        for feed, got in zip(feeds, runner.run(feeds), strict=True):
            assert close(got, reference(feed.sequence, feed.keep)), (step, feed.row)
        seqs = {row: seq + [(len(seq) * 7 + step) % 60, (len(seq) + step) % 60][:1 + step % 2]
                for row, seq in seqs.items()}
        if step == 3:
            runner.release("b")
            seqs.pop("b")
            seqs["d"] = list(range(30, 42))
        steps += 1
    return steps


@pytest.mark.parametrize("family", ["gemma3_text", "mistral"])
def test_sliding_layers_attend_within_their_window(family):
    model = _windowed(family)
    runner = RaggedRunner(model, prefix_cache_bytes=0)
    assert windowed_script(model, runner) == 6
    full = _windowed(family)
    full.config.sliding_window = 10_000  # the same weights, every layer seeing everything
    for module in full.modules():
        if getattr(module, "sliding_window", None):
            module.sliding_window = 10_000
    sequence = list(range(3, 23))
    assert not close(RaggedRunner(full, prefix_cache_bytes=0).run([Feed("a", sequence, 1)])[0],
                     runner.run([Feed("x", sequence, 1)])[0])  # the window matters on these rows
