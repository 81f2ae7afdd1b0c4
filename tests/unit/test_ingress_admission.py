"""The ingress gateway's admission plan (:mod:`ambit.waypoint.ingress_admission`): which ports have a pending phase,
for how long, and what each refusal is called in the config dump."""

from __future__ import annotations

import pytest

from ambit.model.ingress import ListenerProtocol
from ambit.proxy.admission import Refusal, Ticket
from ambit.waypoint.ingress_admission import REFUSAL_WORDS, gateway_budget, pending_timeout, port_gate
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(
    max_connections=10,
    max_pending_handshakes=4,
    max_pending_handshakes_per_peer=2,
    max_connections_per_peer=6,
    handshake_timeout=3.0,
    request_headers_timeout=7.0,
)


@pytest.mark.parametrize(
    ("protocol", "kind", "handshake", "timeout"),
    [
        (ListenerProtocol.HTTPS, "gateway_https", True, 3.0),
        (ListenerProtocol.TLS, "gateway_tls", True, 3.0),
        (ListenerProtocol.HTTP, "gateway_http", True, 7.0),
        (ListenerProtocol.TCP, "gateway_tcp", False, 3.0),
    ],
)
def test_each_port_s_gate_has_its_protocol_s_pending_phase(
    protocol: ListenerProtocol, kind: str, handshake: bool, timeout: float
) -> None:
    gate = port_gate(protocol, LIMITS, gateway_budget(LIMITS, lambda listener, reason: None))
    assert (gate.kind, gate.handshake, gate.limits.handshake_timeout) == (kind, handshake, timeout)
    assert pending_timeout(protocol, LIMITS) == timeout
    assert (gate.limits.max_pending, gate.limits.max_pending_per_peer) == (4, 2)


def test_the_ports_share_one_budget_and_a_newcomer_evicts_the_oldest_pending_connection() -> None:
    seen: list[tuple[str, Refusal]] = []
    budget = gateway_budget(LIMITS, lambda listener, reason: seen.append((listener, reason)))
    https = port_gate(ListenerProtocol.HTTPS, LIMITS, budget)
    http = port_gate(ListenerProtocol.HTTP, LIMITS, budget)
    closed: list[int] = []
    tickets = []
    for n, gate in enumerate([https, https, http, http]):
        ticket = gate.admit(f"198.51.100.{n}")
        assert isinstance(ticket, Ticket)
        ticket.on_evict(lambda n=n: closed.append(n))
        tickets.append(ticket)
    assert budget.pending == 4
    newcomer = http.admit("198.51.100.9")
    assert isinstance(newcomer, Ticket) and closed == [0]  # the gateway's oldest, on another port
    assert seen == [("gateway_https", Refusal.EVICTED)]
    assert isinstance(http.admit("198.51.100.9"), Ticket)  # its second, evicting the next oldest
    assert http.admit("198.51.100.9") == Refusal.PEER_PENDING  # its third: over its share of pending places
    assert closed == [0, 1]


def test_every_refusal_has_a_word_in_the_config_dump() -> None:
    assert set(REFUSAL_WORDS) == set(Refusal)
    assert REFUSAL_WORDS[Refusal.NODE_PEER_CONNECTIONS] == "peer connection limit"
    assert REFUSAL_WORDS[Refusal.CONNECTIONS] == REFUSAL_WORDS[Refusal.NODE_CONNECTIONS] == "connection limit"
