"""What a role reports about itself (``resources.py``): CPU, resident memory, the bytes its
messages moved through real ZeroMQ sockets (counted in ``transport``), and its weight-sync
bytes; GPU memory only where the process uses a GPU."""

import time

import psutil
import zmq

from dapo_async import protocol, transport
from dapo_async.resources import ResourceMeter


def burn_cpu_s(seconds: float) -> None:
    """Compute until this process's CPU time has grown by ``seconds`` as the kernel counts it
    (in clock ticks): a fixed amount of work can finish inside one tick on a fast machine and
    read as 0 % (a clean-clone CI run did)."""
    proc = psutil.Process()
    start = sum(proc.cpu_times()[:2])
    deadline = time.monotonic() + 30
    while sum(proc.cpu_times()[:2]) - start < seconds and time.monotonic() < deadline:
        sum(i * i for i in range(20_000))


def test_a_roles_meter_counts_the_bytes_its_messages_move_and_what_it_uses():
    ctx = zmq.Context()
    server = transport.bind_server(ctx, zmq.ROUTER)
    client = transport.connect_client(ctx, zmq.DEALER, server.endpoint)
    try:
        meter = ResourceMeter(lambda: 3 << 20)
        sent0, recv0 = transport.TRAFFIC["sent"], transport.TRAFFIC["received"]
        msg = protocol.Heartbeat(generator_id="g" * 200, version=3)
        size = sum(len(bytes(f)) for f in protocol.encode(msg))
        for _ in range(5):
            transport.send(client, msg)
            _, got = transport.recv_routed(server.socket, timeout_s=10)
            assert got == msg
        assert transport.TRAFFIC["sent"] - sent0 == 5 * size
        assert transport.TRAFFIC["received"] - recv0 == 5 * size
        burn_cpu_s(0.05)  # some CPU time to measure, past the clock's 10 ms ticks
        m = meter.metrics()
        assert m["resources/cpu_percent"] > 0 and m["resources/rss_mb"] > 10
        assert m["resources/sent_mb"] >= 5 * size / 2**20 and m["resources/wsync_mb"] == 3.0
        assert not any(k.startswith("resources/gpu_") for k in m)  # no GPU in use here
    finally:
        client.close(linger=0)
        server.socket.close(linger=0)
        ctx.term()
