"""`dapo-async bench async`: synchronous vs asynchronous training throughput, measured in one run.

Runs the same training job twice with the launcher (`dapo-async train`), first synchronous
(``buffer.max_staleness=0``: generation and training alternate) then asynchronous
(``buffer.max_staleness=--staleness``: they overlap), and reads each learner's metrics:

- ``*_samples_per_s``: responses trained per second in steady state: from the end of step
  ``1 + staleness`` to the end of the last step, in both runs (start-up, the first generation and
  the backlog an asynchronous run may build before its first step are excluded);
- ``*_learner_idle``: the learner's share of that time spent waiting for data;
- ``speedup`` = async ÷ sync samples/s; held-out accuracy before and after each run;
- ``*stale_share*``: the share of the qualified groups dropped as stale at assembly.
- ``*filtered_token_share*``: the share of the generated response tokens in groups dynamic
  sampling dropped (all responses equally right or wrong), over the whole run: decoding that
  trains nothing, which makes the generator the bottleneck as the policy masters the task;
- ``phase<i>_learner_idle*`` and ``phase<i>_produced_per_qualified*``: the window in thirds,
  each with the learner's idle share and the groups generated per group that qualified
  (``bench.common.window_phases``): where in the run the learner waits, and why.

The default is the tiny CPU job (one learner, one generator, one torch thread each).

``--workload longtail`` (``configs/tiny_longtail.yaml``: chains of 1 to 10 steps, responses from
a few tokens to 70) runs three jobs: synchronous, asynchronous with ``generator.mode=batch`` and
asynchronous with ``generator.mode=stream``, and adds per mode ``engine_occupancy_*`` (the share
of the engine's sequence slots doing useful work), ``speedup_stream_vs_batch``, and, per
asynchronous mode, the two-sample KS statistic between the response lengths of the groups that
qualified and of those trained (``ks_len_*``, ``ks_p_*``): a mode that favours fast responses
trains shorter ones than it generates.

``--rounds N`` (default 3) runs the set N times (one folder a round) and reports each figure's
median over the rounds, a ratio as the median of each round's own ratio, and under ``range`` its
lowest and highest; single runs of the long-tail set moved by ±0.1 in
``speedup_stream_vs_batch`` on one machine (docs/results.md). ``--decode-delay-ms`` slows the hf
generator's every decode step (a slower CPU's generator). Per mode, ``learner_lent_s`` and
``generator_borrowed_s`` say how long the learner's threads went to the generator while it
waited (``launch.share_cores``); with ``launch.spare_generators``, ``spare_cpu_s`` is the CPU
time the spares used (only while the learner waited) and ``learner_core_idle`` the share of the
window the learner waited and no spare used its core (``bench.common.window_core_idle``).
``machine`` names the CPU, its cores and caches (``bench.common.machine``). A run whose policy
collapsed (the learner's ``sampled_drop`` alert) is named under ``warnings`` and on stderr: its
samples/s measures dynamic sampling refilling, not the overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from dapo_async.bench.common import (
    PHASES,
    collapsed_steps,
    heldout_accuracy,
    learner_window,
    machine,
    print_result,
    run_train,
    window_core_idle,
    window_phases,
    window_rates,
    window_wait_floor,
)
from dapo_async.bench.options import DEFAULT_CONFIG, LONGTAIL_CONFIG
from dapo_async.bench.stats import ks_two_sample, quantile
from dapo_async.buffer.counters import Counters


def steady_state(run_dir: Path, skip: int = 1) -> dict[str, float]:
    """Figures over the learner steps after the first ``skip`` ones."""
    start, window = learner_window(run_dir, skip)
    out = {
        **window_rates(start, window),
        **window_core_idle(run_dir, start, window),
        "learner_wait_floor": window_wait_floor(run_dir, start, window, os.cpu_count() or 1),
        "steps": float(skip + len(window)),
        "staleness_mean": sum(r["staleness/mean"] for r in window) / len(window),
    }
    for i, part in enumerate(window_phases(start, window), 1):  # flat keys: medians per round
        out[f"phase{i}_learner_idle"] = part["learner_idle"]
        out[f"phase{i}_produced_per_qualified"] = part["produced_per_qualified"]
    for when in ("before", "after"):
        if (run_dir / f"eval_{when}.json").exists():
            out[f"heldout_{when}"] = heldout_accuracy(run_dir, when)
    return out


def run_job(config: str, overrides: list[str], run_dir: Path, skip: int) -> dict[str, float]:
    run_train(config, overrides, run_dir)
    out = steady_state(run_dir, skip)
    gens = [json.loads(p.read_text()) for p in (run_dir / "generators").glob("*.json")]
    occupancy = [g["engine_occupancy"] for g in gens if "engine_occupancy" in g]
    out["engine_occupancy"] = statistics.fmean(occupancy) if occupancy else float("nan")
    # cores lent by the learner while it waited, borrowed by generators (launch.share_cores)
    out["generator_borrowed_s"] = sum(g.get("cores/borrowed_s", 0.0) for g in gens)
    out["learner_lent_s"] = last_learner_value(run_dir, "cores/lent_s")
    final = json.loads((run_dir / "buffer_final.json").read_text())
    out["filtered_token_share"] = filtered_token_share(final["counters"])
    out["stale_share"] = stale_share(final["counters"])
    hists = final["response_len_hist"]
    qualified, trained = (
        {int(k): v for k, v in hists[h].items()} for h in ("qualified", "trained")
    )
    out["ks_len"], out["ks_p"] = ks_two_sample(qualified, trained)
    out["len_p05"], out["len_p95"] = quantile(qualified, 0.05), quantile(qualified, 0.95)
    out["len_min"], out["len_max"] = float(min(qualified)), float(max(qualified))
    out["collapsed_at"] = collapsed_steps(run_dir)
    return out


def filtered_token_share(counters: dict) -> float:
    """``Counters.filtered_token_share`` of a buffer's final counters (NaN for a buffer that
    did not count tokens)."""
    share = Counters.from_dict(counters).filtered_token_share()
    return float("nan") if share is None else share


def stale_share(counters: dict) -> float:
    """The share of the qualified groups dropped as stale at assembly: a surplus admission let
    in (``buffer.admit_expected``) or a generator that lagged (NaN with none qualified)."""
    qualified = counters.get("qualified", 0)
    stale = counters.get("dropped", {}).get("stale", 0)
    return stale / qualified if qualified else float("nan")


def _span(steps: list[int]) -> str:
    return f"{steps[0]}–{steps[-1]}" if len(steps) > 1 else str(steps[0])


def collapse_warnings(res: dict[str, dict]) -> list[str]:
    """One line per job of a round whose policy collapsed (``collapsed_at`` steps)."""
    return [
        f"{name}: the sampled accuracy collapsed at steps {_span(r['collapsed_at'])} (alert "
        "sampled_drop): its samples/s measures dynamic sampling refilling, not the steady state"
        for name, r in res.items()
        if r.get("collapsed_at")
    ]


def last_learner_value(run_dir: Path, key: str) -> float:
    """The learner's last reported ``key`` (0.0 when it never reported one)."""
    value = 0.0
    path = run_dir / "metrics" / "learner.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            value = float(json.loads(line).get(key, value))
        except ValueError:
            continue  # a line cut by a crash
    return value


