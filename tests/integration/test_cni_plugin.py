"""The real ``ambit-cni`` plugin, exec'd as a runtime does, against the embedded API server and a fake node agent."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ambit.apiserver.server import ApiServer
from ambit.cni.installer import write_kubeconfig
from ambit.k8s import KubeClient, kinds

MODE = "istio.io/dataplane-mode"
PREV = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/pod"}],
    "ips": [{"interface": 0, "address": "198.18.1.7/24", "gateway": "198.18.1.1"}],
}


class FakeAgent:
    """An aiohttp server on a UNIX socket that records ``/cmdadd`` bodies and answers ``status``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self.status = 200

    async def cmdadd(self, request: web.Request) -> web.Response:
        self.events.append(await request.json())
        return web.Response(status=self.status, text="ok" if self.status == 200 else "ztunnel not connected")


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[FakeAgent]:
    fake = FakeAgent(tmp_path / "pluginevent.sock")
    app = web.Application()
    app.router.add_post("/cmdadd", fake.cmdadd)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(fake.path)).start()
    try:
        yield fake
    finally:
        await runner.cleanup()


@pytest.fixture
async def kubeconfig(apiserver: ApiServer, tmp_path: Path) -> AsyncIterator[Path]:
    """The plugin's JSON kubeconfig as the installer writes it, plus the test's namespaces and pods."""
    path = tmp_path / "istio-cni-kubeconfig"
    ca = (apiserver.settings.data_dir / "pki" / "ca.crt").read_bytes()
    write_kubeconfig(path, apiserver.url, ca, apiserver.admin_token)
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as kube:
        privileged = {"pod-security.kubernetes.io/enforce": "privileged"}  # "mesh" holds a hostNetwork pod
        for ns, labels in (
            ("mesh", {MODE: "ambient", **privileged}),
            ("plain", {}),
            ("kube-system", {MODE: "ambient"}),
        ):
            if ns != "kube-system":
                await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns, "labels": labels}})
        for ns, name, labels, host in (
            ("mesh", "web", {}, False),
            ("mesh", "host", {}, True),
            ("mesh", "optout", {MODE: "none"}, False),
            ("plain", "solo", {MODE: "ambient"}, False),
            ("plain", "other", {}, False),
        ):
            spec = {"containers": [{"name": "c", "image": "busybox"}], "hostNetwork": host}
            await kube.create(kinds.PODS, {"metadata": {"name": name, "labels": labels}, "spec": spec}, ns)
    yield path


def network_config(kubeconfig: Path, agent_socket: Path) -> bytes:
    conf = {
        "cniVersion": "1.0.0",
        "name": "ambit-lab",
        "type": "ambit-cni",
        "kubeconfig": str(kubeconfig),
        "agent_socket": str(agent_socket),
        "exclude_namespaces": ["kube-system"],
        "ambient_enabled": True,
        "prevResult": PREV,
    }
    return json.dumps(conf).encode()


def cni_env(command: str = "ADD", namespace: str = "mesh", name: str = "web") -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "0123abcd",
        "CNI_NETNS": "/var/run/netns/pod",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=x",
    }


