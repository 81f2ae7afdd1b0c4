"""Admission on the ingress gateway's listeners: the HBONE listeners' mechanism (:mod:`ambit.proxy.admission`).

Theory of operation: whoever reaches the gateway's address can open connections, and each costs the gateway a
task, buffers and, on an HTTPS port, a TLS handshake that a slow client may stretch out. So the gateway admits
connections as the node proxy and the waypoint admit HBONE ones: one :class:`~ambit.proxy.admission.NodeBudget`
for the gateway and one :class:`~ambit.proxy.admission.ListenerGate` per listener port, asked at accept before
anything is spent.

Rules:

1. The budget holds ``max_connections`` connections over every port, ``max_connections_per_peer`` of them from one
   address, and ``max_pending_handshakes`` pending ones (rule 2); more are reset at accept.
2. On a port whose clients must first show that they are clients, a connection is *pending* until it has: an
   HTTPS port's until its TLS handshake is done and the client judged (its certificate, on a mutual-TLS
   listener), a TLS passthrough port's until its whole ClientHello is read, a plain HTTP port's until its first
   request head is complete (the slowloris's stage). At most ``max_pending_handshakes`` are pending per port, and
   ``max_pending_handshakes_per_peer`` from one address; when a port's (or the gateway's) pending places are all
   taken, the newcomer evicts the oldest pending connection, which is closed, so a flood that keeps reopening
   connections cannot lock legitimate clients out (theirs take milliseconds). A TCP port's connection is
   established at accept.
3. A pending connection has a deadline from accept (:func:`pending_timeout`): ``handshake_timeout`` for a TLS
   handshake or a ClientHello (which ``sniff_timeout`` bounds too), ``request_headers_timeout`` for a first request
   head. An HTTPS connection, established with its handshake, then has ``request_headers_timeout`` for its first
   request head (:class:`~ambit.waypoint.settings.WaypointLimits`); established connections are never evicted.
4. Every refusal, eviction and expiry is counted by a word in the config dump's ``connection_refusals``
   (:data:`REFUSAL_WORDS`) and in ``ambit_listener_connections_refused_total{listener="gateway_<protocol>"}``.
"""

from __future__ import annotations

from collections.abc import Callable

from ambit.model.ingress import ListenerProtocol
from ambit.proxy.admission import ListenerGate, ListenerLimits, NodeBudget, Refusal
from ambit.waypoint.settings import WaypointLimits

REFUSAL_WORDS = {
    Refusal.CONNECTIONS: "connection limit",
    Refusal.NODE_CONNECTIONS: "connection limit",
    Refusal.NODE_PEER_CONNECTIONS: "peer connection limit",
    Refusal.PEER_PENDING: "peer pending limit",
    Refusal.PENDING: "pending limit",
    Refusal.NODE_PENDING: "pending limit",
    Refusal.EVICTED: "evicted",
}
"""Rule 4: the config dump's word for each refusal at accept (the first two were the gateway's words before)."""


def gateway_budget(limits: WaypointLimits, on_refused: Callable[[str, Refusal], None]) -> NodeBudget:
    """Rule 1: the budget every port of the gateway shares."""
    pending = min(limits.max_pending_handshakes, limits.max_connections)
    return NodeBudget(
        limits.max_connections,
        pending,
        on_refused,
        min(limits.max_connections_per_peer, limits.max_connections),
    )


def pending_timeout(protocol: ListenerProtocol, limits: WaypointLimits) -> float:
    """Rule 3: how long a connection of this port may stay pending."""
    return limits.request_headers_timeout if protocol is ListenerProtocol.HTTP else limits.handshake_timeout


def gate_kind(protocol: ListenerProtocol) -> str:
    """The ``listener`` label of a port's refusals: ``gateway_https`` and so on."""
    return f"gateway_{protocol.value.lower()}"


def port_gate(protocol: ListenerProtocol, limits: WaypointLimits, budget: NodeBudget) -> ListenerGate:
    """Rules 2 and 3: the gate of one listener port."""
    pending = min(limits.max_pending_handshakes, limits.max_connections)
    return ListenerGate(
        gate_kind(protocol),
        ListenerLimits(
            limits.max_connections,
            pending,
            min(limits.max_pending_handshakes_per_peer, pending),
            pending_timeout(protocol, limits),
        ),
        budget,
        handshake=protocol is not ListenerProtocol.TCP,
    )