def round_runner(args: argparse.Namespace, steps: int, root: Path) -> Callable[..., dict]:
    """``run(name, *overrides)``: one job of a round in ``root/name``, ``steps`` steps, the
    command line's overrides, figures from step 1 + max_staleness on (the steady state)."""
    base = [f"learner.num_steps={steps}", "tracking.aim=false", *args.overrides]
    if args.decode_delay_ms:
        base.append(f"generator.decode_delay_s={args.decode_delay_ms / 1000}")
    return lambda name, *o: run_job(args.config, [*base, *o], root / name, 1 + args.staleness)


def longtail_round(args: argparse.Namespace, steps: int, root: Path) -> dict:
    """Synchronous, asynchronous batch and asynchronous stream generation, one run each."""
    run = round_runner(args, steps, root)
    runs = {
        "sync": ["buffer.max_staleness=0", "generator.mode=batch"],
        "batch": [f"buffer.max_staleness={args.staleness}", "generator.mode=batch"],
        "stream": [f"buffer.max_staleness={args.staleness}", "generator.mode=stream"],
    }
    res = {name: run(name, *o) for name, o in runs.items()}
    out: dict = {"workload": "longtail", "steps": steps, "max_staleness": args.staleness}
    for name, r in res.items():
        out[f"samples_per_s_{name}"] = r["samples_per_s"]
        out[f"learner_idle_{name}"] = r["learner_idle"]
        out[f"learner_core_idle_{name}"] = r["learner_core_idle"]
        out[f"learner_wait_floor_{name}"] = r["learner_wait_floor"]
        out[f"spare_cpu_s_{name}"] = r["spare_cpu_s"]
        out[f"engine_occupancy_{name}"] = r["engine_occupancy"]
        out[f"heldout_after_{name}"] = r.get("heldout_after")
        out[f"learner_lent_s_{name}"] = r["learner_lent_s"]
        out[f"generator_borrowed_s_{name}"] = r["generator_borrowed_s"]
        out[f"filtered_token_share_{name}"] = r["filtered_token_share"]
        out[f"stale_share_{name}"] = r["stale_share"]
        out.update({f"{k}_{name}": v for k, v in r.items() if k.startswith("phase")})
    for name in ("batch", "stream"):
        out[f"ks_len_{name}"], out[f"ks_p_{name}"] = res[name]["ks_len"], res[name]["ks_p"]
    out["speedup_stream_vs_batch"] = res["stream"]["samples_per_s"] / res["batch"]["samples_per_s"]
    out["speedup_batch_vs_sync"] = res["batch"]["samples_per_s"] / res["sync"]["samples_per_s"]
    out["speedup_stream_vs_sync"] = res["stream"]["samples_per_s"] / res["sync"]["samples_per_s"]
    r = res["stream"]
    out["response_len"] = {k: r[f"len_{k}"] for k in ("min", "p05", "p95", "max")}
    out["run_dirs"] = [str(root / name) for name in runs]
    out["warnings"] = collapse_warnings(res)
    return out


