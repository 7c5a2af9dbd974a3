"""Separate hosts on one machine: network namespaces joined by veth links to a bridge, each with
its own non-loopback address (``ip netns`` / ``ip link``, root only)."""

import os
import shutil
import subprocess

SUBNET = "10.77.{}.{}"


def can_make_namespaces() -> str:
    """'' when namespaces can be made here, else why not."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"dapo_probe_{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return f"cannot create a network namespace: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


class Hosts:
    """``names`` as namespaces on a private bridge: ``addr[name]`` is each one's address;
    ``cmd(name, argv)`` runs argv inside it."""

    def __init__(self, names: list[str]):
        tag = os.getpid() % 10000
        self.bridge = f"dapobr{tag}"
        self.ns = {n: f"dapo_{n}_{tag}" for n in names}
        net = tag % 250 + 1
        self.addr = {n: SUBNET.format(net, i + 1) for i, n in enumerate(names)}
        self._run("ip", "link", "add", self.bridge, "type", "bridge")
        self._run("ip", "link", "set", self.bridge, "up")
        for i, n in enumerate(names):
            ns, host_end = self.ns[n], f"dv{tag}_{i}"
            self._run("ip", "netns", "add", ns)
            self._run("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0",
                      "netns", ns)  # fmt: skip
            self._run("ip", "link", "set", host_end, "master", self.bridge)
            self._run("ip", "link", "set", host_end, "up")
            self._run("ip", "-n", ns, "addr", "add", f"{self.addr[n]}/24", "dev", "eth0")
            self._run("ip", "-n", ns, "link", "set", "eth0", "up")
            self._run("ip", "-n", ns, "link", "set", "lo", "up")

    @staticmethod
    def _run(*argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, text=True)

    def cmd(self, name: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[name], *argv]

    def close(self) -> None:
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