async def exec_plugin(env: dict[str, str], stdin: bytes) -> tuple[dict[str, Any] | None, int, str]:
    """Run the plugin as a runtime does; returns (parsed stdout or None, exit status, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-m",
        "ambit.cni.plugin",
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return (json.loads(out) if out.strip() else None), proc.returncode, err.decode()


async def test_an_ambient_pod_is_posted_to_the_agent_and_prev_result_echoed(kubeconfig: Path, agent: FakeAgent) -> None:
    result, status, err = await exec_plugin(cni_env(), network_config(kubeconfig, agent.path))
    assert (result, status, err) == (PREV, 0, "")
    assert len(agent.events) == 1
    event = agent.events[0]
    assert event["netns"] == "/var/run/netns/pod"
    assert (event["podName"], event["podNamespace"]) == ("web", "mesh")
    assert event["podUid"]  # from the Pod object: CNI_ARGS had no K8S_POD_UID
    assert event["ips"] == [{"interface": 0, "address": "198.18.1.7/24", "gateway": "198.18.1.1"}]


async def test_a_pod_labelled_ambient_in_a_plain_namespace_is_posted(kubeconfig: Path, agent: FakeAgent) -> None:
    result, status, _ = await exec_plugin(
        cni_env(namespace="plain", name="solo"), network_config(kubeconfig, agent.path)
    )
    assert (result, status) == (PREV, 0)
    assert [e["podName"] for e in agent.events] == ["solo"]


@pytest.mark.parametrize(
    ("namespace", "name"),
    [("plain", "other"), ("mesh", "host"), ("mesh", "optout"), ("kube-system", "coredns")],
)
async def test_pods_that_are_not_ambient_are_passed_through(
    kubeconfig: Path, agent: FakeAgent, namespace: str, name: str
) -> None:
    result, status, err = await exec_plugin(
        cni_env(namespace=namespace, name=name), network_config(kubeconfig, agent.path)
    )
    assert (result, status, err) == (PREV, 0, "")
    assert agent.events == []


async def test_an_agent_error_fails_the_add(kubeconfig: Path, agent: FakeAgent) -> None:
    agent.status = 500
    result, status, err = await exec_plugin(cni_env(), network_config(kubeconfig, agent.path))
    assert status == 1 and result is not None and err == ""
    assert result["code"] == 11 and "500" in result["msg"] and result["details"] == "ztunnel not connected"
    assert len(agent.events) == 1


async def test_a_missing_agent_socket_fails_the_add(kubeconfig: Path, tmp_path: Path) -> None:
    result, status, err = await exec_plugin(cni_env(), network_config(kubeconfig, tmp_path / "absent.sock"))
    assert status == 1 and result is not None and err == ""
    assert result["code"] == 11 and "failed to contact the node agent" in result["msg"]


async def test_a_missing_pod_fails_the_add(kubeconfig: Path, agent: FakeAgent) -> None:
    result, status, _ = await exec_plugin(cni_env(name="ghost"), network_config(kubeconfig, agent.path))
    assert status == 1 and result is not None and result["code"] == 11 and "404" in result["details"]
    assert agent.events == []


@pytest.mark.parametrize(
    ("env_change", "stdin", "code"),
    [
        ({}, b"{definitely not json", 6),
        ({"CNI_COMMAND": "FROB"}, None, 4),
        ({"CNI_NETNS": ""}, None, 4),
        ({"CNI_COMMAND": ""}, None, 4),
    ],
)
async def test_bad_invocations_print_a_cni_error_and_no_traceback(
    kubeconfig: Path, agent: FakeAgent, env_change: dict[str, str], stdin: bytes | None, code: int
) -> None:
    env = {k: v for k, v in {**cni_env(), **env_change}.items() if v}
    result, status, err = await exec_plugin(env, stdin if stdin is not None else network_config(kubeconfig, agent.path))
    assert status == 1 and result is not None and result["code"] == code and result["msg"]
    assert "Traceback" not in err and err == ""
    assert agent.events == []


@pytest.mark.parametrize("command", ["DEL", "CHECK"])
async def test_del_and_check_succeed_without_output(kubeconfig: Path, agent: FakeAgent, command: str) -> None:
    result, status, err = await exec_plugin(cni_env(command), network_config(kubeconfig, agent.path))
    assert (result, status, err) == (None, 0, "")
    assert agent.events == []


async def test_version_starts_fast() -> None:
    """VERSION is the cheapest call, so its wall time is the plugin's start-up; printed for the record."""
    timings = []
    for _ in range(10):
        started = time.perf_counter()
        result, status, _ = await exec_plugin({"CNI_COMMAND": "VERSION"}, b"")
        timings.append(time.perf_counter() - started)
        assert status == 0 and result == {
            "cniVersion": "1.0.0",
            "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"],
        }
    median = statistics.median(timings)
    print(f"ambit-cni VERSION median wall time: {median * 1000:.1f} ms")
    assert median < 1.0  # generous: a regression to heavy imports shows up in the printed figure first
