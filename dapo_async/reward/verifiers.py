"""Answer verifiers: DAPO's "Answer:" verifier and a boxed-answer verifier.

``dapo_math``: look at the last ``TAIL_CHARS`` characters of the response, take the last match of
``Answer\\s*:\\s*(...)`` up to the end of its line (case-insensitive), normalise it and the ground
truth Minerva-style (units, ``\\text{}``, spaces, dollar signs, trailing periods, shorthand
fractions …) and compare strings: score +1 if equal, else −1.

``boxed``: the content of the last ``\\boxed{...}`` (balanced braces), normalised the same way;
when the ``math_verify`` package is installed it decides equivalence, else string equality.

Both return ``{"score": float, "acc": float, "pred": str | None}``.
"""

from __future__ import annotations

import re

TAIL_CHARS = 300
CORRECT, INCORRECT = 1.0, -1.0

_ANSWER_RE = re.compile(r"Answer\s*:\s*([^\n]*)", re.IGNORECASE)

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


def normalize_answer(answer: str) -> str:
    """Minerva-style normalisation of a final answer string."""
    s = answer.strip()
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
    s = s.replace("$", "")
    # 1,000 -> 1000 (only when the whole answer is a number with thousands separators)
    if s.replace(",", "").lstrip("-").isdigit():
        s = s.replace(",", "")
    s = s.rstrip(".")
    return s.strip()


def _result(pred: str | None, ground_truth: str) -> dict:
    if pred is None:
        return {"score": INCORRECT, "acc": 0.0, "pred": None}
    ok = normalize_answer(pred) == normalize_answer(ground_truth)
    return {"score": CORRECT if ok else INCORRECT, "acc": 1.0 if ok else 0.0, "pred": pred}


def extract_answer(response: str) -> str | None:
    """The last "Answer:" value within the last TAIL_CHARS characters, or None."""
    matches = _ANSWER_RE.findall(response[-TAIL_CHARS:])
    return matches[-1].strip() if matches else None


def dapo_math(response: str, ground_truth: str) -> dict:
    return _result(extract_answer(response), ground_truth)


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


BUILTIN = {"dapo_math": dapo_math, "boxed": boxed}
