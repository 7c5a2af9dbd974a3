"""A simulated accelerator for CPU tests: inside ``sim_device()``, ``meta`` behaves like a GPU
whose tensors hold real data.

Why: the bugs a first GPU run finds are mostly of one class — an object made on the CPU (a
``torch.Generator()``, a mask, an index) meeting a tensor on the model's device. On a CPU-only
machine every tensor is on the CPU, so that class never fails. Here a tensor "on" ``meta`` is a
``SimTensor``: a wrapper that reports ``device('meta')`` and computes on a real CPU tensor
inside. Every op is checked as CUDA checks it:

- tensors of one op must share a device: simulated with simulated, CPU with CPU; CPU scalars
  (0-dim) mix with either, as CUDA allows; ``copy_``/``to`` are the crossings, as on a GPU;
- a generator must be on the device of the tensors it draws for (``torch.Generator(device=
  'meta')`` makes a simulated one; CPU generators fail on simulated tensors, like CUDA);
- ``.numpy()`` of a simulated tensor fails (a CUDA tensor must be moved first); ``.tolist()``,
  ``.item()`` and ``int()`` work (they synchronise on a GPU; ``host_reads`` counts them).

Usage::

    with sim_device() as sim:
        engine = HFEngine(model_dir, device="meta")   # the model's weights become SimTensors
        ...                                           # a CPU-made tensor meeting them raises
        sim.host_reads                                # device → host reads so far
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

SIM = torch.device("meta")
_RealGenerator = torch.Generator
# ops that move data between devices (allowed to mix), as on a GPU
_CROSSING = {"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "lift_fresh"}
# advanced indexing takes indices on the CPU for a device tensor (CUDA moves them itself)
_CPU_INDICES_OK = {"index", "index_put", "index_put_", "_index_put_impl_"}
# ops that read device data back to the host (a synchronisation on a GPU)
_HOST_READS = {"_local_scalar_dense"}
# Python-level factories that take data and a device without going through the dispatcher
_DATA_FACTORIES = (torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor)


class DeviceMismatch(RuntimeError):
    """Raised where CUDA would raise "Expected all tensors to be on the same device"."""


class SimTensor(torch.Tensor):
    """A tensor on the simulated device, computing on ``_sim_data`` (a CPU tensor)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        assert not isinstance(data, SimTensor)
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            data.size(),
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            device=SIM,
            requires_grad=data.requires_grad,
        )
        out._sim_data = data
        return out

    def tolist(self):
        _STATE.host_reads += 1
        return self._sim_data.tolist()

    def numpy(self, *args, **kwargs):
        raise TypeError(
            "can't convert meta (simulated device) tensor to numpy: use Tensor.cpu() first"
        )

    def __repr__(self, *, tensor_contents=None):
        return f"SimTensor({self._sim_data!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


class _State:
    def __init__(self):
        self.generators: list[torch.Generator] = []  # the simulated ones made so far
        self.host_reads = 0

    def is_sim_generator(self, g) -> bool:
        """The dispatcher hands ops a new Python wrapper of the generator, so identity is lost:
        a generator is simulated when its state is a simulated one's (a CPU generator seeded
        and drawn exactly alike would pass; the tests make none)."""
        state = g.get_state()
        return any(torch.equal(state, sim.get_state()) for sim in self.generators)


_STATE = _State()


def _is_sim_device(device) -> bool:
    return device is not None and not isinstance(device, int) and torch.device(device) == SIM


def _run(func, args, kwargs):
    seen: set[str] = set()

    def unwrap(x):
        if isinstance(x, SimTensor):
            seen.add("sim")
            return x._sim_data
        if isinstance(x, torch.Tensor):
            if x.dim() > 0 or x.device.type != "cpu":
                seen.add(x.device.type)
        elif isinstance(x, _RealGenerator):
            seen.add("sim" if _STATE.is_sim_generator(x) else x.device.type)
        return x

    real_args, real_kwargs = tree_map(unwrap, (args, kwargs))
    name = func._schema.name.split("::")[-1]
    on_sim = "sim" in seen
    if "device" in real_kwargs:  # factories and .to(): the device asked for decides
        on_sim = _is_sim_device(real_kwargs["device"])
        if on_sim:
            real_kwargs["device"] = torch.device("cpu")
    elif name in _CPU_INDICES_OK and seen == {"sim", "cpu"} and isinstance(args[0], SimTensor):
        pass
    elif len(seen) > 1 and name not in _CROSSING:
        raise DeviceMismatch(
            f"Expected all tensors to be on the same device, but found {sorted(seen)} "
            f"in {func} (a tensor or generator made on the CPU met one on the model's device)"
        )
    if name in _HOST_READS and "sim" in seen:
        _STATE.host_reads += 1
    out = func(*real_args, **real_kwargs)
    if name.endswith("_") and args and isinstance(args[0], torch.Tensor):
        return args[0]  # in-place: the caller's tensor, not a new wrapper
    if "out" in kwargs:
        return kwargs["out"]
    if not on_sim:
        return out
    return tree_map(lambda t: SimTensor(t) if type(t) is torch.Tensor else t, out)


class _Dispatch(TorchDispatchMode):
    """Sees factory ops (``torch.zeros(..., device='meta')``) and every op on SimTensors."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


class _Factories(TorchFunctionMode):
    """``torch.tensor(data, device='meta')`` copies its data in C++, below the dispatcher."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DATA_FACTORIES and _is_sim_device(kwargs.get("device")):
            return SimTensor(func(*args, **{**kwargs, "device": "cpu"}))
        return func(*args, **kwargs)


class _GeneratorType(type):
    """``isinstance(g, torch.Generator)`` and ``torch.Generator | None`` keep working while
    ``torch.Generator`` is replaced (torch modules imported inside ``sim_device()`` use both)."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, _RealGenerator)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _RealGenerator)


class _Generator(metaclass=_GeneratorType):
    """``torch.Generator`` inside ``sim_device()``: ``device='meta'`` gives a simulated one."""

    def __new__(cls, device="cpu"):
        if _is_sim_device(device):
            g = _RealGenerator("cpu")
            _STATE.generators.append(g)
            return g
        return _RealGenerator(device)


@contextlib.contextmanager
def sim_device():
    """Inside: ``meta`` is a simulated accelerator (module docstring); yields the counters."""
    _STATE.host_reads = 0
    torch.Generator = _Generator
    # module.to('meta') swaps each parameter's contents in place (a wrapper cannot take
    # ``param.data = ...``), so a parameter shared by two modules (tied embeddings) stays shared
    swap_before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with _Factories(), _Dispatch():
            yield _STATE
    finally:
        torch.Generator = _RealGenerator
        torch.__future__.set_swap_module_params_on_conversion(swap_before)
        _STATE.generators.clear()


def real(t: torch.Tensor) -> torch.Tensor:
    """The CPU data behind a simulated tensor (the tensor itself otherwise)."""
    return t._sim_data if isinstance(t, SimTensor) else t