def _spread(out: dict, key: str, fmt: str = ".2f") -> str:
    """``value`` or, over several rounds, ``value (low–high)``."""
    lo_hi = out.get("range", {}).get(key)
    text = format(out[key], fmt)
    return f"{text} ({lo_hi[0]:{fmt}}–{lo_hi[1]:{fmt}})" if lo_hi else text


def _core_idle(out: dict, suffix: str, prefix: str = "") -> str:
    """The floor of the learner's wait (``bench.common.window_wait_floor``) and, with spare
    generators, the learner's core idle share, beside its wait share."""
    text = f", floor {_spread(out, f'{prefix}learner_wait_floor{suffix}')}"
    if out.get(f"{prefix}spare_cpu_s{suffix}"):
        text += f", core idle {_spread(out, f'{prefix}learner_core_idle{suffix}')} (spares)"
    return text


def _phases(out: dict, key: Callable[[str], str]) -> str:
    """The learner's idle share and the groups made per qualified one, by part of the window
    (``key(figure)`` names a part's key; \"\" when the result has none)."""
    parts = [i for i in range(1, PHASES + 1) if key(f"phase{i}_learner_idle") in out]
    if not parts:
        return ""
    idle = "/".join(f"{out[key(f'phase{i}_learner_idle')]:.2f}" for i in parts)
    made = "/".join(f"{out[key(f'phase{i}_produced_per_qualified')]:.1f}" for i in parts)
    return f"; by thirds of the run: learner idle {idle}, groups made per qualified {made}"


def longtail_summary(out: dict) -> str:
    return (
        f"longtail: sync {out['samples_per_s_sync']:.1f}, batch {out['samples_per_s_batch']:.1f}, "
        f"stream {out['samples_per_s_stream']:.1f} samples/s; stream/batch "
        f"{_spread(out, 'speedup_stream_vs_batch')}x; learner idle stream "
        f"{_spread(out, 'learner_idle_stream')}{_core_idle(out, '_stream')}; occupancy batch {out['engine_occupancy_batch']:.2f} "
        f"stream {out['engine_occupancy_stream']:.2f}; generated tokens dropped by dynamic "
        f"sampling stream {out['filtered_token_share_stream']:.2f}; qualified groups dropped "
        f"stale stream {out['stale_share_stream']:.3f}; KS(trained vs qualified lengths) stream "
        f"{out['ks_len_stream']:.3f} (p {out['ks_p_stream']:.2f})"
        f"{_phases(out, lambda k: f'{k}_stream')}"
    )


def default_round(args: argparse.Namespace, steps: int, root: Path) -> dict:
    """Synchronous (max_staleness 0) and asynchronous training on the config, one run each."""
    run = round_runner(args, steps, root)
    sync = run("sync", "buffer.max_staleness=0")
    asyn = run("async", f"buffer.max_staleness={args.staleness}")
    out = versus(args, run, asyn["samples_per_s"])
    out["warnings"] = collapse_warnings({"sync": sync, "async": asyn})
    return out | {
        "steps": steps,
        "steady_state_from_step": 1 + args.staleness,
        "max_staleness": args.staleness,
        "sync_samples_per_s": sync["samples_per_s"],
        "async_samples_per_s": asyn["samples_per_s"],
        "speedup": asyn["samples_per_s"] / sync["samples_per_s"],
        "sync_learner_idle": sync["learner_idle"],
        "async_learner_idle": asyn["learner_idle"],
        "sync_learner_core_idle": sync["learner_core_idle"],
        "async_learner_core_idle": asyn["learner_core_idle"],
        "async_learner_wait_floor": asyn["learner_wait_floor"],
        "sync_spare_cpu_s": sync["spare_cpu_s"],
        "async_spare_cpu_s": asyn["spare_cpu_s"],
        "async_staleness_mean": asyn["staleness_mean"],
        "sync_learner_lent_s": sync["learner_lent_s"],
        "async_learner_lent_s": asyn["learner_lent_s"],
        "sync_generator_borrowed_s": sync["generator_borrowed_s"],
        "async_generator_borrowed_s": asyn["generator_borrowed_s"],
        "async_filtered_token_share": asyn["filtered_token_share"],
        "async_stale_share": asyn["stale_share"],
        **{f"async_{k}": v for k, v in asyn.items() if k.startswith("phase")},
        "heldout_before": sync.get("heldout_before"),
        "sync_heldout_after": sync.get("heldout_after"),
        "async_heldout_after": asyn.get("heldout_after"),
        "run_dirs": [str(root / "sync"), str(root / "async")],
    }


