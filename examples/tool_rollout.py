"""A tool-calling rollout: the policy may write `CALL <python arithmetic>` on a line of its
own; the tool's answer is appended as environment tokens (no loss) and the policy goes on.

    generator.rollout=examples.tool_rollout:rollout  generator.mode=batch
"""

import ast
import operator

from dapo_async.rollouts import Episode

MAX_CALLS = 3
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expr: str) -> str:
    """+ - * of integers only (never ``eval``: the policy writes this text)."""

    def walk(node):
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError("unsupported")

    try:
        return str(walk(ast.parse(expr, mode="eval").body))
    except (SyntaxError, ValueError, RecursionError):
        return "error"


async def rollout(ctx, sample):
    ep = Episode(sample.prompt_tokens)  # token in, token out: never re-tokenised
    newline = ctx.encode("\n")
    calls = 0
    while True:
        turn = await ctx.generate(ep.tokens, stop_token_ids=newline)  # a turn ends at "\n"
        ep.add_turn(turn)
        line = ctx.decode(turn.tokens).strip()
        if not line.startswith("CALL ") or turn.finish != "stop" or calls == MAX_CALLS:
            break
        calls += 1
        ep.add_env(ctx.encode(f"= {evaluate(line[5:])}\n"))  # the tool speaks: sampled = 0
    return ep.trajectory(info={"tool_call": float(calls > 0)})
