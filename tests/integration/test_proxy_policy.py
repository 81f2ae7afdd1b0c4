"""L4 policy enforced by the node proxy's inbound side (spec §7.3), with real sockets, TLS and HBONE on loopback.

Each test serves pod ``apps/web`` (:mod:`tests.integration.inbound_rig`) with an echo application, sets the
proxy's policies the way the xDS client does (``ctx.policies`` then ``ctx.policies_changed()``) and checks what a
client sees: 401 on HBONE, a reset on plaintext, a closed long-lived connection after a policy change, the
``DENY`` response flag in the metrics and the reason in the access log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.inbound_rig import ACCESS_LOGGER, POD_IP, SERVER, TD, InboundProxy, inbound_proxy
from tests.unit.workload_builders import pod

from ambit.model.identity import SpiffeId
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, StringMatch
from ambit.proxy.hbone_client import HboneClient, TunnelRefusedError
from ambit.proxy.hbone_stream import HboneStream
from ambit.proxy.sockets import HostSocketFactory, connect
from ambit.proxy.streams import StreamClosedError
from ambit.rbac import NOT_ALLOWED

FACTORY = HostSocketFactory(mark=None)
FRIEND = SpiffeId(TD, "apps", "friend")
STRANGER = SpiffeId(TD, "evil", "default")


def rule(*matches: Match) -> Rule:
    return Rule((Clause(matches),))


def allow_principal(principal: str, name: str = "allow-friend") -> Policy:
    return Policy(
        name, "apps", Scope.NAMESPACE, Action.ALLOW, (rule(Match(principals=(StringMatch.exact(principal),))),)
    )


def deny_namespace(namespace: str, name: str = "deny-evil") -> Policy:
    return Policy(
        name, "apps", Scope.NAMESPACE, Action.DENY, (rule(Match(namespaces=(StringMatch.exact(namespace),))),)
    )


STATIC_STRICT = Policy(
    "istio_converted_static_strict",
    "istio-system",
    Scope.WORKLOAD_SELECTOR,
    Action.DENY,
    (rule(Match(not_principals=(StringMatch.presence(),))),),
)


def set_policies(proxy: InboundProxy, *policies: Policy) -> int:
    proxy.ctx.policies.replace_all(policies)
    return proxy.ctx.policies_changed()


@contextlib.asynccontextmanager
async def echo_app() -> AsyncIterator[int]:
    """An echo server on the pod's address; yields its port."""
    writers: set[asyncio.StreamWriter] = set()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            writers.discard(writer)

    server = await asyncio.start_server(echo, POD_IP, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in list(writers):
            writer.close()
        await server.wait_closed()


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[InboundProxy, int]]:
    async with echo_app() as port, inbound_proxy(tmp_path, plaintext_target=(POD_IP, port)) as proxy:
        yield proxy, port


async def hbone_client(proxy: InboundProxy, identity: SpiffeId) -> HboneClient:
    cert = await proxy.ca.fetch_certificate(identity)
    return await HboneClient.connect(await connect(FACTORY, proxy.hbone), cert, frozenset({SERVER}), trust_domain=TD)


async def echo_through(stream: HboneStream, payload: bytes = b"ping") -> bytes:
    await stream.write(payload)
    async with asyncio.timeout(5):
        return await stream.read()


async def tunnel_status(proxy: InboundProxy, identity: SpiffeId, port: int) -> int:
    """200 when a tunnel opens and echoes, else the refusal's status."""
    client = await hbone_client(proxy, identity)
    try:
        stream = await client.open_tunnel(f"{POD_IP}:{port}", [])
    except TunnelRefusedError as exc:
        await client.aclose()
        return exc.status
    try:
        assert await echo_through(stream) == b"ping"
        stream.abort()
        return 200
    finally:
        await client.aclose()


