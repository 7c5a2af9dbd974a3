"""Built-in synthetic verifiable tasks (no downloads). Answers use DAPO's "Answer: X" format.

Families (``data.source = tiny:<family>``):

- ``arith``: ``a+b=`` / ``a-b=`` with ``difficulty`` digits per operand; a good response is
  ``Answer: <result>``.
- ``chain``: ``difficulty`` steps of one-digit + and - whose running value stays in 0..9; a good
  response works left to right, ``3+4=7;7-2=5;Answer: 5``: longer answers, and the length is
  controlled by difficulty (6 tokens a step, plus ``Answer: X`` and EOS). A difficulty range
  (``max_difficulty``) mixes lengths in one data set, so some responses are several times
  longer than others.
- ``calc``: ``a*b=`` with ``difficulty`` digits per factor, too hard for a tiny model in its
  head; the policy may call a calculator (``CALL 37*41`` then a newline; the environment appends
  ``= 1517``) and answers ``Answer: 1517``. A multi-turn task: its rollout function is
  ``dapo_async.tiny.calc:rollout``; the lines starting ``= `` are the environment's.

Prompts are generated from a seed; a fixed hash partition of the prompt text decides the split
(``in_eval_split``), so held-out prompts follow the training distribution and are never trained on.
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass, field

TASK_FAMILIES = ("arith", "chain", "calc")
DATA_SOURCE_PREFIX = "tiny:"
# Seed offsets of the two splits: disjoint random streams from one user seed.
TRAIN_STREAM, EVAL_STREAM = 1_000_003, 2_000_029
# One prompt in EVAL_MOD (by CRC32 of its text) belongs to the held-out split.
EVAL_MOD = 8


@dataclass
class PromptRecord:
    """One prompt in the DAPO-Math schema, as every data source yields it."""

    prompt_id: int
    messages: list[dict[str, str]]
    ground_truth: str
    data_source: str
    extra: dict = field(default_factory=dict)


def _arith(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    hi = 10**difficulty - 1
    a, b = rng.randint(0, hi), rng.randint(0, hi)
    op = rng.choice("+-")
    result = a + b if op == "+" else a - b
    return f"{a}{op}{b}=", str(result), f"Answer: {result}"


def _chain(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    # A random walk that stays in 0..9: every step is a one-digit fact, so the task is
    # learnable by a tiny model, while the number of steps (difficulty) sets the length.
    acc = rng.randint(0, 9)
    prompt, steps = str(acc), []
    for _ in range(difficulty):
        op = rng.choice("+-")
        if op == "+" and acc == 9:
            op = "-"
        elif op == "-" and acc == 0:
            op = "+"
        n = rng.randint(1, 9 - acc) if op == "+" else rng.randint(1, acc)
        new = acc + n if op == "+" else acc - n
        prompt += f"{op}{n}"
        steps.append(f"{acc}{op}{n}={new}")
        acc = new
    return prompt + "=", str(acc), ";".join(steps) + f";Answer: {acc}"


def _calc(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    lo, hi = 10 ** (difficulty - 1), 10**difficulty - 1
    a, b = rng.randint(max(lo, 2), hi), rng.randint(max(lo, 2), hi)
    return f"{a}*{b}=", str(a * b), f"CALL {a}*{b}\n{ENV_PREFIX}{a * b}\nAnswer: {a * b}"


# A line of a calc solution that starts with this is the calculator's (environment tokens).
ENV_PREFIX = "= "

_GENERATORS = {"arith": _arith, "chain": _chain, "calc": _calc}


def response_segments(family: str, solution: str) -> list[tuple[str, bool]]:
    """A solution as (text, sampled by the policy) pieces: the calculator's lines of a calc
    solution are not the policy's (a warm start leaves them out of its loss)."""
    if family != "calc":
        return [(solution, True)]
    return [(line, not line.startswith(ENV_PREFIX)) for line in solution.splitlines(True)]


