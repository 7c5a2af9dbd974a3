"""Separate hosts for real: the buffer, the learner and a generator each in its own network
namespace with its own non-loopback address, started with the commands docs/cluster.md gives
(the run's CurveZMQ keys on every link, the weight-sync store's included, on the learner's
address), train a few steps; a client in a fourth namespace without the keys gets nothing from
the buffer nor from the weight-sync store."""

import json
import signal
import subprocess
import sys

import pytest
import yaml
from netns import Hosts, can_make_namespaces
from testutil import TRAIN_FAST

BUFFER_PORT, WSYNC_PORT = 5555, 29555
NUM_STEPS = 3

# Waits until both ports accept TCP connections from its namespace (so "no answer" means
# refused, not "not up yet"), then asks each role as a client without the run's keys would.
STRANGER = """
import socket, sys, time, zmq
from dapo_async import protocol as P, transport as T
from dapo_async.weight_sync.store import RemoteStore, StoreError
buffer_ep, wsync_ep = sys.argv[1], sys.argv[2]
for ep in (buffer_ep.removeprefix("tcp://"), wsync_ep):
    host, port = ep.rsplit(":", 1)
    deadline = time.time() + 300
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            assert time.time() < deadline, f"{ep} never listened"
            time.sleep(0.5)
ctx = zmq.Context()
sock = T.connect_client(ctx, zmq.DEALER, buffer_ep)
try:
    T.request(sock, P.Hello("stranger", 1, "hf"), timeout_s=5)
    print("buffer ANSWERED")
except T.RecvTimeout:
    print("buffer NO ANSWER")
sock.close(linger=0)
store = RemoteStore(wsync_ep, None, timeout_s=5)
try:
    store.check(["latest"])
    print("wsync ANSWERED")
except StoreError:
    print("wsync NO ANSWER")
store.close()
"""


def write_config(tmp_path, tiny_model, repo):
    cfg = yaml.safe_load((repo / "configs" / "tiny_cpu.yaml").read_text())
    cfg.update(name="hosts", run_dir=str(tmp_path / "run"))
    cfg["model"]["path"] = str(tiny_model)
    for item in [*TRAIN_FAST, f"learner.num_steps={NUM_STEPS}"]:
        key, val = item.split("=")
        sec, k = key.split(".")
        cfg.setdefault(sec, {})[k] = yaml.safe_load(val)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_three_hosts_train_with_authentication_on_every_link(tiny_model, tmp_path, repo, cli_env):
    why = can_make_namespaces()
    if why:
        pytest.skip(why)
    cfg = write_config(tmp_path, tiny_model, repo)
    keys = tmp_path / "keys"
    cli = [sys.executable, "-m", "dapo_async.cli"]
    subprocess.run([*cli, "keys", "--out", str(keys)], check=True, cwd=repo, env=cli_env,
                   capture_output=True)  # fmt: skip
    hosts = Hosts(["buffer", "learner", "gen", "stranger"])
    a = hosts.addr
    buffer_ep = f"tcp://{a['buffer']}:{BUFFER_PORT}"
    wsync_ep = f"{a['learner']}:{WSYNC_PORT}"
    # no weight_sync.allow_unauthenticated_network: the store is authenticated with the keys
    common = [f"launch.curve_keys_dir={keys}"]
    env = {**cli_env, "GLOO_SOCKET_IFNAME": "eth0"}
    logs = {n: open(tmp_path / f"{n}.log", "w") for n in ("buffer", "learner", "gen")}
    procs = {}

    def start(host, argv):
        procs[host] = subprocess.Popen(hosts.cmd(host, argv), cwd=repo, env=env,
                                       stdout=logs[host], stderr=subprocess.STDOUT)  # fmt: skip

    try:
        start("buffer", [*cli, "buffer", str(cfg), f"launch.host={a['buffer']}",
                         f"buffer.port={BUFFER_PORT}", *common])  # fmt: skip
        start("learner", [*cli, "learner", str(cfg), f"launch.buffer_endpoint={buffer_ep}",
                          f"launch.host={a['learner']}", f"weight_sync.port={WSYNC_PORT}",
                          *common])  # fmt: skip
        start("gen", [*cli, "generator", str(cfg), f"launch.buffer_endpoint={buffer_ep}",
                      f"weight_sync.endpoint={wsync_ep}", *common])  # fmt: skip
        stranger = subprocess.run(
            hosts.cmd("stranger", [sys.executable, "-c", STRANGER, buffer_ep, wsync_ep]),
            cwd=repo, env=env, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert procs["learner"].wait(timeout=600) == 0, (tmp_path / "learner.log").read_text()[
            -3000:
        ]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        hosts.close()
    assert stranger.stdout.split("\n")[:2] == ["buffer NO ANSWER", "wsync NO ANSWER"], (
        stranger.stdout + stranger.stderr[-2000:]
    )
    run = tmp_path / "run"
    rows = [json.loads(x) for x in (run / "metrics" / "learner.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rollout/reward_mean" in r] == list(range(1, NUM_STEPS + 1))
    gen_rows = [json.loads(x) for p in (run / "metrics").glob("gen*.jsonl") for x in p.open()]
    assert max(r.get("generator/version", -1) for r in gen_rows) >= 1  # weights over the link
    assert a["buffer"] in (run / "endpoints" / "buffer").read_text()