async def plaintext_echo(proxy: InboundProxy) -> bytes:
    """Send ``ping`` in plaintext (as an uncaptured client would); what comes back (b"" on a reset or close)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, proxy.plaintext)
        await loop.sock_sendall(sock, b"ping")
        async with asyncio.timeout(5):
            return await loop.sock_recv(sock, 4)
    except ConnectionResetError:
        return b""
    finally:
        sock.close()


def failed_with_deny(proxy: InboundProxy) -> int:
    text = proxy.ctx.metrics.render().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("istio_tcp_connections_failed_total{") and 'response_flags="DENY"' in line
    )


async def test_without_policies_every_peer_gets_in(mesh: tuple[InboundProxy, int]) -> None:
    proxy, port = mesh
    assert await tunnel_status(proxy, STRANGER, port) == 200
    assert await plaintext_echo(proxy) == b"ping"


async def test_an_allow_by_principal_lets_only_that_identity_in_and_a_refusal_is_a_401_counted_as_deny(
    mesh: tuple[InboundProxy, int], caplog: pytest.LogCaptureFixture
) -> None:
    proxy, port = mesh
    set_policies(proxy, allow_principal("cluster.local/ns/apps/sa/friend"))
    assert await tunnel_status(proxy, FRIEND, port) == 200
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        assert await tunnel_status(proxy, STRANGER, port) == 401
    assert failed_with_deny(proxy) == 1
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert any("connection failed" in line and NOT_ALLOWED in line for line in lines), lines
    # a plaintext client has no principal: refused with a reset
    assert await plaintext_echo(proxy) == b""
    assert failed_with_deny(proxy) == 2


async def test_a_deny_by_namespace_is_a_401_naming_the_policy(
    mesh: tuple[InboundProxy, int], caplog: pytest.LogCaptureFixture
) -> None:
    proxy, port = mesh
    set_policies(proxy, deny_namespace("evil"))
    assert await tunnel_status(proxy, FRIEND, port) == 200
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        assert await tunnel_status(proxy, STRANGER, port) == 401
    assert any("explicitly denied by: apps/deny-evil" in r.getMessage() for r in caplog.records)
    assert await plaintext_echo(proxy) == b"ping"  # no identity: not in namespace "evil"


async def test_the_static_strict_policy_refuses_plaintext_and_lets_mutual_tls_in(
    tmp_path: Path,
) -> None:
    strict_web = dataclasses.replace(
        pod("web", POD_IP, service_account="web", node="node-1"), authorization_policies=(STATIC_STRICT.key,)
    )
    async with echo_app() as port, inbound_proxy(tmp_path, strict_web, plaintext_target=(POD_IP, port)) as proxy:
        set_policies(proxy, STATIC_STRICT)
        assert await plaintext_echo(proxy) == b""
        assert await tunnel_status(proxy, STRANGER, port) == 200
        assert failed_with_deny(proxy) == 1


async def test_a_long_lived_tunnel_is_closed_within_a_second_of_a_deny_that_now_matches(
    mesh: tuple[InboundProxy, int],
) -> None:
    proxy, port = mesh
    friend = await hbone_client(proxy, FRIEND)
    stranger = await hbone_client(proxy, STRANGER)
    try:
        kept = await friend.open_tunnel(f"{POD_IP}:{port}", [])
        doomed = await stranger.open_tunnel(f"{POD_IP}:{port}", [])
        assert await echo_through(kept) == b"ping"
        assert await echo_through(doomed) == b"ping"
        assert len(proxy.ctx.guards) == 2
        started = time.monotonic()
        assert set_policies(proxy, deny_namespace("evil")) == 1
        with pytest.raises(StreamClosedError):  # the stream was reset by the proxy
            async with asyncio.timeout(1):
                await echo_through(doomed)
        assert time.monotonic() - started < 1.0
        assert await echo_through(kept, b"still") == b"still"
        assert len(proxy.ctx.guards) == 1
    finally:
        await friend.aclose()
        await stranger.aclose()


async def test_a_long_lived_plaintext_connection_is_closed_when_strict_mode_arrives(
    mesh: tuple[InboundProxy, int],
) -> None:
    proxy, _ = mesh
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, proxy.plaintext)
        await loop.sock_sendall(sock, b"ping")
        async with asyncio.timeout(5):
            assert await loop.sock_recv(sock, 4) == b"ping"
        assert set_policies(proxy, Policy("strict", "apps", Scope.NAMESPACE, Action.DENY, STATIC_STRICT.rules)) == 1
        async with asyncio.timeout(1):
            with contextlib.suppress(ConnectionResetError):
                assert await loop.sock_recv(sock, 4) == b""
    finally:
        sock.close()


async def test_a_policy_change_that_still_allows_keeps_the_connection(mesh: tuple[InboundProxy, int]) -> None:
    proxy, port = mesh
    client = await hbone_client(proxy, FRIEND)
    try:
        stream = await client.open_tunnel(f"{POD_IP}:{port}", [])
        assert await echo_through(stream) == b"ping"
        assert set_policies(proxy, allow_principal("cluster.local/ns/apps/sa/friend")) == 0
        assert await echo_through(stream, b"again") == b"again"
    finally:
        await client.aclose()


async def test_dry_run_policies_log_and_do_not_refuse(
    mesh: tuple[InboundProxy, int], caplog: pytest.LogCaptureFixture
) -> None:
    proxy, port = mesh
    dry = Policy("dry-deny", "apps", Scope.NAMESPACE, Action.DENY, deny_namespace("evil").rules, dry_run=True)
    set_policies(proxy, dry)
    with caplog.at_level(logging.INFO, logger="ambit.proxy.inbound"):
        assert await tunnel_status(proxy, STRANGER, port) == 200
    assert any("would be denied: explicitly denied by: apps/dry-deny" in r.getMessage() for r in caplog.records)
    assert failed_with_deny(proxy) == 0
