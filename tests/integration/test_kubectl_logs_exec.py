"""``kubectl logs`` and ``kubectl exec``: the real kubectl against the embedded API server, which proxies
``pods/log`` and ``pods/exec`` to a kubelet server on a unix socket (:mod:`ambit.lab.runtime.kubelet_server`) whose
pods are a table the test writes and whose containers are local processes."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import ssl
import struct
import sys
import termios
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from tests.integration.kubelet_fakes import FakePods, short_directory
from tests.integration.lab_cluster import kubectl

from ambit.apiserver.limits import LimitSettings
from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.k8s import KubeClient, kinds
from ambit.k8s.remotecommand import PROTOCOLS, V5, Channel, frame, parse_frame
from ambit.lab.runtime.kubelet_server import KubeletServer, TerminalProcess
from ambit.lab.runtime.terminal import Terminal

pytestmark = pytest.mark.kubectl

STREAM_LIMIT = 3
"""Open pod streams a user other than an admin may hold in these tests."""


class LocalExec:
    """Runs the command as a local process (the container is the test's own machine)."""

    async def start(
        self, pod_uid: str, container: str, argv: Sequence[str], *, stdin: bool, merge_stderr: bool
    ) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
        )

    async def start_tty(self, pod_uid: str, container: str, argv: Sequence[str]) -> TerminalProcess:
        master, slave = os.openpty()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
            )
        finally:
            os.close(slave)
        return TerminalProcess(proc, Terminal(master))


