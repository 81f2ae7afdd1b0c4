"""A DestinationRule's effect on one request (:mod:`ambit.waypoint.traffic_policy`) and on its connection
(:mod:`ambit.waypoint.origination`): the plan table, the load balancers, the PROXY header, TLS over an in-memory
stream pair."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import ssl
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.model.destination_policy import (
    ClientTls,
    ConnectionPool,
    ConsistentHash,
    DestinationPolicy,
    H2Upgrade,
    LoadBalancer,
    LoadBalancerType,
    ProxyProtocolVersion,
    Subset,
    TlsMode,
    TrafficPolicy,
)
from ambit.model.routes import BackendService
from ambit.model.workload import AppProtocol, Workload
from ambit.tls.certs import issue_client_cert, issue_server_cert, new_ca
from ambit.waypoint.destinations import PLAIN, Refusal, Transport
from ambit.waypoint.origination import (
    MAX_PEM_FILE,
    TlsOriginationError,
    TlsStream,
    client_context,
    proxy_header,
    read_pem_file,
)
from ambit.waypoint.traffic_policy import DEFAULT, BackendPolicy, Balancer, plan_backend, plan_upstream_h2

HOST = "reviews.app.svc.cluster.local"
KEY = f"app/{HOST}"
UPGRADE = ConnectionPool(h2_upgrade=H2Upgrade.UPGRADE)


def config(*rules: DestinationPolicy) -> dict[str, DestinationPolicy]:
    return {rule.service_key: rule for rule in rules}


def backend(subset: str = "", port: int = 80) -> BackendService:
    return BackendService("app", HOST, port, subset)


RULE = DestinationPolicy(
    KEY,
    "app/reviews",
    TrafficPolicy(tls=ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True)),
    (Subset("v1", frozenset({"w1"}), TrafficPolicy(connection_pool=UPGRADE)), Subset("v2", frozenset({"w2"}))),
)


@pytest.mark.parametrize(
    ("rules", "target", "upgrade", "expected"),
    [
        ((), backend(), False, DEFAULT),
        ((), backend("v1"), False, Refusal(503, f"subset v1 of {KEY}: no DestinationRule defines it")),
        ((RULE,), backend("v3"), False, Refusal(503, f"subset v3 of {KEY}: not defined by app/reviews")),
        (
            (RULE,),
            backend("v1"),
            False,
            BackendPolicy(
                frozenset({"w1"}),
                TrafficPolicy(connection_pool=UPGRADE, tls=ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True)),
                Transport(ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True), h2=True, sni=HOST),
                f"{KEY}/v1",
            ),
        ),
        (
            (RULE,),
            backend("v1"),
            True,  # a WebSocket upgrade is never sent as HTTP/2
            BackendPolicy(
                frozenset({"w1"}),
                TrafficPolicy(connection_pool=UPGRADE, tls=ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True)),
                Transport(ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True), h2=False, sni=HOST),
                f"{KEY}/v1",
            ),
        ),
        (
            (DestinationPolicy(KEY, "r", TrafficPolicy(tls=ClientTls(TlsMode.ISTIO_MUTUAL))),),
            backend(),
            False,
            BackendPolicy(None, TrafficPolicy(tls=ClientTls(TlsMode.ISTIO_MUTUAL)), PLAIN, f"{KEY}/"),
        ),
        (
            (DestinationPolicy(KEY, "r", TrafficPolicy(tls=ClientTls(TlsMode.MUTUAL, private_key="k"))),),
            backend(),
            False,
            BackendPolicy(
                None,
                TrafficPolicy(tls=ClientTls(TlsMode.MUTUAL, private_key="k")),
                Transport(ClientTls(TlsMode.MUTUAL, private_key="k"), sni=HOST),
                f"{KEY}/",
            ),
        ),
        (
            (DestinationPolicy(KEY, "r", TrafficPolicy(proxy_protocol=ProxyProtocolVersion.V2)),),
            backend(),
            False,
            BackendPolicy(
                None,
                TrafficPolicy(proxy_protocol=ProxyProtocolVersion.V2),
                Transport(proxy_protocol=ProxyProtocolVersion.V2),
                f"{KEY}/",
            ),
        ),
    ],
    ids=[
        "no rule",
        "subset, no rule",
        "undefined subset",
        "subset policy",
        "upgrade request",
        "ISTIO_MUTUAL",
        "MUTUAL",
        "PROXY",
    ],
)
def test_plan_backend(
    rules: tuple[DestinationPolicy, ...], target: BackendService, upgrade: bool, expected: object
) -> None:
    assert plan_backend(config(*rules), target, upgrade=upgrade) == expected


def test_a_racing_service_races_with_or_without_a_rule_and_keeps_the_rules_transport() -> None:
    plain = plan_backend({}, backend(), racing={KEY})
    assert isinstance(plain, BackendPolicy) and plain.transport == Transport(race_first_connect=True)
    assert plan_backend({}, backend(), racing={"app/other"}) is DEFAULT
    ruled = plan_backend(config(RULE), backend(), racing={KEY})
    unraced = plan_backend(config(RULE), backend())
    assert isinstance(ruled, BackendPolicy) and isinstance(unraced, BackendPolicy)
    assert ruled.transport.race_first_connect and not unraced.transport.race_first_connect
    assert ruled.transport.tls == unraced.transport.tls
    assert isinstance(plan_backend({}, backend("v1"), racing={KEY}), Refusal)  # a subset still needs a rule


def workloads(n: int) -> list[Workload]:
    return [Workload(uid=f"w{i}", name=f"w{i}", namespace="app", addresses=()) for i in range(n)]


def test_round_robin_cycles_in_uid_order_per_key() -> None:
    balancer = Balancer()
    choose = balancer.chooser(LoadBalancer(LoadBalancerType.ROUND_ROBIN), "k", lambda c: c[0], lambda: 0.0)
    candidates = workloads(3)[::-1]
    assert [choose(candidates).uid for _ in range(7)] == ["w0", "w1", "w2", "w0", "w1", "w2", "w0"]
    other = balancer.chooser(LoadBalancer(LoadBalancerType.ROUND_ROBIN), "k2", lambda c: c[0], lambda: 0.0)
    assert other(candidates).uid == "w0"


def test_round_robin_positions_are_bounded() -> None:
    balancer = Balancer(max_keys=4)
    for i in range(100):
        balancer.chooser(LoadBalancer(LoadBalancerType.ROUND_ROBIN), f"k{i}", lambda c: c[0], lambda: 0.0)(workloads(2))
    assert len(balancer.positions) == 4


def test_least_request_prefers_the_endpoint_with_fewer_in_flight() -> None:
    balancer = Balancer()
    draws = iter([0.0, 0.0] * 50)
    choose = balancer.chooser(LoadBalancer(), "k", lambda c: c[0], lambda: next(draws))
    pair = workloads(2)
    balancer.started("w0")
    assert choose(pair).uid == "w1"
    balancer.finished("w0")
    balancer.started("w1")
    assert choose(pair).uid == "w0"
    balancer.finished("w1")
    assert balancer.in_flight == {}


@given(st.lists(st.floats(0, 0.999999), min_size=2, max_size=2), st.integers(2, 6))
def test_least_request_picks_two_distinct_candidates(draws: list[float], n: int) -> None:
    balancer = Balancer()
    it = iter(draws)
    candidates = workloads(n)
    for w in candidates:
        balancer.started(w.uid)
    chosen = balancer.chooser(LoadBalancer(), "k", lambda c: c[0], lambda: next(it))(candidates)
    assert chosen in candidates


def test_consistent_hash_keeps_a_key_on_one_endpoint_and_moves_only_the_leavers_keys() -> None:
    balancer = Balancer()
    lb = LoadBalancer(consistent_hash=ConsistentHash(header_name="x-user"))
    five, four = workloads(5), workloads(4)
    before, after = {}, {}
    for user in range(200):
        headers = (("X-User", f"u{user}"),)
        before[user] = balancer.chooser(lb, "k", lambda c: c[0], lambda: 0.0, headers=headers)(five).uid
        again = balancer.chooser(lb, "k", lambda c: c[0], lambda: 0.0, headers=headers)(five).uid
        assert again == before[user]
        after[user] = balancer.chooser(lb, "k", lambda c: c[0], lambda: 0.0, headers=headers)(four).uid
    assert len(Counter(before.values())) == 5
    moved = {u for u in before if before[u] != after[u]}
    assert moved == {u for u in before if before[u] == "w4"}
    # No key: the default choice.
    assert balancer.chooser(lb, "k", lambda c: c[-1], lambda: 0.0)(five).uid == "w4"


def test_consistent_hash_on_a_query_parameter_and_the_source_ip() -> None:
    balancer = Balancer()
    by_query = LoadBalancer(consistent_hash=ConsistentHash(query_parameter="session"))
    picks = {
        balancer.chooser(by_query, "k", lambda c: c[0], lambda: 0.0, path=f"/p?a=1&session=s{i % 3}")(workloads(8)).uid
        for i in range(30)
    }
    assert len(picks) <= 3
    by_ip = LoadBalancer(consistent_hash=ConsistentHash(use_source_ip=True))
    first = balancer.chooser(by_ip, "k", lambda c: c[0], lambda: 0.0, source_ip="10.0.0.1")(workloads(8))
    assert balancer.chooser(by_ip, "k", lambda c: c[-1], lambda: 0.5, source_ip="10.0.0.1")(workloads(8)) == first


@pytest.mark.parametrize(
    ("version", "source", "destination", "expected"),
    [
        (ProxyProtocolVersion.V1, "10.0.0.1:5000", "10.0.0.2:80", b"PROXY TCP4 10.0.0.1 10.0.0.2 5000 80\r\n"),
        (ProxyProtocolVersion.V1, "[fd00::1]:5000", "[fd00::2]:80", b"PROXY TCP6 fd00::1 fd00::2 5000 80\r\n"),
        (ProxyProtocolVersion.V1, "10.0.0.1:5000", "[fd00::2]:80", b"PROXY UNKNOWN\r\n"),
        (ProxyProtocolVersion.V1, "junk", "10.0.0.2:80", b"PROXY UNKNOWN\r\n"),
        (
            ProxyProtocolVersion.V2,
            "10.0.0.1:5000",
            "10.0.0.2:80",
            b"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c"
            + ipaddress.IPv4Address("10.0.0.1").packed
            + ipaddress.IPv4Address("10.0.0.2").packed
            + b"\x13\x88\x00\x50",
        ),
        (ProxyProtocolVersion.V2, "junk", "10.0.0.2:80", b"\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00"),
    ],
)
def test_proxy_headers(version: ProxyProtocolVersion, source: str, destination: str, expected: bytes) -> None:
    assert proxy_header(version, source, destination) == expected


@given(st.text(max_size=60), st.text(max_size=60), st.sampled_from(list(ProxyProtocolVersion)))
def test_any_address_text_gives_a_header_never_an_error(
    source: str, destination: str, version: ProxyProtocolVersion
) -> None:
    header = proxy_header(version, source, destination)
    assert header.startswith(b"PROXY ") or header.startswith(b"\r\n\r\n\x00\r\nQUIT\n")
    assert b"\n" not in header[:-1] or version is ProxyProtocolVersion.V2


class _Pipe:
    """One end of an in-memory duplex byte stream."""

    def __init__(self, inbox: asyncio.Queue[bytes], outbox: asyncio.Queue[bytes]) -> None:
        self.inbox, self.outbox = inbox, outbox

    async def read(self) -> bytes:
        return await self.inbox.get()

    async def write(self, data: bytes | memoryview) -> None:
        self.outbox.put_nowait(bytes(data))

    def write_eof(self) -> None:
        self.outbox.put_nowait(b"")

    def abort(self) -> None:
        self.outbox.put_nowait(b"")

    async def aclose(self) -> None:
        self.outbox.put_nowait(b"")


def _pair() -> tuple[_Pipe, _Pipe]:
    a: asyncio.Queue[bytes] = asyncio.Queue()
    b: asyncio.Queue[bytes] = asyncio.Queue()
    return _Pipe(a, b), _Pipe(b, a)


async def _server(context: ssl.SSLContext, pipe: _Pipe) -> bytes:
    """A TLS server on the other end: completes the handshake, reads one line, answers ``pong:<line>``."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=True)
    shaken, received = False, b""
    while True:
        try:
            if not shaken:
                tls.do_handshake()
                shaken = True
            received += tls.read(1024)
            if received.endswith(b"\n"):
                tls.write(b"pong:" + received)
                await pipe.write(outgoing.read())
                return received
        except ssl.SSLWantReadError:
            if data := outgoing.read():
                await pipe.write(data)
            data = await pipe.read()
            if not data:
                return received
            incoming.write(data)
        except ssl.SSLError:
            if data := outgoing.read():
                await pipe.write(data)
            return received


