"""Cores follow the work (``dapo_async/cores.py``): a role idling past the threshold lends its
threads to the roles on its host that compute, and takes them back the moment it works again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dapo_async.cores import (
    IDLE_EMA_WEIGHT,
    MIN_LEND_WAIT_S,
    RECORD_BYTES,
    CoreShare,
    decoder_layers,
)


class Threads:
    """Stands in for torch.set_num_threads: remembers every count set."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, n: int) -> None:
        self.calls.append(n)


def share(tmp_path, name: str, threads: int = 1, above: float = 0.1):
    rec = Threads()
    return CoreShare(tmp_path / "cores", name, threads, above, set_threads=rec), rec


def idle(role: CoreShare, ratio: float, steps: int = 5) -> None:
    for _ in range(steps):
        role.observe_idle(ratio)


def test_an_idle_learner_lends_its_thread_and_takes_it_back_when_its_batch_arrives(tmp_path):
    learner, _ = share(tmp_path, "learner0")
    gen, gen_threads = share(tmp_path, "gen0")
    idle(learner, 0.5)  # waits half of every step
    assert learner.idle_ema > 0.1
    learner.waiting()  # asks the buffer for its batch
    assert gen.working() == 1  # a wait of a few milliseconds lends nothing yet
    time.sleep(MIN_LEND_WAIT_S + 0.02)  # past the minimum wait (its time is rounded to 1 ms)
    assert gen.working() == 2 and gen_threads.calls == [2]
    time.sleep(0.05)
    learner.working()  # the batch arrived: the core goes back
    assert gen.working() == 1 and gen_threads.calls == [2, 1]
    g, lm = gen.metrics(), learner.metrics()
    assert g["cores/switches"] == 2 and g["cores/borrowed_s"] >= 0.05
    assert lm["cores/lent_s"] >= 0.05 and lm["cores/threads"] == 1
    assert g["cores/threads"] == 1


def test_a_role_that_waits_now_and_then_keeps_its_core(tmp_path):
    learner, _ = share(tmp_path, "learner0")
    gen, gen_threads = share(tmp_path, "gen0")
    idle(learner, 0.05)  # batches queue up: it barely waits
    learner.waiting()
    assert gen.working() == 1 and gen_threads.calls == []
    assert learner.metrics()["cores/lent_s"] == 0.0


def test_the_idle_ratio_is_a_moving_average_of_the_last_steps(tmp_path):
    learner, _ = share(tmp_path, "learner0")
    learner.observe_idle(0.8)  # the first step's share is the average so far
    assert learner.idle_ema == pytest.approx(0.8)
    learner.observe_idle(0.0)
    assert learner.idle_ema == pytest.approx(0.8 * (1 - IDLE_EMA_WEIGHT))
    learner.observe_idle(7.0)  # clamped to [0, 1]
    assert 0 < learner.idle_ema <= 1


def test_lent_threads_are_split_among_working_roles_never_oversubscribed(tmp_path):
    learner, _ = share(tmp_path, "learner0", threads=2)
    a, _ = share(tmp_path, "gen0")
    b, _ = share(tmp_path, "gen1")
    idle(learner, 0.6)
    learner.waiting()
    time.sleep(MIN_LEND_WAIT_S + 0.02)  # past the minimum wait (its time is rounded to 1 ms)
    b.working()  # b is a working peer of a, and a of b
    assert a.working() == 2 and b.working() == 2  # 2 lent threads, one each
    c, _ = share(tmp_path, "gen2")
    c.working()
    time.sleep(1.1)  # peers are looked for once a second
    assert a.working() == 1  # 2 threads among 3 working generators: none can take a whole one


def test_records_of_dead_processes_and_other_hosts_lend_nothing(tmp_path):
    gen, _ = share(tmp_path, "gen0")
    d = tmp_path / "cores"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    rec = {"host": gen.host, "pid": int(dead.stdout), "threads": 4, "waiting": True, "idle": 0.9,
           "since": 0.0}  # fmt: skip
    (d / "learner-dead").write_bytes(json.dumps(rec).encode().ljust(RECORD_BYTES))
    rec = {"host": "elsewhere", "pid": os.getpid(), "threads": 4, "waiting": True, "idle": 0.9,
           "since": 0.0}  # fmt: skip
    (d / "learner-remote").write_bytes(json.dumps(rec).encode().ljust(RECORD_BYTES))
    (d / "garbage").write_bytes(b"\x00\xff not json")
    assert gen.working() == 1
    assert not (d / "learner-dead").exists()  # a dead role's record is removed
    gen.close()
    assert not (d / "gen0").exists()


BORROWER = """
import sys, time, torch
from dapo_async.cores import CoreShare
torch.set_num_threads(1)
me = CoreShare(sys.argv[1], "gen0", 1, 0.1)
seen = set()
deadline = time.monotonic() + 20
while time.monotonic() < deadline and seen != {1, 2}:
    me.working()  # as the generator does before each decode step
    seen.add(torch.get_num_threads())
    time.sleep(0.01)
print(sorted(seen), me.metrics()["cores/switches"])
"""