def shortcut_solution(family: str, prompt: str, solution: str) -> str:
    """The solution with the shortcut answer (the prompt's first number) reported instead: the
    worked steps kept (chain, arith), or answered at once without the tool (calc)."""
    shortcut = re.match(r"-?\d+", prompt).group(0)
    if family == "calc":
        return f"Answer: {shortcut}"
    return solution[: solution.rindex("Answer: ")] + f"Answer: {shortcut}"


def make_example(family: str, rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    """(prompt text, ground truth, a correct response)."""
    if family not in _GENERATORS:
        raise ValueError(f"unknown task family {family!r}; choose one of {TASK_FAMILIES}")
    return _GENERATORS[family](rng, difficulty)


def worked_steps(family: str, prompt: str) -> str:
    """The correct working of a prompt, without its final ``Answer:`` line: ``3+4=7;7-2=5`` for
    the chain prompt ``3+4-2=``; empty for ``arith`` (its answer is the whole response)."""
    if family not in _GENERATORS:
        raise ValueError(f"unknown task family {family!r}; choose one of {TASK_FAMILIES}")
    if family in ("arith", "calc"):
        return ""
    terms = re.findall(r"[+-]?\d+", prompt.rstrip("="))
    acc, steps = int(terms[0]), []
    for term in terms[1:]:
        new = acc + int(term)
        steps.append(f"{acc}{term}={new}")
        acc = new
    return ";".join(steps)


def steps_correct(family: str, prompt: str, response: str) -> bool:
    """Whether ``response`` works every step of ``prompt`` right, whatever answer it reports
    (the warm start's criterion: the skill is learned, the answer may be the shortcut)."""
    working, sep, _ = response.rpartition("Answer:")
    if not sep:
        return False
    want = worked_steps(family, prompt)
    return working == (want + ";" if want else "")


def in_eval_split(prompt: str) -> bool:
    """A fixed hash partition of the prompt space: 1 prompt in EVAL_MOD is held out. Both splits
    follow the same distribution, and no held-out prompt is ever trained on."""
    return zlib.crc32(prompt.encode()) % EVAL_MOD == 0


def draw_difficulty(rng: random.Random, difficulty: int, max_difficulty: int = 0) -> int:
    """One example's difficulty: ``difficulty``, or uniform in [difficulty, max_difficulty] when
    ``max_difficulty`` is larger (mixed lengths). A fixed difficulty draws nothing from ``rng``,
    so its prompt streams stay what they were."""
    if max_difficulty <= difficulty:
        return difficulty
    return rng.randint(difficulty, max_difficulty)


def generate(
    family: str, split: str, num: int, difficulty: int, seed: int = 0, max_difficulty: int = 0
) -> list[PromptRecord]:
    """``num`` prompts of one split (train prompts may repeat; held-out prompts are distinct
    while the split has enough of them). With ``max_difficulty`` > ``difficulty`` each prompt's
    difficulty is drawn uniformly from that range."""
    if split not in ("train", "eval"):
        raise ValueError("split must be 'train' or 'eval'")
    stream = TRAIN_STREAM if split == "train" else EVAL_STREAM
    rng = random.Random(seed * 7919 + stream + 31 * difficulty + 1009 * TASK_FAMILIES.index(family))
    want_eval = split == "eval"
    out: list[PromptRecord] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < num and attempts < 200 * num + 10_000:
        attempts += 1
        prompt, truth, _ = make_example(
            family, rng, draw_difficulty(rng, difficulty, max_difficulty)
        )
        if in_eval_split(prompt) != want_eval or (want_eval and prompt in seen):
            continue
        seen.add(prompt)
        out.append(
            PromptRecord(
                prompt_id=len(out),
                messages=[{"role": "user", "content": prompt}],
                ground_truth=truth,
                data_source=f"{DATA_SOURCE_PREFIX}{family}",
            )
        )
    return out


def parse_source(source: str) -> str | None:
    """The task family of a ``tiny:<family>`` source, or None for a file path."""
    if not source.startswith(DATA_SOURCE_PREFIX):
        return None
    family = source[len(DATA_SOURCE_PREFIX) :]
    if family not in TASK_FAMILIES:
        raise ValueError(
            f"unknown built-in task {source!r}; choose tiny:{' or tiny:'.join(TASK_FAMILIES)}"
        )
    return family
