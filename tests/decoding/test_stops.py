"""Stop strings in a stream: text that may begin a stop string is held back, a stop string is
never sent, and the rest of the final text arrives once the Result is known."""

from cdsl_struct.decoding.stops import StopHoldback, _occurrences


def test_holdback_never_sends_a_stop_string_or_its_start():
    held = StopHoldback(["END", "\n\n"])
    sent = [held.push(piece) for piece in ["hello E", "N", "D more"]]
    assert sent == ["hello ", "", ""]
    assert held.finish("hello ") == ""  # the Result was cut before the stop string


def test_holdback_releases_text_that_turned_out_not_to_be_a_stop_string():
    held = StopHoldback(["END"])
    assert held.push("an E") == "an "
    assert held.push("ND") == ""
    assert held.push("x") == ""  # "END" appeared: nothing past it is sent ...
    assert held.finish("an ENDx tail") == "ENDx tail"  # ... unless the constraint kept it as text
    fresh = StopHoldback(["END"])
    assert fresh.push("an EN") + fresh.push("ough") == "an ENough"


def test_every_occurrence_is_a_candidate():
    assert _occurrences("a7b7c", "7", 0) == [1, 3]
    assert _occurrences("a7b7c", "7", 2) == [3]
    assert _occurrences("aaa", "aa", 0) == [0, 1]