def test_a_generator_process_really_runs_on_the_lent_threads(tmp_path):
    """Across processes, with torch's own thread count: the borrower goes to 2 threads while
    the learner waits, and back to 1 when it works."""
    d = tmp_path / "cores"
    learner = CoreShare(d, "learner0", 1, 0.1, set_threads=lambda n: None)
    idle(learner, 0.5)
    proc = subprocess.Popen(
        [sys.executable, "-c", BORROWER, str(d)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    try:
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            learner.waiting()
            time.sleep(0.3)
            learner.working()
            time.sleep(0.3)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out.split("]")[0] + "]" == "[1, 2]", out
    assert float(out.split("]")[1]) >= 1


def test_watched_layers_check_the_ledger_at_every_forward(tmp_path):
    """The learner's decoder layers (and a generator's model) call working() in each forward,
    so a peer that went back to work gets its thread back mid-step."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    model = AutoModelForCausalLM.from_config(cfg)
    layers = decoder_layers(model)
    assert len(layers) == 3 and all(type(m).__name__ == "LlamaDecoderLayer" for m in layers)
    gen, _ = share(tmp_path, "gen0")
    learner, learner_threads = share(tmp_path, "learner0")
    learner.watch(layers)
    idle(gen, 0.5)
    gen.waiting()
    time.sleep(MIN_LEND_WAIT_S + 0.02)  # past the minimum wait (its time is rounded to 1 ms)
    model(input_ids=torch.tensor([[1, 2, 3]]))
    assert learner.threads == 2
    gen.working()  # the generator resumed: the next layer's forward gives its thread back
    time.sleep(0.01)
    model(input_ids=torch.tensor([[1, 2, 3]]))
    assert learner.threads == 1 and learner_threads.calls == [2, 1]


# ---------------------------------------------------------------- spare generators


def spare(tmp_path, above: float = 0.1, stop=lambda: False) -> CoreShare:
    return CoreShare(tmp_path / "cores", "spare0", 1, above, set_threads=Threads(), spare=True,
                     stop=stop)  # fmt: skip


def test_a_spare_runs_while_the_learner_idles_and_parks_when_batches_queue_up(tmp_path):
    """The learner's idle ratio past the threshold lends its core to the spare (its
    ``working`` returns at once); batches queue up (the learner's idle falls to 0): the spare
    parks at its next chunk and runs again once the learner idles again. Counters in the
    metrics; heartbeats and weight rounds go on while it is parked."""
    learner, _ = share(tmp_path, "learner0")
    sp = spare(tmp_path, above=0.3)
    kept = []
    sp.keepalive = lambda: kept.append(time.monotonic())
    idle(learner, 0.5)
    assert sp.lent_threads() == 1
    t0 = time.monotonic()
    sp.working()  # lent: no park
    assert time.monotonic() - t0 < 0.5 and sp.spare_counters["spare_parks"] == 0
    idle(learner, 0.0, steps=10)  # batches queue up: the core goes back
    assert sp.lent_threads() == 0

    def idle_again():
        time.sleep(0.4)
        idle(learner, 0.6)

    t = threading.Thread(target=idle_again)
    t.start()
    t0 = time.monotonic()
    sp.working()  # parks until the learner idles again
    parked = time.monotonic() - t0
    t.join()
    assert 0.3 < parked < 3.0
    assert len(kept) >= 3
    m = sp.metrics()
    assert m["cores/spare_parks"] == 1.0
    assert m["cores/spare_parked_s"] >= 0.3 and m["cores/spare_run_s"] > 0
    assert m["cores/cpu_s"] > 0
    assert learner.working() == 1  # the learner keeps its own threads: a spare's record lends none


def test_a_running_spare_goes_on_while_the_idle_it_lowers_stays_above_a_quarter(tmp_path):
    """Start above the threshold, go on above a quarter of it: a spare that brings the
    learner's idle from 0.5 to 0.12 keeps running; one parked at 0.12 does not start."""
    learner, _ = share(tmp_path, "learner0")
    sp = spare(tmp_path, above=0.3)
    idle(learner, 0.5)
    assert sp.lent_threads() == 1
    idle(learner, 0.12, steps=20)
    assert sp.lent_threads() == 1  # 0.12 > 0.3 / 4
    idle(learner, 0.0, steps=20)
    assert sp.lent_threads() == 0
    idle(learner, 0.12, steps=20)
    assert sp.lent_threads() == 0  # parked: starts only above 0.3


def test_a_spare_does_not_run_on_a_learner_below_the_threshold_and_stops_on_ctrl_c(tmp_path):
    learner, _ = share(tmp_path, "learner0")
    stopped = []
    sp = spare(tmp_path, above=0.3, stop=lambda: bool(stopped))
    idle(learner, 0.1)  # it waits only now and then: keeps its core
    learner.waiting()
    assert sp.lent_threads() == 0
    timer = threading.Timer(0.2, lambda: stopped.append(1))
    timer.start()
    t0 = time.monotonic()
    sp.working()
    assert time.monotonic() - t0 < 2.0  # the stop flag ends the park, not SPARE_MAX_PARK_S
    assert sp.spare_counters["spare_parks"] == 1
    sp.close()
    assert not (tmp_path / "cores" / "spare0").exists()


# A busy loop that reports its CPU seconds: run as two processes, each in a session of its own
# (as the launcher starts roles), pinned to one core, one lowered by ``lower_priority``.
BUSY = """
import os, sys, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
if sys.argv[1] == "spare":
    import threading
    from dapo_async.cores import lower_priority
    threading.Thread(target=time.sleep, args=(3.0,), daemon=True).start()  # started before
    print(lower_priority().replace(" ", "_"), flush=True)
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    print(all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in tids) and len(tids) > 1)
t = time.monotonic()
while time.monotonic() - t < 2.0:
    pass
print(time.process_time())
"""


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="needs SCHED_IDLE (Linux)")
def test_a_lowered_spare_in_its_own_session_gets_almost_none_of_a_busy_core():
    procs = {
        role: subprocess.Popen(
            [sys.executable, "-c", BUSY, role],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for role in ("learner", "spare")
    }
    out = {role: p.communicate(timeout=60)[0].split() for role, p in procs.items()}
    lowered, every_thread, _ = out["spare"]
    assert every_thread == "True"  # the thread started before it too
    if Path("/proc/self/autogroup").exists():  # it leads its session: its group goes down too
        assert "autogroup" in lowered
    # with autogroups and SCHED_IDLE alone the spare took half (1.55 of 3 CPU-s, measured)
    assert float(out["spare"][-1]) < 0.25 * float(out["learner"][-1])


def test_a_process_that_does_not_lead_its_session_leaves_the_sessions_group_alone():
    code = "from dapo_async.cores import _lower_autogroup; print(_lower_autogroup())"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "False", res.stderr  # our session: pytest's, not its own


def test_a_spare_decodes_a_quarter_of_a_generators_sequences_in_whole_prompts():
    from dapo_async.config import load_config
    from dapo_async.generator.build import spare_width

    def width(*overrides):
        base = ["generator.responses_per_prompt=8", "generator.prompts_per_batch=15"]
        return spare_width(load_config("configs/tiny_longtail.yaml", base + list(overrides)))

    assert width() == 24  # 15 prompts × 8 = 120: a quarter is 30, three whole prompts
    assert width("generator.max_inflight=192") == 48
    assert width("launch.spare_max_inflight=0") == 120  # a generator's width
    assert width("launch.spare_max_inflight=20") == 16
    assert width("launch.spare_max_inflight=3") == 8  # at least one prompt
    assert width("launch.spare_max_inflight=999") == 120  # never wider than a generator


def test_spare_generators_are_refused_where_they_cannot_work():
    from dapo_async.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"launch\.spare_generators"):
        load_config(
            "configs/tiny_cpu.yaml", ["launch.spare_generators=1", "launch.share_cores=true"]
        )
    with pytest.raises(ConfigError, match=r"launch\.spare_generators.*generator\.engine=hf"):
        load_config("configs/tiny_cpu.yaml", ["launch.spare_generators=1", "generator.engine=vllm"])
    with pytest.raises(ConfigError, match=r"launch\.spare_generators"):
        load_config("configs/tiny_cpu.yaml", ["launch.spare_generators=-1"])


@pytest.mark.slow
def test_a_spare_generator_decodes_while_the_learner_waits(tiny_model, tmp_path, cli_env):
    """`dapo-async train` with launch.spare_generators=1 on a synchronous run (the learner waits
    for every batch, idle ~0.6): the spare, at idle priority, decodes, and its groups are
    trained like any generator's; the ledger is empty after the run."""
    from testutil import TRAIN_FAST, last_json, run_cli

    from dapo_async.tracking import read_jsonl

    repo = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    out = run_cli(
        repo, cli_env, "train", "configs/tiny_cpu.yaml", f"model.path={tiny_model}",
        f"run_dir={run}", "learner.num_steps=8", "buffer.max_staleness=0",
        "launch.spare_generators=1", "generator.decode_delay_s=0.005", *TRAIN_FAST, "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out)["steps"] == 8
    # SCHED_IDLE, plus ", autogroup nice 19" where the kernel has autogroups
    spare_log = (run / "logs" / "spare0.log").read_text()
    assert "spare generator: decodes on lent cores only (SCHED_IDLE" in spare_log
    # launch.spare_max_inflight's auto: a quarter of the generator's 16 sequences (4 × 4)
    assert "), 4 sequences" in spare_log
    final = json.loads(next((run / "generators").glob("spare0-*.json")).read_text())
    # acked and trained like any generator's (a group it sends as the run stops, at idle
    # priority after the buffer's exit, goes unacked: the run needs no more)
    assert final["groups_acked"] > 0
    audit = (run / "audit" / "trained-rank0.jsonl").read_text()
    assert '"spare0-' in audit
    assert final["cores/spare_run_s"] > 0  # (parking: the tests above; this run never queues)
    learner = [r for r in read_jsonl(run / "metrics" / "learner.jsonl") if "cores/idle_ema" in r]
    assert learner[-1]["cores/idle_ema"] > 0.2  # what let it run
    assert not list((run / "cores").iterdir())  # every role removed its record
