"""What every role process does at start: logging, config, signals, run directory, endpoints.

Roles never import the launcher; the launcher and the per-role commands both call these.
Endpoints are exchanged through small files in the run directory (``<run_dir>/endpoints/``),
written atomically, so roles started separately (other hosts: a shared filesystem, or pass the
endpoint explicitly) find each other.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from dapo_async.utils import atomic_write_text, pid_alive

# How long a role waits for a peer's endpoint file before giving up.
ENDPOINT_WAIT_S = 300.0
# Roles started by `dapo-async train` get this variable; they stop if that launcher dies.
LAUNCHER_PID_ENV = "DAPO_LAUNCHER_PID"
# How often a launched role checks that its launcher is alive.
WATCHDOG_PERIOD_S = 1.0
# A role still running this long after it was asked to stop exits hard.
HARD_EXIT_AFTER_S = 25.0


class StopFlag:
    """Set by SIGINT/SIGTERM; loops poll it. A second signal exits at once."""

    def __init__(self) -> None:
        self.stop = False
        self.reason = ""

    def install(self) -> StopFlag:
        def handler(signum, frame):
            if self.stop:
                os._exit(130)
            self.stop = True
            self.reason = signal.Signals(signum).name

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
        launcher = os.environ.get(LAUNCHER_PID_ENV)
        if launcher:
            threading.Thread(target=self._watch, args=(int(launcher),), daemon=True).start()
        return self

    def _watch(self, launcher_pid: int) -> None:
        """Stop when the launcher is gone (killed without cleaning up); exit hard if the
        role does not stop by itself in time."""
        stop_seen = None
        while True:
            time.sleep(WATCHDOG_PERIOD_S)
            if not self.stop and not pid_alive(launcher_pid):
                self.stop = True
                self.reason = "launcher died"
            if self.stop:
                stop_seen = stop_seen or time.monotonic()
                if time.monotonic() - stop_seen > HARD_EXIT_AFTER_S:
                    os._exit(1)

    def __bool__(self) -> bool:
        return self.stop


def setup_logging(role: str) -> logging.Logger:
    logging.basicConfig(
        level=os.environ.get("DAPO_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {role} %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in ("aim", "urllib3", "filelock", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(role)


def write_endpoint(run_dir: str | Path, name: str, endpoint: str) -> Path:
    d = Path(run_dir) / "endpoints"
    d.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(d / name, endpoint)


def read_endpoint(
    run_dir: str | Path, name: str, timeout_s: float = ENDPOINT_WAIT_S, stop: StopFlag | None = None
) -> str:
    p = Path(run_dir) / "endpoints" / name
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (stop and stop.stop):
        if p.is_file():
            text = p.read_text().strip()
            if text:
                return text
        time.sleep(0.1)
    if stop and stop.stop:
        raise SystemExit(f"stopped ({stop.reason}) while waiting for endpoint {name!r}")
    raise TimeoutError(
        f"no endpoint {name!r} in {p.parent} after {timeout_s:.0f}s (is that role running?)"
    )


def set_threads(n: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:
        pass


def leave_world_and_exit(code: int) -> None:
    """End a rank of a multi-rank torch.distributed world: leave it together with the other
    ranks (a barrier, then every process group destroyed), flush the logs and the standard
    streams, and exit without the interpreter's teardown.

    Why without: a 2-rank gloo world (FSDP2, whose collectives are asynchronous) that had left
    cleanly still aborted one rank now and then ("terminate called without an active
    exception", SIGABRT, after its last line of output; once in 170 runs of a 2-rank world
    here), so a finished run read as a crash.
    Every file a rank writes is written atomically and closed before this is called, so
    skipping the finalizers loses nothing."""
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
