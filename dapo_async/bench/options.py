"""The command line of each `dapo-async bench WHAT`: which module runs it and which options it
takes, so that `dapo-async bench ablation --help` lists the ablation's options only and an option
another bench owns (`bench transport --stream`) is a usage error instead of being ignored.

Stdlib only: the CLI builds these parsers before any heavy import; each bench module is imported
when it runs (``BENCHES[name].module``'s ``main(args)``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_CONFIG = "configs/tiny_cpu.yaml"
# The ladder's setting: longer chains, so the rungs separate (docs/results.md).
LADDER_CONFIG = "configs/tiny_long.yaml"
# `bench async --workload longtail`: responses of 1 to 10 steps.
LONGTAIL_CONFIG = "configs/tiny_longtail.yaml"
DEFAULT_SEEDS = "0,1,2"
# `bench learn --task`: the config of each built-in task's job.
TASK_CONFIGS = {"tiny:chain": DEFAULT_CONFIG, "tiny:calc": "configs/tiny_calc.yaml"}


def _runs(p: argparse.ArgumentParser, config: str | None, config_help: str = "") -> None:
    """Options of the benches that launch training runs: config, overrides, where runs go."""
    p.add_argument("--config", default=config, help=config_help or f"the run config ({config})")
    p.add_argument("--out", default="", help="folder for the run directories (default: temp)")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. algo.clip_high=0.3")


def _seeds(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", default=DEFAULT_SEEDS, help="seeds, one run per arm each")
    p.add_argument(
        "--eval-every", type=int, default=5, help="held-out evaluation period (learner steps)"
    )


def _buffer(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=32, help="groups per batched message")


def _decoder(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=LONGTAIL_CONFIG, help=f"the run config ({LONGTAIL_CONFIG})")
    p.add_argument("--seconds", type=float, default=None, help="stream time per measurement (4)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("overrides", nargs="*", help="dotted config overrides")


def _transport(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=None, help="time per measurement (2)")
    _buffer(p)  # the same batching as the buffer bench


def _generator(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"the run config ({DEFAULT_CONFIG})")
    p.add_argument("--engine", default="", help="hf | vllm (default: the config's)")
    p.add_argument("--seconds", type=float, default=None, help="time per measurement (3)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    p.add_argument("overrides", nargs="*", help="dotted config overrides")


def _weights(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--bucket-mb", type=int, default=64, help="flat bucket size")
    p.add_argument("--rounds", type=int, default=4, help="repetitions")


def _async(p: argparse.ArgumentParser) -> None:
    _runs(p, None, f"the run config ({DEFAULT_CONFIG}; --workload longtail: {LONGTAIL_CONFIG})")
    p.add_argument("--steps", type=int, default=None, help="learner steps per run (24)")
    p.add_argument("--staleness", type=int, default=2, help="max_staleness of the async run")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="repeat the set of runs (default 3); figures are medians over rounds of each "
        "round's own ratio, with their range",
    )
    p.add_argument(
        "--versus",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="default workload: each round also runs the async job with these overrides "
        "(repeat), reported beside it as versus_* and async_vs_versus (an A/B in one run, e.g. "
        "tracking.samples_per_step=0 for what recording costs)",
    )
    p.add_argument(
        "--decode-delay-ms",
        type=float,
        default=0.0,
        help="compute (spin) this long in each decode step of the hf generator: a slower CPU's "
        "generator (generator.decode_delay_s)",
    )
    p.add_argument(
        "--workload",
        choices=("default", "longtail"),
        default="default",
        help="default (sync vs async on the config) or longtail (sync, async batch generation "
        "and async stream generation)",
    )


def _ablation(p: argparse.ArgumentParser) -> None:
    _runs(p, DEFAULT_CONFIG, f"the DAPO arm's config ({DEFAULT_CONFIG})")
    _seeds(p)
    p.add_argument("--steps", type=int, default=None, help="learner steps (default: the config's)")
    p.add_argument(
        "--baseline", default="configs/tiny_grpo_naive.yaml", help="the naive-GRPO arm's config"
    )
    p.add_argument(
        "--components", action="store_true", help="also naive GRPO plus one DAPO component each"
    )
    p.add_argument(
        "--sync", action="store_true", help="also DAPO synchronous (max_staleness=0): async gap"
    )
    p.add_argument(
        "--stream", action="store_true", help="also DAPO with generator.mode=batch and =stream"
    )


def _learn(p: argparse.ArgumentParser) -> None:
    _runs(p, "", f"the run config (default: the --task's, {DEFAULT_CONFIG} for tiny:chain)")
    p.add_argument(
        "--task",
        default="tiny:chain",
        choices=sorted(TASK_CONFIGS),
        help="the built-in task whose job runs: tiny:chain (the main job) or tiny:calc "
        "(multi-turn, a calculator tool; reports the share of episodes that call it)",
    )
    p.add_argument("--init-seeds", default=DEFAULT_SEEDS, help="tiny-policy init seeds")
    p.add_argument("--rl-seeds", default="0,1", help="RL seeds per init seed")
    p.add_argument(
        "--cache-root", default=".cache", help="tiny policies go to CACHE_ROOT/tiny-seedS"
    )
    p.add_argument("--fresh", action="store_true", help="delete the cached tiny policies first")


def _ladder(p: argparse.ArgumentParser) -> None:
    _runs(p, LADDER_CONFIG)
    _seeds(p)
    p.add_argument("--steps", type=int, default=None, help="learner steps (default: the config's)")
    p.add_argument(
        "--ladder",
        default="paper",
        choices=("paper", "async"),
        help="paper (naive GRPO → DAPO, one component at a time, cumulative) or async "
        "(max_staleness 0,1,2,4 × decoupled / naive objective at one wall-clock budget)",
    )
    p.add_argument("--budget-s", type=float, default=60.0, help="--ladder async: training seconds")
    p.add_argument("--target", type=float, default=0.6, help="accuracy for time-to-target")


def _faults(p: argparse.ArgumentParser) -> None:
    _runs(p, DEFAULT_CONFIG)
    p.add_argument(
        "--only",
        default="",
        help="comma-separated scenarios: generators,buffer,learner,wsync (default: all four)",
    )


def _soak(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")


def _logprobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--response-tokens", type=int, default=8192, help="response length")
    p.add_argument("--vocab", type=int, default=32768, help="vocabulary size")
    p.add_argument("--chunk", type=int, default=1024, help="positions per chunk")


def _learner(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokens", default="8192,32768", help="response tokens per step, one set of runs each"
    )
    p.add_argument(
        "--shape", default="", help="qwen2.5-0.5b | cpu (default: qwen2.5-0.5b on a GPU, else cpu)"
    )
    p.add_argument("--steps", type=int, default=1, help="timed steps per run (the fastest counts)")


def _packing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds")


@dataclass(frozen=True)
class Bench:
    """One `dapo-async bench NAME`: its module (``main(args)``), one-line help, its options."""

    module: str
    help: str
    add_options: Callable[[argparse.ArgumentParser], None]


def _bench(name: str, help: str, add_options: Callable[[argparse.ArgumentParser], None]) -> Bench:
    return Bench(f"dapo_async.bench.{name}_bench", help, add_options)


BENCHES: dict[str, Bench] = {
    "transport": _bench("transport", "protocol path vs raw ZeroMQ", _transport),
    "buffer": _bench("buffer", "buffer ingest/serve rates and memory", _buffer),
    "generator": _bench("generator", "generator loop vs its bare engine", _generator),
    "decoder": _bench("decoder", "the hf stream decoder against its forward rate", _decoder),
    "weights": _bench("weights", "bucketed weight sync vs one flat broadcast", _weights),
    "async": _bench("async", "synchronous vs asynchronous training samples/s", _async),
    "ablation": _bench("ablation", "DAPO vs naive GRPO (and its components) over seeds", _ablation),
    "learn": _bench("learn", "the main job from fresh tiny policies: held-out gains", _learn),
    "ladder": _bench("ladder", "the DAPO paper's ladder or the staleness ladder", _ladder),
    "faults": _bench("faults", "what SIGKILL of each role costs a running job", _faults),
    "soak": _bench("soak", "a real buffer under 16 generators, 2 learners, hostile peers", _soak),
    "logprobs": _bench("logprobs", "peak memory of full vs chunked log-probs", _logprobs),
    "learner": _bench("learner", "the learner's step on a real-shaped model: tok/s, MFU", _learner),
    "packing": _bench("packing", "learner tokens/s, padded vs packed micro-batches", _packing),
}
