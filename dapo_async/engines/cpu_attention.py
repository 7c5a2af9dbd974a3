"""The decode step's attention on a CPU as a small C kernel (``decode_attention.c``), compiled
once per machine with the system's C compiler and called through ctypes.

Why: at one query per row, torch computes a decode step's attention as two batched matrix
products over B × H tiny matrices (one query row each) around a softmax; each matrix costs a
fixed dispatch on top of its few hundred multiply-adds, and at the tiny policy's shapes
(B 128, H 4, D 32, T ~50) the products took a third of the generator's decode step. One loop in
C over (row, head) that computes the scores, the softmax and the weighted values in one pass
did the same float32 math in about half the time in a one-off timing (not a repo command);
`dapo-async bench decoder` measures what it buys the stream (×1.17–1.21 tokens/s on a 2-core
AMD EPYC, docs/results.md).

    decode_attention(q_BH1D, k_BKTD, v_BKTD, bias_B11T, scale) -> out_B1(H·D), or None where
    the kernel does not apply (not a float32 CPU tensor, a key/value layout it cannot read in
    place) or could not be built: the caller computes it with torch then

Build (the first call in a process, ~0.2 s, or a cached library): ``$CC`` (default ``cc``)
with -O3 -march=native -ffast-math (vectorised loops, glibc's vector exp: libmvec) and, where
the compiler refuses a flag, fewer flags; linked without -ffast-math (``_compile``: the process
that loads the library keeps IEEE subnormals). The library goes to ``$DAPO_ASYNC_KERNEL_CACHE`` (or
``$XDG_CACHE_HOME/dapo_async/kernels``, ``~/.cache/...``) under a key that hashes the source,
the compiler's version, the flags and this CPU's model and flags (a library built for one CPU
must not run on another that shares the home directory); it is written under a temporary name
and renamed, so processes that build at once do not clash. A failed build is logged once and
leaves torch's path: the kernel is an optimisation, never a requirement.

-ffast-math assumes finite inputs: a NaN in the cache (a diverged policy) gives an unspecified
attention output instead of NaN; the learner's alerts catch such a policy first.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.c")
# Compiler flag sets, tried in order until one builds: the vectorised build (the vector exp of
# glibc's libmvec), the same without libmvec (non-glibc systems), then the plainest one.
FLAG_SETS = (
    ("-O3", "-march=native", "-ffast-math", "-lmvec"),
    ("-O3", "-march=native", "-ffast-math"),
    ("-O3",),
)
# A compiler that has not finished in this long is not waited for (the torch path runs).
BUILD_TIMEOUT_S = 60.0
# How ``_compile`` builds, part of the cache key: a library built another way is not reused.
RECIPE = b"2: compile -c with the flags, link -shared without them"

_loaded: dict[str, object] = {}  # "lib": the ctypes functions by name, or None after a failed build


def cache_dir() -> Path:
    """Where built kernels are kept (module docstring)."""
    if os.environ.get("DAPO_ASYNC_KERNEL_CACHE"):
        return Path(os.environ["DAPO_ASYNC_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dapo_async" / "kernels"


def _cpu_signature() -> str:
    """This CPU's model and instruction-set flags (what -march=native compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() + platform.processor()
    keep = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("model name", "flags")]
    return "\n".join(sorted(set(keep))) + platform.machine()


def _compiler_version(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10)
    return out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else ""


def build(cc: str | None = None) -> Path:
    """The kernel's shared library for this machine: cached, or compiled now. Raises
    RuntimeError (saying what failed) when no flag set builds."""
    cc = cc or os.environ.get("CC", "cc")
    try:
        version = _compiler_version(cc)
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"no C compiler ({cc}: {e})") from e
    # what every flag set's key shares: the recipe, the source, the compiler, this CPU
    common = [RECIPE, SOURCE.read_bytes(), version.encode(), _cpu_signature().encode()]
    errors = []
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join([*common, " ".join(flags).encode()])).hexdigest()[:16]
        lib = cache_dir() / key / "decode_attention.so"
        if lib.exists():
            return lib
        lib.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
        os.close(fd)
        error = _compile(cc, flags, tmp)
        if error is None:
            os.replace(tmp, lib)  # atomic: a concurrent builder's library is the same
            return lib
        os.unlink(tmp)
        errors.append(f"{' '.join(flags)}: {error}")
    raise RuntimeError("the decode attention kernel did not build: " + " | ".join(errors))