@dataclass
class Rig:
    kube: KubeClient
    config: Path
    pods: FakePods
    logs: Path
    server: ApiServer

    def log_file(self, uid: str, container: str) -> Path:
        return self.logs / uid / f"{container}.log"

    async def pod(
        self, name: str, containers: Sequence[str] = ("main",), node: str = "node-a", **meta: Any
    ) -> dict[str, Any]:
        """A running pod of ``node``, known to the fake kubelet when it is node-a's."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", **meta},
            "spec": {
                "nodeName": node,
                "containers": [{"name": c, "image": "registry.example/x:1"} for c in containers],
            },
        }
        pod = await self.kube.create(kinds.PODS, body, "default")
        running = [
            {"name": c, "ready": True, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}} for c in containers
        ]
        status = {"phase": "Running", "containerStatuses": running}
        pod = await self.kube.patch_status(kinds.PODS, name, {"status": status}, "default")
        if node == "node-a":
            self.pods.pods[("default", name)] = pod
        return pod

    def finish(self, name: str) -> None:
        pod = self.pods.pods[("default", name)]
        for cs in pod["status"]["containerStatuses"]:
            cs["state"] = {"terminated": {"exitCode": 0}}


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with short_directory("kl") as path:
        yield path


@pytest.fixture
async def rig(tmp_path: Path, socket_dir: Path) -> AsyncIterator[Rig]:
    server = ApiServer(
        ApiServerSettings(
            data_dir=tmp_path / "apiserver",
            port=0,
            kubelet_socket_dir=socket_dir,
            limits=LimitSettings(max_pod_streams_per_user=STREAM_LIMIT),
        )
    )
    await server.start()
    pods = FakePods()
    logs = tmp_path / "logs"
    kubelet = KubeletServer(pods, LocalExec(), lambda uid, c: logs / uid / f"{c}.log", poll_interval=0.05)
    await kubelet.serve(socket_dir / "node-a" / "kubelet.sock")
    try:
        async with KubeClient.from_kubeconfig(server.kubeconfig) as kube:
            yield Rig(kube, server.kubeconfig, pods, logs, server)
    finally:
        await kubelet.aclose()
        await server.aclose()


def write_log(rig: Rig, pod: dict[str, Any], container: str, text: str) -> None:
    path = rig.log_file(pod["metadata"]["uid"], container)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(text)


async def run_kubectl(config: Path, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    env = dict(os.environ, KUBECONFIG=str(config), KUBECACHEDIR=str(config.parent / "kubecache"))
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# -- logs ---------------------------------------------------------------------------------------------------------
async def test_kubectl_logs_prints_the_containers_output_and_its_tail(rig: Rig) -> None:
    pod = await rig.pod("p")
    write_log(rig, pod, "main", "one\ntwo\nthree\n")
    assert await kubectl(rig.config, "logs", "p") == "one\ntwo\nthree\n"
    assert await kubectl(rig.config, "logs", "p", "--tail=1") == "three\n"
    assert await kubectl(rig.config, "logs", "p", "--limit-bytes=5") == "one\nt"


async def test_kubectl_logs_follow_streams_appended_output_until_the_container_finishes(rig: Rig) -> None:
    pod = await rig.pod("p")
    write_log(rig, pod, "main", "first\n")
    follow = asyncio.create_task(run_kubectl(rig.config, "logs", "-f", "p"))
    await asyncio.sleep(1.0)
    write_log(rig, pod, "main", "second\n")
    await asyncio.sleep(0.5)
    assert not follow.done()
    rig.finish("p")
    code, out, err = await asyncio.wait_for(follow, 30)
    assert (code, out) == (0, "first\nsecond\n"), err


async def test_kubectl_logs_of_a_pod_with_two_containers_needs_a_name_or_the_default_annotation(rig: Rig) -> None:
    await rig.pod("two", containers=("a", "b"))
    pod = await rig.pod(
        "annotated", containers=("a", "b"), annotations={"kubectl.kubernetes.io/default-container": "b"}
    )
    write_log(rig, pod, "b", "from b\n")
    assert await kubectl(rig.config, "logs", "annotated") == "from b\n"
    assert await kubectl(rig.config, "logs", "two", "-c", "a") == ""
    code, _, err = await run_kubectl(rig.config, "get", "--raw", "/api/v1/namespaces/default/pods/two/log")
    assert code != 0
    assert "a container name must be specified for pod two, choose one of: [a b]" in err


async def test_kubectl_logs_and_exec_reach_a_running_init_container_by_name(rig: Rig) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "init", "namespace": "default"},
        "spec": {
            "nodeName": "node-a",
            "initContainers": [{"name": "setup", "image": "registry.example/x:1"}],
            "containers": [{"name": "main", "image": "registry.example/x:1"}],
        },
    }
    await rig.kube.create(kinds.PODS, body, "default")
    status = {
        "phase": "Pending",
        "initContainerStatuses": [
            {"name": "setup", "ready": False, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
        ],
        "containerStatuses": [{"name": "main", "ready": False, "state": {"waiting": {"reason": "PodInitializing"}}}],
    }
    pod = await rig.kube.patch_status(kinds.PODS, "init", {"status": status}, "default")
    rig.pods.pods[("default", "init")] = pod
    write_log(rig, pod, "setup", "preparing\n")
    assert await kubectl(rig.config, "logs", "init", "-c", "setup") == "preparing\n"
    code, out, err = await run_kubectl(rig.config, "exec", "init", "-c", "setup", "--", "echo", "inside")
    assert (code, out) == (0, "inside\n"), err


async def test_kubectl_logs_refuses_previous_timestamps_and_a_negative_tail_with_kubes_codes(rig: Rig) -> None:
    await rig.pod("p")
    code, _, err = await run_kubectl(rig.config, "logs", "p", "--previous")
    assert code != 0 and 'previous terminated container "main" in pod "p" not found' in err
    code, _, err = await run_kubectl(rig.config, "logs", "p", "--timestamps")
    assert code != 0 and "timestamps are not available" in err
    code, _, err = await run_kubectl(rig.config, "get", "--raw", "/api/v1/namespaces/default/pods/p/log?tailLines=-3")
    assert code != 0 and "tailLines: Invalid value: -3" in err


# -- exec ---------------------------------------------------------------------------------------------------------
async def test_kubectl_exec_relays_stdout_stderr_and_the_exit_code(rig: Rig) -> None:
    await rig.pod("p")
    code, out, err = await run_kubectl(rig.config, "exec", "p", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert code == 3
    assert out == "out\n"
    assert "err\n" in err
    code, out, _ = await run_kubectl(rig.config, "exec", "p", "--", "echo", "fine")
    assert (code, out) == (0, "fine\n")


async def test_kubectl_exec_with_stdin_pipes_it_to_the_command_and_ends_at_its_end(rig: Rig) -> None:
    await rig.pod("p")
    data = b"".join(b"line %d\n" % i for i in range(20000))
    code, out, err = await run_kubectl(rig.config, "exec", "-i", "p", "--", "cat", stdin=data)
    assert code == 0, err
    assert out.encode() == data


async def test_kubectl_exec_into_a_deployment_resolves_to_its_pod(rig: Rig) -> None:
    await rig.kube.create(
        kinds.DEPLOYMENTS,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "x", "namespace": "default"},
            "spec": {
                "selector": {"matchLabels": {"app": "x"}},
                "template": {
                    "metadata": {"labels": {"app": "x"}},
                    "spec": {"containers": [{"name": "main", "image": "registry.example/x:1"}]},
                },
            },
        },
        "default",
    )
    await rig.pod("x-1", labels={"app": "x"})
    code, out, err = await run_kubectl(rig.config, "exec", "deploy/x", "--", "sh", "-c", "echo $0", "resolved")
    assert (code, out) == (0, "resolved\n"), err
    code, _, err = await run_kubectl(rig.config, "exec", "deploy/x", "--", "true")
    assert code == 0, err


def role(name: str, verbs: list[str], resources: str = "pods, pods/exec") -> str:
    """A Role granting ``verbs`` on ``resources`` (pods and pods/exec), bound to the user jane."""
    return f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {name}, namespace: default}}
rules: [{{apiGroups: [""], resources: [{resources}], verbs: {verbs}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {name}, namespace: default}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {name}}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: jane}}]
"""


