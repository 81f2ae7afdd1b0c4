"""The node agent against the real embedded API server, with a recording runner (no root) and a fake node proxy."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ambit.apiserver.server import ApiServer
from ambit.cni.addcheck import Inode, NetnsFacts
from ambit.cni.agent import NodeAgent, NodeAgentSettings
from ambit.cni.enrolment import REDIRECTION_ANNOTATION, EnrolmentManager, EnrolmentSettings
from ambit.commands import Call, CommandResult, RecordingRunner
from ambit.k8s import (
    EventRecorder,
    EventRecorderSettings,
    InformerSettings,
    KubeAlreadyExistsError,
    KubeClient,
    kinds,
)

NODE = "node-1"
MODE = "istio.io/dataplane-mode"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
FAST = InformerSettings(backoff_initial=0.02, backoff_max=0.1, watch_timeout=30)
Obj = dict[str, Any]


class FakeLink:
    def __init__(self) -> None:
        self.added: list[str] = []
        self.deleted: list[str] = []
        self.fail = False
        self.attempts: list[float] = []
        """Loop time of every add, failed or not."""

    async def add(self, pod_uid: str, netns_path: str, workload: dict[str, Any]) -> None:
        self.attempts.append(asyncio.get_running_loop().time())
        if self.fail:
            raise ConnectionRefusedError("node proxy not connected")
        self.added.append(pod_uid)

    async def delete(self, pod_uid: str) -> None:
        self.deleted.append(pod_uid)


class Machine:
    """Answers ``ip rule show`` as a kernel would: the rule is there once it has been added in that netns."""

    def __init__(self) -> None:
        self.rules: set[str] = set()

    def __call__(self, call: Call) -> CommandResult | None:
        argv = call.argv
        if argv[:1] == ("ip",) and "rule" in argv and "-n" in argv:
            ns = argv[argv.index("-n") + 1]
            if "add" in argv:
                self.rules.add(ns)
            elif "del" in argv:
                self.rules.discard(ns)
            elif "show" in argv and ns in self.rules:
                return CommandResult(argv, 0, b"32764: from all fwmark 0x111/0xfff lookup 100\n")
        return None


def netns_for(pod: Obj) -> str:
    return f"/run/netns/pod-{pod['metadata']['uid'][:8]}"


HOST_NETNS: Inode = (4, 1)


class FakeNetns:
    """The kernel as :mod:`ambit.cni.addcheck` asks it: every ``/run/netns/pod-*`` is a namespace of its own."""

    def inspect(self, path: str) -> NetnsFacts | None:
        if path.startswith("/run/netns/pod-"):
            return NetnsFacts(path, True, (4, int(path.removeprefix("/run/netns/pod-"), 16)))
        if path == "/run/netns/host-alias":  # the host's namespace bind-mounted where sandboxes live
            return NetnsFacts(path, True, HOST_NETNS)
        if path == "/proc/1/ns/net":
            return NetnsFacts("/proc/1/ns/net", True, HOST_NETNS)
        if path == "/run/netns/plain-file":
            return NetnsFacts(path, False, (65024, 7))
        return None

    def forbidden(self) -> frozenset[Inode]:
        return frozenset({HOST_NETNS})


class Rig:
    def __init__(self, kube: KubeClient, socket_path: str) -> None:
        self.kube = kube
        self.socket_path = socket_path
        self.runner = RecordingRunner(respond=Machine())
        self.link = FakeLink()
        self.recorder = EventRecorder(kube, EventRecorderSettings("ambit.dev/nodeagent", NODE))
        self.agent: NodeAgent | None = None

    async def start_agent(self, retry_initial: float = 1.0, retry_interval: float = 60) -> NodeAgent:
        manager = EnrolmentManager(
            self.kube,
            self.recorder,
            self.runner,
            self.link,
            EnrolmentSettings(node_name=NODE),
            netns_exists=lambda path: True,
        )
        settings = NodeAgentSettings(
            node_name=NODE,
            socket_path=self.socket_path,
            informer=FAST,
            retry_interval=retry_interval,
            retry_initial=retry_initial,
        )
        self.agent = NodeAgent(self.kube, manager, settings, netns_for, netns_probe=FakeNetns())
        await self.agent.start()
        return self.agent

    async def stop_agent(self) -> None:
        if self.agent is not None:
            await self.agent.aclose()
            self.agent = None

    async def namespace(self, name: str, mode: str | None = None) -> None:
        labels = {MODE: mode} if mode else {}
        try:
            await self.kube.create(kinds.NAMESPACES, {"metadata": {"name": name, "labels": labels}})
        except KubeAlreadyExistsError:
            await self.label_namespace(name, mode)

    async def label_namespace(self, name: str, mode: str | None) -> None:
        await self.kube.patch(kinds.NAMESPACES, name, {"metadata": {"labels": {MODE: mode}}})

    async def pod(
        self, name: str, namespace: str = "apps", *, node: str = NODE, running: bool = True, **spec: Any
    ) -> Obj:
        body = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.example/app:1"}], **spec},
        }
        created = await self.kube.create(kinds.PODS, body, namespace)
        if running:
            created = await self.kube.patch_status(kinds.PODS, name, {"status": {"phase": "Running"}}, namespace)
        return created

    async def annotation(self, name: str, namespace: str = "apps") -> str | None:
        pod = await self.kube.get(kinds.PODS, name, namespace)
        value = (pod["metadata"].get("annotations") or {}).get(REDIRECTION_ANNOTATION)
        return value if isinstance(value, str) else None

    async def events(self, name: str, namespace: str = "apps") -> list[tuple[str, str]]:
        await self.recorder.flush()
        items, _ = await self.kube.list(kinds.EVENTS, namespace)
        return [(e["type"], e["reason"]) for e in items if e["regarding"]["name"] == name]

    def count(self, fragment: str) -> int:
        return sum(fragment in command for command in self.runner.commands)

    def pod_scripts(self) -> int:
        """nft scripts run in pods' namespaces (installs and removals; not the hand-over sysctl beside them)."""
        return sum(c.startswith("ip netns exec pod-") and " nft -f -" in c for c in self.runner.commands)


