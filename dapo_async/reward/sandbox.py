"""Code-execution reward: run candidate code against test cases in a locked-down subprocess.

Each test runs ``python -I solution.py`` in a fresh temp directory with its input on stdin and
these limits: CPU seconds (RLIMIT_CPU), address space (RLIMIT_AS), file size (RLIMIT_FSIZE),
processes (RLIMIT_NPROC; as root the child first drops to a user of its own, so the limit holds),
stdout/stderr bytes (read through a pipe; the run is killed past the limit) and wall-clock time.
Nothing the code starts outlives the run: as root each run gets a user id no other process has
(``sandbox_uid``: a range above any real account, one id per concurrent run of this process,
the process id keeping them apart across processes), and when the run ends every process of that
user is killed (``kill(-1)`` from a helper that becomes the user) — children that left the
process group (``setsid``, ``start_new_session``, double forks) included. Without root the child
leads its own process group, which is killed as a whole. The child runs in a new, empty network namespace (no route anywhere, not
even to this machine's loopback listeners; ``Limits.isolate_network``). As root it also gets a
private mount namespace in which every mount is read-only except its temp directory
(``Limits.isolate_filesystem``); without root, writes are limited by the user's own rights. A run that hits a limit is tagged (``timeout``, ``cpu_limit``,
``memory_limit``, ``output_limit``, ``error``) and scores as wrong.

Ground truth format: JSON ``{"tests": [{"input": "...", "output": "..."}, ...]}``; the code is the
last fenced ```python block of the response (or the whole response if it has none).
"""

from __future__ import annotations

import json
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Sandbox user ids: SANDBOX_UID_BASE + pid × SLOTS_PER_PROCESS + slot. The base sits above any
# account a system creates (useradd stops at 60000; containers map at most 2^16 or 2^32 ids)
# and the ids need no passwd entry: the kernel checks numbers. pid < 2^22 (the kernel's largest
# pid_max), so ids stay below 2^31.
SANDBOX_UID_BASE = 1 << 30
SLOTS_PER_PROCESS = 64
# kill(-1) passes per cleanup: a process forking as the first pass lands can leave a child.
KILL_PASSES = 5
# Exit status of a child that could not enter its network namespace (tagged "sandbox_error").
NO_NAMESPACE_EXIT = 111
_CODE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 2  # CPU seconds per test (SIGXCPU, then SIGKILL)
    wall_s: float = 5.0  # wall-clock seconds per test (sleeping code burns no CPU)
    memory_mb: int = 512  # address space; Python itself needs ~30 MB
    output_bytes: int = 1 << 20  # stdout + stderr kept; more kills the run
    file_bytes: int = 1 << 20  # largest file the code may write
    num_procs: int = 16  # processes of the sandbox user (fork bombs)
    isolate_network: bool = True  # run in an empty network namespace (no loopback listeners)
    isolate_filesystem: bool = True  # as root: everything read-only but the run's directory


@dataclass
class RunResult:
    tag: str  # "ok" | "timeout" | "cpu_limit" | "memory_limit" | "output_limit" | "error"
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


# unshare(2) flags (linux/sched.h): a new network namespace has only a loopback device, down,
# so the code reaches no listener of this machine (the run's own buffer included) and no network.
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
# mount(2) flags (linux/mount.h), for a private mount namespace whose mounts are all read-only
# but the run's own directory.
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


def _load_libc():
    # loaded in the parent: after fork only async-signal-safe work belongs in the child
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()


def _mount_points() -> list[bytes]:
    """Every mount point of this process (read in the parent, before the fork)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    points = {line.split()[4].encode().decode("unicode_escape").encode() for line in lines}
    return sorted(points, key=len)


def _isolate(limits: Limits, workdir: bytes, mounts: list[bytes]) -> None:
    """New namespaces for the child: an empty network one, and (as root) a private mount one in
    which every mount is read-only except ``workdir``. Fails closed: the child exits rather than
    run code with the host's network or a writable file system."""
    root = os.geteuid() == 0
    fs = limits.isolate_filesystem and root  # without root the user's own rights apply
    flags = (CLONE_NEWNET if limits.isolate_network else 0) | (CLONE_NEWNS if fs else 0)
    if limits.isolate_network and not root:
        flags |= CLONE_NEWUSER
    if not flags:
        return
    if _LIBC is None or _LIBC.unshare(flags) != 0:
        os._exit(NO_NAMESPACE_EXIT)
    if not fs:
        return
    if _LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        os._exit(NO_NAMESPACE_EXIT)
    if _LIBC.mount(workdir, workdir, None, MS_BIND, None) != 0:
        os._exit(NO_NAMESPACE_EXIT)
    for point in mounts:
        ok = _LIBC.mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None) == 0
        if point == b"/" and not ok:
            os._exit(NO_NAMESPACE_EXIT)


