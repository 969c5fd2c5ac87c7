"""CDLH and CDSL: parameters are checked, hard constraints hold, states and passes are counted."""

import re
from types import SimpleNamespace

import pytest

from cdsl_struct import Regex, compile
from cdsl_struct.decoding import DraftModelProposer, decode
from cdsl_struct.decoding.lookahead import (
    CDLH,
    CDSL,
    CDSL_STATES,
    GuidedDraft,
    _closing_index,
    optimistic_reward,
    state_ended,
)
from cdsl_struct.decoding.loops import SENTENCE_GUARD
from cdsl_struct.models.runner import ModelRunner
from cdsl_struct.rewards import CallableReward, KeywordCoverage, Reward, RewardError
from tests.decoding.test_mechanics_tiny import PROMPT, letters_vocab, tiny_model

PATTERN = "[a-h]{2,6}"


@pytest.fixture(scope="module")
def setup():
    compiled = compile(Regex(PATTERN), letters_vocab(), backend="llguidance")
    return compiled, ModelRunner(tiny_model(1)), DraftModelProposer(ModelRunner(tiny_model(2)))


def likes_h(text, final=False):
    return text.count("h") / max(len(text), 1)


def test_cdlh_keeps_the_constraint_and_follows_the_reward(setup):
    compiled, target, _ = setup
    plain = decode(target, compiled, PROMPT, max_tokens=8)
    steered = decode(target, compiled, PROMPT, max_tokens=8, strategy=CDLH(likes_h, k=4, d=2, lam=50.0))
    assert re.fullmatch(PATTERN, steered.text) and steered.finish_reason == "stop"
    assert likes_h(steered.text) > likes_h(plain.text)  # the reward changed the text
    # each token: one pass to score the candidates, then at most d batched roll-out passes (plus the prefill)
    steps = len(steered.tokens)
    assert 1 + steps < steered.stats.target_passes <= 1 + steps * (1 + 2)


def test_cdlh_without_reward_weight_is_greedy_decoding(setup):
    compiled, target, _ = setup
    plain = decode(target, compiled, PROMPT, max_tokens=8)
    for d in (0, 2):  # lam 0: candidates ranked by log p alone, whatever the roll-outs found
        unweighted = decode(target, compiled, PROMPT, max_tokens=8, strategy=CDLH(likes_h, k=4, d=d, lam=0.0))
        assert unweighted.tokens == plain.tokens
    # d 0: no roll-outs, exactly one target pass per token, as greedy decoding
    no_rollouts = decode(target, compiled, PROMPT, max_tokens=8, strategy=CDLH(likes_h, k=4, d=0, lam=0.0))
    assert no_rollouts.stats.target_passes == plain.stats.target_passes


def never(text, final=False):
    return 0.0


@pytest.mark.parametrize(("a_t", "r_t", "reward", "allowed"), [
    (0.0, 0.0, likes_h, {"accept"}),  # both thresholds always pass
    (0.0, 1.0, never, {"reject_reward"}),  # a always passes, r never does
    (1.0, 1.0, never, {"reject_both", "reject_reward"}),  # r never passes
    (1.0, 0.0, likes_h, {"accept", "reject_acceptance"}),  # r always passes
])
def test_cdsl_state_visits_follow_from_the_thresholds(setup, a_t, r_t, reward, allowed):
    compiled, target, draft = setup
    cdsl = CDSL(draft, reward, d=3, acceptance_threshold=a_t, reward_threshold=r_t, fallback="target",
                reward_on="text", commit="lookahead")
    result = decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl)
    assert re.fullmatch(PATTERN, result.text) and result.finish_reason == "stop"
    assert set(cdsl.states) <= allowed
    # fallback "target": every step is exactly one target pass (verification), after the prefill pass
    assert sum(cdsl.states.values()) == result.stats.target_passes - 1


def test_cdsl_reward_threshold_changes_the_accepted_text(setup):
    compiled, target, draft = setup
    draft_text = decode(draft.runner, compiled, PROMPT, max_tokens=8).text
    texts = {}
    for r_t in (0.0, 1.0):  # a_t 0: only the reward threshold decides
        cdsl = CDSL(draft, likes_h, d=3, acceptance_threshold=0.0, reward_threshold=r_t, fallback="target",
                    reward_on="text", commit="lookahead")
        texts[r_t] = decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl).text
        assert set(cdsl.states) == ({"accept"} if r_t == 0.0 else {"reject_reward"})
    assert texts[0.0] == draft_text  # every lookahead kept: the draft's own text
    assert texts[1.0] != draft_text  # likes_h < 1 on every lookahead: the target wrote it instead