@pytest.mark.parametrize("trusted", [True, False])
async def test_tls_over_a_byte_stream_verifies_the_backend_and_carries_bytes(trusted: bool, tmp_path: Path) -> None:
    ca = new_ca("ca", now=time.time())
    leaf = issue_server_cert(ca, common_name=HOST, dns_names=(HOST,), ip_addresses=(), now=time.time())
    (tmp_path / "leaf.pem").write_bytes(leaf.cert_pem + leaf.key_pem)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "leaf.pem")
    other = new_ca("other", now=time.time())
    anchor = (ca if trusted else other).cert_pem.decode()
    client_end, server_end = _pair()
    server = asyncio.create_task(_server(server_context, server_end))
    stream = TlsStream(client_end, client_context(ClientTls(TlsMode.SIMPLE, ca_certificates=anchor), h2=False), HOST)
    if not trusted:
        with pytest.raises(TlsOriginationError, match="certificate is not trusted: unable to get local issuer"):
            await stream.handshake()
        server.cancel()
        return
    await stream.handshake()
    assert stream.alpn is None or stream.alpn == "http/1.1"
    await stream.write(b"ping\n")
    assert await stream.read() == b"pong:ping\n"
    assert await server == b"ping\n"


def test_bad_ca_certificates_are_a_clear_error() -> None:
    pem = "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"
    with pytest.raises(TlsOriginationError, match="CA certificates do not load"):
        client_context(ClientTls(TlsMode.SIMPLE, ca_certificates=pem), h2=True)