async def eventually(predicate: Callable[[], Any]) -> None:
    """Poll ``predicate`` (a coroutine function) until it is true, for at most five seconds."""
    async with asyncio.timeout(5.0):
        for _ in itertools.count():
            if await predicate():
                return
            await asyncio.sleep(0.02)


@pytest.fixture
async def rig(apiserver: ApiServer) -> AsyncIterator[Rig]:
    with tempfile.TemporaryDirectory(prefix="agent", dir="/tmp") as directory:
        async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as kube:
            rig = Rig(kube, str(Path(directory) / "pluginevent.sock"))
            rig.recorder.start()
            try:
                yield rig
            finally:
                await rig.stop_agent()
                await rig.recorder.aclose()


async def post(socket_path: str, body: bytes) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path)) as session,
        session.post("http://localhost/cmdadd", data=body, headers={"Content-Type": "application/json"}) as response,
    ):
        return response.status, await response.text()


def add_event(pod: Obj, netns: str | None = None) -> bytes:
    meta = pod["metadata"]
    event = {
        "netns": netns or netns_for(pod),
        "podName": meta["name"],
        "podNamespace": meta["namespace"],
        "podUid": meta["uid"],
        "ips": [{"interface": 0, "address": "198.18.1.5/24", "gateway": "198.18.1.1"}],
    }
    return json.dumps(event).encode()


async def test_labelling_a_namespace_enrols_its_running_pods_on_this_node(rig: Rig) -> None:
    await rig.namespace("apps")
    await rig.namespace("kube-system")
    # a hostNetwork pod needs a namespace whose Pod Security level allows it
    await rig.kube.patch(kinds.NAMESPACES, "apps", {"metadata": {"labels": {PSA_ENFORCE: "privileged"}}})
    web = await rig.pod("web")
    elsewhere = await rig.pod("elsewhere", node="node-2")
    host = await rig.pod("host", hostNetwork=True)
    system = await rig.pod("dns", "kube-system", labels={MODE: "ambient"})
    await rig.start_agent()
    assert rig.link.added == []

    await rig.label_namespace("apps", "ambient")
    await eventually(lambda: _is(rig.annotation("web"), "enabled"))
    assert rig.link.added == [web["metadata"]["uid"]]
    assert rig.count(f"ip netns exec pod-{web['metadata']['uid'][:8]} nft -f -") == 1
    assert ("Normal", "AmbientEnrolled") in await rig.events("web")
    for pod in (elsewhere, host, system):
        assert pod["metadata"]["uid"] not in rig.link.added
    assert await rig.annotation("host") is None
    assert await rig.annotation("dns", "kube-system") is None


