"""Rewards: keyword inflections, harmlessness, progress rewards, combinators, bad scores."""

import math

import pytest

from cdsl_struct.rewards import (
    TALK_ABOUT_WORDS,
    CallableReward,
    Harmlessness,
    KeywordCoverage,
    MinReward,
    RegexMatch,
    RewardError,
    SchemaProgress,
    WeightedMean,
    list_shaped,
)


def test_keyword_coverage_counts_inflections():
    reward = KeywordCoverage(["field_N", "look_V", "stand_V"])
    assert reward("The player stood in the field looking at the batter.") == 1.0
    assert reward.covered("Two fields, standing room only") == ["field", "stand"]
    assert reward("Nothing relevant here.") == 0.0
    assert reward("a field") == pytest.approx(1 / 3)
    assert reward.missing("a field") == ["look", "stand"]


def test_keyword_coverage_suggests_the_forms_of_missing_words_only():
    reward = KeywordCoverage(["field_N", "stand_V"])
    suggested = reward.suggestions("a field")
    assert {"stand", "stood", "standing", "stands"} <= set(suggested)
    assert not {"field", "fields"} & set(suggested)
    assert reward.suggestions("fields where they stood") == []
    assert CallableReward(lambda text: 0.5).suggestions("x") == []  # a plain callable suggests nothing
    merged = MinReward([reward, KeywordCoverage(["stand", "look"])]).suggestions("")
    assert len(merged) == len(set(merged)) and {"field", "stood", "looked"} <= set(merged)


def test_which_rewards_are_earned_by_the_end():
    coverage, harmless = KeywordCoverage(["dog"]), Harmlessness()
    assert coverage.earned_by_end and SchemaProgress({"required": ["a"]}).earned_by_end
    assert RegexMatch("x").earned_by_end and not harmless.earned_by_end
    assert not CallableReward(lambda text: 1.0).earned_by_end  # unknown: judged on every prefix
    assert MinReward([coverage, KeywordCoverage(["cat"])]).earned_by_end
    assert not WeightedMean([coverage, harmless]).earned_by_end


def test_keyword_coverage_hard_mode_and_word_boundaries():
    hard = KeywordCoverage(["dance", "kid"], mode="hard")
    assert hard("The kids danced.") == 1.0
    assert hard("The kids sat.") == 0.0
    assert KeywordCoverage(["cat"])("concatenate") == 0.0  # whole words only
    with pytest.raises(ValueError, match="mode"):
        KeywordCoverage(["a"], mode="medium")


def test_harmlessness_ranks_rude_text_lower():
    reward = Harmlessness()
    polite, rude = reward("Have a lovely day, my friend."), reward("You are a stupid idiot, shut up.")
    assert 0.0 <= rude < 0.5 < polite <= 1.0
    assert reward("") == 1.0


