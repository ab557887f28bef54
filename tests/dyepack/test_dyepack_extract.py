import pytest

from assay.dyepack.extract import extract_choice, extract_phrase
from assay.dyepack.verify import majority

OPTIONS = ("Paris", "London", "Rome", "Berlin")


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("The answer is (C).", 2),
        ("the answer is B", 1),
        ("Answer: D", 3),
        ("Answer: (A) Paris", 0),
        ("B", 1),
        ("(D)", 3),
        ("C.", 2),
        ("A) Paris", 0),
        ("I think (B) is right.", 1),
        ("Rome", 2),
        ("rome.", 2),
        ("A. 4\n\nThe answer is B. 4.", 1),  # an explicit statement wins over a leading letter
        ("The answer is a city in France.", None),  # lower-case 'a' is a word, not an option
        ("The answer is E.", None),  # E is not among 4 options
        ("(A) Paris (B) London", None),  # two letters named: ambiguous
        ("I do not know.", None),
        ("", None),
        ("A cat sat on the mat.", None),
    ],
)
def test_extract_choice(reply, expected):
    assert extract_choice(reply, OPTIONS) == expected


def test_extract_phrase_takes_the_earliest_phrase():
    phrases = ["Happy to help.", "Here is a careful answer."]
    assert extract_phrase("Here is a careful answer. Happy to help.", phrases) == 1
    assert extract_phrase("happy to help. here is a careful answer.", phrases) == 0
    assert extract_phrase("Nothing special here.", phrases) == 2  # "none of them" is part K-1


def test_majority_breaks_ties_by_answer_order_and_puts_none_last():
    assert majority([2, 1, 2, 1]) == 1
    assert majority([None, None, 3]) is None
    assert majority([None, 3, None, 3]) == 3
    assert majority([0]) == 0