async def test_a_pod_opting_out_is_unenrolled(rig: Rig) -> None:
    await rig.namespace("apps", "ambient")
    web = await rig.pod("web")
    await rig.start_agent()
    await eventually(lambda: _is(rig.annotation("web"), "enabled"))

    await rig.kube.patch(kinds.PODS, "web", {"metadata": {"labels": {MODE: "none"}}}, "apps")
    await eventually(lambda: _is(rig.annotation("web"), None))
    assert rig.link.deleted == [web["metadata"]["uid"]]
    assert rig.pod_scripts() == 2  # install, then removal (nft; the host set is node-side)


async def test_a_deleted_pod_is_unenrolled(rig: Rig) -> None:
    await rig.namespace("apps", "ambient")
    web = await rig.pod("web")
    await rig.start_agent()
    await eventually(lambda: _is(rig.annotation("web"), "enabled"))
    await rig.kube.delete(kinds.PODS, "web", "apps", grace_period_seconds=0)

    async def deleted() -> bool:
        return rig.link.deleted == [web["metadata"]["uid"]]

    await eventually(deleted)


async def test_a_node_proxy_failure_marks_the_pod_pending_with_a_warning(rig: Rig) -> None:
    await rig.namespace("apps", "ambient")
    rig.link.fail = True
    await rig.pod("web")
    await rig.start_agent()
    await eventually(lambda: _is(rig.annotation("web"), "pending"))
    assert ("Warning", "AmbientProxyUnavailable") in await rig.events("web")


async def test_a_pending_pod_is_retried_with_a_doubling_back_off_and_enrolled_once_the_node_proxy_takes_it(
    rig: Rig,
) -> None:
    await rig.namespace("apps", "ambient")
    rig.link.fail = True
    await rig.pod("web")
    agent = await rig.start_agent(retry_initial=0.1, retry_interval=0.4)
    assert [agent.retry_delay(n) for n in range(5)] == [0.1, 0.2, 0.4, 0.4, 0.4]
    await eventually(lambda: _is(rig.annotation("web"), "pending"))

    async def retried() -> bool:
        return len(rig.link.attempts) >= 5

    await eventually(retried)
    gaps = [later - earlier for earlier, later in itertools.pairwise(rig.link.attempts)]
    # Each wait at least its back-off (ticks of half the first one may add to it); the waits grow, then stay capped.
    for gap, least in zip(gaps, [0.1, 0.2, 0.4, 0.4], strict=False):
        assert gap >= least - 0.01, gaps
    rig.link.fail = False
    await eventually(lambda: _is(rig.annotation("web"), "enabled"))
    assert ("Warning", "AmbientProxyUnavailable") in await rig.events("web")