@pytest.mark.parametrize("fallback", ["cdlh", "target"])
def test_cdsl_counts_states_and_keeps_the_constraint(setup, fallback):
    compiled, target, draft = setup
    cdsl = CDSL(draft, likes_h, d=3, acceptance_threshold=0.5, reward_threshold=0.2, fallback=fallback,
                cdlh=CDLH(likes_h, k=3, d=2, lam=5.0))
    result = decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl)
    assert re.fullmatch(PATTERN, result.text) and result.finish_reason == "stop"
    assert set(cdsl.states) <= set(CDSL_STATES) and sum(cdsl.states.values()) >= 1
    assert result.stats.draft_passes > 0
    steps = sum(cdsl.states.values())
    if fallback == "target":
        assert result.stats.target_passes == 1 + steps
    else:  # a CDLH fallback step adds its candidate roll-outs (d 2) to the verification pass
        fallbacks = cdsl.states["reject_reward"] + cdsl.states["reject_both"]
        assert 1 + steps <= result.stats.target_passes <= 1 + steps + 2 * fallbacks


def test_cdsl_with_thresholds_zero_is_lossless_speculation(setup):
    compiled, target, draft = setup
    plain = decode(target, compiled, PROMPT, max_tokens=8)
    cdsl = CDSL(draft, likes_h, d=3, acceptance_threshold=0.0, reward_threshold=0.0, commit="prefix")
    assert decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl).text == plain.text
    assert set(cdsl.states) == {"accept"}


def test_cdsl_keeps_whole_accepted_lookaheads_and_verified_prefixes(setup):
    compiled, target, draft = setup
    draft_only = decode(draft.runner, compiled, PROMPT, max_tokens=8)
    keep_all = CDSL(draft, likes_h, d=8, acceptance_threshold=0.0, reward_threshold=0.0, commit="lookahead")
    result = decode(target, compiled, PROMPT, max_tokens=8, strategy=keep_all)
    assert result.tokens[:len(draft_only.tokens) - 1] == draft_only.tokens[:-1]  # the draft's own text
    assert result.stats.target_passes <= 3
    # a_t = 1 and a draft that disagrees: only verified prefixes plus target tokens, i.e. the target's text
    strict = CDSL(draft, likes_h, d=3, acceptance_threshold=1.0, reward_threshold=0.0, commit="lookahead")
    plain = decode(target, compiled, PROMPT, max_tokens=8)
    assert decode(target, compiled, PROMPT, max_tokens=8, strategy=strict).tokens == plain.tokens


def test_guided_draft_picks_reward_carrying_tokens(setup):
    compiled, _, draft = setup
    plain = decode(draft.runner, compiled, PROMPT, max_tokens=8)
    guided = GuidedDraft(draft.runner, likes_h, k=8, lam=100.0)
    cdsl = CDSL(guided, likes_h, d=6, acceptance_threshold=0.0, reward_threshold=0.0)
    steered = decode(draft.runner, compiled, PROMPT, max_tokens=8, strategy=cdsl)
    assert re.fullmatch(PATTERN, steered.text)
    assert likes_h(steered.text) > likes_h(plain.text)
    assert isinstance(CDSL(draft.runner, likes_h).draft, GuidedDraft)  # a bare draft model is reward-guided
    with pytest.raises(ValueError, match="k must be"):
        GuidedDraft(draft.runner, likes_h, k=0)
    with pytest.raises(ValueError, match="lam must be"):
        GuidedDraft(draft.runner, likes_h, lam=-1.0)


class WantsWord(Reward):
    """Met once ``word`` appears; suggests it until then."""

    def __init__(self, word: str) -> None:
        self.word = word

    def score(self, text, *, final):
        return float(self.word in text)

    def suggestions(self, text):
        return [] if self.word in text else [self.word]


def test_guided_draft_writes_suggested_words_whole_and_steered_commit_keeps_them(setup):
    compiled, target, draft = setup
    wants = WantsWord("hhh")
    plain = decode(target, compiled, PROMPT, max_tokens=8)
    assert "hhh" not in plain.text
    # k=1: the draft's own candidate is its argmax; only the suggestion can bring the word
    guided = GuidedDraft(draft.runner, wants, k=1, lam=1000.0)
    cdsl = CDSL(guided, wants, d=4, acceptance_threshold=0.0, reward_threshold=0.0, commit="steered")
    result = decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl)
    assert "hhh" in result.text and re.fullmatch(PATTERN, result.text)
    # without suggestions the draft never finds the word: the target's own text
    unsuggested = GuidedDraft(draft.runner, wants, k=1, lam=1000.0, suggest=False)
    cdsl = CDSL(unsuggested, wants, d=4, acceptance_threshold=0.0, reward_threshold=0.0, commit="steered")
    assert decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl).text == plain.text


