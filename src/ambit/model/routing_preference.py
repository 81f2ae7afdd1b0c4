"""Which of a service's endpoints are close enough to a client to be picked: the service's routing preference.

Theory of operation: pure. A service in STRICT or FAILOVER mode (``LoadBalancing.mode``) names scopes, most
significant first (``routing_preference``; istiod sends ``[NETWORK, REGION, ZONE]`` for ``PreferClose``,
``[NODE]`` STRICT for ``internalTrafficPolicy: Local``). :func:`closest` ranks each eligible endpoint by what it
shares with the client workload and keeps the ones it may pick; the caller then chooses among them by capacity as
for any service. :func:`client_view` is the part of the client that ranking reads, so a caller can keep the result
per service and view (the outbound path does: :class:`ambit.model.state.WorkloadState`).

Rules (ztunnel's ``load_balance``):

1. Without a preference, or in UNSPECIFIED or PASSTHROUGH mode, every eligible endpoint stays.
2. An endpoint's rank is the number of consecutive scopes, in the preference's order, it shares with the client,
   stopping at the first it does not: REGION, ZONE and SUBZONE compare the localities' parts, NODE the node names,
   CLUSTER the cluster ids, NETWORK the networks. Values are compared as they are: two unknown (empty) ones match.
3. NETWORK as the first scope is special: an endpoint on another network does not stop the run there (the other
   scopes still count), and an endpoint on the client's network gets ``len(preference) - 1`` more, so it outranks
   every endpoint on another network.
4. STRICT keeps only the endpoints sharing every scope (rank ``len(preference)`` before rule 3's bonus); when none
   does there is no candidate: the connection has no healthy upstream, as any service without endpoints.
5. FAILOVER keeps the endpoints of the highest rank present: the closest ring while it has an eligible endpoint,
   the next one out when it has none (unhealthy or gone), and so on.
6. The endpoints kept stay in the order given (the state's uid order), so ``choose`` sees a stable sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ambit.model.workload import LoadBalancingMode, RoutingScope, Service, Workload

__all__ = ["MAX_ROUTING_SCOPES", "ClientView", "client_view", "closest", "weighs_preference"]

MAX_ROUTING_SCOPES = len(RoutingScope)
"""The longest preference a service may carry (the xDS and local config readers refuse longer ones): one of each
scope, as istiod never repeats one; it bounds the work of ranking an endpoint."""

ClientView = tuple[str, ...]
"""The client's value for each scope of a preference, in the preference's order."""

_VALUES: dict[RoutingScope, Callable[[Workload], str]] = {
    RoutingScope.REGION: lambda w: w.locality.region,
    RoutingScope.ZONE: lambda w: w.locality.zone,
    RoutingScope.SUBZONE: lambda w: w.locality.subzone,
    RoutingScope.NODE: lambda w: w.node,
    RoutingScope.CLUSTER: lambda w: w.cluster_id,
    RoutingScope.NETWORK: lambda w: w.network,
}

_WEIGHED = (LoadBalancingMode.STRICT, LoadBalancingMode.FAILOVER)


def weighs_preference(service: Service) -> bool:
    """Whether picking an endpoint of ``service`` depends on the client (rule 1)."""
    return bool(service.routing_preference) and service.load_balancing_mode in _WEIGHED


def client_view(service: Service, client: Workload) -> ClientView:
    """What :func:`closest` reads of ``client`` for ``service``'s preference."""
    return tuple(_VALUES[scope](client) for scope in service.routing_preference)


def _rank(preference: tuple[RoutingScope, ...], view: ClientView, endpoint: Workload) -> tuple[int, int]:
    """(scopes matched in a run, rule 3's bonus) of ``endpoint`` seen from ``view``."""
    network_first = preference[0] is RoutingScope.NETWORK
    rank = bonus = 0
    for index, scope in enumerate(preference):
        matches = _VALUES[scope](endpoint) == view[index]
        if index == 0 and network_first:
            if not matches:
                continue  # rule 3: another network does not end the run
            bonus = len(preference) - 1
        if not matches:
            break
        rank += 1
    return rank, bonus


def closest(service: Service, view: ClientView, candidates: Sequence[Workload]) -> list[Workload]:
    """The candidates a client with ``view`` may pick among (rules 1-6); empty only when STRICT finds no match or
    there was no candidate."""
    if not weighs_preference(service):
        return list(candidates)
    preference = service.routing_preference
    strict = service.load_balancing_mode is LoadBalancingMode.STRICT
    best = -1
    kept: list[Workload] = []
    for endpoint in candidates:
        rank, bonus = _rank(preference, view, endpoint)
        if strict and rank != len(preference):
            continue
        rank += bonus
        if rank > best:
            best, kept = rank, [endpoint]
        elif rank == best:
            kept.append(endpoint)
    return kept