async def test_kubectl_exec_needs_create_on_pods_exec(rig: Rig) -> None:
    await rig.pod("p")
    await kubectl(rig.config, "apply", "-f", "-", stdin=role("reader", ["get", "list"]))
    code, _, err = await run_kubectl(rig.config, "exec", "p", "--as=jane", "--", "true")
    assert code != 0
    assert 'User "jane" cannot create resource "pods/exec" in API group "" in the namespace "default"' in err
    await kubectl(rig.config, "apply", "-f", "-", stdin=role("execer", ["create"]))
    code, out, err = await run_kubectl(rig.config, "exec", "p", "--as=jane", "--", "echo", "allowed")
    assert (code, out) == (0, "allowed\n"), err


async def test_a_node_cannot_exec_into_a_pod_of_another_node(rig: Rig) -> None:
    await rig.pod("elsewhere", node="node-b")
    as_node = ("--as=system:node:node-a", "--as-group=system:nodes", "--as-group=system:authenticated")
    code, _, err = await run_kubectl(rig.config, "exec", "elsewhere", *as_node, "--", "true")
    assert code != 0
    assert "forbidden" in err.lower()


async def test_exec_refuses_a_pod_without_a_node_and_a_kubelet_that_cannot_be_reached(rig: Rig) -> None:
    await rig.pod("far", node="node-z")
    code, _, err = await run_kubectl(rig.config, "exec", "far", "--", "true")
    assert code != 0 and "error dialing backend" in err
    code, _, err = await run_kubectl(rig.config, "logs", "far")
    assert code != 0 and "error dialing backend" in err
    await rig.kube.create(
        kinds.PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pending", "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "registry.example/x:1"}]},
        },
        "default",
    )
    code, _, err = await run_kubectl(rig.config, "exec", "pending", "--", "true")
    assert code != 0 and "pod pending does not have a host assigned" in err
    code, _, err = await run_kubectl(rig.config, "logs", "pending")
    assert code != 0 and 'container "main" in pod "pending" is waiting to start: ContainerCreating' in err