def test_steer_ratio_keeps_a_steered_word_only_where_the_target_finds_it_plausible(setup):
    compiled, target, draft = setup
    wants = WantsWord("hhh")
    plain = decode(target, compiled, PROMPT, max_tokens=8)
    texts = {}
    for ratio in (0.0, 1.0):
        guided = GuidedDraft(draft.runner, wants, k=1, lam=1000.0)
        cdsl = CDSL(guided, wants, d=4, acceptance_threshold=0.0, reward_threshold=0.0, steer_ratio=ratio)
        texts[ratio] = decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl).text
    assert "hhh" in texts[0.0]  # kept against the target's choice
    # ratio 1: a steered token must be the target's own choice, so every commit is the target's: its text
    assert texts[1.0] == plain.text
    with pytest.raises(ValueError, match="steer_ratio"):
        CDSL(draft, wants, steer_ratio=1.5)


def test_an_output_ends_where_only_forced_tokens_are_left(setup):
    compiled, _, _ = setup
    tail = compile(Regex("[a-g]{1,3}hh"), compiled.vocabulary, backend="llguidance")  # "hh" after 1-3 letters
    encode = tail.vocabulary.encode
    state = tail.new_state()
    state.advance(encode("ab"))
    assert not state_ended(state, tail)  # another letter may come
    state.advance(encode("c"))
    assert state.forced_tokens() == encode("hh")
    assert state_ended(state, tail) and state.num_tokens == 3  # judged without moving the state
    # a lookahead "chh" from "ab": the token that ended the output is "c" (index 0), not the forced "hh"
    state.advance(encode("hh"))
    assert _closing_index(SimpleNamespace(state=state, compiled=tail), encode("chh")) == 0
    assert state.num_tokens == 5  # left after the whole lookahead


def test_bad_parameters_are_clear_errors(setup):
    _, _, draft = setup
    with pytest.raises(ValueError, match="k must be"):
        CDLH(likes_h, k=0)
    with pytest.raises(ValueError, match="d must be"):
        CDSL(draft, likes_h, d=0)
    with pytest.raises(ValueError, match="acceptance_threshold"):
        CDSL(draft, likes_h, acceptance_threshold=1.5)
    with pytest.raises(ValueError, match="reward_threshold"):
        CDSL(draft, likes_h, reward_threshold=-0.1)
    with pytest.raises(ValueError, match="fallback"):
        CDSL(draft, likes_h, fallback="beam")
    with pytest.raises(ValueError, match="reward_on"):
        CDSL(draft, likes_h, reward_on="tokens")
    assert CDSL(draft, likes_h).reward_on == "text"  # a callable is judged on every prefix
    assert CDSL(draft, WantsWord("hh")).reward_on == "text"
    assert CDSL(draft, KeywordCoverage(["dog"])).reward_on == "ending"
    with pytest.raises(ValueError, match="commit"):
        CDSL(draft, likes_h, commit="all")


def test_reward_on_ending_rejects_only_short_endings(setup):
    compiled, target, draft = setup
    never = CallableReward(lambda text, final: 0.0 if final else 1.0, name="never-finished")
    cdsl = CDSL(draft, never, d=3, acceptance_threshold=0.0, reward_threshold=0.5, reward_on="ending",
                fallback="target")
    two_letters = compile(Regex("[a-h]{2}"), compiled.vocabulary, backend="llguidance")
    result = decode(target, two_letters, PROMPT, max_tokens=8, strategy=cdsl)  # lookaheads reach EOS
    assert re.fullmatch("[a-h]{2}", result.text) and result.finish_reason == "stop"
    assert cdsl.states["reject_reward"] >= 1  # the lookahead that ends the output is refused


def test_a_reward_returning_nan_stops_decoding_with_a_typed_error(setup):
    compiled, target, _ = setup
    with pytest.raises(RewardError, match="nan"):
        decode(target, compiled, PROMPT, max_tokens=4,
               strategy=CDLH(CallableReward(lambda text: float("nan"), name="nan"), k=2, d=1))


