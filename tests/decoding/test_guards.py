"""RewardGuard: spent words and tokens that lose the reward are kept off, never every token."""

import re
from types import SimpleNamespace

import pytest
import torch

from cdsl_struct import Regex, compile
from cdsl_struct.decoding import DraftModelProposer, decode
from cdsl_struct.decoding.guards import RewardGuard, marked_tokens
from cdsl_struct.decoding.lookahead import CDLH, CDSL, GuidedDraft
from cdsl_struct.models.runner import ModelRunner
from cdsl_struct.rewards import KeywordCoverage, Reward, list_shaped
from tests.decoding.test_lookahead import Spends
from tests.decoding.test_mechanics_tiny import PROMPT, letters_vocab, tiny_model

PATTERN = "[a-h]{2,6}"


class Loses(Reward):
    """Flat until ``letter`` is written, lost for good after: only ``Reward.losing`` can keep it out
    before a lookahead that writes it is scored."""

    earned_by_end = True

    def __init__(self, letter: str) -> None:
        self.letter = letter
        self.guard_marks = letter

    def score(self, text, *, final):
        return 0.0 if self.failed(text) else 1.0

    def failed(self, text):
        return self.letter in text

    def losing(self, text, pieces):
        return [i for i, piece in enumerate(pieces) if piece is not None and self.letter in piece]


@pytest.fixture(scope="module")
def letters():
    return compile(Regex(PATTERN), letters_vocab(), backend="llguidance")


def test_spent_words_never_leave_a_position_without_a_token(letters):
    session = SimpleNamespace(compiled=letters)
    guard = RewardGuard(Spends("a"))
    row = torch.full((letters.vocab_size,), -float("inf"))
    row[0] = 1.0  # only "a" allowed: the guard gives way rather than end the output
    assert guard.guard(session, "ab", row.clone())[0] == 1.0
    row[1] = 0.5
    guarded = guard.guard(session, "ab", row.clone())
    assert guarded[0] == -float("inf") and guarded[1] == 0.5
    assert torch.equal(guard.guard(session, "bc", row.clone()), row)  # nothing spent yet
    assert torch.equal(RewardGuard(Spends("a"), spent=False).guard(session, "ab", row.clone()), row)


def test_marked_tokens_are_built_once_with_the_ends_last(vocab_of):
    vocabulary = vocab_of("smollm2")
    ids, pieces = marked_tokens(vocabulary, ",.")
    assert marked_tokens(vocabulary, ",.") == (ids, pieces)
    assert marked_tokens(vocabulary, ",.")[1] is pieces
    ends = len(vocabulary.eos_token_ids)
    assert ids[-ends:] == list(vocabulary.eos_token_ids) and pieces[-ends:] == (None,) * ends
    assert all("," in p or "." in p for p in pieces[:-ends])
    assert vocabulary.encode(",")[0] in ids and vocabulary.encode(" the")[0] not in ids


def test_a_spent_word_is_kept_off_by_its_first_token_unless_that_starts_other_words_too(vocab_of):
    vocabulary = vocab_of("smollm2")
    session = SimpleNamespace(compiled=SimpleNamespace(vocabulary=vocabulary))
    guard = RewardGuard(KeywordCoverage(["dog"], off_topic=["ai", "chatbot", "walk", "scissors"]))
    blocked = set(guard.blocked(session, "I am"))
    first = {spelling: vocabulary.encode(spelling) for spelling in
             (" AI", " ai", " walk", " Walk", " scissors", " Ai", " chatbot", " WALK", " Scissors")}
    assert [len(first[s]) for s in (" AI", " Ai", " chatbot", " WALK")] == [1, 2, 2, 3]
    assert {first[s][0] for s in (" AI", " ai", " walk", " Walk", " scissors")} <= blocked
    # " A" of " Ai", " chat" of " chatbot", " W" of " WALK", " Sc" of " Scissors": words of their own, or
    # too short to tell, that start many other words
    assert not {first[s][0] for s in (" Ai", " chatbot", " WALK", " Scissors")} & blocked
    assert vocabulary.encode(" A")[0] not in blocked and vocabulary.encode(" chat")[0] not in blocked