def _compile(cc: str, flags: tuple[str, ...], out: str) -> str | None:
    """Compile SOURCE with ``flags`` into the shared library ``out``; the error, or None.
    Compiled and linked in two commands: a link with -ffast-math adds crtfastmath, whose
    constructor sets flush-to-zero for the whole process that loads the library (every
    float op of torch and numpy there would lose subnormals); the compile alone does not."""
    libs = [f for f in flags if f.startswith("-l")]
    opts = [f for f in flags if not f.startswith("-l")]
    steps = (
        [cc, *opts, "-fPIC", "-c", str(SOURCE), "-o", out + ".o"],
        [cc, "-shared", out + ".o", "-o", out, *libs, "-lm"],
    )
    try:
        for cmd in steps:
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except (OSError, subprocess.SubprocessError) as e:
                return str(e)
            if res.returncode != 0:
                return res.stderr.strip()[-300:]
        return None
    finally:
        if os.path.exists(out + ".o"):  # the object file is this function's alone
            os.unlink(out + ".o")


def kernel(name: str = "decode_attention"):
    """The loaded kernel ``name`` (a ctypes function: ``decode_attention`` or
    ``decode_attention_slots``), or None where the library cannot be built (logged once)."""
    if "lib" not in _loaded:
        try:
            lib = ctypes.CDLL(str(build()))
            fn = lib.decode_attention
            fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 12 + [ctypes.c_float]
            slots = lib.decode_attention_slots
            slots.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int64] * 10 + [ctypes.c_float]
            fn.restype = slots.restype = None
            _loaded["lib"] = {"decode_attention": fn, "decode_attention_slots": slots}
        except (RuntimeError, OSError, AttributeError) as e:
            log.warning("%s; decode attention stays on torch's matrix products", e)
            _loaded["lib"] = None
    return None if _loaded["lib"] is None else _loaded["lib"][name]


def applies(q_BH1D, k_BKTD, v_BKTD, bias_B11T) -> bool:
    """Whether the kernel can read these tensors as they are: float32 on a CPU, each key and
    value row contiguous, one bias row a batch row, whole query groups per KV head."""
    tensors = (q_BH1D, k_BKTD, v_BKTD, bias_B11T)
    return (
        all(t.device.type == "cpu" and t.dtype == torch.float32 and t.dim() == 4 for t in tensors)
        and k_BKTD.shape == v_BKTD.shape
        and q_BH1D.shape[0] == k_BKTD.shape[0] == bias_B11T.shape[0]
        and q_BH1D.shape[-1] == k_BKTD.shape[-1]
        and k_BKTD.stride(-1) == 1
        and v_BKTD.stride(-1) == 1
        and bias_B11T.shape[1:3] == (1, 1)
        and bias_B11T.shape[-1] == k_BKTD.shape[-2]
        and bias_B11T.stride(-1) == 1
        and q_BH1D.shape[1] % k_BKTD.shape[1] == 0
        and q_BH1D.shape[2] == 1
    )


def decode_attention(q_BH1D, k_BKTD, v_BKTD, bias_B11T, scale: float) -> torch.Tensor | None:
    """[B, 1, H·D] attention of one query per row (module docstring), or None: not applicable
    to these tensors, or no kernel on this machine."""
    if not applies(q_BH1D, k_BKTD, v_BKTD, bias_B11T):
        return None
    fn = kernel()
    if fn is None:
        return None
    B, H, _, D = q_BH1D.shape
    KV, T = k_BKTD.shape[1], k_BKTD.shape[2]
    q = q_BH1D.contiguous()
    out = torch.empty((B, 1, H * D), dtype=torch.float32)
    scratch = torch.empty(T, dtype=torch.float32)
    fn(
        q.data_ptr(), k_BKTD.data_ptr(), v_BKTD.data_ptr(), bias_B11T.data_ptr(),
        out.data_ptr(), scratch.data_ptr(), B, H, KV, T, D,
        *k_BKTD.stride()[:3], *v_BKTD.stride()[:3], bias_B11T.stride(0), scale,
    )  # fmt: skip
    return out


def decode_attention_slots(q_BH1D, k_SKTD, v_SKTD, slot_B, len_B, scale: float) -> torch.Tensor:
    """[B, 1, H·D] attention of one query per row over a slot cache (``slot_kv.SlotKV``): row b
    reads slot ``slot_B[b]`` over its first ``len_B[b]`` time slots. The caller checked that
    the kernel is built (``kernel``) and holds float32 CPU buffers whose rows are contiguous."""
    fn = kernel("decode_attention_slots")
    B, H, _, D = q_BH1D.shape
    q = q_BH1D.contiguous()
    out = torch.empty((B, 1, H * D), dtype=torch.float32)
    scratch = torch.empty(int(len_B.max()), dtype=torch.float32)
    fn(
        q.data_ptr(), k_SKTD.data_ptr(), v_SKTD.data_ptr(), slot_B.data_ptr(), len_B.data_ptr(),
        out.data_ptr(), scratch.data_ptr(), B, H, k_SKTD.shape[1], D,
        *k_SKTD.stride()[:3], *v_SKTD.stride()[:3], scale,
    )  # fmt: skip
    return out
