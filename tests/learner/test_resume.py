"""Exact resume: a real buffer (with its write-ahead log) and a real learner process, fed by a
scripted generator whose groups depend only on the prompt. 4 straight steps equal 2 steps,
SIGKILL of buffer and learner together, restart with --resume, 2 more steps: the same prompts in
the same order, no group trained twice, and bit-equal parameters and optimizer state."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from dapo_async.utils import free_port

HERE = Path(__file__).resolve().parent
GROUPS_PER_STEP = 4
START_TIMEOUT_S = 120


def write_config(tmp: Path, tiny_model) -> Path:
    cfg = {
        "name": "resume",
        "run_dir": str(tmp / "run"),
        "model": {"path": str(tiny_model)},
        "data": {"source": "tiny:chain", "num_train": 256, "num_eval": 8, "difficulty": 3},
        "generator": {"max_tokens": 12, "responses_per_prompt": 4},  # scripted groups of G
        "reward": {"overlong_shaping": False},
        "buffer": {
            "groups_per_step": GROUPS_PER_STEP,
            "max_staleness": 100,
            "dynamic_sampling": False,
            "wal": True,
            "port": free_port(),
        },
        "learner": {"num_steps": 4, "checkpoint_every": 2, "keep_checkpoints": 5},
        "weight_sync": {"mode": "disk"},
        "tracking": {"aim": False},
    }
    p = tmp / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


class Procs:
    def __init__(self, tmp: Path, repo: Path, env: dict):
        self.tmp, self.repo, self.env = tmp, repo, env
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        p = subprocess.Popen(cmd, cwd=self.repo, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = p
        return p

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def cleanup(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dapo_async.cli", *args]


def wait_for(cond, what: str, procs: Procs, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        for name, p in procs.procs.items():
            if p.poll() not in (None, 0) and name != "gen":
                raise AssertionError(f"{name} exited {p.returncode}:\n{procs.log(name)[-3000:]}")
        time.sleep(0.1)
    raise TimeoutError(what)


def run_job(tmp: Path, tiny_model, repo, env, kill_after_step: int | None) -> Path:
    tmp.mkdir()
    cfg = str(write_config(tmp, tiny_model))
    run = tmp / "run"
    ps = Procs(tmp, repo, env)
    go, stop = tmp / "go", tmp / "stop"
    # The straight run may produce freely; the interrupted one only 3 steps' worth before the kill.
    max_groups = GROUPS_PER_STEP * ((kill_after_step or 0) + 1)
    if kill_after_step is None:
        go.write_text("1")
    endpoint_file = run / "endpoints" / "buffer"
    try:
        ps.start("buffer", cli("buffer", cfg))
        wait_for(endpoint_file.exists, "buffer endpoint", ps)
        endpoint = endpoint_file.read_text()
        ps.start(
            "gen",
            [
                sys.executable,
                str(HERE / "scripted_generator.py"),
                endpoint,
                "--max-groups",
                str(max_groups),
                "--go",
                str(go),
                "--stop",
                str(stop),
                "--keys",
                str(run / "keys"),
            ],
        )
        ps.start("learner", cli("learner", cfg))
        if kill_after_step is not None:
            audit = run / "audit" / "trained-rank0.jsonl"

            def reached():
                ckpt = (run / "checkpoints" / f"step-{kill_after_step:08d}").exists()
                asked = audit.exists() and f'"step": {kill_after_step},' in audit.read_text()
                return ckpt and asked

            wait_for(reached, "checkpoint before the kill", ps)
            time.sleep(1.0)  # the learner now waits for data it will never get
            for name in ("buffer", "learner"):  # SIGKILL both together
                ps.procs[name].send_signal(signal.SIGKILL)
            for name in ("buffer", "learner"):
                ps.procs.pop(name).wait()
            endpoint_file.unlink()
            ps.start("buffer", cli("buffer", cfg))
            wait_for(endpoint_file.exists, "restarted buffer endpoint", ps)
            ps.start("learner", cli("learner", cfg, "--resume"))
            wait_for(lambda: "resumed from" in ps.log("learner"), "learner resume", ps)
            time.sleep(1.0)
            go.write_text("1")
        ps.procs["learner"].wait(timeout=START_TIMEOUT_S)
        assert ps.procs["learner"].returncode == 0, ps.log("learner")[-3000:]
    finally:
        stop.write_text("1")
        if "buffer" in ps.procs and ps.procs["buffer"].poll() is None:
            ps.procs["buffer"].send_signal(signal.SIGINT)
            ps.procs["buffer"].wait(timeout=30)
        ps.cleanup()
    return run


def trained_by_step(run: Path) -> dict[int, dict]:
    """The last record of every step (a step trained again after the resume replaces the
    attempt the kill interrupted)."""
    out = {}
    for line in (run / "audit" / "trained-rank0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = rec
    return out


@pytest.mark.slow
def test_kill_and_resume_equals_straight_run(tiny_model, tmp_path, repo, cli_env):
    straight = run_job(tmp_path / "straight", tiny_model, repo, cli_env, None)
    resumed = run_job(tmp_path / "resumed", tiny_model, repo, cli_env, kill_after_step=2)

    a, b = trained_by_step(straight), trained_by_step(resumed)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3]
    for step in range(4):
        assert a[step]["prompts"] == b[step]["prompts"], f"step {step} trained other prompts"
    ids = [g for s in range(4) for g in b[s]["groups"]]
    assert len(ids) == len(set(ids)), "a group was trained twice"

    ca = straight / "checkpoints" / "step-00000004"
    cb = resumed / "checkpoints" / "step-00000004"
    wa, wb = load_file(ca / "model.safetensors"), load_file(cb / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    sa = torch.load(ca / "trainer.pt", weights_only=False)
    sb = torch.load(cb / "trainer.pt", weights_only=False)
    assert sa["version"] == sb["version"] == 4
    assert sa["scheduler"] == sb["scheduler"]
    oa, ob = sa["optimizer"]["state"], sb["optimizer"]["state"]
    assert oa.keys() == ob.keys()
    for k in oa:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(oa[k][name], ob[k][name]), (k, name)
    # and the run did move the weights
    w0 = load_file(Path(tiny_model) / "model.safetensors")
    assert any(not torch.equal(w0[k], wa[k]) for k in wa)
