"""The tiny build runs at BUILD_THREADS torch threads whatever its caller set: the thread count
decides how matmul sums are split, hence the warm start's rounding and where it stops."""

import torch
from safetensors.torch import load_file

from dapo_async.tiny.build import BUILD_THREADS, build


def test_the_callers_thread_count_changes_neither_the_build_nor_the_caller(tmp_path):
    before = torch.get_num_threads()
    built = {}
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            meta = build(tmp_path / f"t{threads}", seed=0, sft_steps=20, log=lambda s: None)
            assert torch.get_num_threads() == threads  # restored for the caller
            assert meta["torch_threads"] == BUILD_THREADS
            built[threads] = load_file(tmp_path / f"t{threads}" / "model.safetensors")
    finally:
        torch.set_num_threads(before)
    assert built[1].keys() == built[3].keys()
    assert all(torch.equal(built[1][k], built[3][k]) for k in built[1])
