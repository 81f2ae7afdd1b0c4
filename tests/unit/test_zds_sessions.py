"""Pair tests: the agent's and the proxy's ZDS state machines joined in memory (spec §3.3, §11.2 statemanager)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.api import zds_pb2
from ambit.zds.agent import AgentHub, AgentSession, AgentState, PodEntry
from ambit.zds.commands import CloseConnection, CloseFds, OpenPodListeners, Output, SendMessage, StopPodProxy
from ambit.zds.errors import Blame, ProtocolError
from ambit.zds.events import (
    HelloReceived,
    ProtocolViolated,
    RequestAcked,
    RequestNacked,
    SnapshotCompleted,
    SnapshotReconciled,
    SuccessorReported,
    TimedOut,
)
from ambit.zds.protocol import Datagram, WorkloadInfo, encode_hello, encode_response
from ambit.zds.proxy import PodState, ProxySession, ProxyState

INFO = WorkloadInfo("web-0", "default", "web")
T = TypeVar("T")


def pod(uid: str, fd: int | None = 100) -> PodEntry:
    return PodEntry(uid, WorkloadInfo(f"pod-{uid}", "default", "sa"), fd)


@dataclass
class ZdsPair:
    """One agent session and the proxy session, joined in memory; the proxy's shell opens listeners on request."""

    proxy: ProxySession
    agent: AgentSession
    failing: set[str] = field(default_factory=set)
    agent_saw: list[Output] = field(default_factory=list)
    proxy_saw: list[Output] = field(default_factory=list)
    now: float = 0.0

    @classmethod
    def connect(cls, snapshot: list[PodEntry], proxy: ProxySession | None = None) -> ZdsPair:
        pair = cls(proxy or ProxySession(), AgentSession(snapshot, 0.0))
        pair.to_agent(pair.proxy.connection_made())
        return pair

    def to_agent(self, outputs: list[Output]) -> None:
        for out in outputs:
            self.proxy_saw.append(out)
            if isinstance(out, SendMessage):
                self.to_proxy(self.agent.datagram_received(Datagram(out.data, out.fds), self.now))
            elif isinstance(out, OpenPodListeners):
                if out.uid in self.failing:
                    self.to_agent(self.proxy.listeners_failed(out.uid, "bind: address in use"))
                else:
                    self.to_agent(self.proxy.listeners_opened(out.uid))

    def to_proxy(self, outputs: list[Output]) -> None:
        for out in outputs:
            self.agent_saw.append(out)
            if isinstance(out, SendMessage):
                self.to_agent(self.proxy.datagram_received(Datagram(out.data, out.fds)))

    def proxy_commands(self, kind: type[T]) -> list[T]:
        return [o for o in self.proxy_saw if isinstance(o, kind)]

    def agent_events(self, kind: type[T]) -> list[T]:
        return [o for o in self.agent_saw if isinstance(o, kind)]


def test_snapshot_adds_known_pods_keeps_unknown_then_completes() -> None:
    pair = ZdsPair.connect([pod("a", 10), pod("b", None)])
    assert pair.agent_events(HelloReceived) == [HelloReceived()]
    assert [c.uid for c in pair.proxy_commands(OpenPodListeners)] == ["a"]
    assert pair.proxy_commands(OpenPodListeners)[0].fd == 10
    assert pair.agent_events(RequestAcked) == [
        RequestAcked("add", "a"),
        RequestAcked("keep", "b"),
        RequestAcked("snapshot_sent", ""),
    ]
    assert pair.agent_events(SnapshotCompleted) == [SnapshotCompleted()]
    assert pair.agent.state is AgentState.LIVE
    assert pair.proxy.state is ProxyState.LIVE
    assert pair.proxy.ready
    assert set(pair.proxy.pods) == {"a"}


def test_add_starts_a_proxy_and_add_is_idempotent() -> None:
    pair = ZdsPair.connect([])
    pair.to_proxy(pair.agent.submit_add(pod("a", 11), 1.0))
    pair.to_proxy(pair.agent.submit_add(pod("a", 11), 2.0))
    assert [c.uid for c in pair.proxy_commands(OpenPodListeners)] == ["a", "a"]
    assert list(pair.proxy.pods) == ["a"]
    assert pair.proxy.pods["a"].state is PodState.RUNNING
    assert pair.agent_events(RequestAcked)[-2:] == [RequestAcked("add", "a")] * 2


