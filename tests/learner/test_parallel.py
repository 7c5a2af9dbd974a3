"""Data-parallel learners (real gloo processes, DDP and FSDP2) end with the parameters of one
rank trained on the full batch; activation checkpointing does not change the update."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from learner_helpers import max_rel_err

from dapo_async.utils import free_port

HERE = Path(__file__).resolve().parent
NUM_STEPS = 3
# The bound. The workers train in float64 (rank_worker.py says why).
REL_TOL = 1e-5


def run_world(tiny_model, out: Path, world: int, *overrides: str) -> dict:
    port = free_port()
    procs = []
    logs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        log = open(out.with_suffix(f".rank{rank}.log"), "w")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "rank_worker.py"),
                    str(tiny_model),
                    str(out),
                    str(NUM_STEPS),
                    *overrides,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        for p in procs:
            p.wait(timeout=240)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    for rank, p in enumerate(procs):
        assert p.returncode == 0, out.with_suffix(f".rank{rank}.log").read_text()[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_equal_one_rank_on_full_batch(tiny_model, tmp_path, mode):
    fsdp = f"learner.fsdp={mode == 'fsdp'}"
    one = run_world(tiny_model, tmp_path / "one.pt", 1, fsdp)
    two = run_world(tiny_model, tmp_path / "two.pt", 2, fsdp)
    err = max_rel_err(two, one)
    assert err <= REL_TOL, err
    # and training moved the weights (the comparison is not between two untouched models)
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float64).state_dict()
    assert max_rel_err(one, start) > 1e-3


def test_two_rank_dpo_equals_one_rank(tiny_model, tmp_path):
    one = run_world(tiny_model, tmp_path / "one.pt", 1, "algo.objective=dpo")
    two = run_world(tiny_model, tmp_path / "two.pt", 2, "algo.objective=dpo")
    assert max_rel_err(two, one) <= REL_TOL


def test_fsdp_mixed_precision_keeps_master_weights_and_follows_full_precision(tiny_model, tmp_path):
    """FSDP2 with learner.compute_dtype=bfloat16 (a MixedPrecisionPolicy: bf16 compute, fp32
    gradient reduction) over float64 master weights: the parameters stay float64 and land within
    a tenth of the update's size of the full-precision result."""
    from transformers import AutoModelForCausalLM

    full = run_world(tiny_model, tmp_path / "fp.pt", 2, "learner.fsdp=true")
    mixed = run_world(
        tiny_model, tmp_path / "bf.pt", 2, "learner.fsdp=true", "learner.compute_dtype=bfloat16"
    )
    start = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float64).state_dict()
    assert all(t.dtype == torch.float64 for t in mixed.values())
    assert max_rel_err(mixed, full) < 0.1 * max_rel_err(full, start)
    assert max_rel_err(mixed, full) > 0  # bf16 did compute (else the two would be equal)
