import pytest

from dapo_async.reward.verifiers import (
    boxed,
    dapo_math,
    extract_answer,
    last_boxed,
    normalize_answer,
)


@pytest.mark.parametrize(
    "response,truth,acc",
    [
        ("so the result is\nAnswer: 42", "42", 1.0),
        ("Answer: 42.", "42", 1.0),  # trailing period
        ("answer :   42", "42", 1.0),  # case and spaces
        ("Answer: $42$", "42", 1.0),  # dollar signs
        ("Answer: 42 \\text{ cm}", "42", 1.0),  # units in \text{}
        ("Answer: 42 degrees", "42", 1.0),  # unit word
        ("Answer: \\text{(B)}", "(B)", 1.0),  # \text{} unwrapped
        ("Answer: \\frac12", "\\frac{1}{2}", 1.0),  # shorthand fraction
        ("Answer: \\frac{1}{2}", "\\frac{1}{2}", 1.0),
        ("Answer: 1,000", "1000", 1.0),  # thousands separator
        ("Answer: x = 5", "5", 1.0),  # takes the right side of =
        ("Answer: 41", "42", 0.0),
        ("Answer: 3\nAnswer: 42", "42", 1.0),  # the last Answer: wins
        ("Answer: 42\nAnswer: 3", "42", 0.0),
        ("I think it's 42", "42", 0.0),  # missing answer
        ("Answer: 42\n" + "x" * 400, "42", 0.0),  # outside the last 300 characters
        ("x" * 400 + "\nAnswer: 42", "42", 1.0),
    ],
)
def test_dapo_math_cases(response, truth, acc):
    res = dapo_math(response, truth)
    assert res["acc"] == acc
    assert res["score"] == (1.0 if acc else -1.0)


def test_dapo_math_pred_and_missing():
    assert dapo_math("Answer: 7", "7")["pred"] == "7"
    assert dapo_math("nothing", "7")["pred"] is None
    assert extract_answer("ANSWER: 12 apples\n") == "12 apples"


def test_normalize_examples():
    assert normalize_answer("  \\$5.00. ") == "5.00"
    assert normalize_answer("\\boxed{7}") == "7"
    assert normalize_answer("10^{\\circ}") == "10"
    assert normalize_answer("\\sqrt2") == "\\sqrt{2}"


@pytest.mark.parametrize(
    "response,truth,acc",
    [
        ("The answer is \\boxed{42}.", "42", 1.0),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),  # nested braces
        ("\\boxed{1} then \\boxed{2}", "2", 1.0),  # last box wins
        ("\\boxed{1} then \\boxed{2}", "1", 0.0),
        ("no box here: 42", "42", 0.0),
        ("\\boxed{42", "42", 0.0),  # unbalanced
        ("\\fbox{9}", "9", 1.0),
    ],
)
def test_boxed_cases(response, truth, acc):
    assert boxed(response, truth)["acc"] == acc


def test_last_boxed_nested():
    assert last_boxed("\\boxed{a{b}c}") == "a{b}c"
