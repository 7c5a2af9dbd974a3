"""The Slurm template (tools/slurm/dapo_hetjob.sbatch) run on this machine with a stand-in srun
(tests/launch/fake_slurm/: each step's tasks run here with Slurm's task variables): it starts
the buffer, the learner, the evaluator and two generators, each supervised; a generator killed
with SIGKILL comes back under the same id, and the learner finishes its steps. Resubmitting the
same job name resumes the run from its checkpoint."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testutil import TRAIN_FAST

from dapo_async.utils import free_port

REPO = Path(__file__).resolve().parents[2]
FAKE_SLURM = Path(__file__).parent / "fake_slurm"
# Generous: five roles share two cores; a tiny step takes a second or two once all are up.
RUN_TIMEOUT_S = 420
START_LINE = re.compile(r"\[supervise gen-1\] started pid (\d+) \(start (\d+)\)")


def _wait_for(what: str, ok, proc, timeout_s: float, logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ok():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    tails = {p.name: p.read_text(errors="replace")[-1500:] for p in logs.glob("*.log")}
    raise AssertionError(f"{what} (job exit {proc.poll()}):\n{json.dumps(tails, indent=1)}")


def _submit(tmp_path: Path, run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        shutil.copytree(FAKE_SLURM, bin_dir)
        for f in bin_dir.iterdir():
            f.chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        PY=sys.executable,
        RUN_DIR=str(run_dir),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="dapo-test",
        SLURM_SUBMIT_DIR=str(REPO),
        SLURM_JOB_NODELIST_HET_GROUP_0="localhost",
        SLURM_JOB_NUM_NODES_HET_GROUP_1="1",
        GPUS_PER_LEARNER_NODE="1",
        GPUS_PER_GENERATOR_NODE="2",  # two generators of one "GPU" each
        BUFFER_PORT=str(free_port()),
        WSYNC_PORT=str(free_port()),
        RDZV_PORT=str(free_port()),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    script = REPO / "tools" / "slurm" / "dapo_hetjob.sbatch"
    return subprocess.Popen(
        ["bash", str(script), "configs/tiny_cpu.yaml", *overrides],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen) -> str:
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the job did not finish:\n{out[-3000:]}") from None
    return out


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 120)
def test_slurm_template_runs_every_role_and_brings_a_killed_generator_back(tiny_model, tmp_path):
    run_dir = tmp_path / "runs" / "dapo-test"
    logs = run_dir / "logs"
    overrides = [
        f"model.path={tiny_model}",
        "learner.num_steps=12",
        "learner.eval_every=4",
        "learner.checkpoint_every=4",
        "launch.restart_window_s=60",
        *TRAIN_FAST,
    ]
    proc = _submit(tmp_path, run_dir, overrides)
    try:
        gen_log = logs / "generators.log"

        def gen1_starts() -> list[tuple[int, int]]:
            text = gen_log.read_text(errors="replace") if gen_log.exists() else ""
            return [(int(p), int(n)) for p, n in START_LINE.findall(text)]

        def learner_stepped() -> bool:
            m = run_dir / "metrics" / "learner.jsonl"
            return m.exists() and "rollout/" in m.read_text()

        _wait_for("the learner's first step", learner_stepped, proc, RUN_TIMEOUT_S, logs)
        (pid, n), *_ = gen1_starts()
        assert n == 1
        os.kill(pid, signal.SIGKILL)
        _wait_for("gen-1 restarted", lambda: len(gen1_starts()) >= 2, proc, 120, logs)
        out = _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-3000:]
    assert "1 learner node(s), 1 generator node(s) × 2 generator(s)" in out
    for name in ("buffer", "learner", "evaluator", "generators"):
        assert (logs / f"{name}.log").exists(), name
    assert "[supervise gen-0] started pid" in gen_log.read_text()
    assert gen1_starts()[1][1] == 2  # the same supervisor, its second start
    summary = json.loads((run_dir / "learner_summary.json").read_text())
    assert summary["steps"] == 12
    evals = [json.loads(line) for line in (run_dir / "metrics" / "evaluator.jsonl").open()]
    assert evals and all(0.0 <= r["eval/accuracy"] <= 1.0 for r in evals)
    assert "[supervise evaluator] finished" in (logs / "evaluator.log").read_text()

    # resubmitting the job (same name, so the same run directory) resumes from its checkpoint;
    # the new evaluator is not fooled by the first session's summary: it evaluates step 16
    proc = _submit(tmp_path, run_dir, [*overrides[:1], "learner.num_steps=17", *overrides[2:]])
    out = _finish(proc)
    assert proc.returncode == 0, out[-3000:]
    learner_log = (logs / "learner.log").read_text()
    assert "resumed from" in learner_log and "step-00000012 at version 12" in learner_log
    assert json.loads((run_dir / "learner_summary.json").read_text())["steps"] == 17
    evals = [json.loads(line) for line in (run_dir / "metrics" / "evaluator.jsonl").open()]
    assert 16 in {r["step"] for r in evals}
