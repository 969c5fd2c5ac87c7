"""Strategy rows on the batched engine (``decoding.programs``), on the embedded SmolLM2: CDLH and
CDSL rows batched with each other and with plain rows decode exactly what each decodes alone,
share target and draft forwards, and hold and free the cache rows of their roll-outs."""

import re

import pytest

from cdsl_struct import Regex, compile
from cdsl_struct.decoding import decode
from cdsl_struct.decoding.engine import BatchEngine, Request
from cdsl_struct.decoding.lookahead import CDLH, CDSL, GuidedDraft
from cdsl_struct.decoding.strategy import MAIN, Passes
from cdsl_struct.models.batch import BatchRunner, Feed
from cdsl_struct.models.runner import ModelRunner, self_draft
from cdsl_struct.prompts import chat_header, prompt_ids
from cdsl_struct.rewards import KeywordCoverage

SENTENCE = r"[A-Z][a-z]+( [a-z]+){2,12}\."
TOPICS = [["dog", "ball"], ["cook", "kitchen"], ["river", "boat"], ["snow", "child"]]


@pytest.fixture(scope="module")
def parts(smollm2, one_torch_thread):
    compiled = compile(Regex(SENTENCE), smollm2.tokenizer, eos_token_ids=smollm2.eos_token_ids)
    prompts = [prompt_ids(smollm2.tokenizer, f"Write one sentence using the words {a} and {b}.") for a, b in TOPICS]
    draft = self_draft(smollm2.model, "layers:10")  # shares the target's weights
    return compiled, prompts, draft


def strategy(kind, words, draft):
    reward = KeywordCoverage(words)
    if kind == "cdlh":
        return CDLH(reward, k=3, d=2)
    if kind == "cdsl":
        return CDSL(GuidedDraft(draft, reward), reward, d=4, cdlh=CDLH(reward, k=3, d=2))
    return None


def test_strategy_rows_batched_together_equal_each_alone(smollm2, parts):
    compiled, prompts, draft = parts
    kinds = ["cdlh", "cdsl", "cdsl", None]
    target = ModelRunner(smollm2.model)
    alone = [decode(target, compiled, ids, max_tokens=14, strategy=strategy(kind, words, draft))
             for kind, words, ids in zip(kinds, TOPICS, prompts, strict=True)]
    engine = BatchEngine(BatchRunner(smollm2.model, pad_token_id=smollm2.eos_token_ids[0]), max_batch_size=4)
    requests = [Request(tuple(ids), compiled, max_tokens=14, strategy=strategy(kind, words, draft))
                for kind, words, ids in zip(kinds, TOPICS, prompts, strict=True)]
    together = engine.run(requests)
    engine.close()
    for kind, solo, batched in zip(kinds, alone, together, strict=True):
        assert batched.tokens == solo.tokens, kind
        assert batched.finish_reason in ("stop", "length")
        if batched.complete:
            assert re.fullmatch(SENTENCE, batched.text)
    # the rows shared target forwards, and the two CDSL rows their draft forwards
    assert engine.stats.steps < sum(r.stats.target_passes for r in alone)
    draft_runner = next(iter(engine.programs.drafts.values()))
    assert draft_runner.passes < sum(r.stats.draft_passes for r in together)
    assert together[0].stats.target_passes == alone[0].stats.target_passes  # each row's own passes counted
    assert not engine.runner.order  # every row and roll-out released


def _cdsl_alone_and_together(smollm2, compiled, prompts, draft, rows=3):
    alone = [decode(ModelRunner(smollm2.model), compiled, ids, max_tokens=10, strategy=strategy("cdsl", words, draft))
             for words, ids in zip(TOPICS[:rows], prompts[:rows], strict=True)]
    engine = BatchEngine(BatchRunner(smollm2.model, pad_token_id=smollm2.eos_token_ids[0]), max_batch_size=4)
    together = engine.run([Request(tuple(ids), compiled, max_tokens=10, strategy=strategy("cdsl", words, draft))
                           for words, ids in zip(TOPICS[:rows], prompts[:rows], strict=True)])
    return alone, together, engine


def test_rows_drafting_on_a_dynamically_quantised_draft_draft_alone(smollm2, parts, dynamic_int8_draft):
    """torch's dynamic quantisation scales activations over its whole batch: batched, a row's
    lookahead would depend on its neighbours. Its rows draft one at a time and decode what they do alone."""
    compiled, prompts, _ = parts
    dynamic = dynamic_int8_draft
    alone, together, engine = _cdsl_alone_and_together(smollm2, compiled, prompts, dynamic, rows=2)
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert not engine.programs.drafts  # no batched draft runner was made
    assert not engine.programs.solo_drafts  # each row's own draft runner went with the row
    engine.close()


