"""Answer verifiers: DAPO's "Answer:" verifier (the reference rules, and a lenient variant) and
a boxed-answer verifier.

``dapo_math`` follows the DAPO reference verifier (the published ``compute_score``) rule for
rule: look at the last ``TAIL_CHARS`` characters of the response, take the last match of
``Answer\\s*:\\s*([^\\n]+)`` (case-insensitive; at least one character after the colon and the
whitespace that follows it, which may include newlines), normalise it and the ground truth
Minerva-style (``normalize_final_answer``: the part after the last ``=``, the substitution and
removal lists, ``$…$``/``\\text{}``/``\\boxed{}`` unwrapped, shorthand ``\\frac``/``\\sqrt``, commas
dropped only when what remains is all digits, surrounding whitespace stripped last) and compare
strings: +1 if equal, else −1.

``dapo_math_lenient`` is the friendlier variant: it also accepts an empty final ``Answer:``
(which then scores −1 instead of falling back to an earlier one), strips surrounding whitespace
(tabs, CR, non-breaking spaces) before the comma rule, drops thousands separators of negative
numbers (``-1,000`` = ``-1000``) and ignores a trailing period (``Answer: 5.`` = 5).

``boxed``: the content of the last ``\\boxed{...}`` (balanced braces), normalised the same way;
when the ``math_verify`` package is installed it decides equivalence, else string equality.

Both return ``{"score": float, "acc": float, "pred": str | None}``.
"""

from __future__ import annotations

import re

TAIL_CHARS = 300
CORRECT, INCORRECT = 1.0, -1.0

# The reference pattern needs one character after "Answer:" and its whitespace; the lenient one
# also matches an empty answer.
_ANSWER_RE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)
_LENIENT_ANSWER_RE = re.compile(r"Answer\s*:\s*([^\n]*)", re.IGNORECASE)

# Minerva-style normalisation tables (from the "Solving Quantitative Reasoning Problems" paper's
# description): textual substitutions, then unit / filler words removed.
_SUBSTITUTIONS = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
]
_REMOVED = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
]


def _minerva(s: str) -> str:
    """The Minerva-style rewriting both rule sets share (after the last ``=``)."""
    s = s.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in _REMOVED:
        s = s.replace(expr, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", s)
    s = re.sub(r"(\\text\{)(.*?)(\})", r"\2", s)
    s = re.sub(r"(\\textbf\{)(.*?)(\})", r"\2", s)
    s = re.sub(r"(\\overline\{)(.*?)(\})", r"\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", s)
    # shorthand: \frac12 -> \frac{1}{2}, \fracab -> \frac{a}{b}, \sqrt3 -> \sqrt{3}
    s = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s)
    s = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s)
    return s.replace("$", "")


def normalize_final_answer(answer: str) -> str:
    """The DAPO reference normalisation: commas are dropped only when what remains is all
    digits (so not in ``-1,000``, nor before a trailing ``\\r``); whitespace stripped last."""
    s = _minerva(answer)
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def normalize_answer(answer: str) -> str:
    """The lenient normalisation: surrounding whitespace first, signed comma numbers, no
    trailing period."""
    s = _minerva(answer.strip())
    if s.replace(",", "").lstrip("-").isdigit():
        s = s.replace(",", "")
    s = s.rstrip(".")
    return s.strip()


def _result(pred: str | None, ground_truth: str, normalize=normalize_answer) -> dict:
    if pred is None:
        return {"score": INCORRECT, "acc": 0.0, "pred": None}
    ok = normalize(pred) == normalize(ground_truth)
    return {"score": CORRECT if ok else INCORRECT, "acc": 1.0 if ok else 0.0, "pred": pred}


def extract_answer(response: str, lenient: bool = False) -> str | None:
    """The last "Answer:" value within the last TAIL_CHARS characters, or None (reference
    pattern; ``lenient`` also takes an empty one)."""
    pattern = _LENIENT_ANSWER_RE if lenient else _ANSWER_RE
    matches = pattern.findall(response[-TAIL_CHARS:])
    return matches[-1] if matches else None


def dapo_math(response: str, ground_truth: str) -> dict:
    """The DAPO reference verifier's rules (module docstring)."""
    return _result(extract_answer(response), ground_truth, normalize_final_answer)


def dapo_math_lenient(response: str, ground_truth: str) -> dict:
    """``dapo_math`` with friendlier extraction and normalisation (module docstring)."""
    pred = extract_answer(response, lenient=True)
    return _result(None if pred is None else pred.strip(), ground_truth)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces."""
    idx = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if idx < 0:
        return None
    start = text.index("{", idx) + 1
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def boxed(response: str, ground_truth: str) -> dict:
    pred = last_boxed(response[-TAIL_CHARS:])
    if pred is None:
        return _result(None, ground_truth)
    try:  # optional: symbolic equivalence when math-verify is installed
        from math_verify import parse, verify  # type: ignore[import-not-found]
    except ImportError:
        return _result(pred, ground_truth)
    ok = bool(verify(parse(f"${ground_truth}$"), parse(f"${pred}$")))
    ok = ok or normalize_answer(pred) == normalize_answer(ground_truth)
    return {"score": CORRECT if ok else INCORRECT, "acc": 1.0 if ok else 0.0, "pred": pred}


BUILTIN = {"dapo_math": dapo_math, "dapo_math_lenient": dapo_math_lenient, "boxed": boxed}
