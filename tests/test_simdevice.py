"""The simulated accelerator (tests/simdevice.py) fails where CUDA fails and computes like the
CPU where CUDA would not fail: the device-path tests that use it are only as good as this."""

import pytest
import torch
from simdevice import DeviceMismatch, SimTensor, real, sim_device


def test_mixing_a_cpu_tensor_or_generator_with_a_simulated_one_fails():
    with sim_device():
        x_B = torch.ones(3, device="meta")
        assert isinstance(x_B, SimTensor) and x_B.device.type == "meta"
        with pytest.raises(DeviceMismatch):
            x_B + torch.ones(3)
        probs_BV = torch.softmax(torch.zeros(2, 5, device="meta"), -1)
        with pytest.raises(DeviceMismatch):
            torch.multinomial(probs_BV, 1, generator=torch.Generator().manual_seed(0))
        with pytest.raises(DeviceMismatch):
            x_B.index_select(0, torch.tensor([0, 2]))  # an index made on the CPU
        with pytest.raises(TypeError):
            x_B.numpy()  # a device tensor must be moved to the host first


def test_what_cuda_allows_computes_like_the_cpu():
    with sim_device() as sim:
        x_B = torch.arange(4, device="meta", dtype=torch.float32)
        y_B = x_B * 2 + torch.tensor(1.0)  # a CPU scalar mixes, as on CUDA
        assert y_B.tolist() == [1.0, 3.0, 5.0, 7.0]
        assert float(y_B.sum()) == 16.0 and sim.host_reads == 2
        g = torch.Generator(device="meta").manual_seed(0)
        draw = torch.multinomial(torch.ones(2, 5, device="meta"), 1, generator=g)
        assert isinstance(draw, SimTensor)
        host_B = torch.zeros(4)
        host_B.copy_(y_B)  # the crossing, as on a GPU
        assert host_B.tolist() == [1.0, 3.0, 5.0, 7.0] and type(y_B.cpu()) is torch.Tensor
        y_B.add_(1)  # in place: the same tensor, data changed
        assert real(y_B).tolist() == [2.0, 4.0, 6.0, 8.0]
        assert isinstance(torch.tensor([1, 2], device="meta"), SimTensor)
        assert y_B[torch.tensor([0, 2])].tolist() == [2.0, 6.0]  # CUDA takes CPU indices here


def test_a_module_moved_to_the_simulated_device_trains():
    with sim_device():
        lin = torch.nn.Linear(4, 2).to("meta")
        assert all(isinstance(p, SimTensor) for p in lin.parameters())
        opt = torch.optim.AdamW(lin.parameters(), lr=0.1)
        before = real(lin.weight).clone()
        lin(torch.ones(3, 4, device="meta")).sum().backward()
        opt.step()
        assert not torch.equal(real(lin.weight), before)
        with pytest.raises(DeviceMismatch):
            lin(torch.ones(3, 4))  # input left on the CPU
