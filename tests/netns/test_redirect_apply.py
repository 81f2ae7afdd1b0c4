"""Redirection rules on a real namespace: idempotent apply, clean removal, and where connections really land.

Each test makes its own pair of namespaces, ``rdt<hex>-pod`` and ``rdt<hex>-peer``, joined by a veth pair
(198.18.250.1/24 in the pod, 198.18.250.9/24 in the peer), and deletes them in the fixture's finalizer.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ambit.commands import SubprocessRunner
from ambit.redirect import InPodSettings
from ambit.redirect.apply import Backend, apply_inpod, remove_inpod
from ambit.redirect.nftables import render_inpod_nft

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]

POD_IP = "198.18.250.1"
PEER_IP = "198.18.250.9"
PYTHON = [sys.executable, "-I", "-S"]
# Listens on every port given; answers each connection with "<listening port> <original destination>".
SERVER = """
import socket, struct, sys, threading
def serve(s, port):
    while True:
        c, _ = s.accept()
        try:
            raw = c.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST
            dst = f"{socket.inet_ntoa(raw[4:8])}:{struct.unpack('!H', raw[2:4])[0]}"
        except OSError:
            dst = "none"
        c.sendall(f"{port} {dst}".encode())
        c.close()
for port in map(int, sys.argv[1:]):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(16)
    threading.Thread(target=serve, args=(s, port), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""
CLIENT = """
import socket, sys
s = socket.socket()
if int(sys.argv[3]):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, int(sys.argv[3]))
s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print(s.recv(100).decode())
except OSError as exc:
    print(f"error {exc!r}")
"""


@dataclass(frozen=True)
class Pair:
    pod: str
    peer: str


def sh(*argv: str, stdin: str | None = None) -> str:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def pair() -> Iterator[Pair]:
    prefix = f"rdt{secrets.token_hex(2)}"
    names = Pair(f"{prefix}-pod", f"{prefix}-peer")
    try:
        for ns in (names.pod, names.peer):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", names.pod, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", names.peer)
        for ns, ip in ((names.pod, POD_IP), (names.peer, PEER_IP)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        yield names
    finally:
        for ns in (names.pod, names.peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        assert prefix not in sh("ip", "netns", "list")


def routing(ns: str) -> tuple[str, str]:
    return sh("ip", "-n", ns, "rule", "show", "priority", "32764"), sh("ip", "-n", ns, "route", "show", "table", "100")


def iptables_state(ns: str) -> str:
    text = sh("ip", "netns", "exec", ns, "iptables-save")
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def section(saved: str, table: str) -> str:
    """One table's block of ``iptables-save`` output ("" when absent)."""
    _, found, rest = saved.partition(f"*{table}\n")
    return rest.partition("COMMIT")[0] if found else ""


def test_nft_rules_apply_twice_to_the_same_ruleset_and_remove_cleanly(pair: Pair) -> None:
    runner, settings = SubprocessRunner(), InPodSettings()
    sh("ip", "netns", "exec", pair.pod, "nft", "-c", "-f", "-", stdin=render_inpod_nft(settings))
    apply_inpod(pair.pod, settings, "nftables", runner)
    first = sh("ip", "netns", "exec", pair.pod, "nft", "list", "ruleset")
    apply_inpod(pair.pod, settings, "nftables", runner)
    assert sh("ip", "netns", "exec", pair.pod, "nft", "list", "ruleset") == first
    assert "istio-ambient-raw" in first
    rule, route = routing(pair.pod)
    assert "fwmark 0x111/0xfff lookup 100" in rule
    assert "local default dev lo" in route

    apply_inpod(pair.pod, InPodSettings(dns_capture=False), "nftables", runner)
    assert "istio-ambient-raw" not in sh("ip", "netns", "exec", pair.pod, "nft", "list", "ruleset")

    remove_inpod(pair.pod, settings, "nftables", runner)
    remove_inpod(pair.pod, settings, "nftables", runner)
    assert sh("ip", "netns", "exec", pair.pod, "nft", "list", "ruleset") == ""
    assert routing(pair.pod) == ("", "")


def test_iptables_rules_apply_twice_to_the_same_state_and_remove_cleanly(pair: Pair) -> None:
    runner, settings = SubprocessRunner(), InPodSettings(reroute_interfaces=("eth1",))
    apply_inpod(pair.pod, settings, "iptables", runner)
    first = iptables_state(pair.pod)
    apply_inpod(pair.pod, settings, "iptables", runner)
    assert iptables_state(pair.pod) == first
    assert first.count("-A PREROUTING -j ISTIO_PRERT") == 3  # mangle, nat, raw
    assert "fwmark 0x111/0xfff lookup 100" in routing(pair.pod)[0]

    apply_inpod(pair.pod, InPodSettings(), "iptables", runner)
    assert "eth1" not in iptables_state(pair.pod)
    apply_inpod(pair.pod, InPodSettings(dns_capture=False), "iptables", runner)
    assert "ISTIO" not in section(iptables_state(pair.pod), "raw")

    remove_inpod(pair.pod, settings, "iptables", runner)
    remove_inpod(pair.pod, settings, "iptables", runner)
    left = iptables_state(pair.pod)
    # iptables-nft leaves the built-in tables and chains behind, empty.
    assert "ISTIO" not in left
    assert "-A " not in left
    assert routing(pair.pod) == ("", "")


def connect(ns: str, host: str, port: int, mark: int = 0) -> str:
    argv = ["ip", "netns", "exec", ns, *PYTHON, "-c", CLIENT, host, str(port), str(mark)]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=10).stdout.strip()


@pytest.fixture
def servers(pair: Pair) -> Iterator[Pair]:
    """The proxy's ports listening in the pod (unmarked sockets), and port 80 in the peer."""
    procs = [
        subprocess.Popen(
            ["ip", "netns", "exec", ns, *PYTHON, "-c", SERVER, *ports],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for ns, ports in ((pair.pod, ["15001", "15006", "15008"]), (pair.peer, ["80"]))
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        yield pair
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()  # reaps it and closes its pipes


@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_connections_land_where_the_rules_send_them(servers: Pair, backend: Backend) -> None:
    pair = servers
    assert connect(pair.pod, PEER_IP, 80).startswith("80 ")  # no rules yet: straight to the peer
    apply_inpod(pair.pod, InPodSettings(), backend, SubprocessRunner())
    time.sleep(0.05)

    assert connect(pair.pod, PEER_IP, 80) == f"15001 {PEER_IP}:80"
    assert connect(pair.pod, "198.18.250.77", 443) == "15001 198.18.250.77:443"
    assert connect(pair.pod, PEER_IP, 80, mark=0x539).startswith("80 ")  # the proxy's own sockets pass
    assert connect(pair.peer, POD_IP, 8080) == f"15006 {POD_IP}:8080"
    assert connect(pair.peer, POD_IP, 15008).startswith("15008 ")  # HBONE lands on its listener as it is

    remove_inpod(pair.pod, InPodSettings(), backend, SubprocessRunner())
    assert connect(pair.pod, PEER_IP, 80).startswith("80 ")
