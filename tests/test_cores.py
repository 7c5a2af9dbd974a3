"""Cores follow the work (``dapo_async/cores.py``): a role idling past the threshold lends its
threads to the roles on its host that compute, and takes them back the moment it works again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

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