def test_outlier_detection_ejects_for_longer_each_time_and_keeps_one_in() -> None:
    from ambit.model.destination_policy import OutlierDetection

    balancer = Balancer()
    detection = OutlierDetection(consecutive_5xx=2, interval=1.0, base_ejection_time=10.0, max_ejection_percent=10)
    for now in (0.0, 0.1):
        balancer.record("k", "w1", False, now, detection, 3)
    assert balancer.ejected("k", 0.2) == {"w1"}  # at least one may be ejected, whatever the percentage
    for now in (0.3, 0.4):
        balancer.record("k", "w2", False, now, detection, 3)
    assert balancer.ejected("k", 0.5) == {"w1"}  # 10 % of 3: no second one
    assert balancer.ejected("k", 10.2) == frozenset()
    for now in (11.0, 11.1):
        balancer.record("k", "w1", False, now, detection, 3)
    assert balancer.ejected("k", 30.0) == {"w1"} and balancer.ejected("k", 31.2) == frozenset()  # 2 x 10 s
    balancer.record("k", "w3", True, 40.0, detection, 3)
    assert "w3" not in balancer.outliers["k"]


def test_mutual_without_a_certificate_or_with_a_key_of_another_fails_the_context_without_quoting_it() -> None:
    ca = new_ca("client-ca", now=time.time())
    pair, other = (issue_client_cert(ca, common_name=n, now=time.time()) for n in ("a", "b"))
    with pytest.raises(TlsOriginationError, match="MUTUAL without a client certificate and key"):
        client_context(ClientTls(TlsMode.MUTUAL), h2=False)
    wrong = ClientTls(TlsMode.MUTUAL, client_certificate=pair.cert_pem.decode(), private_key=other.key_pem.decode())
    with pytest.raises(TlsOriginationError, match="do not load") as raised:
        client_context(wrong, h2=False)
    assert "PRIVATE KEY" not in str(raised.value) and other.key_pem.decode() not in repr(wrong)
    right = ClientTls(TlsMode.MUTUAL, client_certificate=pair.cert_pem.decode(), private_key=pair.key_pem.decode())
    assert client_context(right, h2=False).verify_mode is ssl.CERT_REQUIRED