def test_rows_drafting_on_the_int8_self_draft_share_its_forwards(smollm2, parts):
    """The int8 self-draft quantises each token on its own scale (``models.int8``): its rows draft in
    one batched forward and still decode exactly what each decodes alone."""
    compiled, prompts, _ = parts
    int8 = self_draft(smollm2.model, "int8")
    alone, together, engine = _cdsl_alone_and_together(smollm2, compiled, prompts, int8)
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    draft_runner = next(iter(engine.programs.drafts.values()))
    assert draft_runner.passes < sum(r.stats.draft_passes for r in together)
    assert not engine.programs.solo_drafts
    engine.close()


def test_a_strategy_row_reserves_cache_for_its_branches(parts):
    compiled, prompts, draft = parts
    plain = Request(tuple(prompts[0]), compiled, max_tokens=20)
    cdlh = Request(tuple(prompts[0]), compiled, max_tokens=20, strategy=CDLH(KeywordCoverage(["dog"]), k=5, d=3))
    assert cdlh.reserved_tokens == 6 * plain.reserved_tokens
    no_rollouts = Request(tuple(prompts[0]), compiled, max_tokens=20, strategy=CDLH(KeywordCoverage(["dog"]), d=0))
    assert no_rollouts.reserved_tokens == plain.reserved_tokens


class Failing:
    """A strategy whose program asks for one pass, then raises."""

    branches = 0

    def steps(self, session):
        yield Passes.target(Feed(MAIN, session.sequence))
        raise RuntimeError("judging failed")


class Misbehaving:
    branches = 0

    def steps(self, session):
        yield "not passes"


def test_a_failing_program_ends_its_own_row_only(smollm2, parts):
    compiled, prompts, draft = parts
    engine = BatchEngine(BatchRunner(smollm2.model, pad_token_id=smollm2.eos_token_ids[0]), max_batch_size=4)
    rows = engine.run_rows([Request(tuple(prompts[0]), compiled, max_tokens=6, strategy=Failing()),
                            Request(tuple(prompts[1]), compiled, max_tokens=6, strategy=Misbehaving()),
                            Request(tuple(prompts[2]), compiled, max_tokens=6,
                                    strategy=strategy("cdlh", TOPICS[2], draft))])
    engine.close()
    assert isinstance(rows[0].error, RuntimeError)
    assert isinstance(rows[1].error, TypeError) and "Passes" in str(rows[1].error)
    assert rows[2].error is None and len(rows[2].result.tokens) == 6
    assert not engine.runner.order


@pytest.mark.parametrize("runner_kind", ["padded", "ragged"])
def test_rollouts_start_from_a_copy_of_the_row_cache_not_a_prefill(smollm2, parts, runner_kind):
    from cdsl_struct.models.ragged import RaggedRunner

    compiled, prompts, _ = parts
    runner = (BatchRunner(smollm2.model, pad_token_id=smollm2.eos_token_ids[0], prefix_cache_bytes=0)
              if runner_kind == "padded" else RaggedRunner(smollm2.model, prefix_cache_bytes=0))
    engine = BatchEngine(runner, max_batch_size=1)
    request = Request(tuple(prompts[0]), compiled, max_tokens=6, strategy=strategy("cdlh", TOPICS[0], None))
    result = engine.run([request])[0]
    engine.close()
    assert len(result.tokens) > 1
    # only the prompt is prefilled: every step's k roll-outs fork the row (before, each re-read the whole sequence)
    assert runner.prefilled_positions <= len(prompts[0])


def test_draft_rows_copy_a_shared_prompt_prefix_and_decode_alike_in_any_batch(smollm2, parts):
    """``Programs.share_prefix`` (``Generator`` shares its chat header): the int8 self-draft's runner
    prefills the prefix once, at its first draft pass, and rows starting with it copy it; CDSL rows
    decoded together equal each decoded alone on an engine sharing the same prefix."""
    compiled, prompts, _ = parts
    int8 = self_draft(smollm2.model, "int8")
    header = chat_header(smollm2.tokenizer)
    assert len(header) > 10 and all(ids[:len(header)] == header for ids in prompts)

    def run(requests):
        engine = BatchEngine(BatchRunner(smollm2.model, pad_token_id=smollm2.eos_token_ids[0]), max_batch_size=4)
        engine.programs.share_prefix(header)
        results = engine.run(requests)
        draft_runner = next(iter(engine.programs.drafts.values()))
        assert list(draft_runner.shared) == [tuple(header)]
        engine.close()
        return results

    def requests():
        return [Request(tuple(ids), compiled, max_tokens=10, strategy=strategy("cdsl", words, int8))
                for words, ids in zip(TOPICS[:3], prompts[:3], strict=True)]

    together = run(requests())
    assert [r.tokens for r in together] == [run([request])[0].tokens for request in requests()]