# -- the protocol, spoken by hand -----------------------------------------------------------------------------------
def exec_url(rig: Rig, *command: str, stdin: bool = False, tty: bool = False) -> str:
    words = "&".join(f"command={quote(w)}" for w in command)
    flags = "&stdout=true&stderr=true" + ("&stdin=true" if stdin else "") + ("&tty=true" if tty else "")
    return f"{rig.server.url}/api/v1/namespaces/default/pods/p/exec?{words}{flags}"


async def open_exec(rig: Rig, session: aiohttp.ClientSession, url: str) -> aiohttp.ClientWebSocketResponse:
    context = ssl.create_default_context(cafile=str(rig.server.settings.data_dir / "pki" / "ca.crt"))
    return await session.ws_connect(
        url,
        protocols=PROTOCOLS,
        headers={"Authorization": f"Bearer {rig.server.admin_token}"},
        ssl=context,
        max_msg_size=0,
    )


async def test_exec_tolerates_empty_messages_and_ends_stdin_at_v5s_close(rig: Rig) -> None:
    await rig.pod("p")
    async with aiohttp.ClientSession() as session:
        ws = await open_exec(rig, session, exec_url(rig, "cat", stdin=True))
        assert ws.protocol == V5
        await ws.send_bytes(b"")
        await ws.send_bytes(frame(Channel.STDIN, b""))
        await ws.send_bytes(frame(Channel.RESIZE, b'{"Width": 80, "Height": 24}'))
        await ws.send_bytes(frame(Channel.STDIN, b"hello "))
        await ws.send_bytes(frame(Channel.STDIN, b"there"))
        await ws.send_bytes(frame(Channel.CLOSE, bytes((Channel.STDIN,))))
        out, status = b"", None
        async for msg in ws:
            got = parse_frame(msg.data)
            assert got is not None
            if got.channel is Channel.STDOUT:
                out += got.data
            elif got.channel is Channel.ERROR:
                status = json.loads(got.data)
        assert out == b"hello there"
        assert status == {"metadata": {}, "status": "Success"}


async def test_a_client_that_never_reads_stalls_the_command_and_leaving_ends_it(rig: Rig, tmp_path: Path) -> None:
    await rig.pod("p")
    marker = tmp_path / "finished"
    script = f"import sys; sys.stdout.buffer.write(bytes(200_000_000)); open({str(marker)!r}, 'w')"
    async with aiohttp.ClientSession() as session:
        ws = await open_exec(rig, session, exec_url(rig, sys.executable, "-c", script))
        await asyncio.sleep(3)  # 200 MB through unbounded buffers would be done by now
        assert not marker.exists()
        await ws.close()
    await asyncio.sleep(1)
    assert not marker.exists()  # the command was killed, not left to finish


async def test_a_user_cannot_hold_more_open_log_and_exec_streams_than_the_limit(rig: Rig) -> None:
    """The attack: a viewer opens ``logs -f`` streams without end, each a task, a kubelet connection and a poll."""
    pod = await rig.pod("p")
    write_log(rig, pod, "main", "line\n")
    grant = role("tailer", ["get", "create"], resources="pods, pods/log, pods/exec")
    await kubectl(rig.config, "apply", "-f", "-", stdin=grant)
    context = ssl.create_default_context(cafile=str(rig.server.settings.data_dir / "pki" / "ca.crt"))
    as_jane = {"Authorization": f"Bearer {rig.server.admin_token}", "Impersonate-User": "jane"}
    follow = f"{rig.server.url}/api/v1/namespaces/default/pods/p/log?follow=true"
    async with aiohttp.ClientSession(headers=as_jane) as session:
        held = [await session.get(follow, ssl=context) for _ in range(STREAM_LIMIT)]
        assert [r.status for r in held] == [200] * STREAM_LIMIT
        refused = await session.get(follow, ssl=context)
        assert refused.status == 429 and refused.headers["Retry-After"] == "1"
        body = await refused.json()
        assert body["reason"] == "TooManyRequests"
        assert body["message"] == f"too many pod streams: jane has {STREAM_LIMIT} open, the limit is {STREAM_LIMIT}"
        with pytest.raises(aiohttp.WSServerHandshakeError) as raised:  # exec takes from the same count
            await session.ws_connect(exec_url(rig, "true"), protocols=PROTOCOLS, ssl=context)
        assert raised.value.status == 429
        code, out, err = await run_kubectl(rig.config, "logs", "p")  # the admin is exempt
        assert (code, out) == (0, "line\n"), err
        held.pop().close()  # a stream that ends gives its place back
        deadline = asyncio.get_running_loop().time() + 30  # the server notices the departure within a poll
        while (again := await session.get(follow, ssl=context)).status != 200:
            again.release()
            assert asyncio.get_running_loop().time() < deadline, "the ended stream was never given back"
            await asyncio.sleep(0.05)
        again.close()
        for response in held:
            response.close()


