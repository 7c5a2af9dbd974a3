"""`dapo-async tune CONFIG --grid KEY=V1,V2 [--grid ...] [overrides]`: a throughput-tuning sweep.
(With ``--search KEY=low:high`` instead: a hyper-parameter search on the learning curve,
``search.py``.)

Runs one short training job (`dapo-async train`) per point of the grid (the product of every
``--grid``), measures each with the same steady-state figures as `bench async` (learner samples/s
and idle ratio after the first ``1 + max_staleness`` steps), prints a table sorted by samples/s and,
with ``--json``, one JSON line ``{"best": {...}, "results": [...]}``. Points that fail are listed
with their error and do not stop the sweep.

``--recommend [--budget N]``: from the best point's per-role rates, the learner/generator split
for N processes (default: the machine's cores), verified by one run there
(``recommend.py``; the JSON adds ``recommend``, ``predicted_samples_per_s`` and
``measured_samples_per_s``). Without ``--grid`` the config as given is the only point.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from dapo_async.bench.async_bench import run_job


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    grid = []
    for item in items:
        key, sep, values = item.partition("=")
        vals = [v for v in values.split(",") if v != ""]
        if not sep or not key or not vals:
            raise SystemExit(f"tune: --grid wants KEY=V1,V2,..., got {item!r}")
        grid.append((key, vals))
    return grid


def _search(args: argparse.Namespace) -> int:
    if args.grid or args.recommend:
        raise SystemExit("tune: --search does not combine with --grid or --recommend")
    from dapo_async.bench import search

    return search.main(args)


def main(args: argparse.Namespace) -> int:
    from dapo_async.config import ConfigError, load_config

    if args.search:  # a learning-curve search (Optuna), not a throughput grid
        return _search(args)
    grid = parse_grid(args.grid)
    if not grid and not args.recommend:
        raise SystemExit("tune: give at least one --grid KEY=V1,V2 (or --recommend)")
    points = [
        dict(zip([k for k, _ in grid], combo)) for combo in itertools.product(*[v for _, v in grid])
    ]
    root = Path(args.out) if args.out else Path("runs") / f"tune-{time.strftime('%Y%m%d-%H%M%S')}"
    # every point in the project's Aim repo (beside the sweep's folder), named
    # <sweep>-NNN/<role> and tagged with its grid values
    aim_repo = root.resolve().parent / "aim"
    base = [f"learner.num_steps={args.steps}", f"tracking.aim_repo={aim_repo}", *args.overrides]
    results = []
    for i, point in enumerate(points):
        tags = ",".join(f"{k}={v}" for k, v in point.items())
        overrides = [*base, *(f"{k}={v}" for k, v in point.items()), f"tracking.tags=[{tags}]"]
        try:
            cfg = load_config(args.config, overrides)  # fail fast on a bad key or value
        except ConfigError as e:
            results.append({"point": point, "error": str(e)})
            continue
        skip = 1 + cfg.buffer.max_staleness
        print(f"[tune] {i + 1}/{len(points)} {point}", file=sys.stderr, flush=True)
        run_dir = root / f"{root.name}-{i:03d}"
        try:
            res = run_job(args.config, overrides, run_dir, skip)
            results.append({"point": point, "run_dir": str(run_dir), **res})
        except Exception as e:  # one bad point does not end the sweep
            results.append({"point": point, "error": str(e).splitlines()[0][:300]})
    ok = sorted((r for r in results if "error" not in r), key=lambda r: -r["samples_per_s"])
    for r in ok:
        print(
            f"{r['samples_per_s']:8.1f} samples/s  learner idle {r['learner_idle']:.2f}  {r['point']}",
            file=sys.stderr,
        )
    for r in results:
        if "error" in r:
            print(f"  failed: {r['point']}: {r['error']}", file=sys.stderr)
    plot = plot_grid(results, root / "tune.png") if ok else None
    if plot is not None:
        print(f"[tune] wrote {plot}", file=sys.stderr)
    out = {"best": ok[0] if ok else None, "results": results, "plot": str(plot or "")}
    if ok and args.recommend:
        from dapo_async.bench.recommend import describe, recommend

        print("[tune] verifying the recommended split", file=sys.stderr, flush=True)
        rec = recommend(args, base, ok[0], root, run_job)
        print(describe(rec), file=sys.stderr)
        out["recommend"] = rec
        out["predicted_samples_per_s"] = rec["predicted_samples_per_s"]
        out["measured_samples_per_s"] = rec["measured_samples_per_s"]
    if args.json:
        print(json.dumps(out))
    return 0 if ok else 1


def plot_grid(results: list[dict], path: Path) -> Path | None:
    """Samples/s and learner idle ratio of every measured point, side by side (one bar each,
    labelled with its grid values); failed points are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if "error" not in r]
    if not ok:
        return None
    labels = ["\n".join(f"{k}={v}" for k, v in r["point"].items()) for r in ok]
    fig, (ax_rate, ax_idle) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(ok)), 4.5))
    ax_rate.bar(range(len(ok)), [r["samples_per_s"] for r in ok])
    ax_rate.set_ylabel("learner samples/s (steady state)")
    ax_idle.bar(range(len(ok)), [r["learner_idle"] for r in ok], color="tab:orange")
    ax_idle.set_ylabel("learner idle ratio")
    ax_idle.set_ylim(0, 1)
    for ax in (ax_rate, ax_idle):
        ax.set_xticks(range(len(ok)), labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("tune: one short run per grid point")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
