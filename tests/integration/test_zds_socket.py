"""ZDS over a real SOCK_SEQPACKET socketpair: netns fds cross the socket, bad datagrams are refused."""

from __future__ import annotations

import os
import socket

from ambit.zds.agent import AgentHub, PodEntry
from ambit.zds.commands import CloseConnection, OpenPodListeners, Output, StopPodProxy
from ambit.zds.events import ProtocolViolated, RequestAcked
from ambit.zds.protocol import Datagram, WorkloadInfo
from ambit.zds.proxy import ProxySession
from ambit.zds.transport import ZdsSocket

INFO = WorkloadInfo("web-0", "default", "web")


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


async def _exchange(agent: ZdsSocket, proxy: ZdsSocket, proxy_session: ProxySession, hub: AgentHub) -> list[Output]:
    """Deliver datagrams both ways until the agent has nothing in flight; return everything both sides reported."""
    seen: list[Output] = []
    session = hub.find_session(1)
    assert session is not None
    while session.deadline is not None and not session.closed:
        datagram = await proxy.receive()
        assert datagram is not None
        outputs = proxy_session.datagram_received(datagram)
        for out in list(outputs):
            if isinstance(out, OpenPodListeners):
                outputs.extend(proxy_session.listeners_opened(out.uid))
        await proxy.apply(outputs, seen.append)
        reply = await agent.receive()
        assert reply is not None
        await agent.apply(session.datagram_received(reply, 0.0), seen.append)
    return seen


async def test_add_carries_a_real_netns_fd_and_del_follows() -> None:
    a, p = _pair()
    agent, proxy = ZdsSocket(a), ZdsSocket(p)
    hub, proxy_session = AgentHub(), ProxySession()
    netns = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        session = hub.connect(1, 0.0)
        await proxy.apply(proxy_session.connection_made(), lambda _: None)
        hello = await agent.receive()
        assert hello is not None
        await agent.apply(session.datagram_received(hello, 0.0), lambda _: None)
        await _exchange(agent, proxy, proxy_session, hub)  # the (empty) snapshot

        await agent.apply([out for _, out in hub.pod_added(PodEntry("u1", INFO, netns), 1.0)], lambda _: None)
        seen = await _exchange(agent, proxy, proxy_session, hub)
        opened = [o for o in seen if isinstance(o, OpenPodListeners)]
        assert len(opened) == 1
        assert opened[0].fd != netns
        assert os.fstat(opened[0].fd).st_ino == os.fstat(netns).st_ino
        assert os.get_inheritable(opened[0].fd) is False  # received with MSG_CMSG_CLOEXEC
        os.close(opened[0].fd)
        assert RequestAcked("add", "u1") in seen

        await agent.apply([out for _, out in hub.pod_deleted("u1", 2.0)], lambda _: None)
        seen = await _exchange(agent, proxy, proxy_session, hub)
        assert StopPodProxy("u1") in seen
        assert RequestAcked("del", "u1") in seen
    finally:
        os.close(netns)
        await agent.aclose()
        await proxy.aclose()


async def test_garbage_is_nacked_and_closed_and_the_agent_takes_a_new_connection() -> None:
    a, p = _pair()
    agent, proxy = ZdsSocket(a), ZdsSocket(p)
    proxy_session = ProxySession()
    await proxy.apply(proxy_session.connection_made(), lambda _: None)
    await agent.send(b"\xff\xfe\xfd")
    datagram = await proxy.receive()
    assert datagram is not None
    seen: list[Output] = []
    await proxy.apply(proxy_session.datagram_received(datagram), seen.append)
    assert any(isinstance(o, ProtocolViolated) for o in seen)
    assert any(isinstance(o, CloseConnection) for o in seen)
    assert proxy.closed
    assert await agent.receive() is not None  # the hello
    nack = await agent.receive()
    assert nack is not None and nack.data
    assert await agent.receive() is None  # end of stream
    await agent.aclose()

    # the agent side serves a fresh connection
    hub = AgentHub()
    a2, p2 = _pair()
    agent2, proxy2 = ZdsSocket(a2), ZdsSocket(p2)
    session = hub.connect(1, 0.0)
    await proxy2.apply(proxy_session.connection_made(), lambda _: None)
    hello = await agent2.receive()
    assert hello is not None
    await agent2.apply(session.datagram_received(hello, 0.0), lambda _: None)
    seen = await _exchange(agent2, proxy2, proxy_session, hub)
    assert RequestAcked("snapshot_sent", "") in seen
    await agent2.aclose()
    await proxy2.aclose()


async def test_message_over_1024_bytes_is_rejected() -> None:
    a, p = _pair()
    agent, proxy = ZdsSocket(a), ZdsSocket(p)
    try:
        await agent.send(b"\x00" * 2000)
        datagram = await proxy.receive()
        assert datagram == Datagram(b"\x00" * 1024, (), truncated=True)
        seen: list[Output] = []
        session = ProxySession()
        session.connection_made()
        await proxy.apply(session.datagram_received(datagram), seen.append)
        violations = [o for o in seen if isinstance(o, ProtocolViolated)]
        assert violations and "over 1024" in violations[0].error.reason
    finally:
        await agent.aclose()
        await proxy.aclose()