@pytest.mark.parametrize("text, closing, ending", [
    ("Bartender, bottle, drink", True, True),     # a third item: its comma, its full stop, the end make a list
    ("Car, drive, front of a road, pedestrian", True, True),
    ("Bartender, bottle", False, False),          # two items and a comma: not yet
    ("The man, who was tall, walked", False, False),
    ("He bought eggs, milk", False, False),
    ("Fresh beer", True, False),                  # a keyword opening the sentence as an item of its own
])
def test_list_guard_keeps_off_exactly_the_tokens_that_make_a_list(vocab_of, text, closing, ending):
    vocabulary = vocab_of("smollm2")
    session = SimpleNamespace(compiled=SimpleNamespace(vocabulary=vocabulary))
    reward = KeywordCoverage(["bar", "beer", "drink"], no_lists=True)
    blocked = set(RewardGuard(reward).blocked(session, text))
    # every token of the vocabulary: kept off exactly when the text with it is lost (a list so far),
    # or when it ends a sentence there as a list
    for token, raw in enumerate(vocabulary.token_bytes):
        if token in vocabulary.special_ids:
            continue
        piece = raw.decode("utf-8", errors="replace")
        stop = next((i for i, c in enumerate(piece) if c in ".!?"), None)
        loses = reward.failed(text + piece) or (stop is not None and list_shaped(text + piece[:stop], final=True))
        assert (token in blocked) == loses, (text, piece)
    assert all(eos in blocked for eos in vocabulary.eos_token_ids) == ending
    assert (vocabulary.encode(",")[0] in blocked) == closing and (vocabulary.encode(".")[0] in blocked) == ending
    assert not RewardGuard(KeywordCoverage(["bar"], no_lists=False)).blocked(session, text)
    assert not RewardGuard(reward, lost=False).blocked(session, text)
    assert not RewardGuard(reward).blocked(session, text + ", pour,")  # already a list: nothing to save


def _written_letter(compiled, runner):
    """A letter the plain greedy ``runner`` writes."""
    return decode(runner, compiled, PROMPT, max_tokens=8).text[1]


def test_cdlh_with_the_reward_guard_writes_no_token_that_loses_its_reward(letters):
    target = ModelRunner(tiny_model(1))
    letter = _written_letter(letters, target)
    loses = Loses(letter)

    def text(reward_guard):
        cdlh = CDLH(loses, k=3, d=2, reward_guard=reward_guard)
        return decode(target, letters, PROMPT, max_tokens=8, strategy=cdlh).text

    guarded = text(True)
    assert re.fullmatch(PATTERN, guarded) and letter not in guarded
    assert letter in text(False)  # the paper's CDLH: the roll-outs' reward alone


@pytest.mark.parametrize("fallback", ["target", "cdlh"])
def test_cdsl_writes_no_token_that_loses_its_reward(letters, fallback):
    target = ModelRunner(tiny_model(1))
    draft = DraftModelProposer(ModelRunner(tiny_model(2)))
    letter = _written_letter(letters, target)
    loses = Loses(letter)

    def text(avoid_lost):
        guided = GuidedDraft(draft.runner, loses, avoid_lost=avoid_lost)
        cdsl = CDSL(guided, loses, d=3, fallback=fallback, avoid_lost=avoid_lost)
        return decode(target, letters, PROMPT, max_tokens=8, strategy=cdsl).text

    guarded = text(True)
    assert re.fullmatch(PATTERN, guarded) and letter not in guarded
    assert letter in text(False)  # without the guard, ending-judged reward lets the target write it


@pytest.mark.parametrize("method", ["cdsl", "cdlh"])
def test_the_budget_closers_steps_keep_off_tokens_that_lose_the_reward(monkeypatch, method):
    """Near ``max_tokens`` the closer steps a lookahead row; its choice among the tokens after which
    an ending still fits leaves the reward's losing tokens out too."""
    from cdsl_struct.decoding import lookahead

    compiled = compile(Regex("[a-h]{3,8}"), letters_vocab(), backend="llguidance")
    target = ModelRunner(tiny_model(1))
    draft = DraftModelProposer(ModelRunner(tiny_model(2)))
    loses = Loses("a")  # the plain greedy target writes "ea..."

    def text():
        strategy = CDSL(GuidedDraft(draft.runner, loses), loses, d=3) if method == "cdsl" else \
            CDLH(loses, k=3, d=2, reward_guard=True)
        result = decode(target, compiled, PROMPT, max_tokens=3, strategy=strategy, on_budget="close")
        assert result.closed_by_budget and re.fullmatch("[a-h]{3,8}", result.text)
        return result.text

    assert "a" not in text()
    closing_step = lookahead.closing_step
    monkeypatch.setattr(lookahead, "closing_step", lambda session, guard=None, strings=False: closing_step(session))
    assert "a" in text()  # the closer's steps unguarded: the letter comes back


def test_cdlh_guards_its_roll_outs_as_its_candidates(letters, monkeypatch):
    """A candidate is judged by its roll-out; with ``reward_guard`` the roll-out keeps off what the
    candidates keep off, so a candidate is not scored by a loss another token would have avoided."""
    target = ModelRunner(tiny_model(1))
    seen: list[str] = []
    guard = RewardGuard.guard

    def spy(self, session, text, row):
        seen.append(text)
        return guard(self, session, text, row)

    monkeypatch.setattr(RewardGuard, "guard", spy)
    result = decode(target, letters, PROMPT, max_tokens=6, strategy=CDLH(Loses("a"), k=3, d=2, reward_guard=True))
    committed = result.text
    # a call per candidate choice (one per committed token) and per roll-out token after it
    assert len(seen) > 2 * len(committed)
    assert any(not committed.startswith(text) for text in seen)  # roll-outs leave the committed text
