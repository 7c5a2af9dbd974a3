"""The `dapo-async` console script: argument parsing and dispatch to each subcommand.

Owns only parsing; every subcommand imports its heavy modules (torch, vLLM, Aim) after the
arguments are parsed, so `dapo-async --help` and `dapo-async config` start fast.
Exit status: 0 on success; 1 with a one-line reason on stderr on failure; 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from dapo_async.bench.options import BENCHES


class CliError(Exception):
    """A failure reported as one line on stderr with exit status 1."""


def _add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument(
        "config", nargs=None if required else "?", help="YAML file, e.g. configs/tiny_cpu.yaml"
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.clip_high=0.3")


def cmd_config(args: argparse.Namespace) -> int:
    import dataclasses

    from dapo_async import config

    if args.action == "docs" and args.config:
        return _explain(args.config)
    if args.action == "check":
        if args.config is None:
            raise CliError("config check needs a config file")
        from dapo_async.tools.config_check import main as check_main

        return check_main(args)
    if args.action == "docs":
        print("| key | default | accepts | description |\n| --- | --- | --- | --- |")
        for key, doc, default, accepts in config.field_docs():
            cell = doc.replace("|", "\\|")  # a bare | would split the table's cell
            print(f"| `{key}` | `{json.dumps(default)}` | {accepts} | {cell} |")
        return 0
    if args.config is None:
        raise CliError("config show needs a config file")
    cfg = config.load_config(args.config, args.overrides)
    for key in args.get or []:  # scripts (the Slurm template) read resolved values this way
        value = cfg
        for part in key.split("."):
            if not hasattr(value, part):
                raise CliError(f"config show --get: no key {key!r}")
            value = getattr(value, part)
        if dataclasses.is_dataclass(value):
            raise CliError(f"config show --get: {key!r} is a section; name one of its keys")
        print(json.dumps(value) if not isinstance(value, str) else value)
    if not args.get:
        print(config.to_yaml(cfg), end="")
    return 0


def _explain(key: str) -> int:
    """`config docs KEY`: the key (or every key of a section) with default, rule and doc."""
    import textwrap

    from dapo_async import config
    from dapo_async.config.load import unknown_key

    rows = [r for r in config.field_docs() if r[0] == key or r[0].startswith(key + ".")]
    if not rows:
        raise unknown_key(key)
    for name, doc, default, accepts in rows:
        print(f"{name} = {json.dumps(default)}    ({accepts})")
        print(textwrap.fill(doc, width=96, initial_indent="    ", subsequent_indent="    "))
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from dapo_async.transport import generate_keys

    paths = generate_keys(args.out)
    print(f"server public key: {paths['server']}")
    print(
        f"server secret key: {paths['server_secret']} (only on the hosts that serve: the "
        "buffer, learner rank 0's weight-sync store, a reward server)"
    )
    for role in ("learner", "generator", "client"):
        print(f"{role} key pair: {paths[role]}, {paths[role + '_secret']}")
    print(f"authorized client keys: {paths['authorized']}/")
    print(f"Set launch.curve_keys_dir={args.out} on every role.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dapo-async",
        description="Asynchronous actor-learner RL for LLMs with DAPO.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (
        _add_roles,
        _add_model_commands,
        _add_reward_commands,
        _add_admin,
        _add_bench,
        _add_tools,
    ):
        add(sub)
    for command in sub.choices.values():  # reports what it does not take (main); benches: each
        command.set_defaults(parser=command)
    return parser


def _add_roles(sub) -> None:
    """train (all roles, supervised), one role each (buffer, learner, generator, evaluator), and
    supervise (one role kept running where `train` does not run)."""
    p = sub.add_parser("train", help="train on one machine (the tiny CPU default runs end to end)")
    _add_config_args(p)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in run_dir from its newest checkpoint",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON summary line")
    p.set_defaults(func=_lazy("dapo_async.launch.train", "main"))

    p = sub.add_parser("buffer", help="run the replay-buffer service (one per run)")
    _add_config_args(p)
    p.set_defaults(func=_lazy("dapo_async.buffer.main", "main"))

    p = sub.add_parser("learner", help="run a learner rank (under torchrun for several ranks)")
    _add_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    p.set_defaults(func=_lazy("dapo_async.learner.main", "main"))

    p = sub.add_parser("generator", help="run one generator process")
    _add_config_args(p)
    p.add_argument(
        "--id", default="", help="generator name; a random suffix makes each process unique"
    )
    p.add_argument(
        "--spare",
        action="store_true",
        help="idle priority; decode only on cores a waiting learner lends (launch.spare_generators)",
    )
    p.set_defaults(func=_lazy("dapo_async.generator.main", "main"))

    from dapo_async.launch import keep_running  # argparse and the stdlib only

    keep_running.add_parser(sub)

    p = sub.add_parser("evaluator", help="run periodic held-out evaluation off the learner")
    _add_config_args(p)
    p.set_defaults(func=_lazy("dapo_async.evaluator.main", "main"))


def _add_model_commands(sub) -> None:
    """eval, init-tiny."""
    p = sub.add_parser("eval", help="held-out avg@k / pass@k of a model (run config's data)")
    p.add_argument("--config", default=None, help="run config (data, reward, lengths)")
    p.add_argument("--model", default=None, help="HF causal-LM directory (default: the config's)")
    p.add_argument(
        "--engine", choices=("hf", "vllm"), default=None, help="default: eval.engine (auto: hf)"
    )
    p.add_argument("--data", default=None, help="tiny:<task> or a parquet/jsonl file")
    p.add_argument(
        "--k", type=int, default=None, help="samples per prompt (avg@k, pass@k); default eval.k"
    )
    p.add_argument("--num-prompts", type=int, default=None, help="prompts of a built-in task")
    p.add_argument("--difficulty", type=int, default=None, help="built-in task difficulty")
    p.add_argument("--max-difficulty", type=int, default=None, help="mixed difficulty up to this")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default for k=1)")
    p.add_argument("--max-tokens", type=int, default=None, help="default: eval.max_tokens")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    p.add_argument("overrides", nargs="*", help="dotted config overrides")
    p.set_defaults(func=_lazy("dapo_async.tools.eval_cmd", "main"))

    p = sub.add_parser("init-tiny", help="build (or reuse) the built-in tiny policy")
    p.add_argument("--out", default=".cache/tiny", help="model directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--task",
        default="chain",
        help="warm-start task: chain | arith | calc (multi-turn, calculator tool)",
    )
    p.add_argument("--difficulty", type=int, default=3, help="warm-start task difficulty")
    p.add_argument(
        "--max-difficulty", type=int, default=0, help="mixed difficulty up to this (0 = off)"
    )
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.add_argument(
        "--sft-steps",
        type=int,
        default=None,
        help="exactly this many warm-start steps, no criterion (default: until 90%% of "
        "held-out prompts have every step right)",
    )
    p.set_defaults(func=_lazy("dapo_async.tiny.build", "main"))


def _add_reward_commands(sub) -> None:
    """reward score, reward-server."""
    p = sub.add_parser("reward", help="score a response read on stdin (verifier debugging)")
    p.add_argument("action", choices=["score"])
    p.add_argument(
        "--fn",
        default="dapo_math",
        help="dapo_math | dapo_math_lenient | boxed | code | package.module:function",
    )
    p.add_argument(
        "--ground-truth",
        required=True,
        help='the answer; for code: JSON {"tests": [{"input": stdin, "output": stdout}, ...]}',
    )
    p.add_argument("--prompt", default="", help="the prompt (four-argument functions)")
    p.add_argument(
        "--extra-info", default="{}", help="JSON object for four-argument functions' extra_info"
    )
    p.set_defaults(func=_lazy("dapo_async.reward.cli", "main"))

    p = sub.add_parser(
        "reward-server", help="serve an HF sequence-classification reward model over ZeroMQ"
    )
    p.add_argument("--model", required=True, help="HF sequence-classification model directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = a free port (printed)")
    p.add_argument("--keys", default="", help="CurveZMQ keys directory (`dapo-async keys`)")
    p.add_argument("--endpoint-file", default="", help="also write the endpoint to this file")
    p.add_argument("--insecure-allow-public-bind", action="store_true")
    p.add_argument("--max-batch", type=int, default=64, help="texts per forward pass")
    p.add_argument("--batch-wait-s", type=float, default=0.005, help="wait for more requests")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.set_defaults(func=_lazy("dapo_async.reward.server", "main"))


def _add_admin(sub) -> None:
    """config, keys."""
    p = sub.add_parser(
        "config",
        help="show the resolved config, check it against its model and data, or the key "
        "reference (`config docs KEY`: one key or section)",
    )
    p.add_argument("action", choices=["show", "check", "docs"])
    _add_config_args(p, required=False)
    p.add_argument(
        "--get", action="append", metavar="KEY", help="show: print only this key's value (repeat)"
    )
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("keys", help="generate CurveZMQ key pairs for non-loopback binds")
    p.add_argument("--out", required=True, help="directory for the keys")
    p.set_defaults(func=cmd_keys)


def _add_bench(sub) -> None:
    """bench WHAT: one sub-command a bench, each with its own options (bench/options.py)."""
    p = sub.add_parser("bench", help="throughput benchmarks (print figures; --json for one line)")
    benches = p.add_subparsers(dest="what", metavar="WHAT", required=True)
    for name, bench in BENCHES.items():
        b = benches.add_parser(name, help=bench.help, description=bench.help)
        b.add_argument("--json", action="store_true", help="end with one JSON line")
        bench.add_options(b)
        b.set_defaults(func=_lazy(bench.module, "main"), parser=b)  # over bench's own


def _add_tools(sub) -> None:
    """tune, report, dashboard."""
    p = sub.add_parser(
        "tune",
        help="throughput sweep (--grid) or hyper-parameter search with pruning (--search)",
    )
    _add_config_args(p)
    p.add_argument(
        "--grid", action="append", default=[], help="KEY=V1,V2,... (repeat for a product grid)"
    )
    _add_search_args(p)
    p.add_argument("--steps", type=int, default=8, help="learner steps per point")
    p.add_argument("--out", default="", help="folder for the runs (default: runs/tune-<time>)")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    p.add_argument(
        "--recommend",
        action="store_true",
        help="predict the best learner/generator split from the best point and verify it",
    )
    p.add_argument(
        "--budget", type=int, default=0, help="--recommend: processes to split (default: cores)"
    )
    p.add_argument(
        "--cores",
        type=int,
        default=0,
        help="--recommend: cores they share (default: this machine's)",
    )
    p.set_defaults(func=_lazy("dapo_async.bench.tune", "main"))

    p = sub.add_parser("report", help="write PNG plots of runs (summary, dynamics, …; overlays)")
    p.add_argument("run_dir", nargs="+", help="run directories (hold metrics/*.jsonl)")
    p.add_argument("--out", default="", help="output folder; default RUN_DIR/report (one run only)")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    p.set_defaults(func=_lazy("dapo_async.tools.report", "main"))

    from dapo_async.tools import inspect_cmd

    inspect_cmd.add_parser(sub)

    p = sub.add_parser("dashboard", help="serve the run's Aim repo (`aim up`) until Ctrl-C")
    p.add_argument("run_dir", help="the run directory (or an Aim repo with --repo)")
    p.add_argument(
        "--repo",
        default="",
        help="Aim repo path; default: the project's repo beside the run directory (runs/aim), "
        "or RUN_DIR/aim for a run that kept its own",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    p.add_argument("--port", type=int, default=43800, help="UI port")
    p.set_defaults(func=_lazy("dapo_async.tools.dashboard", "main"))


def _lazy(module: str, attr: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib

        return getattr(importlib.import_module(module), attr)(args)

    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line. Overrides may follow options (`train CONFIG --json a.b=1`: argparse
    alone takes positionals in one run); anything else a sub-command does not take is reported
    by that sub-command, with its usage (`bench transport …`), exit status 2."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and isinstance(getattr(args, "overrides", None), list):
        late = [a for a in unknown if "=" in a and not a.startswith("-")]
        args.overrides = [*args.overrides, *late]
        unknown = [a for a in unknown if a not in late]
    if unknown:
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _add_search_args(p) -> None:
    """`tune --search`: the options of the Optuna search (dapo_async/bench/search.py)."""
    p.add_argument(
        "--search",
        action="append",
        default=[],
        help="KEY=low:high[:log]: a searched key and its range (repeat; integers stay integers)",
    )
    p.add_argument("--trials", type=int, default=8, help="--search: trials (default 8)")
    p.add_argument(
        "--objective",
        default="heldout",
        choices=("heldout", "reward", "samples_per_s"),
        help="--search: what to maximise (held-out accuracy at the last evaluation, default)",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="--search: held-out evaluation (and pruning check) every N steps; 0 = --steps/4",
    )
    p.add_argument("--pruner", default="median", choices=("median", "halving"), help="--search")
    p.add_argument("--budget-s", type=float, default=0, help="--search: wall-clock limit, 0 = none")
    p.add_argument("--resume", action="store_true", help="--search: continue the study in --out")
    p.add_argument("--seed", type=int, default=0, help="--search: the TPE sampler's seed")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from dapo_async.config import ConfigError
    from dapo_async.transport import SecurityError

    try:
        return int(args.func(args) or 0)
    except (CliError, ConfigError, SecurityError) as e:
        print(f"dapo-async {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"dapo-async {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`dapo-async config docs | head`): not an error of ours; point
        # stdout at /dev/null so the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
