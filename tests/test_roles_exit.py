"""``roles.leave_world_and_exit``: the ranks of a gloo world leave together and exit with the
code given, their buffered output flushed (the exit skips the interpreter's teardown)."""

import os
import subprocess
import sys

import pytest

from dapo_async.utils import free_port

RANK_SCRIPT = """
import sys, torch, torch.distributed as dist
from dapo_async.roles import leave_world_and_exit
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank,
                        world_size=2)
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print("sum", t.item(), end="")  # no newline: only a flush at exit writes it through a pipe
leave_world_and_exit(3 + rank)
print("never")
"""


@pytest.mark.timeout(120)
def test_two_gloo_ranks_leave_together_with_their_codes_and_output():
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(rank), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # buffered as on a plain terminal-less run: the flush must come from the helper
            env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
        )
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=90) for p in procs]
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 3 + rank, err[-2000:]
        assert out == "sum 3.0", (out, err[-2000:])
