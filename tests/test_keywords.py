"""A keyword request without a model: its options, the instruction naming the words, the answer's
form, the coverage report."""

from __future__ import annotations

import re

import pytest

from cdsl_struct.arguments import read_arguments
from cdsl_struct.errors import InvalidArgument
from cdsl_struct.keywords import (
    HOLD_ENDING_WORDS,
    OPTIMISM,
    PARAGRAPH,
    SENTENCE,
    KeywordReport,
    Keywords,
    named_prompt,
)


def test_a_list_a_dict_or_a_request_make_the_same_request():
    plain = Keywords.of(["dog", " ride "])
    assert plain == Keywords(("dog", "ride"))
    assert Keywords.of({"words": ["dog", "ride"]}) == plain
    assert Keywords.of(plain) is plain
    assert Keywords.of(None) is None
    options = Keywords.of({"words": ["dog"], "name": False, "form": "text", "max_repeats": 1, "no_lists": False,
                           "instruction": "Say {words}.", "hold_ending": False, "optimism": 0.5})
    assert (options.name, options.form, options.max_repeats, options.no_lists, options.instruction,
            options.hold_ending, options.optimism) == (False, "text", 1, False, "Say {words}.", False, 0.5)
    assert plain.optimism == OPTIMISM and Keywords.of({"words": ["dog"], "optimism": 0}).optimism == 0.0


@pytest.mark.parametrize(("value", "message"), [
    ("dog", "list of words"), ([], "list of words"), (["dog", ""], "list of words"), ([3], "list of words"),
    ({"words": ["dog"], "colour": "red"}, "unknown keyword option"), ({"name": True}, "needs its words"),
    ({"words": ["dog"], "form": "poem"}, "form must be one of"), ({"words": ["dog"], "name": "yes"}, "true or false"),
    ({"words": ["dog"], "hold_ending": 1}, "true or false"),
    ({"words": ["dog"], "max_repeats": 0}, "max_repeats"),
    ({"words": ["dog"], "optimism": 1.5}, "optimism"), ({"words": ["dog"], "optimism": True}, "optimism"),
    ({"words": ["dog"], "optimism": "low"}, "optimism"),
    ({"words": ["dog"], "instruction": "Use them."}, "{words}"),
])
def test_bad_keyword_requests_are_refused_naming_the_argument(value, message):
    with pytest.raises(InvalidArgument, match=message) as caught:
        Keywords.of(value)
    assert caught.value.param == "keywords"


def test_the_instruction_names_the_words_only_where_the_message_lacks_one():
    request = Keywords(("dog", "ride", "walk"))
    assert request.naming("Write a sentence.") == "Write one sentence that uses the words dog, ride, walk."
    assert request.naming("Write about a dog who rode home.") is not None  # walk is missing
    assert request.naming("The dogs rode and walked.") is None  # inflections name them
    assert Keywords(("dog",), name=False).naming("Write a sentence.") is None
    assert Keywords(("field_N", "look_V")).naming("Hi.").endswith("field, look.")  # CommonGen's tags dropped
    assert Keywords(("dog", "walk"), instruction="Mention {words}!").naming("Hi.") == "Mention dog, walk!"


def test_the_instruction_goes_to_the_last_user_message():
    request = Keywords(("dog", "walk"))
    assert named_prompt("Write a sentence. ", request) == \
        "Write a sentence.\n\nWrite one sentence that uses the words dog, walk."
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello."},
                {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Describe a scene."}]
    named = named_prompt(messages, request)
    assert named[:3] == messages[:3] and messages[3]["content"] == "Describe a scene."  # the caller's list is kept
    assert named[3] == {"role": "user", "content": "Describe a scene.\n\nWrite one sentence that uses the words "
                                                   "dog, walk."}
    assert named_prompt([{"role": "user", "content": "A dog went for a walk."}], request)[0]["content"] == \
        "A dog went for a walk."
    only_system = [{"role": "system", "content": "x"}]
    assert named_prompt(only_system, request) is only_system


def test_the_report_says_which_words_the_answer_holds_in_the_order_given():
    report = Keywords(("walk", "Dog", "ride")).report("The dogs walked home.")
    assert report == KeywordReport(covered=("walk", "Dog"), missing=("ride",))
    assert not report.complete
    assert report.as_dict() == {"covered": ["walk", "Dog"], "missing": ["ride"]}
    assert Keywords(("dog",)).report("Dogs bark.").complete


@pytest.mark.parametrize(("text", "sentence", "paragraph"), [
    ("She rode her dog to the park.", True, True),
    ("The price was 3.5 dollars, a lot!", True, True),
    ("A recipe for a dish.add, butter.", False, False),
    ("A juggling ball.1.1.1.", False, False),
    ("3.5 dollars, 12 cents.", True, True),
    ('"Walk the dog," she said.', True, True),
    ("Is it raining?", True, True),
    ("One sentence. Another one.", False, True),
    ("no capital here.", False, False),
    ("No ending", False, False),
    ("Two lines.\nHere.", False, False),
    ("One.  Two spaces.", False, False),
])
def test_the_sentence_form_is_one_finished_sentence_on_one_line(text, sentence, paragraph):
    assert bool(re.fullmatch(SENTENCE.pattern, text)) is sentence
    assert bool(re.fullmatch(PARAGRAPH.pattern, text)) is paragraph


def test_keywords_alone_answer_in_their_form_and_any_constraint_replaces_it():
    assert read_arguments(keywords=["dog"]).spec == SENTENCE
    assert read_arguments(keywords={"words": ["dog"], "form": "paragraph"}).spec == PARAGRAPH
    assert read_arguments(keywords={"words": ["dog"], "form": "text"}).spec is None
    assert read_arguments(keywords=["dog"], regex="[a-z]+").spec.pattern == "[a-z]+"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert read_arguments(keywords=["dog"], tools=[tool]).spec is None
    read = read_arguments(keywords=["dog", "walk"])
    assert read.keywords == Keywords(("dog", "walk"))
    assert read.reward.no_lists and read.reward.max_repeats == 2
    # a JSON answer's commas separate values: a schema's is judged by its string values, a tool call's not
    by_values = read_arguments(keywords=["dog"], schema={"type": "object"}).reward
    assert by_values.no_lists and by_values.json_values and not read.reward.json_values
    assert not read_arguments(keywords={"words": ["dog"], "no_lists": False}, schema={"type": "object"}).reward.no_lists
    assert not read_arguments(keywords=["dog"], tools=[tool]).reward.no_lists
    assert read_arguments(keywords=["dog"], regex="[a-z, ]+").reward.no_lists
    assert read.reward.off_topic and not read_arguments(keywords=["dog"], schema={"type": "object"}).reward.off_topic
    assert not read_arguments(keywords={"words": ["dog"], "no_lists": False}).reward.off_topic
    # no sentence ends while a word is missing: prose only, a JSON answer ends where its schema does
    assert read.reward.hold_ending == HOLD_ENDING_WORDS
    assert not read_arguments(keywords=["dog"], schema={"type": "object"}).reward.hold_ending
    assert not read_arguments(keywords={"words": ["dog"], "hold_ending": False}).reward.hold_ending
    assert read_arguments(regex="[a-z]+").keywords is None