def _uids_in_use() -> set[int]:
    """Real user ids of every process on the machine, zombies included (a killed process counts
    against its user's RLIMIT_NPROC until its reaper collects it)."""
    uids = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                line = next(line for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        uids.add(int(line.split()[1]))
    return uids


class _UidSlots:
    """The sandbox user ids of this process, one per concurrent run. Slots rotate, and a slot
    whose user still has processes is passed over: the processes a run's cleanup killed are
    reparented to init, which may reap them only a second later (seen: ~1.5 s in a container), and
    until then they would count against the next run's RLIMIT_NPROC and fail its first fork."""

    def __init__(self):
        import threading

        self.lock = threading.Lock()
        self.free = list(range(SLOTS_PER_PROCESS))

    def _uid(self, slot: int) -> int:
        return SANDBOX_UID_BASE + (os.getpid() % (1 << 22)) * SLOTS_PER_PROCESS + slot

    def take(self) -> int:
        busy = _uids_in_use()
        with self.lock:
            slot = next((s for s in self.free if self._uid(s) not in busy), None)
            if slot is None:
                raise RuntimeError(
                    f"no sandbox user free: {SLOTS_PER_PROCESS - len(self.free)} runs at once and "
                    f"{len(self.free)} users whose killed processes are not yet reaped"
                )
            self.free.remove(slot)
        return self._uid(slot)

    def give(self, uid: int) -> None:
        with self.lock:
            self.free.append((uid - SANDBOX_UID_BASE) % SLOTS_PER_PROCESS)


_UIDS = _UidSlots()


_KILL_ALL = (
    "import os, signal\n"
    f"for _ in range({KILL_PASSES}):\n"
    "    try:\n"
    "        os.kill(-1, signal.SIGKILL)\n"
    "    except ProcessLookupError:\n"
    "        break\n"
)


def _kill_user(uid: int) -> None:
    """SIGKILL every process of ``uid``: a helper running as that user calls kill(-1), which
    reaches all the user's processes but itself, until none is left (a process forking while
    the first pass lands can leave a child: ``KILL_PASSES``)."""
    subprocess.run(
        [sandbox_python(), "-I", "-S", "-c", _KILL_ALL],
        user=uid,
        group=uid,
        extra_groups=[],
        env={},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=30,
        check=False,
    )


def _preexec(limits: Limits, workdir: str, mounts: list[bytes], uid: int | None):
    def setup() -> None:
        os.setsid()
        _isolate(limits, workdir.encode(), mounts)
        if uid is not None:  # root ignores RLIMIT_NPROC: run as the run's own user instead
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        mem = limits.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.num_procs, limits.num_procs))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return setup


def _world_executable(path: str) -> bool:
    """True if a user with no special rights can run ``path`` (every parent dir o+x)."""
    p = os.path.realpath(path)
    if not (os.path.isfile(p) and os.stat(p).st_mode & 0o001):
        return False
    d = os.path.dirname(p)
    while d not in ("/", ""):
        if not os.stat(d).st_mode & 0o001:
            return False
        d = os.path.dirname(d)
    return True


def sandbox_python() -> str:
    """The interpreter candidate code runs with; as root it must be usable by any user (the
    sandbox's own has no group or account)."""
    if os.geteuid() != 0:
        return sys.executable
    for cand in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if _world_executable(cand):
            return os.path.realpath(cand)
    raise RuntimeError("no Python interpreter that any user can run (needed by the code sandbox)")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _prepare(code: str) -> tuple[str, str]:
    """A fresh world-readable work dir holding ``solution.py``: (dir, script path)."""
    workdir = tempfile.mkdtemp(prefix="dapo_sandbox_")
    os.chmod(workdir, 0o777)
    path = os.path.join(workdir, "solution.py")
    with open(path, "w") as f:
        f.write(code)
    os.chmod(path, 0o644)
    return workdir, path