def test_optimism_is_checked_and_prefers_unfinished_rollouts(setup):
    compiled, target, _ = setup
    with pytest.raises(ValueError, match="optimism"):
        CDLH(likes_h, optimism=2.0)
    # a reward met by nothing: without optimism every candidate scores log p alone (greedy decoding);
    # with full optimism an unfinished roll-out outscores ending, so the output runs to the pattern's
    # longest (6 letters) before EOS is the only token left
    unmet = CallableReward(lambda text: 0.0, name="unmet")
    plain = decode(target, compiled, PROMPT, max_tokens=8)
    hasty = decode(target, compiled, PROMPT, max_tokens=8, strategy=CDLH(unmet, k=9, d=1, lam=50.0, optimism=0.0))
    patient = decode(target, compiled, PROMPT, max_tokens=8, strategy=CDLH(unmet, k=9, d=1, lam=50.0, optimism=1.0))
    assert hasty.text == plain.text and len(plain.text) < 6
    assert len(patient.text) == 6 and re.fullmatch(PATTERN, patient.text) and patient.finish_reason == "stop"


def test_cdsl_gives_its_optimism_to_the_draft_and_fallback_it_builds(setup):
    _, _, draft = setup
    cdsl = CDSL(draft.runner, likes_h, optimism=0.2)
    assert cdsl.draft.optimism == cdsl.cdlh.optimism == 0.2
    assert CDSL(draft.runner, likes_h).draft.optimism == 0.5
    given = CDLH(likes_h, optimism=0.9)
    assert CDSL(draft.runner, likes_h, optimism=0.2, cdlh=given).cdlh is given  # one given is kept as it is
    with pytest.raises(ValueError, match="optimism"):
        CDSL(draft.runner, likes_h, optimism=1.5)


def test_guided_draft_stops_after_an_unsure_token(setup):
    compiled, target, draft = setup
    counts = {}
    for stop_below in (0.0, 1.0):  # 1.0: every token of the draft's own is unsure
        guided = GuidedDraft(draft.runner, likes_h, lam=0.0, stop_below=stop_below)
        cdsl = CDSL(guided, likes_h, d=4, acceptance_threshold=0.0, reward_threshold=0.0)
        result = decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl)
        assert re.fullmatch(PATTERN, result.text)
        counts[stop_below] = (result.stats.draft_passes, sum(cdsl.states.values()))
    assert counts[1.0][0] <= counts[1.0][1]  # at most one drafted token per step
    assert counts[0.0][0] > counts[0.0][1]
    with pytest.raises(ValueError, match="stop_below"):
        GuidedDraft(draft.runner, likes_h, stop_below=1.5)


def test_optimism_fades_with_the_token_budget():
    class Budget:
        max_tokens = 10

        @staticmethod
        def answer_of(tokens):  # the text a reward scores
            return "x" * len(tokens)

    half = CallableReward(lambda text: 0.5, name="half")
    assert optimistic_reward(Budget, half, [], ended=False, optimism=1.0) == 1.0  # all the budget left
    assert optimistic_reward(Budget, half, [1] * 5, ended=False, optimism=1.0) == 0.75
    assert optimistic_reward(Budget, half, [1] * 10, ended=False, optimism=1.0) == 0.5  # nothing left to earn
    assert optimistic_reward(Budget, half, [1], ended=True, optimism=1.0) == 0.5  # finished: the reward as is


class Spends(Reward):
    """Indifferent to the text, but counts ``letter`` against it once it appears (a keyword at its
    limit): its reward is flat, so only ``Reward.spent`` can keep the letter out."""

    earned_by_end = True

    def __init__(self, letter: str) -> None:
        self.letter = letter

    def score(self, text, *, final):
        return 1.0

    def spent(self, text):
        return [self.letter] if self.letter in text else []


def _spent_letter(compiled, runner):
    """The letter the plain greedy ``runner`` writes twice or more (its own repeat)."""
    text = decode(runner, compiled, PROMPT, max_tokens=8).text
    return next(c for c in text if text.count(c) > 1)


def test_guided_draft_does_not_start_a_spent_word(setup):
    compiled, _, draft = setup
    letter = _spent_letter(compiled, draft.runner)
    spends = Spends(letter)
    # CDSL that keeps every lookahead whole: its text is the guided draft's own
    for avoid, repeats in ((False, True), (True, False)):
        guided = GuidedDraft(draft.runner, spends, lam=20.0, avoid_spent=avoid)
        cdsl = CDSL(guided, spends, d=8, acceptance_threshold=0.0, reward_threshold=0.0, commit="lookahead",
                    avoid_spent=avoid)
        text = decode(draft.runner, compiled, PROMPT, max_tokens=8, strategy=cdsl).text
        assert re.fullmatch(PATTERN, text)
        assert (text.count(letter) > 1) == repeats


