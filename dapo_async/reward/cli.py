"""`dapo-async reward score`: score one response read on stdin and print the verdict as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from dapo_async.reward.compose import RewardError, normalize_result, resolve


def main(args: argparse.Namespace) -> int:
    response = sys.stdin.read()
    try:
        fn = resolve(args.fn)
        res = normalize_result(fn(response, args.ground_truth))
    except RewardError as e:
        print(f"dapo-async reward: error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(res, default=str))
    return 0
