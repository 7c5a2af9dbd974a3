"""The code sandbox stops hostile code within its limits, tags it, and serves the next run."""

import json
import time

from dapo_async.reward.sandbox import Limits, code_exec, run_python

FAST = Limits(cpu_s=1, wall_s=3.0, memory_mb=256, output_bytes=1 << 16, num_procs=8)


def test_correct_and_wrong_solutions():
    tests = json.dumps(
        {"tests": [{"input": "2 3\n", "output": "5"}, {"input": "10 -4\n", "output": "6"}]}
    )
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    bad = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"
    assert code_exec(good, tests, FAST)["acc"] == 1.0
    res = code_exec(bad, tests, FAST)
    assert res["acc"] == 0.0 and res["tag"] == "wrong"
    assert code_exec(good, "not json", FAST)["tag"] == "bad_ground_truth"


def test_infinite_loop_is_stopped():
    t0 = time.monotonic()
    res = run_python("while True:\n    pass\n", limits=FAST)
    assert res.tag in ("cpu_limit", "timeout")
    assert time.monotonic() - t0 < FAST.wall_s + 2


def test_sleeping_code_hits_wall_clock():
    res = run_python("import time\ntime.sleep(60)\n", limits=Limits(cpu_s=5, wall_s=1.0))
    assert res.tag == "timeout" and res.seconds < 3


def test_fork_bomb_is_contained():
    code = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    t0 = time.monotonic()
    res = run_python(code, limits=FAST)
    assert res.tag in ("cpu_limit", "timeout", "error")
    assert time.monotonic() - t0 < FAST.wall_s + 3
    # the group was killed: a normal run afterwards works, and may fork up to its own limit at
    # once (the bomb's killed processes, not yet reaped by init, do not count against it)
    assert run_python("print('alive')", limits=FAST).stdout.strip() == "alive"
    forks = (
        "import os, time\n"
        "pids = []\n"
        f"for _ in range({FAST.num_procs - 2}):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(0.2); os._exit(0)\n"
        "    pids.append(pid)\n"
        "print(sum(os.waitpid(p, 0)[1] == 0 for p in pids))\n"
    )
    res = run_python(forks, limits=FAST)
    assert res.stdout.strip() == str(FAST.num_procs - 2), res


def test_huge_output_is_cut():
    res = run_python("import sys\nsys.stdout.write('x' * (100 * 1024 * 1024))\n", limits=FAST)
    assert res.tag == "output_limit"
    assert len(res.stdout) <= FAST.output_bytes


def test_memory_hog_is_stopped():
    res = run_python("x = bytearray(2 * 1024 * 1024 * 1024)\n", limits=FAST)
    assert res.tag == "memory_limit"
    assert run_python("print(1 + 1)", limits=FAST).stdout.strip() == "2"


def _attempt(setup: str, action: str, done: str, refused: str) -> str:
    """Candidate code that runs ``setup``, tries ``action`` and prints ``done``, or ``refused``
    and the errno when the action raises OSError."""
    return (
        f"{setup}\ntry:\n    {action}; print({done!r})\n"
        f"except OSError as e:\n    print({refused!r}, e.errno)\n"
    )


def test_code_reaches_no_loopback_listener():
    """Candidate code runs in an empty network namespace: a listener on this machine's loopback
    (where the run's own buffer listens) is unreachable; with isolation off it is reachable,
    so the test can tell the difference."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    code = _attempt(
        "import socket", f"socket.socket().connect(('127.0.0.1', {port}))", "CONNECTED", "BLOCKED"
    )
    try:
        isolated = run_python(code)
        assert isolated.tag == "ok" and isolated.stdout.startswith("BLOCKED"), isolated
        open_net = run_python(code, limits=Limits(isolate_network=False))
        assert open_net.stdout.strip() == "CONNECTED", open_net
    finally:
        srv.close()


def test_code_writes_nowhere_but_its_directory():
    """As root the sandbox gives the code a private mount namespace, read-only but for its own
    temp directory: /tmp and /dev/shm (world-writable, so the sandbox user alone could write there)
    refuse; with the isolation off the same write goes through, so the test can fail."""
    import os
    import uuid

    import pytest

    if os.geteuid() != 0:
        pytest.skip("file-system isolation needs root (mount namespace); CI runs as root")
    target = f"/dev/shm/dapo-sandbox-escape-{uuid.uuid4().hex}"
    setup = "import os\nopen(os.path.join(os.getcwd(), 'mine.txt'), 'w').write('ok')"
    code = _attempt(setup, f"open({target!r}, 'w').write('x')", "WROTE", "DENIED")
    try:
        isolated = run_python(code)
        assert isolated.tag == "ok" and isolated.stdout.startswith("DENIED"), isolated
        assert not os.path.exists(target)
        open_fs = run_python(code, limits=Limits(isolate_filesystem=False))
        assert open_fs.stdout.strip() == "WROTE", open_fs
    finally:
        if os.path.exists(target):
            os.remove(target)


ESCAPES = {
    "start_new_session": (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
        "                     start_new_session=True, stdin=subprocess.DEVNULL,\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(p.pid)\n"
    ),
    "double_fork": (
        "import os, sys, time\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    if os.fork() == 0:\n"
        "        os.write(w, str(os.getpid()).encode()); os.close(w)\n"
        "        for fd in (0, 1, 2): os.close(fd)\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "os.close(w); print(os.read(r, 32).decode())\n"
    ),
    "setsid": (
        "import os, time\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    os.write(w, str(os.getpid()).encode()); os.close(w)\n"
        "    for fd in (0, 1, 2): os.close(fd)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "os.close(w); print(os.read(r, 32).decode())\n"
    ),
}


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
    except (FileNotFoundError, StopIteration):
        return False
    return " Z " not in state and "zombie" not in state


def test_nothing_the_code_starts_outlives_the_run():
    """Children that leave the process group — a new session, a double fork, setsid — are killed
    with the run (as root: every process of the run's own user)."""
    import os

    import pytest

    if os.geteuid() != 0:
        pytest.skip("the per-run sandbox user needs root; CI runs as root")
    for name, code in ESCAPES.items():
        res = run_python(code, limits=FAST)
        assert res.tag == "ok" and res.stdout.strip().isdigit(), (name, res)
        pid = int(res.stdout)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"{name}: pid {pid} outlived the sandbox run"
