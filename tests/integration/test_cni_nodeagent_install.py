"""``run_node_agent`` (what ``ambit nodeagent`` runs) in this process, against the embedded API server.

The node's CNI directories are temporary directories; rule commands go to a recording runner (no root, nothing
applied to this machine). Checked: the installer's watch repairs a conflist that lost our entry and a deleted
plugin binary within a couple of seconds; ``--uninstall`` removes the plugin when the agent stops on SIGTERM, a
plain stop leaves it installed; and an enrolment that fails leaves an events.k8s.io Event on the pod that says
what to do.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ambit.apiserver.server import ApiServer
from ambit.cni.addcheck import Inode, NetnsFacts
from ambit.cni.daemon import PLUGIN_EVENT_SOCKET, run_node_agent
from ambit.cni.installer import BINARY_NAME, write_kubeconfig
from ambit.commands import RecordingRunner
from ambit.k8s import KubeClient, kinds

NODE = "node-1"
PRIMARY = {
    "cniVersion": "1.0.0",
    "name": "ambit-lab",
    "plugins": [
        {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "198.18.200.0/24"}},
        {"type": "loopback"},
    ],
}
PRIMARY_NAME = "10-ambit-lab.conflist"
REPAIR_WITHIN = 2.5
"""Seconds: "within a couple of seconds" (the watcher polls every 0.5 s)."""


@dataclass
class Node:
    conf_dir: Path
    bin_dir: Path
    run_dir: Path
    kubeconfig: Path

    @property
    def conflist(self) -> Path:
        return self.conf_dir / PRIMARY_NAME

    @property
    def binary(self) -> Path:
        return self.bin_dir / BINARY_NAME

    def plugin_types(self) -> list[str]:
        return [str(p.get("type")) for p in json.loads(self.conflist.read_text())["plugins"]]


@pytest.fixture
def node(apiserver: ApiServer) -> Iterator[Node]:
    # Short paths: the agent's UNIX sockets live in run_dir (a socket path is limited to 108 bytes).
    with tempfile.TemporaryDirectory(prefix="nodeagent", dir="/tmp") as directory:
        base = Path(directory)
        conf_dir, bin_dir = base / "net.d", base / "bin"
        conf_dir.mkdir()
        (conf_dir / PRIMARY_NAME).write_text(json.dumps(PRIMARY, indent=2))
        kubeconfig = base / "kubeconfig"
        ca = (apiserver.settings.data_dir / "pki" / "ca.crt").read_bytes()
        write_kubeconfig(kubeconfig, apiserver.url, ca, apiserver.admin_token)
        yield Node(conf_dir, bin_dir, base / "run", kubeconfig)


@pytest.fixture
async def agent(node: Node) -> AsyncIterator[asyncio.Task[None]]:
    """The node agent running (installed, serving /cmdadd); cancelled (a plain stop) afterwards if still running."""
    task = await start_agent(node)
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class SandboxesOnly:
    """The kernel as the /cmdadd checks ask it: each ``/run/netns/pod-*`` path is a sandbox namespace of its own."""

    def inspect(self, path: str) -> NetnsFacts | None:
        if path.startswith("/run/netns/pod-"):
            return NetnsFacts(path, True, (4, hash(path)))
        return None

    def forbidden(self) -> frozenset[Inode]:
        return frozenset()


async def start_agent(node: Node, *, uninstall: bool = False) -> asyncio.Task[None]:
    task = asyncio.create_task(
        run_node_agent(
            node.kubeconfig,
            NODE,
            cni_conf_dir=node.conf_dir,
            cni_bin_dir=node.bin_dir,
            run_dir=node.run_dir,
            netns_for=lambda pod: None,
            uninstall=uninstall,
            runner=RecordingRunner(),
            netns_probe=SandboxesOnly(),
        )
    )
    await until("the agent serving /cmdadd", (node.run_dir / PLUGIN_EVENT_SOCKET).exists, task=task)
    return task


async def until(what: str, predicate: Callable[[], bool], *, within: float = 10.0, task: Any = None) -> float:
    """Poll ``predicate`` every 50 ms; the seconds it took. Fails with ``what`` after ``within`` seconds."""
    began = time.monotonic()
    while not predicate():
        if task is not None and task.done():
            task.result()  # the agent failed: show why
            pytest.fail(f"the agent stopped before {what}")
        if time.monotonic() - began > within:
            pytest.fail(f"not within {within:g} s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - began


async def test_the_agent_installs_the_plugin_last_in_the_conflist_and_in_the_bin_dir(
    node: Node, agent: asyncio.Task[None]
) -> None:
    assert node.plugin_types() == ["bridge", "loopback", "ambit-cni"]
    assert node.binary.is_file() and os.access(node.binary, os.X_OK)
    entry = json.loads(node.conflist.read_text())["plugins"][-1]
    assert entry["agent_socket"] == str(node.run_dir / PLUGIN_EVENT_SOCKET)


async def test_a_conflist_that_lost_the_plugin_entry_is_repaired_within_seconds(
    node: Node, agent: asyncio.Task[None]
) -> None:
    node.conflist.write_text(json.dumps(PRIMARY, indent=2))  # as a primary CNI rewriting its file would
    took = await until(
        "ambit-cni back in the conflist",
        lambda: node.plugin_types() == ["bridge", "loopback", "ambit-cni"],
        within=REPAIR_WITHIN,
        task=agent,
    )
    assert took < REPAIR_WITHIN


async def test_a_deleted_plugin_binary_is_put_back_within_seconds(node: Node, agent: asyncio.Task[None]) -> None:
    wanted = node.binary.read_bytes()
    node.binary.unlink()
    await until("the plugin binary back", node.binary.is_file, within=REPAIR_WITHIN, task=agent)
    assert node.binary.read_bytes() == wanted and os.access(node.binary, os.X_OK)


async def test_a_plain_stop_leaves_the_plugin_installed(node: Node) -> None:
    task = await start_agent(node)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert node.plugin_types()[-1] == "ambit-cni" and node.binary.is_file()


async def test_the_agent_with_uninstall_removes_the_plugin_when_sigterm_stops_it(node: Node) -> None:
    before = signal.getsignal(signal.SIGTERM)
    task = await start_agent(node, uninstall=True)
    # Signal only once the agent's own handler is in place (else SIGTERM would end pytest).
    await until("the agent's SIGTERM handler", lambda: signal.getsignal(signal.SIGTERM) != before, task=task)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(task, timeout=10)
    assert node.plugin_types() == ["bridge", "loopback"]
    assert not node.binary.exists()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "the agent leaves no handler behind"


async def test_a_pod_whose_enrolment_fails_gets_an_event_that_says_what_to_do(
    apiserver: ApiServer, node: Node, agent: asyncio.Task[None]
) -> None:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as kube:
        labels = {"istio.io/dataplane-mode": "ambient"}
        await kube.create(kinds.NAMESPACES, {"metadata": {"name": "apps", "labels": labels}})
        annotations = {"ambient.istio.io/bypass-inbound-capture": "maybe"}
        spec = {"nodeName": NODE, "containers": [{"name": "c", "image": "none"}]}
        pod = await kube.create(
            kinds.PODS, {"metadata": {"name": "web", "annotations": annotations}, "spec": spec}, "apps"
        )
        event = {
            "netns": "/run/netns/pod-web",
            "podName": "web",
            "podNamespace": "apps",
            "podUid": pod["metadata"]["uid"],
            "ips": [{"interface": 0, "address": "198.18.200.5/24", "gateway": "198.18.200.1"}],
        }
        status, text = await post_cmdadd(node.run_dir / PLUGIN_EVENT_SOCKET, event)
        assert status == 500 and "bypass-inbound-capture" in text, (status, text)

        async def warnings() -> list[dict[str, Any]]:
            items, _ = await kube.list(kinds.EVENTS, "apps")
            return [e for e in items if e["regarding"]["name"] == "web" and e["type"] == "Warning"]

        found: list[dict[str, Any]] = []
        for _ in range(100):  # the recorder sends Events in the background
            if found := await warnings():
                break
            await asyncio.sleep(0.1)
        assert found, "no Warning Event on the pod within 10 s"
        warning = found[0]
        assert warning["reason"] == "AmbientRedirectionFailed"
        assert warning["regarding"]["uid"] == pod["metadata"]["uid"]
        assert warning["reportingController"] == "ambit.dev/node-agent"
        assert warning["reportingInstance"] == NODE
        assert warning["action"] == "Enrol"
        note = warning["note"]
        assert "ambient.istio.io/bypass-inbound-capture" in note and "'maybe'" in note, note
        assert "Fix the pod's ambient annotations" in note and NODE in note, note
        current = await kube.get(kinds.PODS, "web", "apps")
        assert "ambient.istio.io/redirection" not in (current["metadata"].get("annotations") or {})


async def post_cmdadd(socket_path: Path, event: dict[str, Any]) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket_path))) as session,
        session.post("http://localhost/cmdadd", json=event) as response,
    ):
        return response.status, await response.text()


async def test_in_a_pod_the_agent_uses_its_service_account_and_reports_readiness(
    apiserver: ApiServer, node: Node
) -> None:
    """The istio-cni-node DaemonSet's way: no kubeconfig (the pod's service account and the API server from the
    environment), the ZDS socket where the node proxy's pod mounts it, and /readyz 503 until it serves."""
    from tests.harness import free_port

    from ambit.cni.daemon import PLUGIN_KUBECONFIG, InCluster
    from ambit.zds import ZDS_SOCKET

    account = node.run_dir.parent / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(apiserver.admin_token)
    (account / "ca.crt").write_bytes((apiserver.settings.data_dir / "pki" / "ca.crt").read_bytes())
    (account / "namespace").write_text("istio-system")
    host, port = apiserver.url.removeprefix("https://").rsplit(":", 1)
    environ = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    zds_socket = node.run_dir.parent / "ztunnel" / ZDS_SOCKET
    ready = free_port()
    task = asyncio.create_task(
        run_node_agent(
            None,
            NODE,
            cni_conf_dir=node.conf_dir,
            cni_bin_dir=node.bin_dir,
            run_dir=node.run_dir,
            netns_for=lambda pod: None,
            runner=RecordingRunner(),
            netns_probe=SandboxesOnly(),
            zds_socket=zds_socket,
            ready_address=("127.0.0.1", ready),
            in_cluster=InCluster(environ, account),
        )
    )
    try:
        async with aiohttp.ClientSession() as http:

            async def readyz() -> int:
                try:
                    async with http.get(f"http://127.0.0.1:{ready}/readyz") as reply:
                        return reply.status
                except aiohttp.ClientError:
                    return 0

            await until("the agent serving ZDS", zds_socket.exists, task=task)
            deadline = time.monotonic() + 10
            while await readyz() != 200:
                assert time.monotonic() < deadline, "/readyz never became 200"
                await asyncio.sleep(0.05)
        plugin_kubeconfig = (node.run_dir / PLUGIN_KUBECONFIG).read_text()
        assert f"https://{host}:{port}" in plugin_kubeconfig and apiserver.admin_token in plugin_kubeconfig
        assert BINARY_NAME in os.listdir(node.bin_dir)
        # A node that lost the plugin's kubeconfig (istio's TestCNIRestartsWithMissingKubeConfig deletes it) gets
        # it back from the running agent, the same, within a few seconds.
        (node.run_dir / PLUGIN_KUBECONFIG).unlink()
        await until("the plugin's kubeconfig written again", (node.run_dir / PLUGIN_KUBECONFIG).exists, task=task)
        assert (node.run_dir / PLUGIN_KUBECONFIG).read_text() == plugin_kubeconfig
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
