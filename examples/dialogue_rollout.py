"""A two-party dialogue: the policy answers, a scripted user asks a follow-up that depends on
that answer, the policy answers again. The user's turn is environment tokens (no loss); the
reward reads the whole episode (`reward` below, or add a reward model: reward.model_endpoint).

    generator.rollout=examples.dialogue_rollout:rollout  reward.fn=examples.dialogue_rollout:reward
"""

import re

from dapo_async.rollouts import Episode

_ANSWER = re.compile(r"Answer: (-?\d+)")


async def rollout(ctx, sample):
    ep = Episode(sample.prompt_tokens)
    first = await ctx.generate(ep.tokens)
    ep.add_turn(first)
    said = _ANSWER.search(ctx.decode(first.tokens))
    if said is not None and first.finish == "stop":
        # the user's follow-up, rendered with the model's own chat template, once, into tokens
        # (the policy's EOS already closed its turn)
        ep.add_env(ctx.render([{"role": "user", "content": f"{said.group(1)}*2="}]))
        ep.add_turn(await ctx.generate(ep.tokens))
    return ep.trajectory(info={"follow_up": float(said is not None)})


def reward(response: str, ground_truth: str) -> dict:
    """1 when both answers are right (the second is twice the first), else 0."""
    answers = _ANSWER.findall(response)
    right = answers == [ground_truth, str(2 * int(ground_truth))]
    return {"score": 1.0 if right else 0.0, "acc": float(right)}
