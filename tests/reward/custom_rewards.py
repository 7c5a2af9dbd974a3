"""A user's own reward functions in each documented form (imported by name by the reward
workers and by evaluation). They reward what they were given, not the policy's skill: the data
file these tests write has ground truth ``TRUTH`` and, in ``extra_info``, the question text, so a
function scores +1 only when its arguments arrived as documented (the four-argument forms also
need the response's length to be even, so rewards vary within a group and training has
something to learn from)."""


def _given(ground_truth) -> bool:
    return ground_truth == "TRUTH"


def _context(prompt, extra_info) -> bool:
    return bool(extra_info.get("question")) and extra_info["question"] in prompt


def two_float(response, ground_truth):
    return 1.0 if _given(ground_truth) else -1.0


def two_dict(response, ground_truth):
    ok = _given(ground_truth)
    return {"score": 1.0 if ok else -1.0, "acc": float(ok)}


def four_float(prompt, response, ground_truth, extra_info):
    ok = _context(prompt, extra_info) and len(response) % 2 == 0
    return 1.0 if ok else -1.0


def four_dict(prompt, response, ground_truth, extra_info):
    ok = _context(prompt, extra_info) and len(response) % 2 == 0
    return {"score": 1.0 if ok else -1.0, "acc": float(ok), "pred": response[-8:]}
