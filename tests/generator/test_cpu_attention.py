"""The decode step's attention in C (``engines/cpu_attention.py``): built with the machine's
compiler, it computes what the float64 reference computes for every layout the stream hands it
(spare time slots, masked slots, grouped-query heads, head sizes with and without a
specialised loop) and never reads a row's leading padding; it declines what it cannot read (other dtypes, devices, layouts) instead of
reading it wrongly; a failed build leaves torch's path, said once; and a built library is
reused, keyed by this CPU."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch

from dapo_async.engines import cpu_attention

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here"
)

MASKED = torch.finfo(torch.float32).min


def reference(q_BH1D, k_BKTD, v_BKTD, bias_B11T, scale):
    """The attention in float64, grouped-query heads expanded."""
    B, H, _, D = q_BH1D.shape
    rep = H // k_BKTD.shape[1]
    k = k_BKTD.double().repeat_interleave(rep, 1)
    v = v_BKTD.double().repeat_interleave(rep, 1)
    scores = q_BH1D.double() @ k.transpose(-1, -2) * scale + bias_B11T.double().clamp(min=-1e30)
    return (torch.softmax(scores, -1) @ v).reshape(B, 1, H * D)


def case(B, H, KV, T, D, spare=7, seed=0):
    """q and views of key/value buffers with ``spare`` unused time slots, some slots masked."""
    g = torch.Generator().manual_seed(seed)
    k_buf = torch.randn(B, KV, T + spare, D, generator=g)
    v_buf = torch.randn(B, KV, T + spare, D, generator=g)
    q = torch.randn(B, H, 1, D, generator=g) * 2
    bias = torch.zeros(B, 1, 1, T)
    bias[0, ..., : T // 2] = MASKED  # a left-padded row
    return q, k_buf[:, :, :T], v_buf[:, :, :T], bias


@pytest.mark.parametrize(
    "B,H,KV,T,D",
    [(3, 4, 4, 9, 32), (5, 8, 2, 17, 64), (2, 6, 3, 5, 48), (4, 2, 1, 1, 128), (1, 4, 4, 40, 16)],
)
def test_the_kernel_computes_the_reference_attention(B, H, KV, T, D):
    q, k, v, bias = case(B, H, KV, T, D)
    assert cpu_attention.applies(q, k, v, bias)
    got = cpu_attention.decode_attention(q, k, v, bias, D**-0.5)
    assert got is not None and got.shape == (B, 1, H * D)
    assert (got.double() - reference(q, k, v, bias, D**-0.5)).abs().max() < 1e-5


def test_a_rows_leading_padding_is_never_read():
    """A row that joined a running batch is left-padded to its length: the kernel starts at
    its first unmasked slot, so whatever the padding holds (here NaN) costs nothing and
    changes nothing."""
    q, k, v, bias = case(3, 4, 2, 12, 32)
    bias[1, ..., :5] = MASKED
    want = reference(q, k, v, bias, 32**-0.5)
    k[0, :, :6], v[0, :, :6] = float("nan"), float("nan")
    k[1, :, :5], v[1, :, :5] = float("nan"), float("nan")
    got = cpu_attention.decode_attention(q, k, v, bias, 32**-0.5)
    assert got is not None and (got.double() - want).abs().max() < 1e-5


def test_what_it_cannot_read_is_declined_not_misread():
    q, k, v, bias = case(2, 4, 4, 6, 32)
    for args in (
        (q.bfloat16(), k, v, bias),  # another dtype
        (q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v, bias),  # rows not contiguous
        (q, k, v, bias[..., :-1]),  # a bias that does not cover every slot
        (q[:, :3], k, v, bias),  # 3 query heads over 4 KV heads
        (q, k, v[:, :, :-1], bias),  # values for fewer slots than keys
        (q[:1], k, v, bias),  # a query row short
        (q[..., :16], k, v, bias),  # another head size
        (q, k[0], v[0], bias),  # keys without their batch dimension
        (q.to("meta"), k.to("meta"), v.to("meta"), bias.to("meta")),  # not on a CPU
    ):
        assert not cpu_attention.applies(*args)
        assert cpu_attention.decode_attention(*args, 0.1) is None


def test_loading_the_kernel_leaves_the_process_floating_point_as_it_was(tmp_path):
    """-ffast-math at link time adds crtfastmath, which switches the loading process to
    flush-to-zero: every float op of torch and numpy there would lose subnormals. A fresh
    process, so that nothing loaded before hides it."""
    code = (
        "import sys, torch\n"
        "from dapo_async.engines import cpu_attention\n"
        "assert cpu_attention.kernel() is not None\n"
        "tiny = torch.tensor([1e-40]) * 1.0\n"
        "print(sys.float_info.min / 2 > 0, bool(tiny.item() > 0))\n"
    )
    env = {**os.environ, "DAPO_ASYNC_KERNEL_CACHE": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["True", "True"]  # subnormals survive, in Python and torch


def test_a_built_library_is_reused_and_keyed_by_this_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("DAPO_ASYNC_KERNEL_CACHE", str(tmp_path))
    lib = cpu_attention.build()
    assert lib.is_relative_to(tmp_path) and lib.exists()
    built_at = lib.stat().st_mtime_ns
    assert cpu_attention.build() == lib and lib.stat().st_mtime_ns == built_at
    monkeypatch.setattr(cpu_attention, "_cpu_signature", lambda: "another cpu")
    assert cpu_attention.build() != lib  # never a library compiled for another CPU
    assert len(list(tmp_path.rglob("*.so"))) == 2  # the two libraries, no temporary left


def test_a_failed_build_leaves_torchs_path_and_says_why_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DAPO_ASYNC_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(RuntimeError, match="no C compiler"):
        cpu_attention.build()
    monkeypatch.setattr(cpu_attention, "_loaded", {})
    q, k, v, bias = case(2, 4, 4, 6, 32)
    with caplog.at_level(logging.WARNING, logger=cpu_attention.__name__):
        assert cpu_attention.decode_attention(q, k, v, bias, 0.1) is None
        assert cpu_attention.decode_attention(q, k, v, bias, 0.1) is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "no C compiler" in said[0] and "torch" in said[0]
    # a compiler that rejects the source: every flag set tried, each failure named
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C")
    monkeypatch.setenv("CC", shutil.which("cc") or shutil.which("gcc"))
    monkeypatch.setattr(cpu_attention, "SOURCE", bad)
    with pytest.raises(RuntimeError, match="did not build: -O3 -march=native"):
        cpu_attention.build()
    assert not list(tmp_path.rglob("*.so"))  # no half-written library left behind