async def test_the_kubelet_socket_is_root_only_and_knows_only_its_own_pods(rig: Rig, socket_dir: Path) -> None:
    path = socket_dir / "node-a" / "kubelet.sock"
    assert path.stat().st_mode & 0o777 == 0o600
    await rig.pod("p")
    await rig.pod("elsewhere", node="node-b")
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path))) as session:
        async with session.get("http://node-a/containerLogs/default/elsewhere/main") as response:
            assert response.status == 404
            assert 'pod "default/elsewhere" not found on this node' in (await response.json())["message"]
        async with session.get("http://node-a/containerLogs/default/p/other") as response:
            assert response.status == 404
        async with session.get("http://node-a/containerLogs/default/p/main?tailLines=-1") as response:
            assert response.status == 422
        async with session.get("http://node-a/exec/default/p/main?stdout=true") as response:
            assert response.status == 400  # no command


# -- exec on a terminal (kubectl exec -t) -----------------------------------------------------------------------------
async def test_exec_on_a_terminal_takes_resizes_merges_stderr_and_keeps_the_exit_code(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    await rig.pod("p")
    script = "read line; stty size; echo got $line; echo to-stderr >&2; [ -t 0 ] && echo on-a-tty; exit 4"
    async with aiohttp.ClientSession() as session:
        ws = await open_exec(rig, session, exec_url(rig, "sh", "-c", script, stdin=True, tty=True))
        await ws.send_bytes(frame(Channel.RESIZE, b'{"Width": -1, "Height": 24}'))
        await ws.send_bytes(frame(Channel.RESIZE, b"[" * 4000))
        for _ in range(5):  # a flood of them is counted, not logged line by line
            await ws.send_bytes(frame(Channel.RESIZE, b"{"))
        await ws.send_bytes(frame(Channel.RESIZE, b'{"Width": 100, "Height": 30}'))
        await ws.send_bytes(frame(Channel.STDIN, b"hello\n"))
        out, status, channels = b"", None, set()
        async for msg in ws:
            got = parse_frame(msg.data)
            assert got is not None
            channels.add(got.channel)
            if got.channel is Channel.STDOUT:
                out += got.data
            elif got.channel is Channel.ERROR:
                status = json.loads(got.data)
    assert channels == {Channel.STDOUT, Channel.ERROR}  # stderr is the terminal too
    assert out.replace(b"\r\n", b"\n") == b"hello\n30 100\ngot hello\nto-stderr\non-a-tty\n"
    assert status is not None and status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "4"}]
    refused = [r.getMessage() for r in caplog.records if "resize refused" in r.getMessage()]
    assert len(refused) == 3 and "Width must be from 0 to 65535, not -1" in refused[0]