async def test_a_defect_retrying_one_pending_pod_does_not_end_the_retries_of_the_others(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    await rig.namespace("apps", "ambient")
    rig.link.fail = True
    web = await rig.pod("web")
    await rig.pod("db")
    agent = await rig.start_agent(retry_initial=0.05, retry_interval=0.1)
    await eventually(lambda: _is(rig.annotation("web"), "pending"))
    await eventually(lambda: _is(rig.annotation("db"), "pending"))
    enrol = agent.manager.enrol
    defects = 0

    async def enrol_with_a_defect(pod: Obj, netns_path: str, **kwargs: Any) -> None:
        nonlocal defects
        if pod["metadata"]["uid"] == web["metadata"]["uid"]:
            defects += 1
            raise KeyError("a defect")
        await enrol(pod, netns_path, **kwargs)

    monkeypatch.setattr(agent.manager, "enrol", enrol_with_a_defect)

    async def hit_twice() -> bool:
        return defects >= 2

    await eventually(hit_twice)
    rig.link.fail = False
    await eventually(lambda: _is(rig.annotation("db"), "enabled"))


async def test_cmdadd_over_the_unix_socket_answers_by_enrolment_outcome(rig: Rig) -> None:
    await rig.namespace("apps", "ambient")
    await rig.namespace("plain")
    await rig.start_agent()
    web = await rig.pod("web", running=False)  # the runtime calls the plugin before the pod runs

    status, text = await post(rig.socket_path, add_event(web))
    assert (status, text) == (200, "ok")
    assert await rig.annotation("web") == "enabled"
    assert rig.link.added == [web["metadata"]["uid"]]

    rig.link.fail = True
    db = await rig.pod("db", running=False)
    status, text = await post(rig.socket_path, add_event(db))
    assert status == 500
    assert "node proxy" in text and "Traceback" not in text
    assert await rig.annotation("db") == "pending"

    other = await rig.pod("other", "plain", running=False)
    assert (await post(rig.socket_path, add_event(other)))[0] == 200
    assert other["metadata"]["uid"] not in rig.link.added


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"podName": "web", "podNamespace": "apps"}', b'{"netns": "/run/netns/x", "podName": ""}'],
)
async def test_a_malformed_cmdadd_is_a_400_with_one_line(rig: Rig, body: bytes) -> None:
    await rig.start_agent()
    status, text = await post(rig.socket_path, body)
    assert status == 400
    assert text.startswith("bad /cmdadd body") and "\n" not in text


async def test_cmdadd_for_an_unknown_pod_is_a_500(rig: Rig) -> None:
    await rig.namespace("apps", "ambient")
    await rig.start_agent()
    body = json.dumps({"netns": "/run/netns/x", "podName": "ghost", "podNamespace": "apps"}).encode()
    status, text = await post(rig.socket_path, body)
    assert status == 500 and "does not exist" in text


async def test_cmdadd_for_a_pod_on_another_node_is_refused_and_nothing_is_enrolled(rig: Rig) -> None:
    await rig.namespace("apps", "ambient")
    await rig.start_agent()
    remote = await rig.pod("remote", node="node-2", running=False)
    status, text = await post(rig.socket_path, add_event(remote))
    assert status == 403 and "is on node node-2, not on this node node-1" in text and "\n" not in text
    assert rig.link.added == [] and rig.count("ip netns exec") == 0 and rig.count("nsenter") == 0
    assert await rig.annotation("remote") is None


@pytest.mark.parametrize(
    ("netns", "why"),
    [
        ("/proc/1/ns/net", "not in a pod sandbox netns directory"),
        ("/run/netns/host-alias", "the host's or the node agent's own"),
        ("/run/netns/plain-file", "is not a network namespace"),
        ("/run/netns/absent", "does not exist"),
        ("/run/netns/pod-0000beef", "not this pod's sandbox network namespace"),
    ],
    ids=["host-proc-path", "host-netns-bind-mounted", "not-nsfs", "missing", "another-pods-sandbox"],
)
async def test_cmdadd_with_a_netns_that_is_not_the_pods_sandbox_is_refused(rig: Rig, netns: str, why: str) -> None:
    await rig.namespace("apps", "ambient")
    await rig.start_agent()
    web = await rig.pod("web", running=False)
    status, text = await post(rig.socket_path, add_event(web, netns))
    assert status == 403 and why in text
    assert rig.link.added == [] and rig.count("ip netns exec") == 0 and rig.count("nsenter") == 0


async def test_after_a_restart_running_pods_are_enrolled_again_without_duplicate_rules(rig: Rig) -> None:
    await rig.namespace("apps", "ambient")
    web = await rig.pod("web")
    await rig.start_agent()
    await eventually(lambda: _is(rig.annotation("web"), "enabled"))
    assert (rig.pod_scripts(), rig.count("rule add")) == (1, 1)
    await rig.stop_agent()

    await rig.start_agent()
    uid = web["metadata"]["uid"]

    async def re_added() -> bool:
        return rig.link.added == [uid, uid]

    await eventually(re_added)
    # The nft script replaces our table atomically; the policy rule is seen and not added twice.
    assert (rig.pod_scripts(), rig.count("rule add")) == (2, 1)
    assert await rig.annotation("web") == "enabled"


async def _is(value: Any, expected: Any) -> bool:
    with contextlib.suppress(Exception):
        return bool(await value == expected)
    return False
