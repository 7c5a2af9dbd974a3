"""Device placement in one place (``devices.py``): the GPU plan per role, the shared-device
fallback of weight sync, dtype resolution, the launcher handing each role its devices, the vLLM
start-up environment, and the Slurm task's GPU pick."""

import os
import subprocess
from pathlib import Path

import pytest
import torch

from dapo_async import devices
from dapo_async.config import load_config
from dapo_async.launch import train

REPO = Path(__file__).resolve().parents[1]


def test_plan_gives_roles_their_own_gpus_when_there_are_enough():
    plan = devices.plan_devices(4, 1, 3)
    assert (plan.learner, plan.generators, plan.shared) == ("0", ["1", "2", "3"], False)
    assert plan.wsync_backend("auto") == "nccl"
    tp = devices.plan_devices(8, 2, 3, tensor_parallel=2)
    assert tp.learner == "0,1" and tp.generators == ["2,3", "4,5", "6,7"] and not tp.shared


def test_generators_open_the_learners_gpu_handles_only_where_they_see_its_gpu():
    assert devices.plan_devices(1, 1, 2).generators_see_learner_gpu()  # one shared GPU
    assert devices.plan_devices(2, 2, 3).generators_see_learner_gpu() is False  # 1 of 3 on GPU 0
    assert devices.plan_devices(4, 1, 3).generators_see_learner_gpu() is False  # their own GPUs
    assert devices.plan_devices(0, 1, 2).generators_see_learner_gpu() is False  # CPU


def test_one_gpu_is_shared_and_weight_sync_falls_back_to_gloo():
    plan = devices.plan_devices(1, 1, 2)
    assert (plan.learner, plan.generators, plan.shared) == ("0", ["0", "0"], True)
    assert plan.wsync_backend("auto") == "gloo"  # NCCL refuses two ranks on one device
    assert plan.wsync_backend("nccl") == "nccl"  # an explicit choice is kept
    cpu = devices.plan_devices(0, 1, 2)
    assert cpu.learner is None and cpu.wsync_backend("auto") == "gloo"