def test_different_netns_keeps_latest() -> None:
    pair = ZdsPair.connect([])
    pair.to_proxy(pair.agent.submit_add(pod("a", 11), 1.0))
    newer = PodEntry("a", WorkloadInfo("pod-a2", "default", "sa"), 12)
    pair.to_proxy(pair.agent.submit_add(newer, 2.0))
    assert pair.proxy_commands(OpenPodListeners)[-1].fd == 12
    assert pair.proxy.pods["a"].info.name == "pod-a2"


def test_add_fails_is_nacked_kept_pending_and_connection_stays_up() -> None:
    pair = ZdsPair.connect([])
    pair.failing.add("a")
    pair.to_proxy(pair.agent.submit_add(pod("a"), 1.0))
    assert pair.agent_events(RequestNacked) == [RequestNacked("add", "a", "bind: address in use")]
    assert pair.proxy.pods["a"].state is PodState.PENDING
    assert not pair.proxy.ready
    assert pair.agent.state is AgentState.LIVE
    assert pair.proxy.state is ProxyState.LIVE
    # add fails then delete: the pending pod is gone and the proxy is ready again
    pair.to_proxy(pair.agent.submit_del("a", 2.0))
    assert pair.proxy.pods == {}
    assert pair.proxy.ready


def test_add_while_pending_succeeds_on_retry() -> None:
    pair = ZdsPair.connect([])
    pair.failing.add("a")
    pair.to_proxy(pair.agent.submit_add(pod("a"), 1.0))
    pair.failing.clear()
    pair.to_proxy(pair.agent.submit_add(pod("a"), 2.0))
    assert pair.proxy.pods["a"].state is PodState.RUNNING
    assert pair.proxy.ready


def test_delete_before_snapshot_drops_the_pod() -> None:
    proxy = ProxySession()
    proxy.connection_made()
    outs = proxy.datagram_received(_add("a", fd=5))
    assert outs == [OpenPodListeners("a", INFO, 5)]
    proxy.listeners_opened("a")
    assert _acks(proxy.datagram_received(_del("a"))) == [""]
    outs = proxy.datagram_received(_snapshot_sent())
    assert SnapshotReconciled(frozenset()) in outs
    assert proxy.pods == {}


def test_add_delete_add() -> None:
    pair = ZdsPair.connect([])
    pair.to_proxy(pair.agent.submit_add(pod("a"), 1.0))
    pair.to_proxy(pair.agent.submit_del("a", 2.0))
    pair.to_proxy(pair.agent.submit_add(pod("a"), 3.0))
    assert pair.proxy_commands(StopPodProxy) == [StopPodProxy("a")]
    assert list(pair.proxy.pods) == ["a"]


def test_keep_with_new_snapshot_reconciles_across_reconnect() -> None:
    first = ZdsPair.connect([pod("a"), pod("b"), pod("c")])
    assert set(first.proxy.pods) == {"a", "b", "c"}
    first.proxy.connection_lost()
    # the agent restarted: it knows "a" with a netns, "b" without one, and forgot "c"
    second = ZdsPair.connect([pod("a", 20), pod("b", None)], proxy=first.proxy)
    assert second.proxy_commands(SnapshotReconciled) == [SnapshotReconciled(frozenset({"c"}))]
    assert second.proxy_commands(StopPodProxy) == [StopPodProxy("c")]
    assert set(second.proxy.pods) == {"a", "b"}


def test_missing_workload_info_is_nacked_and_disconnects() -> None:
    proxy = ProxySession()
    proxy.connection_made()
    message = zds_pb2.WorkloadRequest()
    message.add.uid = "a"
    outs = proxy.datagram_received(Datagram(message.SerializeToString(), (7,)))
    assert outs[0] == CloseFds((7,))
    assert isinstance(outs[1], ProtocolViolated)
    assert outs[1].error.blame is Blame.PEER
    assert _acks(outs) and _acks(outs)[0] != ""
    assert isinstance(outs[-1], CloseConnection)
    assert proxy.state is ProxyState.DISCONNECTED


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        (["snapshot", "keep"], "KeepRequest while live"),
        (["snapshot", "snapshot"], "SnapshotSentRequest while live"),
        (["garbage"], "undecodable"),
        (["oversized"], "over 1024"),
        (["del_with_fd"], "no fd"),
    ],
)
def test_proxy_rejects_bad_input_with_nack_and_disconnect(messages: list[str], match: str) -> None:
    proxy = ProxySession()
    proxy.connection_made()
    datagrams = {
        "snapshot": _snapshot_sent(),
        "keep": _keep("a"),
        "garbage": Datagram(b"\xff\xff\xff"),
        "oversized": Datagram(b"\x00" * 1025),
        "del_with_fd": _del("a", fds=(8,)),
    }
    outs: list[Output] = []
    for name in messages:
        outs = proxy.datagram_received(datagrams[name])
    violations = [o for o in outs if isinstance(o, ProtocolViolated)]
    assert violations and match in violations[0].error.reason
    assert _acks(outs)[0] != ""
    assert isinstance(outs[-1], CloseConnection)
    # the proxy reconnects with a fresh snapshot state
    assert isinstance(proxy.connection_made()[0], SendMessage)
    assert proxy.state is ProxyState.SNAPSHOT