def test_pem_files_must_be_small_regular_absolute_files(tmp_path: Path) -> None:
    big = tmp_path / "big.pem"
    big.write_bytes(b"-----BEGIN CERTIFICATE-----\n" + b"A" * (MAX_PEM_FILE + 1))
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = {
        "relative.pem": "not an absolute path",
        str(tmp_path / "missing.pem"): "No such file",
        str(tmp_path): "not a regular file",
        str(fifo): "not a regular file",
        "/dev/zero": "not a regular file",
        str(big): "larger than",
        str(secret): "not a PEM file",
    }
    for path, reason in cases.items():
        with pytest.raises(TlsOriginationError, match=reason) as raised:
            read_pem_file(path)
        assert "hunter2" not in str(raised.value)
    tls = ClientTls(TlsMode.SIMPLE, ca_certificates_path=str(secret))
    with pytest.raises(TlsOriginationError, match="not a PEM file"):
        client_context(tls, h2=False)


# Rule 8: the HTTP version spoken to the endpoint (Istio's cluster protocol; useClientProtocol is Envoy's
# use_downstream_protocol_config, istio cluster_builder.go setUpstreamProtocol and cluster_traffic_policy.go).

CLIENT = ConnectionPool(use_client_protocol=True)
CLIENT_AND_UPGRADE = ConnectionPool(use_client_protocol=True, h2_upgrade=H2Upgrade.UPGRADE)
H11, H2, GRPC_, UNKNOWN = AppProtocol.HTTP11, AppProtocol.HTTP2, AppProtocol.GRPC, AppProtocol.UNKNOWN