async def test_kubectl_exec_it_on_a_terminal_gets_its_size_and_exit_code(rig: Rig) -> None:
    await rig.pod("p")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    env = dict(os.environ, KUBECONFIG=str(rig.config), KUBECACHEDIR=str(rig.config.parent / "kubecache"))
    try:
        proc = await asyncio.create_subprocess_exec(
            "kubectl",
            "exec",
            "-it",
            "p",
            "--",
            "sh",
            "-c",
            "sleep 0.5; stty size; exit 5",
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
    finally:
        os.close(slave)
    terminal = Terminal(master)
    try:
        out = b""

        async def read_all() -> None:
            nonlocal out
            while chunk := await terminal.read():
                out += chunk

        reader = asyncio.create_task(read_all())
        assert await asyncio.wait_for(proc.wait(), 60) == 5
        await asyncio.wait_for(reader, 10)
    finally:
        terminal.close()
    assert b"33 111" in out, out


# -- attach ---------------------------------------------------------------------------------------------------------
async def test_kubectl_attach_streams_the_containers_output_from_now_until_it_stops(rig: Rig) -> None:
    pod = await rig.pod("p")
    write_log(rig, pod, "main", "before\n")
    attach = asyncio.create_task(run_kubectl(rig.config, "attach", "p"))
    await asyncio.sleep(2.0)
    write_log(rig, pod, "main", "after\n")
    await asyncio.sleep(0.5)
    assert not attach.done()
    rig.finish("p")
    code, out, err = await asyncio.wait_for(attach, 30)
    assert (code, out) == (0, "after\n"), err


async def test_kubectl_attach_with_stdin_is_refused_with_the_reason(rig: Rig) -> None:
    await rig.pod("p")
    code, _, err = await run_kubectl(rig.config, "attach", "-i", "p", stdin=b"")
    assert code != 0 and 'container "main" was not started with stdin: true' in err, err
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "interactive", "namespace": "default"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "none", "stdin": True}]},
    }
    await rig.kube.create(kinds.PODS, body, "default")
    running = [{"name": "main", "ready": True, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]
    status = {"phase": "Running", "containerStatuses": running}
    rig.pods.pods[("default", "interactive")] = await rig.kube.patch_status(
        kinds.PODS, "interactive", {"status": status}, "default"
    )
    code, _, err = await run_kubectl(rig.config, "attach", "-i", "interactive", stdin=b"")
    assert code != 0 and "the lab's runtime keeps no container's stdin open" in err, err


async def test_attach_refuses_a_completed_pod_and_needs_create_on_pods_attach(rig: Rig) -> None:
    await rig.pod("p")
    await kubectl(rig.config, "apply", "-f", "-", stdin=role("reader", ["get", "list"]))
    code, _, err = await run_kubectl(rig.config, "attach", "p", "--as=jane")
    assert code != 0
    assert 'cannot create resource "pods/attach" in API group "" in the namespace "default"' in err, err
    await rig.kube.patch_status(kinds.PODS, "p", {"status": {"phase": "Succeeded"}}, "default")
    url = "/api/v1/namespaces/default/pods/p/attach?stdout=true"
    code, _, err = await run_kubectl(rig.config, "create", "--raw", url, "-f", "/dev/null")
    assert code != 0 and "cannot attach into a container in a completed pod; current phase is Succeeded" in err, err


async def test_a_request_without_an_upgrade_gets_the_kubelets_refusal_else_upgrade_request_required(rig: Rig) -> None:
    """As SPDY's fallback sees it: the API server asks the kubelet, which refuses what it would have refused the
    WebSocket, and otherwise needs the upgrade."""
    await rig.pod("p")
    url = "/api/v1/namespaces/default/pods/p/attach?stdin=true&stdout=true"
    code, _, err = await run_kubectl(rig.config, "create", "--raw", url, "-f", "/dev/null")
    assert code != 0 and 'unable to upgrade connection: container "main" was not started with stdin: true' in err, err
    for url in (
        "/api/v1/namespaces/default/pods/p/attach?stdout=true",
        "/api/v1/namespaces/default/pods/p/exec?command=true&stdout=true",
    ):
        code, _, err = await run_kubectl(rig.config, "create", "--raw", url, "-f", "/dev/null")
        assert code != 0 and "Upgrade request required" in err, err
