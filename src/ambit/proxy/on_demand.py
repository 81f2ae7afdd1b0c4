"""What a connection needs the control plane to say before it can be planned, in on-demand mode (spec §4.2).

Theory of operation: a node proxy started with ``--xds-on-demand`` (ztunnel's ``XDS_ON_DEMAND``) subscribes to no
Address at start and asks for each one when a connection needs it: by ``network/IP`` alias for an address, by
``namespace/hostname`` for a waypoint's Service, by uid for a local pod's own workload. The control plane answers a
lookup with what it found (a Service comes with its endpoint workloads) or with the name in ``removed_resources``
("nothing there"), and keeps pushing changes of what the proxy asked for. The functions here are pure: they read
the state and name what is missing; :class:`~ambit.proxy.context.ProxyContext` asks and waits.

Rules:

1. An outbound connection to an IP that is no Service VIP (or range) and no workload address the state knows
   needs that IP's ``network/IP``.
2. Once the destination is known, each waypoint it names (its Services' and its workload's) that the state cannot
   find needs the waypoint's name: ``namespace/hostname`` for a Service, ``network/IP`` for an address.
3. An inbound connection's source is looked up by ``network/IP`` for its metrics labels; nothing waits on it for
   a decision (the peer's identity comes from its certificate).
4. The answer not coming in time fails the connection closed (outbound; counted): a destination the proxy cannot
   see could be a meshed one, and planning it as unknown would send its bytes in plaintext. The same reasoning
   makes a non-on-demand proxy wait for its first full view (:attr:`ProxyContext.synced`).
"""

from __future__ import annotations

from ambit.model.state import WorkloadState
from ambit.model.workload import GatewayAddress, IPAddress, NamespacedHostname, Workload

__all__ = ["address_alias", "outbound_needs"]


def address_alias(network: str, ip: IPAddress) -> str:
    """The ``network/IP`` name an address is looked up by (the control plane's Address aliases)."""
    return f"{network}/{ip}"


def _gateway_name(gateway: GatewayAddress) -> str:
    destination = gateway.destination
    if isinstance(destination, NamespacedHostname):
        return f"{destination.namespace}/{destination.hostname}"
    return address_alias(destination.network, destination.ip)


def outbound_needs(state: WorkloadState, network: str, ip: IPAddress, source: Workload | None) -> tuple[str, ...]:
    """The names to ask for before a connection from ``source`` to ``ip`` is planned (rules 1 and 2); empty
    when the state already has what the plan reads."""
    namespace = source.namespace if source is not None else None
    services = state.find_services_by_vip(network, ip, namespace)
    workload = state.find_workload_by_address(network, ip)
    if not services and workload is None:
        return (address_alias(network, ip),)
    gateways = [g for service in services for g in service.fronting_waypoints]
    if workload is not None and workload.waypoint is not None:
        gateways.append(workload.waypoint)
    return tuple(dict.fromkeys(_gateway_name(g) for g in gateways if state.find_gateway(g) is None))