def versus(args: argparse.Namespace, run, async_samples_per_s: float) -> dict:
    """``--versus``: the async job once more with those overrides, in the same round."""
    if not getattr(args, "versus", None):
        return {}
    alt = run("versus", f"buffer.max_staleness={args.staleness}", *args.versus)
    return {
        "versus": list(args.versus),
        "versus_samples_per_s": alt["samples_per_s"],
        "versus_learner_idle": alt["learner_idle"],
        "async_vs_versus": async_samples_per_s / alt["samples_per_s"],
    }


def default_summary(out: dict) -> str:
    text = (
        f"sync {out['sync_samples_per_s']:.1f} samples/s (learner idle "
        f"{out['sync_learner_idle']:.2f}); async (max_staleness={out['max_staleness']}) "
        f"{out['async_samples_per_s']:.1f} samples/s (learner idle "
        f"{_spread(out, 'async_learner_idle')}{_core_idle(out, '', 'async_')}); speedup {_spread(out, 'speedup')}x; "
        f"generated tokens dropped by dynamic sampling {out['async_filtered_token_share']:.2f}; "
        f"qualified groups dropped stale {out['async_stale_share']:.3f}"
        f"{_phases(out, lambda k: f'async_{k}')}"
    )
    if "versus" in out:
        text += (
            f"; with {' '.join(out['versus'])}: {out['versus_samples_per_s']:.1f} samples/s, "
            f"async/that {_spread(out, 'async_vs_versus', '.3f')}"
        )
    return text


def median_of_rounds(rounds: list[dict]) -> dict:
    """One result from several rounds: each number is the median over the rounds (a ratio is
    the median of each round's own ratio, measured within that round) and ``range[key]`` its
    [lowest, highest]; lists and names come from the first round; every round's result is kept
    under ``rounds``."""
    out = dict(rounds[0])
    if len(rounds) == 1:
        return out
    out["range"] = {}
    for key, value in rounds[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in rounds if isinstance(r.get(key), (int, float))]
            out[key] = statistics.median(values)
            out["range"][key] = [min(values), max(values)]
    out["run_dirs"] = [d for r in rounds for d in r["run_dirs"]]
    out["warnings"] = [
        f"round {i}: {w}" for i, r in enumerate(rounds, 1) for w in r.get("warnings", [])
    ]
    out["rounds"] = rounds
    return out


# Learner steps per run unless --steps says otherwise.
DEFAULT_STEPS = 24


def main(args: argparse.Namespace) -> int:
    if args.config is None:
        args.config = LONGTAIL_CONFIG if args.workload == "longtail" else DEFAULT_CONFIG
    steps = DEFAULT_STEPS if args.steps is None else args.steps
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dapo-bench-async-"))
    skip = 1 + args.staleness
    if steps < skip + 2:
        raise SystemExit(
            f"bench async: --steps must be at least {skip + 2} for --staleness {args.staleness}"
        )
    if args.rounds < 1:
        raise SystemExit(f"bench async: --rounds must be at least 1, got {args.rounds}")
    one_round, summary = (
        (longtail_round, longtail_summary)
        if args.workload == "longtail"
        else (default_round, default_summary)
    )
    rounds = []
    for i in range(args.rounds):
        round_dir = root if args.rounds == 1 else root / f"round{i + 1}"
        rounds.append(one_round(args, steps, round_dir))
        if args.rounds > 1:
            print(
                f"[bench async] round {i + 1}/{args.rounds}: {summary(rounds[-1])}", file=sys.stderr
            )
    out = median_of_rounds(rounds)
    out["machine"] = machine()
    for warning in out["warnings"]:
        print(f"[bench async] warning: {warning}", file=sys.stderr)
    word = f"median of {args.rounds} rounds: " if args.rounds > 1 else ""
    return print_result(f"{word}{summary(out)} — on {out['machine']}", out, args.json)