@pytest.mark.parametrize(
    ("declared", "client_h2", "pool", "upgraded", "upgrade", "follows", "expected"),
    [
        (H2, False, None, False, False, True, True),  # TestServices: HTTP/1.1 on the http2 port, h2c upstream
        (GRPC_, False, None, False, False, True, True),
        (H2, True, None, False, False, True, True),
        (H11, True, None, False, False, True, False),  # h2 client, HTTP/1.1 port: HTTP/1.1 upstream
        (H11, False, None, False, False, True, False),
        (H11, False, UPGRADE, True, False, True, True),  # h2UpgradePolicy UPGRADE
        (H11, False, UPGRADE, True, True, True, False),  # a WebSocket upgrade stays HTTP/1.1
        (H2, False, None, False, True, True, False),
        (UNKNOWN, True, None, False, False, True, True),  # a waypoint follows the client on an undeclared port
        (UNKNOWN, False, None, False, False, True, False),
        (UNKNOWN, True, None, False, False, False, False),  # a gateway speaks HTTP/1.1 there
        (H11, True, CLIENT, False, False, True, True),  # useClientProtocol: the client's version
        (H11, False, CLIENT, False, False, True, False),
        (H2, False, CLIENT, False, False, True, False),  # ... overriding the port's declaration
        (GRPC_, True, CLIENT, False, False, True, True),
        (UNKNOWN, True, CLIENT, False, False, False, True),  # ... also at a gateway
        (H11, False, CLIENT_AND_UPGRADE, False, False, True, False),  # ... and h2UpgradePolicy
    ],
)
def test_the_upstream_http_version_follows_istios_cluster_protocol(
    declared: AppProtocol,
    client_h2: bool,
    pool: ConnectionPool | None,
    upgraded: bool,
    upgrade: bool,
    follows: bool,
    expected: bool,
) -> None:
    got = plan_upstream_h2(
        declared, client_h2=client_h2, pool=pool, upgraded=upgraded, upgrade=upgrade, undeclared_follows_client=follows
    )
    assert got is expected


def test_use_client_protocol_turns_off_the_h2_upgrade_in_the_backend_plan() -> None:
    rule = DestinationPolicy(KEY, "r", TrafficPolicy(connection_pool=CLIENT_AND_UPGRADE))
    planned = plan_backend(config(rule), backend())
    assert isinstance(planned, BackendPolicy) and planned.transport.h2 is False