def test_request_before_the_add_is_acked_is_a_protocol_error() -> None:
    proxy = ProxySession()
    proxy.connection_made()
    proxy.datagram_received(_add("a", fd=5))
    outs = proxy.datagram_received(_keep("b"))
    assert any(isinstance(o, ProtocolViolated) for o in outs)
    assert proxy.listeners_opened("a") == []  # nobody is waiting for that ack any more


def test_new_pods_go_to_newest_connection_and_deletes_to_all() -> None:
    hub = AgentHub()
    proxies = {1: ProxySession(), 2: ProxySession()}
    for conn_id, proxy in proxies.items():
        session = hub.connect(conn_id, 0.0)
        _drive(hub, conn_id, session.datagram_received(_first(proxy.connection_made()), 0.0), proxies)
    routed = hub.pod_added(pod("a", 30), 1.0)
    assert {cid for cid, out in routed if isinstance(out, SendMessage)} == {2}
    _drive_routed(hub, routed, proxies)
    routed = hub.pod_deleted("a", 2.0)
    assert sorted(cid for cid, out in routed if isinstance(out, SendMessage)) == [1, 2]
    _drive_routed(hub, routed, proxies)
    assert proxies[2].pods == {} and proxies[1].pods == {}
    hub.disconnect(2)
    routed = hub.pod_added(pod("b", 31), 3.0)
    assert {cid for cid, out in routed if isinstance(out, SendMessage)} == {1}


def test_new_connection_snapshot_is_the_hub_cache() -> None:
    hub = AgentHub()
    hub.pod_added(pod("a", 40), 0.0)
    hub.pod_added(pod("b", None), 0.0)
    session = hub.connect(1, 0.0)
    pair = ZdsPair(ProxySession(), session)
    pair.to_agent(pair.proxy.connection_made())
    assert pair.agent_events(RequestAcked)[:2] == [RequestAcked("add", "a"), RequestAcked("keep", "b")]


def test_missing_hello_times_out_after_five_seconds() -> None:
    session = AgentSession([], 0.0)
    assert session.timer_fired(4.9) == []
    outs = session.timer_fired(5.0)
    assert outs[0] == TimedOut("hello")
    assert isinstance(outs[1], CloseConnection)
    assert session.closed


def test_missing_ack_times_out_after_five_seconds() -> None:
    session = AgentSession([pod("a")], 0.0)
    outs = session.datagram_received(_first(ProxySession().connection_made()), 1.0)
    assert isinstance(outs[-1], SendMessage)
    assert session.deadline == 6.0
    assert session.timer_fired(6.0)[0] == TimedOut("ack of add a")


def test_agent_rejects_unsolicited_ack_and_fds() -> None:
    session = AgentSession([], 0.0)
    session.datagram_received(_first(ProxySession().connection_made()), 0.0)
    session.datagram_received(Datagram(encode_response()), 0.0)  # acks SnapshotSent
    outs = session.datagram_received(Datagram(encode_response()), 0.0)
    assert isinstance(outs[0], ProtocolViolated)
    assert "no request in flight" in outs[0].error.reason
    other = AgentSession([], 0.0)
    outs = other.datagram_received(Datagram(_first(ProxySession().connection_made()).data, (9,)), 0.0)
    assert outs[0] == CloseFds((9,))
    assert other.closed


def test_delete_drops_a_queued_add_of_the_same_pod() -> None:
    session = AgentSession([], 0.0)
    session.datagram_received(_first(ProxySession().connection_made()), 0.0)  # SnapshotSent in flight
    assert session.submit_add(pod("a"), 0.0) == []
    assert session.submit_del("a", 0.0) == []
    outs = session.datagram_received(Datagram(encode_response()), 0.0)
    sent = [o for o in outs if isinstance(o, SendMessage)]
    assert len(sent) == 1 and sent[0].fds == ()


