"""The NCCL weight-sync group honours weight_sync.timeout_s. torch's CPU build has no NCCL, so a
small hand-written stand-in for the two NCCL classes records what the group is built with."""

import types
from datetime import timedelta
from typing import ClassVar

from dapo_async.weight_sync import collectives as wsync_dist


class _FakeNCCL:
    """Records the arguments of ``ProcessGroupNCCL(store, rank, size, options)``."""

    built: ClassVar[list] = []

    class Options:
        def __init__(self):
            self._timeout = timedelta(minutes=10)  # NCCL's default when none is set
            self.config = types.SimpleNamespace(blocking=1)  # NCCL's default: blocking init

    def __init__(self, store, rank, size, options):
        _FakeNCCL.built.append((rank, size, options))


class _FakeDist:
    ProcessGroupNCCL = _FakeNCCL

    @staticmethod
    def PrefixStore(prefix, store):
        return (prefix, store)


def test_nccl_group_gets_the_configured_timeout(monkeypatch):
    monkeypatch.setattr(wsync_dist, "dist", _FakeDist)
    _FakeNCCL.built.clear()
    pg, prefix = wsync_dist.make_group("store", 3, 1, 4, 7.5, "nccl")
    assert prefix == ("wsync/3", "store")
    ((rank, size, options),) = _FakeNCCL.built
    assert (rank, size) == (1, 4)
    assert options._timeout == timedelta(seconds=7.5)
    # a non-blocking communicator: a member that never joins is waited for on the host
    assert options.config.blocking == 0