def test_cdsl_target_does_not_repeat_a_spent_word(setup):
    compiled, _, draft = setup
    target = ModelRunner(tiny_model(3))  # greedy, it repeats itself: "eaeaea"
    letter = _spent_letter(compiled, target)
    spends = Spends(letter)
    # the draft left unguarded: only the target's own choices (agreement, corrections, fallback) keep it out
    for fallback in ("target", "cdlh"):
        for commit in ("steered", "prefix"):
            cdsl = CDSL(GuidedDraft(draft.runner, spends, avoid_spent=False), spends, d=3, fallback=fallback,
                        commit=commit, cdlh=CDLH(spends, k=3, d=2))
            result = decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl)
            assert re.fullmatch(PATTERN, result.text) and result.text.count(letter) == 1
    # without the guard the target writes its own repeat
    cdsl = CDSL(GuidedDraft(draft.runner, spends, avoid_spent=False), spends, d=3, avoid_spent=False)
    assert decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl).text.count(letter) > 1


def _thrice(tokens):
    """Whether some block of tokens is written three times in a row."""
    return any(tokens[i:i + p] == tokens[i + p:i + 2 * p] == tokens[i + 2 * p:i + 3 * p]
               for p in range(1, len(tokens) // 3 + 1) for i in range(len(tokens) - 3 * p + 1))


@pytest.mark.parametrize("method", ["cdlh", "cdsl-target", "cdsl-cdlh"])
def test_keyword_rows_never_write_a_block_three_times(setup, method):
    _, _, draft = setup
    compiled = compile(Regex("[a-h]{2,16}"), letters_vocab(), backend="llguidance")
    target = ModelRunner(tiny_model(3))  # greedy, it repeats itself: "eaeaea"
    plain = decode(target, compiled, PROMPT, max_tokens=16)
    assert _thrice(plain.tokens)

    def strategy(guard):
        # a reward met from the start: it never moves, as keyword coverage once every keyword is written
        if method == "cdlh":
            return CDLH(lambda text, final=False: 1.0, k=3, d=2, loop_guard=guard)
        fallback = method.split("-")[1]
        return CDSL(draft.runner, lambda text, final=False: 1.0, d=4, fallback=fallback, loop_guard=guard)

    unguarded = decode(target, compiled, PROMPT, max_tokens=16, strategy=strategy(None))
    assert _thrice(unguarded.tokens)  # the draft's cycle, agreed by the target, or the target's own
    guarded = decode(target, compiled, PROMPT, max_tokens=16, strategy=strategy(SENTENCE_GUARD))
    assert re.fullmatch("[a-h]{2,16}", guarded.text) and not _thrice(guarded.tokens)
    assert guarded.stats.loop_guarded > 0


class LosesOn(Reward):
    """Pays 1 until ``letter`` is written and nothing after (a list of keywords, in miniature);
    ``says_failed``: whether it tells decoders so (``Reward.failed``) before the text ends."""

    earned_by_end = True

    def __init__(self, letter: str, says_failed: bool) -> None:
        self.letter, self.says_failed = letter, says_failed

    def score(self, text, *, final):
        return 0.0 if self.letter in text else 1.0

    def failed(self, text):
        return self.says_failed and self.letter in text


def test_cdsl_turns_back_at_the_token_that_loses_the_reward(setup):
    compiled, _, draft = setup
    target = ModelRunner(tiny_model(3))
    plain = decode(target, compiled, PROMPT, max_tokens=8).text
    letter = max(set(plain), key=plain.count)  # the target's own favourite
    for commit in ("steered", "prefix", "lookahead"):
        told = LosesOn(letter, says_failed=True)
        # the fallback judges each candidate by itself (d 0): a roll-out of this target writes the letter
        cdsl = CDSL(GuidedDraft(draft.runner, told), told, d=3, commit=commit, cdlh=CDLH(told, k=3, d=0, lam=50.0))
        result = decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl)
        assert re.fullmatch(PATTERN, result.text) and letter not in result.text
    # judged only on endings and never told, the reward sees the letter when it is too late
    untold = LosesOn(letter, says_failed=False)
    cdsl = CDSL(GuidedDraft(draft.runner, untold), untold, d=3, cdlh=CDLH(untold, k=3, d=2))
    assert letter in decode(target, compiled, PROMPT, max_tokens=8, strategy=cdsl).text


def test_optimism_is_not_credited_to_a_text_that_has_lost_the_reward():
    budget = SimpleNamespace(max_tokens=10, answer_of=lambda tokens: "x" * len(tokens))
    lost = LosesOn("x", says_failed=True)
    assert optimistic_reward(budget, lost, [1], ended=False, optimism=1.0) == 0.0
    assert optimistic_reward(budget, LosesOn("x", says_failed=False), [1], ended=False, optimism=1.0) == 0.9