def test_progress_rewards():
    schema = {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"]}
    progress = SchemaProgress(schema)
    assert progress('{"a":1,') == 0.5 and progress('{"a": 1, "b": 2}') == 1.0
    regex = RegexMatch(r"\d{4}")
    assert regex("in 1969") == 1.0 and regex("soon") == 0.0
    full = RegexMatch(r"\d{4}", full=True)
    assert full("1969", final=True) == 1.0 and full("1969", final=False) == 0.0


def test_combinators():
    half = CallableReward(lambda text: 0.5)
    one = CallableReward(lambda text, final: 1.0)
    assert WeightedMean([half, one])("x") == 0.75
    assert WeightedMean([half, one], weights=[3, 1])("x") == pytest.approx(0.625)
    assert MinReward([half, one])("x") == 0.5
    with pytest.raises(ValueError):
        WeightedMean([half], weights=[-1])


@pytest.mark.parametrize("bad", [math.nan, -0.1, 1.5, "high", None, math.inf])
def test_bad_scores_are_typed_errors(bad):
    with pytest.raises(RewardError, match="my_reward"):
        CallableReward(lambda text: bad, name="my_reward")("x")


def test_keyword_coverage_penalises_repeats_beyond_the_limit():
    reward = KeywordCoverage(["dog", "run_V"], max_repeats=2)
    assert reward.counts("The dog runs, dogs ran, a dog.") == [3, 2]
    assert reward.excess("The dog runs, dogs ran, a dog.") == 1
    assert reward("The dog runs.") == 1.0
    assert reward("The dog runs with a dog.") == 1.0  # twice is allowed
    assert reward("The dog runs with a dog and a dog.") == pytest.approx(0.5)  # one repeat too many
    assert reward("Dog dog dog dog dog.") == 0.0  # stuffing one word never scores
    stuffed = "dog run " * 6
    assert reward(stuffed) < reward("The dog runs.")
    hard = KeywordCoverage(["dog", "run"], mode="hard", max_repeats=1)
    assert hard("The dog runs.") == 1.0 and hard("The dog runs to a dog.") == 0.0
    assert KeywordCoverage(["dog"])("dog dog dog dog") == 1.0  # no limit by default
    with pytest.raises(ValueError, match="max_repeats"):
        KeywordCoverage(["dog"], max_repeats=0)


def test_keyword_coverage_names_the_forms_of_words_at_their_limit_as_spent():
    reward = KeywordCoverage(["dog", "run_V"], max_repeats=2)
    assert reward.spent("The dog runs.") == []  # once each: one more is still free
    spent = reward.spent("The dog runs with dogs.")  # "dog" twice: a third would count against it
    assert {"dog", "dogs"} <= set(spent) and not {"run", "ran", "running"} & set(spent)
    assert {"ran", "running"} <= set(reward.spent("The dogs ran and ran."))
    assert KeywordCoverage(["dog"]).spent("dog dog dog") == []  # no limit, nothing spent
    assert CallableReward(lambda text: 0.5).spent("x") == []  # a plain callable spends nothing
    merged = MinReward([reward, KeywordCoverage(["dog"], max_repeats=1)]).spent("a dog")
    assert len(merged) == len(set(merged)) and "dogs" in merged
    assert WeightedMean([reward]).spent("dog, dog") == reward.spent("dog, dog")


@pytest.mark.parametrize(("text", "final", "shaped"), [
    ("Jockey, horse, race, ride.", True, True),
    ("Sit, a card, a floor, a shuffle, a sit.", True, True),
    ("The car, gas, pump, station, a classic scene.", True, True),
    ("He bought eggs, milk, and bread at the store.", True, False),
    ("Red, white, and blue flags waved.", True, False),
    ("After the race, the jockey rode his horse home, tired but happy.", True, False),
    ("Jockey, horse, race", True, True),
    ("Jockey, horse, race", False, False),  # the last piece is still being written
    ("Jockey, horse, race,", False, True),
])
def test_a_list_of_words_is_told_from_a_sentence(text, final, shaped):
    assert list_shaped(text, final=final) is shaped


def test_no_lists_pays_nothing_for_a_list_and_says_when_it_is_lost():
    plain = KeywordCoverage(["jockey", "horse", "race"])
    strict = KeywordCoverage(["jockey", "horse", "race"], no_lists=True)
    listed, sentence = "Jockey, horse, race.", "The jockey rode his horse in the race."
    assert plain(listed, final=True) == 1.0 and strict(listed, final=True) == 0.0
    assert strict(sentence, final=True) == 1.0
    assert not strict.failed("He saw a jockey, horse") and strict.failed("He saw a jockey, horse, race, crowd,")
    assert not plain.failed("Jockey, horse, race,")
    assert strict.earned_by_end  # still judged on endings: a missing word may come later


def test_no_lists_names_the_pieces_that_make_a_list():
    strict = KeywordCoverage(["jockey", "horse", "race"], no_lists=True)
    pieces = [",", ".", ");", " and", "ly,", " big race.", None]
    assert strict.guard_marks and not KeywordCoverage(["jockey"]).guard_marks
    # a third item: a separator or a stop closes it, the output's end judges it; "ly," lengthens
    # the last word only; " big race." adds two words to it (three: no item), so it ends no list
    assert strict.losing("He saw a jockey, horse, race, crowd", pieces) == [0, 1, 2, 4, 6]
    assert strict.losing("He saw a jockey, horse", pieces) == []
    assert strict.losing("He saw a jockey, horse, crowd,", [" race,", " race.", " a very long race,"]) == [0, 1]
    assert strict.losing("Jockey, horse, race,", pieces) == []  # lost already: nothing to save
    assert KeywordCoverage(["jockey"]).losing("Jockey, horse, race", pieces) == []
    assert CallableReward(lambda text: 1.0).losing("Jockey, horse, race", pieces) == []


def test_combined_rewards_lose_as_their_rule_says():
    strict = KeywordCoverage(["a"], no_lists=True)
    never = CallableReward(lambda text: 1.0)
    pieces, text = [",", " b"], "Dog, cat, bird"
    assert MinReward([strict, never]).guard_marks == strict.guard_marks
    assert MinReward([strict, never]).losing(text, pieces) == [0]
    assert WeightedMean([strict, never]).losing(text, pieces) == []
    assert WeightedMean([strict, strict]).losing(text, pieces) == [0]


def test_text_about_the_words_earns_nothing_and_is_kept_off_before_it_is_written():
    about = KeywordCoverage(["boat", "dock"], off_topic=TALK_ABOUT_WORDS)
    talk, sentence = "Boat, dock are all words that use the alphabet.", "The boat sat at the dock."
    assert about(sentence, final=True) == 1.0 and about(talk, final=True) == 0.0
    assert KeywordCoverage(["boat", "dock"])(talk, final=True) == 1.0
    assert about.failed("Boat and dock are words") and not about.failed(sentence)
    assert {"word", "words", "sentence", "letters"} <= set(about.spent(sentence))  # off before it is written
    # a keyword is never off topic
    own = KeywordCoverage(["word", "dog"], off_topic=TALK_ABOUT_WORDS)
    assert "word" not in own.off_topic and not own.failed("The dog heard a word.")
    assert "words" not in own.spent("The dog")


def test_a_sentence_that_opens_by_listing_a_keyword_is_lost():
    strict = KeywordCoverage(["jump", "pool", "stand"], no_lists=True)
    assert strict.failed("Jump,") and strict.failed("The pool, stand")
    assert strict("Jump, pool, stand are all the same.", final=True) == 0.0
    assert strict("He jumps into the pool, then stands.", final=True) == 1.0
    assert not strict.failed("The man, who was tall,") and not strict.failed("Jumping into the pool,")
    assert not KeywordCoverage(["jump"]).failed("Jump,")
    # the comma that would open the list is kept off, the full stop and the end are not
    assert strict.losing("Jump", [",", ".", None]) == [0]


def test_a_sentence_of_keywords_alone_is_their_list_without_commas():
    strict = KeywordCoverage(["jump", "pool", "stand"], no_lists=True)
    for alone in ("Jump pool stand.", "Jumping pools stands!", "Pool stand."):
        assert strict(alone, final=True) == 0.0, alone
    assert strict("Jump pool stand", final=False) == 1.0  # unfinished, it may still become a sentence
    assert not strict.failed("Jump pool stand")
    for sentence in ("The pool stand jumps.", "Jump into the pool and stand.", "Jump."):
        assert strict(sentence, final=True) > 0.0, sentence
    assert KeywordCoverage(["jump", "pool", "stand"])("Jump pool stand.", final=True) == 1.0
    # its ending is held (written on where anything else fits), a word that makes it a sentence is not
    assert strict.losing("Jump pool stand", [".", None, " in", "s."]) == [0, 1, 3]


def test_combined_rewards_fail_as_their_rule_says():
    strict = KeywordCoverage(["a"], no_lists=True)
    never = CallableReward(lambda text: 1.0)
    listed = "Dog, cat, bird,"
    assert not never.failed(listed)
    assert MinReward([strict, never]).failed(listed)  # one part lost: the minimum is lost
    assert not WeightedMean([strict, never]).failed(listed)  # the mean can still earn the other part
    assert WeightedMean([strict, strict]).failed(listed)


def test_hold_ending_names_the_endings_while_a_word_is_missing():
    held = KeywordCoverage(["dog", "ride", "walk"], hold_ending=20)
    pieces = [".", "!", ",", " walk.", " walks", " the.", None]
    assert held.guard_marks == ".!?" and not KeywordCoverage(["dog"]).guard_marks
    # "walk" missing: the full stop, the "!" and the end are kept off; " walk." ends with every word in
    assert held.losing("The dog went for a ride", pieces) == [0, 1, 5, 6]
    assert held.losing("The dog went for a ride and a walk", pieces) == []
    assert held("The dog went for a ride.", final=True) == 2 / 3  # the score is the same
    # a sentence that has ended is not held: its end, not a closing quote, comes next
    assert held.losing("The dog went for a ride.", [None, "."]) == []
    # beside no_lists: a list's comma and a short answer's full stop both
    both = KeywordCoverage(["jockey", "horse", "race"], no_lists=True, hold_ending=20)
    assert both.losing("A cow, a hen, a crowd", [",", ".", " and"]) == [0, 1]
    assert both.losing("He saw a jockey", [",", ".", " and horse race."]) == [1]
    # a long text may end short of its words: held only below the word count
    assert KeywordCoverage(["dog", "walk"], hold_ending=5).losing("The dog ran off", ["."]) == [0]
    assert KeywordCoverage(["dog", "walk"], hold_ending=4).losing("The dog ran off", ["."]) == []
    with pytest.raises(ValueError, match="hold_ending"):
        KeywordCoverage(["dog"], hold_ending=True)


def test_keywords_match_phrases_possessives_and_accented_words():
    reward = KeywordCoverage(["child", "ice cream", "t-shirt", "café", "naïve"])
    text = "A child's ice cream and two Ice Creams, T-shirts at the Café, so naïve."
    assert reward.counts(text) == [1, 2, 1, 1, 1] and not reward.missing(text)
    assert reward.missing("The child ate ice and cream. Cafe naive shirts.") == ["ice cream", "t-shirt", "café",
                                                                               "naïve"]
    assert "ice creams" in reward.suggestions("Hello") and "t shirt" in reward.suggestions("Hello")
    # the list rules see a phrase's words as the keyword's
    listed = KeywordCoverage(["ice cream", "beach"], no_lists=True)
    assert listed("Ice cream beach.", final=True) == 0.0 and listed("The ice cream on the beach.", final=True) == 1.0
    # a contraction is not a possessive
    assert KeywordCoverage(["don"]).missing("I don't know.") == ["don"]


@pytest.mark.parametrize(("keyword", "found", "not_found"), [
    ("C++", "I write c++ and C++ code.", "I write C code."),
    ("5G", "A 5G phone.", "A 15G phone, a 5GB card."),
    ("COVID-19", "After covid-19 ended.", "After COVID-199 ended."),
    ("Python 3.12", "Upgrade to python 3.12 now.", "Upgrade to Python 3.1 now."),
    ("!!!", "Wow!!!", "Wow!!"),
])
def test_a_keyword_not_made_of_words_is_matched_as_written(keyword, found, not_found):
    """Digits and symbols are no part of a word (``_WORD``): such a keyword was missing from every
    text ("c++" read as the word "c"), so the Result said so and the steering never stopped."""
    reward = KeywordCoverage([keyword, "dog"])
    assert reward.counts(found)[0] >= 1 and reward.counts(not_found)[0] == 0
    assert reward.suggestions("Hello")[0] == keyword  # the draft is steered to it as written
    assert reward.missing(found + " A dog.") == []
    limited = KeywordCoverage([keyword], max_repeats=1)
    assert limited.spent(found) == [keyword] and limited.spent(not_found) == []


def test_json_string_values_are_read_from_a_json_text_finished_or_not():
    from cdsl_struct.rewards.keywords import json_string_values

    text = '{"caption": "Car, gas", "tags": ["dog", "walk"], "n": 3, "quote": "say \\"hi\\"", "mood": "ha'
    assert json_string_values(text) == [("Car, gas", True), ("dog", True), ("walk", True),
                                        ('say \\"hi\\"', True), ("ha", False)]
    assert json_string_values('{"caption": "A", "mo') == [("A", True)]  # a key being written is no value
    assert json_string_values('[{"a": "x"}, "y"]') == [("x", True), ("y", True)]


def test_a_json_answer_is_judged_by_its_string_values():
    words = ["car", "gas", "pump", "station"]
    strict = KeywordCoverage(words, no_lists=True, json_values=True)
    listed = '{"caption": "Car, gas, pump, station", "mood": "busy"}'
    sentence = '{"caption": "A car waits at the gas pump by the station.", "mood": "busy"}'
    assert strict(listed, final=True) == 0.0 and strict(sentence, final=True) == 1.0
    assert KeywordCoverage(words, no_lists=True)(sentence, final=True) == 1.0  # prose judging: the JSON's commas
    # a value that opens with a keyword as an item of its own, or holds three keywords and nothing else
    assert strict('{"caption": "Car, a pump at the gas station."}', final=True) == 0.0
    assert strict('{"caption": "Car gas pump station"}', final=True) == 0.0
    # values that may be tags: one keyword each, or two
    assert strict('{"tags": ["car", "gas", "pump", "station"]}', final=True) == 1.0
    assert strict('{"tags": "car gas", "caption": "A pump at the station, then home."}', final=True) == 1.0
    assert strict.failed('{"caption": "He saw a car, gas, pump, station,') and \
        not strict.failed('{"caption": "He saw a car, gas, pump, station')


def test_in_json_the_guard_keeps_off_what_makes_the_value_being_written_a_list():
    strict = KeywordCoverage(["car", "gas", "pump", "station"], no_lists=True, json_values=True)
    assert strict.guard_marks == ',;"' and not KeywordCoverage(["car"], json_values=True).guard_marks
    pieces = [",", '",', '"}', " station", ", the", None, '\\"', " near the old station,"]
    # a third item closed by a separator or the closing quote; an escaped quote continues the value;
    # " near the old station," ends a piece of four words (no item)
    assert strict.losing('{"caption": "He saw a car, gas, pump, station', pieces) == [0, 1, 2, 4]
    assert strict.losing('{"caption": "He saw a car, gas, pump', pieces) == []
    assert strict.losing('{"caption": "He saw a car, gas, pump, station", "mood"', [",", ":"]) == []  # the JSON's
    assert strict.losing('{"caption": "He saw a car, gas, pump, station\\', ['"', '" and']) == []  # escaped