def test_role_env_counts_within_the_parents_visible_devices():
    assert devices.role_env({}, "1")["CUDA_VISIBLE_DEVICES"] == "1"
    parent = {"CUDA_VISIBLE_DEVICES": "4,6,7"}
    assert devices.role_env(parent, "1,2")["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert devices.role_env({"A": "b"}, None) == {"A": "b"}  # CPU: unchanged


def test_dtypes_resolve_per_device():
    assert devices.resolve_dtype("auto", "cpu") == torch.float32
    assert devices.resolve_dtype("auto", "cuda:0") == torch.bfloat16
    assert devices.resolve_dtype("float32", "cuda:0") == torch.float32
    with pytest.raises(ValueError, match="float8"):
        devices.resolve_dtype("float8", "cpu")


def test_active_compute_dtype_is_autocasts_where_it_is_on():
    assert devices.active_compute_dtype("cpu", torch.float32) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert devices.active_compute_dtype("cpu", torch.float32) == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert devices.active_compute_dtype("cpu", torch.float64) == torch.float64


def test_old_model_dtype_key_names_its_replacements():
    with pytest.raises(ValueError, match=r"learner\.param_dtype"):
        load_config(None, ["model.dtype=bfloat16"])


@pytest.mark.parametrize(
    ("gpus", "backend", "gen", "mode", "slots"),
    [(1, "gloo", "0", "shm", "cuda"), (2, "nccl", "1", "dist", "host")],
)
def test_launcher_gives_each_role_its_gpus(
    monkeypatch, tiny_model, tmp_path, gpus, backend, gen, mode, slots
):
    """One shared GPU: weights through shared memory with the slots on that GPU (CUDA IPC;
    gloo kept as dist mode's backend); a GPU per role: NCCL between them."""
    monkeypatch.setattr(train, "cuda_device_count", lambda: gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = load_config(None, [f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}"])
    cfg, run_dir, cfg_path = train.prepare_run(cfg)
    assert cfg.weight_sync.backend == backend
    assert load_config(str(cfg_path), []).weight_sync.backend == backend  # what roles read
    assert load_config(str(cfg_path), []).weight_sync.mode == mode
    assert load_config(str(cfg_path), []).weight_sync.shm_slots == slots
    _, learner, gens = train.make_roles(cfg, cfg_path, run_dir, resume=False)
    assert learner.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert gens[0].env["CUDA_VISIBLE_DEVICES"] == gen


def test_launcher_sends_weights_through_shared_memory_on_a_cpu_host(
    monkeypatch, tiny_model, tmp_path
):
    monkeypatch.setattr(train, "cuda_device_count", lambda: 0)
    cfg = load_config(None, [f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}"])
    _, _, cfg_path = train.prepare_run(cfg)
    assert load_config(str(cfg_path), []).weight_sync.mode == "shm"
    assert load_config(str(cfg_path), []).weight_sync.shm_slots == "host"
    explicit = load_config(
        None, [f"model.path={tiny_model}", f"run_dir={tmp_path / 'r2'}", "weight_sync.mode=dist"]
    )
    _, _, cfg_path = train.prepare_run(explicit)
    assert load_config(str(cfg_path), []).weight_sync.mode == "dist"  # a choice is kept


def test_gpu_check_does_not_initialise_cuda_and_vllm_workers_are_spawned(python):
    """In a fresh interpreter: an earlier test of the same process may have initialised CUDA
    (on a GPU machine), which says nothing about ``cuda_device_count``."""
    code = (
        "import os, torch\n"
        "from dapo_async import devices\n"
        "from dapo_async.engines.vllm import vllm_environment\n"
        "os.environ.pop('VLLM_WORKER_MULTIPROC_METHOD', None)\n"
        "devices.cuda_device_count()\n"
        "assert not torch.cuda.is_initialized(), 'cuda_device_count initialised CUDA'\n"
        "vllm_environment(gpu=True, cpu_kvcache_gib=1)\n"
        "assert os.environ['VLLM_WORKER_MULTIPROC_METHOD'] == 'spawn'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize(
    ("per_task", "visible", "want"),
    [
        (1, None, "3"),
        (1, "0", "0"),
        (1, "2,4,5,7", "7"),
        (1, "1,2", None),
        (2, None, "6,7"),
        (2, "4,5", "4,5"),
        (2, "0,1,2,3,4,5,6,7", "6,7"),
        (2, "0,1,2,3", None),
    ],
)
def test_slurm_task_picks_its_gpus(per_task, visible, want):
    """Task 3 of a node, one GPU a task: no binding → GPU 3; a site binding one GPU → kept; four
    visible → the fourth of them; two visible → an error, not a wrong device. Two a task
    (tensor parallel 2): GPUs 6,7, of the visible list where it lists more."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["SLURM_LOCALID"] = "3"
    env["DAPO_GPUS_PER_TASK"] = str(per_task)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    script = REPO / "tools" / "slurm" / "pick_gpu.sh"
    res = subprocess.run(
        ["bash", "-c", f'source "{script}" && echo "$CUDA_VISIBLE_DEVICES"'],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if want is None:
        assert res.returncode != 0 and f"only {len(visible.split(','))} GPUs" in res.stderr
    else:
        assert res.returncode == 0 and res.stdout.strip() == want


def test_slurm_learner_uses_a_static_rendezvous_ranked_by_node():
    text = (REPO / "tools" / "slurm" / "dapo_hetjob.sbatch").read_text()
    assert '--node_rank="$SLURM_NODEID"' in text and "--rdzv_backend=c10d" not in text
    assert (
        subprocess.run(["bash", "-n", str(REPO / "tools/slurm/dapo_hetjob.sbatch")]).returncode == 0
    )


def test_the_learner_computes_in_bf16_on_a_cpu_with_native_bf16_matmuls_only():
    """``learner.compute_dtype=auto``: bf16 where the CPU multiplies bf16 in hardware (the
    /proc/cpuinfo flags), float32 elsewhere (emulated bf16 is slower than fp32); a named dtype
    is what it says; generators keep ``resolve_dtype`` (float32 on every CPU)."""
    import torch

    from dapo_async import devices

    zen4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
    spr = "flags\t\t: avx512f amx_bf16 amx_tile\n"
    zen3 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
    assert devices.cpu_has_native_bf16(zen4) and devices.cpu_has_native_bf16(spr)
    assert not devices.cpu_has_native_bf16(zen3) and not devices.cpu_has_native_bf16("")
    native = devices.cpu_has_native_bf16()
    want = torch.bfloat16 if native else torch.float32
    assert devices.learner_compute_dtype("auto", "cpu") == want
    assert devices.learner_compute_dtype("float32", "cpu") == torch.float32
    assert devices.learner_compute_dtype("bfloat16", "cpu") == torch.bfloat16
    assert devices.learner_compute_dtype("auto", "meta") == torch.float32  # not a CPU
    assert devices.resolve_dtype("auto", "cpu") == torch.float32


def test_the_lean_decoders_products_run_in_bf16_on_a_cpu_with_native_bf16_matmuls_only(
    monkeypatch,
):
    """``generator.decode_matmul_dtype=auto``: bf16 products for a float32 model on a CPU that
    multiplies bf16 in hardware; None (the model's dtype) on other CPUs, for a model already in
    bf16, and on a device that is not a CPU; a named dtype is what it says."""
    import torch

    from dapo_async import devices

    for native in (True, False):
        monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda native=native: native)
        want = torch.bfloat16 if native else None
        assert devices.decode_matmul_dtype("auto", torch.float32, "cpu") is want
        assert devices.decode_matmul_dtype("auto", torch.bfloat16, "cpu") is None
        assert devices.decode_matmul_dtype("auto", torch.float32, "meta") is None
        assert devices.decode_matmul_dtype("float32", torch.float32, "cpu") is None
        assert devices.decode_matmul_dtype("bfloat16", torch.float32, "cpu") is torch.bfloat16
        assert devices.decode_matmul_dtype("float32", torch.bfloat16, "meta") is torch.float32