@given(st.lists(st.binary(max_size=64), max_size=6), st.lists(st.integers(0, 2), max_size=6))
def test_arbitrary_datagrams_never_raise_from_either_session(payloads: list[bytes], fd_counts: list[int]) -> None:
    proxy = ProxySession()
    proxy.connection_made()
    agent = AgentSession([pod("a")], 0.0)
    for i, payload in enumerate(payloads):
        fds = tuple(range(3, 3 + (fd_counts[i] if i < len(fd_counts) else 0)))
        for out in proxy.datagram_received(Datagram(payload, fds)):
            if isinstance(out, OpenPodListeners):
                proxy.listeners_opened(out.uid)
        agent.datagram_received(Datagram(payload, fds), float(i))


def _first(outputs: list[Output]) -> Datagram:
    sent = [o for o in outputs if isinstance(o, SendMessage)]
    return Datagram(sent[0].data, sent[0].fds)


def _acks(outputs: list[Output]) -> list[str]:
    errors = []
    for out in outputs:
        if isinstance(out, SendMessage):
            response = zds_pb2.WorkloadResponse()
            response.ParseFromString(out.data)
            errors.append(response.ack.error)
    return errors


def _drive(hub: AgentHub, conn_id: int, outputs: list[Output], proxies: dict[int, ProxySession]) -> None:
    _drive_routed(hub, [(conn_id, o) for o in outputs], proxies)


def _drive_routed(hub: AgentHub, routed: list[tuple[int, Output]], proxies: dict[int, ProxySession]) -> None:
    for conn_id, out in routed:
        if not isinstance(out, SendMessage):
            continue
        proxy = proxies[conn_id]
        replies = proxy.datagram_received(Datagram(out.data, out.fds))
        for reply in list(replies):
            if isinstance(reply, OpenPodListeners):
                replies.extend(proxy.listeners_opened(reply.uid))
        session = hub.find_session(conn_id)
        assert session is not None
        for reply in replies:
            if isinstance(reply, SendMessage):
                _drive(hub, conn_id, session.datagram_received(Datagram(reply.data, reply.fds), 0.0), proxies)


def _add(uid: str, fd: int) -> Datagram:
    message = zds_pb2.WorkloadRequest()
    message.add.uid = uid
    message.add.workload_info.name = INFO.name
    message.add.workload_info.namespace = INFO.namespace
    message.add.workload_info.service_account = INFO.service_account
    return Datagram(message.SerializeToString(), (fd,))


def _keep(uid: str) -> Datagram:
    message = zds_pb2.WorkloadRequest()
    message.keep.uid = uid
    return Datagram(message.SerializeToString())


def _del(uid: str, fds: tuple[int, ...] = ()) -> Datagram:
    message = zds_pb2.WorkloadRequest()
    getattr(message, "del").uid = uid
    return Datagram(message.SerializeToString(), fds)


def _snapshot_sent() -> Datagram:
    message = zds_pb2.WorkloadRequest()
    message.snapshot_sent.SetInParent()
    return Datagram(message.SerializeToString())


def test_protocol_error_names_its_blame() -> None:
    assert ProtocolError("x").blame is Blame.PEER


class _Node:
    """A hub and its proxies joined in memory, driven as the server drives them: after every input the hub tells
    older proxies about successors (:meth:`AgentHub.tell_successors`)."""

    def __init__(self) -> None:
        self.hub = AgentHub()
        self.proxies: dict[int, ProxySession] = {}
        self.now = 0.0

    def connect(self, cid: int, *, notices: bool = True, hello: bool = True) -> None:
        self.proxies[cid] = ProxySession()
        self.hub.connect(cid, self.now)
        first = self.proxies[cid].connection_made()
        assert isinstance(first[-1], SendMessage)
        if hello:
            self.hello(cid, notices)

    def hello(self, cid: int, notices: bool = True) -> None:
        session = self.hub.find_session(cid)
        assert session is not None
        data = encode_hello(successor_notice=notices)
        _drive(self.hub, cid, session.datagram_received(Datagram(data), self.now), self.proxies)
        self.settle()

    def disconnect(self, cid: int) -> None:
        self.hub.disconnect(cid)
        self.proxies[cid].connection_lost()
        self.settle()

    def settle(self) -> list[int]:
        """Tell successors until nothing changes; the connection ids that were told something."""
        told: list[int] = []
        while routed := self.hub.tell_successors(self.now):
            told += [cid for cid, out in routed if isinstance(out, SendMessage)]
            _drive_routed(self.hub, routed, self.proxies)
        return told


