"""The ``tiny:calc`` task's environment: a calculator the policy may call, as a rollout function.

    prompt     "37*41="
    policy     "CALL 37*41\\n"        a turn ends at the newline (a stop token)
    calculator "= 1517\\n"            environment tokens: sampled = 0, no loss
    policy     "Answer: 1517<eos>"    rewarded by the usual verifier on the whole episode

Configure with ``data.source=tiny:calc generator.rollout=dapo_async.tiny.calc:rollout
generator.mode=batch`` (``configs/tiny_calc.yaml``). The warm start (``dapo-async init-tiny
--task calc``) teaches both ways to answer, 70% the shortcut without the tool (``Answer: 37``:
wrong) and 30% the tool; greedy decoding then answers at once and is almost never right, and RL
learns to call the tool. ``check_figures`` is its warm-start criterion: the share of held-out
prompts answered right when the episode is made to open with ``CALL `` (the tool skill), beside
the greedy accuracy, the share of episodes that call the tool and the shortcut share.
"""

from __future__ import annotations

import re

from dapo_async.data.tasks import ENV_PREFIX
from dapo_async.rollouts import Episode, RolloutContext, Sample, Trajectory

TOOL_PREFIX = "CALL "
# Tool calls an episode may make before its next turn is its last.
MAX_CALLS = 2
# What the calculator takes: two integers of at most 6 digits and one of + - *.
_CALL_RE = re.compile(r"CALL (\d{1,6})([*+-])(\d{1,6})\n")


def calculate(a: str, op: str, b: str) -> str:
    x, y = int(a), int(b)
    return str(x * y if op == "*" else x + y if op == "+" else x - y)


async def rollout(ctx: RolloutContext, sample: Sample) -> Trajectory:
    """One calc episode: turns until one is not a well-formed tool call (at most MAX_CALLS
    calls). ``sample.extra["force_tool"]`` opens the episode with ``CALL `` in the prompt (the
    warm start's skill check). Info: ``tool_call`` (1 if the episode called the tool)."""
    prefix = TOOL_PREFIX if sample.extra.get("force_tool") else ""
    ep = Episode(list(sample.prompt_tokens) + (ctx.encode(prefix) if prefix else []))
    newline = ctx.encode("\n")
    calls = 0
    while True:
        turn = await ctx.generate(ep.tokens, stop_token_ids=newline)
        ep.add_turn(turn)
        said = (prefix if calls == 0 else "") + ctx.decode(turn.tokens)
        call = _CALL_RE.fullmatch(said)
        if call is None or turn.finish != "stop" or calls >= MAX_CALLS:
            break
        calls += 1
        ep.add_env(ctx.encode(f"{ENV_PREFIX}{calculate(*call.groups())}\n"))
    return ep.trajectory(info={"tool_call": float(calls > 0), "tool_calls": float(calls)})


def check_figures(model, tokenizer, records, max_tokens: int) -> dict[str, float]:
    """Greedy figures of a calc policy on ``records``: accuracy, tool_rate (episodes that call
    the tool), shortcut_rate (the answer is the prompt's first number) and steps_ok (right when
    made to open with the tool: the skill the warm start stops at)."""
    from dapo_async.engines.base import SamplingParams
    from dapo_async.engines.hf import HFEngine
    from dapo_async.reward.verifiers import dapo_math_lenient, extract_answer
    from dapo_async.rollouts import EpisodeRunner
    from dapo_async.tiny.sft_data import prompt_ids

    was_training = model.training
    engine = HFEngine("", model=model, tokenizer=tokenizer)
    runner = EpisodeRunner(rollout, engine, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    ids = prompt_ids(tokenizer, records)
    free = runner.run([Sample(p, r.ground_truth) for p, r in zip(ids, records)])
    forced = runner.run(
        [Sample(p, r.ground_truth, extra={"force_tool": True}) for p, r in zip(ids, records)]
    )
    model.train(was_training)
    n = max(1, len(records))
    first = [re.match(r"\d+", r.messages[0]["content"]).group(0) for r in records]
    return {
        "accuracy": sum(dapo_math_lenient(t.text, r.ground_truth)["acc"] for t, r in zip(free, records)) / n,
        "steps_ok": sum(dapo_math_lenient(t.text, r.ground_truth)["acc"] for t, r in zip(forced, records)) / n,
        "shortcut_rate": sum((extract_answer(t.text, lenient=True) or "").strip() == f for t, f in zip(free, first)) / n,
        "tool_rate": sum(t.info["tool_call"] for t in free) / n,
    }  # fmt: skip