def _collect(proc: subprocess.Popen, stdin: str, limits: Limits, t0: float, out, err) -> str:
    """Feed stdin, read stdout/stderr until both close, the wall limit or the output limit;
    returns "ok", "timeout" or "output_limit"."""
    try:
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    open_streams, tag = 2, "ok"
    while open_streams:
        left = limits.wall_s - (time.monotonic() - t0)
        if left <= 0:
            tag = "timeout"
            break
        for key, _ in sel.select(timeout=min(left, 0.1)):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            key.data.extend(chunk)
            if len(out) + len(err) > limits.output_bytes:
                tag, open_streams = "output_limit", 0
                break
    sel.close()
    return tag


def _classify(tag: str, rc: int, stderr_text: str, elapsed: float, limits: Limits) -> str:
    if tag != "ok" or rc == 0:
        return tag
    if rc == NO_NAMESPACE_EXIT and not stderr_text:
        return "sandbox_error"
    if rc in (-signal.SIGXCPU, -signal.SIGKILL) and elapsed >= limits.cpu_s * 0.9:
        return "cpu_limit"
    return "memory_limit" if "MemoryError" in stderr_text else "error"


def run_python(code: str, stdin: str = "", limits: Limits = Limits()) -> RunResult:
    """Run ``code`` once under the limits; never raises for anything the code does."""
    workdir, path = _prepare(code)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": workdir,
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
    }
    uid = _UIDS.take() if os.geteuid() == 0 else None
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sandbox_python(), "-I", "-S", path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=env,
            preexec_fn=_preexec(limits, workdir, _mount_points(), uid),
        )
    except BaseException:
        if uid is not None:
            _UIDS.give(uid)
        raise
    out, err = bytearray(), bytearray()
    try:
        tag = _collect(proc, stdin, limits, t0, out, err)
        if tag != "ok":
            _kill_group(proc)
        try:
            rc = proc.wait(timeout=max(0.1, limits.wall_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = proc.wait()
            tag = "timeout" if tag == "ok" else tag
    finally:
        _kill_group(proc)  # forked children of the code die with the group
        if uid is not None:  # and every process of the run's user, wherever it went
            _kill_user(uid)
            _UIDS.give(uid)
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        shutil.rmtree(workdir, ignore_errors=True)
    stderr_text = err[: limits.output_bytes].decode(errors="replace")
    elapsed = time.monotonic() - t0
    tag = _classify(tag, rc, stderr_text, elapsed, limits)
    stdout_text = out[: limits.output_bytes].decode(errors="replace")
    return RunResult(tag, rc, stdout_text, stderr_text, elapsed)


def extract_code(response: str) -> str:
    blocks = _CODE_RE.findall(response)
    return blocks[-1] if blocks else response


def code_exec(response: str, ground_truth: str, limits: Limits = Limits()) -> dict:
    """+1 if every test's stdout matches (whitespace-trimmed), else −1; tagged by the first
    failing test's outcome."""
    try:
        tests = json.loads(ground_truth)["tests"]
    except (ValueError, KeyError, TypeError):
        return {"score": -1.0, "acc": 0.0, "pred": None, "tag": "bad_ground_truth"}
    code = extract_code(response)
    passed = 0
    for t in tests:
        res = run_python(code, str(t.get("input", "")), limits)
        if res.tag != "ok":
            return {"score": -1.0, "acc": 0.0, "pred": None, "tag": res.tag, "passed": passed}
        if res.stdout.strip() != str(t.get("output", "")).strip():
            return {
                "score": -1.0,
                "acc": 0.0,
                "pred": res.stdout[-200:],
                "tag": "wrong",
                "passed": passed,
            }
        passed += 1
    return {"score": 1.0, "acc": 1.0, "pred": None, "tag": "ok", "passed": passed}
