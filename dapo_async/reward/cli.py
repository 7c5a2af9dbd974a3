"""`dapo-async reward score`: score one response read on stdin and print the verdict as JSON.

The function is called in whichever documented form it takes: ``(response, ground_truth)`` or
``(prompt, response, ground_truth, extra_info)`` (``--prompt``, ``--extra-info`` JSON)."""

from __future__ import annotations

import argparse
import json
import sys

from dapo_async.reward.compose import RewardError, call_verifier, resolve


def main(args: argparse.Namespace) -> int:
    response = sys.stdin.read()
    try:
        extra = json.loads(args.extra_info)
    except ValueError as e:
        print(f"dapo-async reward: error: --extra-info is not JSON: {e}", file=sys.stderr)
        return 1
    if not isinstance(extra, dict):
        print("dapo-async reward: error: --extra-info must be a JSON object", file=sys.stderr)
        return 1
    try:
        fn = resolve(args.fn)
        res = call_verifier(fn, response, args.ground_truth, args.prompt, extra)
    except RewardError as e:
        print(f"dapo-async reward: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # the user's function failed: one line, not its traceback
        print(
            f"dapo-async reward: error: reward function {args.fn!r} raised "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(res, default=str))
    return 0