def test_an_older_proxy_hears_of_its_successor_once_the_successor_holds_the_snapshot_and_when_it_goes() -> None:
    node = _Node()
    node.hub.pod_added(pod("a", 50), 0.0)
    node.connect(1)
    assert node.settle() == [] and node.proxies[1].successor is False
    node.connect(2, hello=False)  # connected, its snapshot not sent yet: not a successor
    assert node.settle() == [] and node.proxies[1].successor is False
    node.hello(2)  # the snapshot goes out and is acked within the drive: now it holds every pod
    assert node.proxies[1].successor is True and node.proxies[2].successor is False
    assert node.settle() == []  # told once
    node.disconnect(2)
    assert node.proxies[1].successor is False


def test_a_proxy_whose_hello_asked_for_no_notice_hears_none_as_upstream_ztunnel_would() -> None:
    node = _Node()
    node.connect(1, notices=False)
    node.connect(2)
    assert node.settle() == [] and node.proxies[1].successor is False
    node.connect(3)  # the notice-asking 2 has a successor now
    assert node.proxies[2].successor is True and node.proxies[1].successor is False


def test_the_successor_notice_is_acked_and_counts_as_a_request() -> None:
    node = _Node()
    node.connect(1)
    node.connect(2)
    session = node.hub.find_session(1)
    assert session is not None and session.deadline is None and session.state is AgentState.LIVE


def test_a_proxy_that_reconnects_forgets_its_successor_until_told_again() -> None:
    proxy = ProxySession()
    proxy.connection_made()
    proxy.datagram_received(_snapshot_sent())
    outs = proxy.datagram_received(_successor(True))
    assert SuccessorReported(True) in outs and proxy.successor is True
    assert any(isinstance(o, SendMessage) for o in outs)  # the ack
    proxy.connection_lost()
    assert proxy.connection_made()[0] == SuccessorReported(False) and proxy.successor is False


@given(st.lists(st.tuples(st.sampled_from(["connect", "disconnect"]), st.integers(1, 5)), max_size=25))
def test_every_proxy_that_asked_knows_whether_a_later_one_holds_the_snapshot(steps: list[tuple[str, int]]) -> None:
    node = _Node()
    node.hub.pod_added(pod("a", 60), 0.0)
    next_id = 0
    for action, pick in steps:
        open_ids = sorted(node.proxies)
        if action == "connect" or not open_ids:
            next_id += 1
            node.connect(next_id)
        else:
            gone = open_ids[pick % len(open_ids)]
            node.disconnect(gone)
            del node.proxies[gone]
    for cid, proxy in node.proxies.items():
        assert proxy.successor is any(other > cid for other in node.proxies), (cid, sorted(node.proxies))


def _successor(ready: bool) -> Datagram:
    message = zds_pb2.WorkloadRequest()
    message.successor_ready.SetInParent()
    message.successor_ready.ready = ready
    return Datagram(message.SerializeToString())


def test_a_fan_out_hub_sends_new_pods_to_every_proxy_and_deletes_to_all() -> None:
    node = _Node()
    node.hub = AgentHub(fan_out=True)
    node.connect(1)
    node.connect(2)
    routed = node.hub.pod_added(pod("a", 70), 1.0)
    assert sorted(cid for cid, out in routed if isinstance(out, SendMessage)) == [1, 2]
    _drive_routed(node.hub, routed, node.proxies)
    assert set(node.proxies[1].pods) == set(node.proxies[2].pods) == {"a"}
    node.connect(3)  # a worker started later (or again) gets the pod in its snapshot
    assert set(node.proxies[3].pods) == {"a"}
    routed = node.hub.pod_deleted("a", 2.0)
    _drive_routed(node.hub, routed, node.proxies)
    assert all(proxy.pods == {} for proxy in node.proxies.values())
    assert node.hub.pod_added(pod("b", None), 3.0) == []  # no netns yet: nothing to send to anyone


def test_a_fan_out_hub_tells_every_proxy_the_successor_answer_it_was_given_not_one_about_its_peers() -> None:
    node = _Node()
    node.hub = AgentHub(fan_out=True)
    node.connect(1)
    node.connect(2)
    node.connect(3, notices=False)
    assert node.settle() == [] and not any(p.successor for p in node.proxies.values())  # peers: no successor
    node.hub.set_successor(True)
    assert sorted(node.settle()) == [1, 2]
    assert node.proxies[1].successor and node.proxies[2].successor and not node.proxies[3].successor
    node.connect(4)  # a worker (re)started during a hand-over hears it too
    assert node.proxies[4].successor is True
    node.hub.set_successor(False)
    node.settle()
    assert not any(p.successor for p in node.proxies.values())
