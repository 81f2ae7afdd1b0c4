"""Enrolment state rules (spec §1.2 AddPodToMesh / RemovePodFromMesh) with a recording runner and a fake link."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.cni import netns
from ambit.cni.enrolment import (
    REDIRECTION_ANNOTATION,
    EnrolmentManager,
    EnrolmentSettings,
    EnrolmentState,
    Outcome,
    ProxyUnavailableError,
    RedirectionFailedError,
    next_state,
)
from ambit.cni.pluginevent import BadAddEventError, parse_add_event
from ambit.commands import CommandResult, RecordingRunner
from ambit.k8s import KubeNotFoundError

NETNS = "/run/netns/pod-a"


class FakeLink:
    def __init__(self) -> None:
        self.added: list[tuple[str, str, dict[str, Any]]] = []
        self.deleted: list[str] = []
        self.fail: Exception | None = None

    async def add(self, pod_uid: str, netns_path: str, workload: dict[str, Any]) -> None:
        if self.fail is not None:
            raise self.fail
        self.added.append((pod_uid, netns_path, workload))

    async def delete(self, pod_uid: str) -> None:
        self.deleted.append(pod_uid)


class FakeClient:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, Any]] = []
        self.missing = False

    async def patch_status(self, kind: Any, name: str, patch: Any, namespace: str | None = None) -> dict[str, Any]:
        if self.missing:
            raise KubeNotFoundError({"message": "gone", "code": 404})
        self.patches.append((namespace or "", name, patch))
        return {}


class FakeRecorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, regarding: Any, type: str, reason: str, note: str, action: str, related: Any = None) -> None:
        self.events.append((type, reason, note))


def pod(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "a", "namespace": "apps", "uid": "uid-a", "annotations": annotations or {}},
        "spec": {"serviceAccountName": "web"},
    }


def annotation_values(client: FakeClient) -> list[Any]:
    return [p[2]["metadata"]["annotations"][REDIRECTION_ANNOTATION] for p in client.patches]


class Parts:
    def __init__(self) -> None:
        self.runner, self.link, self.client, self.recorder = RecordingRunner(), FakeLink(), FakeClient(), FakeRecorder()
        self.manager = EnrolmentManager(
            self.client,  # type: ignore[arg-type]
            self.recorder,  # type: ignore[arg-type]
            self.runner,
            self.link,
            EnrolmentSettings(node_name="node-1"),
            netns_exists=lambda path: True,
        )


@pytest.fixture
def p() -> Parts:
    return Parts()


def test_the_transition_table_has_a_rule_for_every_success_and_failure() -> None:
    for state in EnrolmentState:
        assert next_state(state, Outcome.LINK_ACKED) is EnrolmentState.ENROLLED
        assert next_state(state, Outcome.LINK_FAILED) is EnrolmentState.PENDING
        assert next_state(state, Outcome.REMOVED) is EnrolmentState.NOT_ENROLLED
    assert next_state(EnrolmentState.NOT_ENROLLED, Outcome.RULES_FAILED) is EnrolmentState.NOT_ENROLLED
    assert next_state(EnrolmentState.PENDING, Outcome.RULES_FAILED) is EnrolmentState.PENDING


async def test_enrol_applies_rules_then_tells_the_proxy_then_marks_the_pod_enabled(p: Parts) -> None:
    await p.manager.enrol(pod(), NETNS)
    assert p.runner.commands[0] == "ip netns exec pod-a nft -f -"
    assert p.link.added == [("uid-a", NETNS, {"name": "a", "namespace": "apps", "service_account": "web"})]
    assert annotation_values(p.client) == ["enabled"]
    assert [(t, r) for t, r, _ in p.recorder.events] == [("Normal", "AmbientEnrolled")]
    assert p.manager.state("uid-a") is EnrolmentState.ENROLLED


async def test_a_link_failure_leaves_the_pod_pending_with_a_warning(p: Parts) -> None:
    p.link.fail = ConnectionRefusedError("no node proxy")
    with pytest.raises(ProxyUnavailableError, match="retried"):
        await p.manager.enrol(pod(), NETNS)
    assert p.manager.state("uid-a") is EnrolmentState.PENDING
    assert annotation_values(p.client) == ["pending"]
    assert [(t, r) for t, r, _ in p.recorder.events] == [("Warning", "AmbientProxyUnavailable")]
    p.link.fail = None
    await p.manager.enrol(pod(), NETNS)
    assert p.manager.state("uid-a") is EnrolmentState.ENROLLED
    assert annotation_values(p.client) == ["pending", "enabled"]


async def test_a_rules_failure_warns_and_writes_no_annotation(p: Parts) -> None:
    p.runner.respond = lambda call: (
        CommandResult(call.argv, 1, b"", b"nft: no such table") if "nft" in call.argv else None
    )
    with pytest.raises(RedirectionFailedError, match="nft: no such table"):
        await p.manager.enrol(pod(), NETNS)
    assert p.manager.state("uid-a") is EnrolmentState.NOT_ENROLLED
    assert p.client.patches == [] and p.link.added == []
    ((kind, reason, note),) = p.recorder.events
    assert (kind, reason) == ("Warning", "AmbientRedirectionFailed")
    assert "Fix the pod's ambient annotations" in note


async def test_a_bad_annotation_is_a_rules_failure_naming_the_annotation(p: Parts) -> None:
    with pytest.raises(RedirectionFailedError, match=r"ambient\.istio\.io/dns-capture"):
        await p.manager.enrol(pod({"ambient.istio.io/dns-capture": "maybe"}), NETNS)
    assert p.runner.calls == [] and p.link.added == []


async def test_unenrol_removes_rules_tells_the_proxy_and_nulls_the_annotation(p: Parts) -> None:
    await p.manager.enrol(pod(), NETNS)
    p.runner.calls.clear()
    await p.manager.unenrol(pod({REDIRECTION_ANNOTATION: "enabled"}))
    assert p.runner.commands[0] == "ip netns exec pod-a nft -f -"
    assert p.link.deleted == ["uid-a"]
    assert annotation_values(p.client) == ["enabled", None]
    assert p.manager.find("uid-a") is None


async def test_unenrol_of_a_deleted_pod_without_netns_skips_the_rules(p: Parts) -> None:
    p.manager._netns_exists = lambda path: False
    p.client.missing = True
    await p.manager.unenrol(pod({REDIRECTION_ANNOTATION: "enabled"}), NETNS)
    assert p.runner.commands == ["nft -f -"]  # only the host probe set, in the node namespace
    assert p.link.deleted == ["uid-a"]


async def test_a_netns_outside_run_netns_is_entered_with_nsenter(p: Parts) -> None:
    await p.manager.enrol(pod(), "/proc/42/ns/net")
    assert p.runner.commands[0] == "nsenter --net=/proc/42/ns/net nft -f -"
    assert p.runner.commands[1].startswith("nsenter --net=/proc/42/ns/net ip -4 route replace")
    assert all("ambit-netns-by-path" not in c for c in p.runner.commands)


def pod_with_ips(uid: str, *ips: str) -> dict[str, Any]:
    body = pod()
    body["metadata"] = {**body["metadata"], "uid": uid, "name": uid}
    body["status"] = {"podIP": ips[0], "podIPs": [{"ip": ip} for ip in ips]} if ips else {}
    return body


def host_scripts(runner: RecordingRunner) -> list[str]:
    """The stdin of every host-side apply: ``nft -f -`` in the runner's own (the node's) namespace."""
    return [(c.stdin or b"").decode() for c in runner.calls if c.argv == ("nft", "-f", "-")]


async def test_the_host_probe_set_follows_enrolments_in_the_node_namespace(p: Parts) -> None:
    await p.manager.sync_host()
    assert p.runner.commands == ["nft -f -"]  # no ip netns exec: the agent runs in the node's namespace
    (empty,) = host_scripts(p.runner)
    assert "istio-inpod-probes-v4" in empty and "elements" not in empty
    assert "snat ip to 169.254.7.127" in empty

    await p.manager.enrol(pod_with_ips("uid-a", "10.0.0.5", "fd00::5"), NETNS)
    assert p.runner.commands[-1] == "nft -f -"
    assert "elements = { 10.0.0.5 }" in host_scripts(p.runner)[-1]
    assert "fd00::5" not in host_scripts(p.runner)[-1]

    await p.manager.enrol(pod_with_ips("uid-b"), "/run/netns/pod-b", ips=["10.0.0.6/24"])
    script = host_scripts(p.runner)[-1]
    assert "elements = { 10.0.0.5, 10.0.0.6 }" in script
    assert script.startswith("add table inet istio-ambient-nat\ndelete table inet istio-ambient-nat\n")

    await p.manager.unenrol(pod_with_ips("uid-a", "10.0.0.5"))
    assert p.runner.commands[-1] == "nft -f -"
    assert "elements = { 10.0.0.6 }" in host_scripts(p.runner)[-1]
    assert p.manager.probe_ips() == ["10.0.0.6"]


async def test_a_pending_pod_is_not_in_the_probe_set_and_a_host_failure_does_not_fail_enrolment(p: Parts) -> None:
    p.link.fail = ConnectionRefusedError("no node proxy")
    with pytest.raises(ProxyUnavailableError):
        await p.manager.enrol(pod_with_ips("uid-a", "10.0.0.5"), NETNS)
    assert host_scripts(p.runner) == [] and p.manager.probe_ips() == []
    p.link.fail = None
    p.runner.respond = lambda call: CommandResult(call.argv, 1, b"", b"nft: boom") if call.argv[0] == "nft" else None
    await p.manager.enrol(pod_with_ips("uid-a", "10.0.0.5"), NETNS)
    assert p.manager.state("uid-a") is EnrolmentState.ENROLLED
    assert p.runner.commands[-1] == "nft -f -"


def test_netns_names_come_only_from_the_netns_directory() -> None:
    assert netns.netns_name("/run/netns/x") == "x"
    assert netns.netns_name("/var/run/netns/cni-1") == "cni-1"
    assert netns.netns_name("/proc/1/ns/net") is None
    assert netns.netns_name("/run/netns/") is None


def test_a_valid_add_event_is_parsed() -> None:
    event = parse_add_event(
        b'{"netns": "/run/netns/x", "podName": "p", "podNamespace": "n", "podUid": "u",'
        b' "ips": [{"interface": 0, "address": "198.18.1.5/24", "gateway": "198.18.1.1"}]}'
    )
    assert (event.netns, event.pod_name, event.pod_namespace, event.pod_uid) == ("/run/netns/x", "p", "n", "u")
    assert event.ips[0].address == "198.18.1.5/24"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"not json", "not JSON"),
        (b"[]", "expected a JSON object"),
        (b'{"podName": "p", "podNamespace": "n"}', "'netns'"),
        (b'{"netns": "/x", "podName": 3, "podNamespace": "n"}', "'podName'"),
        (b'{"netns": "/x", "podName": "p", "podNamespace": "n", "ips": {}}', "'ips'"),
        (b'{"netns": "/x", "podName": "p", "podNamespace": "n", "ips": [{"interface": "eth0"}]}', "interface"),
    ],
)
def test_a_bad_add_event_is_one_clear_line(body: bytes, fragment: str) -> None:
    with pytest.raises(BadAddEventError, match=fragment) as info:
        parse_add_event(body)
    assert "\n" not in str(info.value)


@given(st.binary(max_size=200))
def test_parse_add_event_raises_only_bad_add_event_error(body: bytes) -> None:
    with contextlib.suppress(BadAddEventError):
        parse_add_event(body)
