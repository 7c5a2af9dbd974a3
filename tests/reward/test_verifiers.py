import pytest

from dapo_async.reward.verifiers import (
    boxed,
    dapo_math,
    dapo_math_lenient,
    extract_answer,
    last_boxed,
    normalize_answer,
    normalize_final_answer,
)


@pytest.mark.parametrize(
    "response,truth,acc",
    [
        ("so the result is\nAnswer: 42", "42", 1.0),
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
    for fn in (dapo_math, dapo_math_lenient):  # where the two rule sets agree
        res = fn(response, truth)
        assert res["acc"] == acc
        assert res["score"] == (1.0 if acc else -1.0)


@pytest.mark.parametrize(
    "response,truth,reference,lenient",
    [
        # a trailing period stays part of the answer in the reference
        ("Answer: 5.", "5", -1.0, 1.0),
        # an empty final "Answer:": the reference pattern needs a character, so the earlier
        # match is the answer; the lenient pattern takes the empty one
        ("Answer: 5\nlet me check that again. Answer:", "5", 1.0, -1.0),
        # CRLF output: the reference's comma rule sees "1,000\r" (not all digits) and keeps the
        # comma; the lenient one strips the CR first
        ("Answer: 1,000\r\n", "1000", -1.0, 1.0),
        # negative numbers keep their thousands separators in the reference
        ("Answer: -1,000", "-1000", -1.0, 1.0),
    ],
)
def test_reference_rules_and_the_lenient_variant(response, truth, reference, lenient):
    assert dapo_math(response, truth)["score"] == reference
    assert dapo_math_lenient(response, truth)["score"] == lenient


def test_reference_normalisation_examples():
    assert normalize_final_answer("1,000") == "1000"
    assert normalize_final_answer("-1,000") == "-1,000"
    assert normalize_final_answer("5.") == "5."
    assert normalize_final_answer("1,000\r") == "1,000"  # stripped only after the comma rule
    assert normalize_final_answer("x = \\frac12 ") == "\\frac{1}{2}"


def test_dapo_math_pred_and_missing():
    assert dapo_math("Answer: 7", "7")["pred"] == "7"
    assert dapo_math("nothing", "7")["pred"] is None
    assert extract_answer("ANSWER: 12 apples\n") == "12 apples"
    assert extract_answer("Answer: 3\nAnswer:") == "3"  # the empty one does not match
    assert extract_answer("Answer: 3\nAnswer:", lenient=True) == ""


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
