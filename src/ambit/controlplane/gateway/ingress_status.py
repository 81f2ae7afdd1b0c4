"""The status of an ingress Gateway (class ``istio``), as istiod writes it (spec §1.5, §10.3), decided without I/O.

Theory of operation: the controller tells :func:`ingress_status` what it found (a
:class:`~ambit.controlplane.gateway.status.Deployed` with the Service's load-balancer addresses) and the judged
listeners (:mod:`.listeners`); the result goes through the same
:func:`~ambit.controlplane.gateway.status.plan_status` as a waypoint's.

Rules:

1. ``Accepted``: False/``InvalidParameters`` when the Gateway's ``parametersRef`` is unusable; else
   True/``Accepted`` when every listener is programmed (istiod counts the listeners its ``buildListener`` found
   valid: accepted, references resolved, not conflicted), True/``ListenersNotValid`` when some are not,
   False/``ListenersNotValid`` when none is.
2. ``Programmed``: a problem is False/``Invalid``; no Service yet False/``AddressNotUsable``; a Service whose
   ``status.loadBalancer.ingress`` is still empty False/``AddressNotAssigned`` ("address pending"); otherwise
   True/``Programmed`` naming the Service and its ports ("<host>:443 and <host>:80": each ``<host>:<port>``, in
   text order, joined as istiod joins them, :func:`~.static_addresses.english_join`). Readiness of the pods does
   not count (istiod reports the Service's address, as a cloud load balancer would).
3. ``status.addresses``: each load-balancer ingress, ``IPAddress`` for an ``ip``, ``Hostname`` for a
   ``hostname``; none while there is a problem. A Service that is not of type ``LoadBalancer`` (the
   ``networking.istio.io/service-type`` annotation, :mod:`.render` rule 5) has no external address and waits for
   none: its in-cluster hostname is reported instead, as ``Hostname`` (istiod reports the internal addresses of
   the class's address type, ``Hostname`` for class ``istio``). That address is what makes the Gateway a
   waypoint candidate (a "sandwich", :mod:`ambit.controlplane.translate.waypoint_gateways` rule 1).
4. One listener status per judged listener: ``attachedRoutes`` as counted by the caller (by
   :func:`ingress_attached_routes`: the routes of a kind the listener supports that name it, from a namespace it
   admits, and, as istiod counts only the parents a route is accepted on, with a hostname that meets the
   listener's (:mod:`ambit.controlplane.translate.ingress` rule 3)), ``supportedKinds`` (by
   the listener's protocol whether or not it is accepted, as istiod lists them: a listener refused for want of a
   ReferenceGrant still lists HTTPRoute on HTTPS, one of an unknown protocol lists none;
   :mod:`ambit.controlplane.translate.route_kinds` among the kinds the ingress serves:
   HTTPRoute and GRPCRoute on HTTP and HTTPS, TLSRoute on TLS passthrough, TLSRoute and TCPRoute on TLS
   ``Terminate``, TCPRoute on TCP), and conditions
   ``Accepted``, ``Conflicted``, ``ResolvedRefs`` from the judgement (False/``InvalidRouteKinds`` instead when
   ``allowedRoutes.kinds`` names a kind it does not support, as istiod overrides it) and ``Programmed`` True
   exactly when the listener is ready (else False/``Invalid``, with istiod's "Bad TLS configuration" when its
   references did not resolve).
5. A Gateway whose ``spec.tls.frontend`` validates some port in ``AllowInsecureFallback`` mode has the condition
   ``InsecureFrontendValidationMode`` True (``ConfigurationChanged``), as istiod writes it; otherwise the condition
   is removed (``retired``, :func:`~.status.plan_status` rule 5).
6. A listener that loses a conflict (:mod:`ambit.controlplane.translate.listeners` rule 3) has the conditions
   istiod's ``ReportListenerConflict`` writes: ``Accepted`` False, ``Conflicted`` True and ``Programmed`` False,
   each with the conflict's reason and message, no ``ResolvedRefs`` (False/``InvalidRouteKinds`` when
   ``allowedRoutes.kinds`` names a kind it does not support), the ``supportedKinds`` of its protocol, and
   ``attachedRoutes`` 0 (istiod builds no route parent for it, whatever routes name it).
7. A ListenerSet naming one of our Gateways (:mod:`ambit.controlplane.translate.listener_sets`): refused (not
   admitted, or a parent of a class that takes none), ``Accepted`` and ``Programmed`` False with the refusal's
   reason and message and no listener status; with no listener programmed, both False/``ListenersNotValid``
   "None of the ListenerSet's listeners are valid"; otherwise ``Accepted`` True and ``Programmed`` as rule 2
   says of the parent's Service, naming the ports of its own programmed listeners; one listener status per
   listener, as rules 4 and 6 (``Same`` in ``allowedRoutes`` is the ListenerSet's namespace). No addresses.
8. The Gateway's ``ResolvedRefs`` (:mod:`ambit.controlplane.translate.listeners` rule 6) follows
   ``Programmed``; ``attachedListenerSets`` counts its valid ListenerSets (absent at zero), and rule 2's ports
   include the programmed listeners of those ListenerSets, as istiod's servers do.
9. A manual deployment (a Gateway whose ``spec.addresses`` name the Services of its proxies, nothing deployed:
   :mod:`.static_addresses`): ``Accepted`` is False/``UnsupportedAddress`` when an address of a type other than
   ``Hostname`` was ignored (before rule 1's other reasons), ``Programmed`` and ``status.addresses`` are judged
   from the named Services (:mod:`.static_addresses` rules 3-5) instead of rules 2 and 3, over the ports of rule
   8. With no ``Hostname`` address at all, only the conditions are written: the listeners, addresses and
   ``attachedListenerSets`` are left as they are (istiod returns before judging them).
10. A ListenerSet of a manual deployment: ``Accepted`` False/``UnsupportedAddress`` "Parent not accepted: <the
    parent's message>" when the parent ignored an address, else as rule 7; ``Programmed`` from the parent's
    Services on the ports of the ListenerSet's listeners that are not conflicted (an unresolved certificate
    counts, a TLS listener without ``tls`` does not: istiod's servers), ``ListenersNotValid`` taking precedence;
    with no
    ``Hostname`` address at all, only those two conditions are written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ambit.controlplane.gateway.static_addresses import (
    Bound,
    bound_programmed,
    english_join,
    load_balancer_addresses,
    reported_addresses,
)
from ambit.controlplane.gateway.status import (
    GATEWAY_GROUP,
    MESSAGE_MAX,
    Deployed,
    attached_routes,
    condition,
    dig,
    invalid_parameters,
    listeners_of,
)
from ambit.controlplane.translate.ingress import served_hostnames
from ambit.controlplane.translate.listener_sets import ListenerSetVerdict
from ambit.controlplane.translate.listeners import INSECURE_FALLBACK, JudgedListener
from ambit.controlplane.translate.route_kinds import INGRESS_ROUTE_KINDS, INVALID_ROUTE_KINDS, supported_kinds

__all__ = [
    "gateway_ports",
    "ingress_addresses",
    "ingress_attached_routes",
    "ingress_status",
    "insecure_frontend",
    "listener_set_server_ports",
    "listener_set_status",
    "listener_status",
    "load_balancer_addresses",
]


def ingress_addresses(service: Mapping[str, Any] | None, host: str) -> tuple[dict[str, str], ...]:
    """Rule 3: the Gateway addresses its Service gives, ``host`` being the Service's hostname."""
    if service is None:
        return ()
    spec = service.get("spec")
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if kind in (None, "LoadBalancer"):  # None: the API server's default is ClusterIP, but one not yet seen waits
        return load_balancer_addresses(service)
    return ({"type": "Hostname", "value": host},)


def ingress_attached_routes(
    gateway: Mapping[str, Any],
    routes: Mapping[str, Sequence[Any]],
    *,
    origin: tuple[str, str] = (GATEWAY_GROUP, "Gateway"),
    listeners: Sequence[Mapping[str, Any]] | None = None,
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, int]:
    """``attachedRoutes`` of each listener: the routes of each kind (``routes``: kind → objects) that name it, counted
    only for the kinds the listener supports and the routes whose hostnames meet its own (rule 4), as
    :func:`~.status.attached_routes` counts them. For a
    ListenerSet, ``origin`` is its (group, kind) and ``listeners`` its listeners, ports defaulted; ``namespace_labels``
    (namespace → labels) lets a ``Selector`` admit routes of other namespaces."""
    out: dict[str, int] = {}
    for listener in listeners_of(gateway) if listeners is None else listeners:
        name = listener.get("name")
        if not isinstance(name, str):
            continue
        kinds, _ = supported_kinds(listener, INGRESS_ROUTE_KINDS)
        out[name] = 0
        for kind in (k["kind"] for k in kinds):
            meeting = [r for r in routes.get(kind, ()) if _hostnames_meet(listener, kind, r)]
            out[name] += attached_routes(
                gateway, meeting, origin=origin, listeners=[listener], namespace_labels=namespace_labels
            ).get(name, 0)
    return out


def _hostnames_meet(listener: Mapping[str, Any], kind: str, route: Any) -> bool:
    """Rule 4: a route none of whose ``hostnames`` meets the listener's hostname is not attached there (a TCPRoute
    has none and always meets it)."""
    if kind == "TCPRoute" or not isinstance(route, Mapping):
        return True
    spec = route.get("spec")
    hostnames = spec.get("hostnames") if isinstance(spec, Mapping) else None
    names = tuple(h for h in hostnames if isinstance(h, str)) if isinstance(hostnames, list) else ()
    host = listener.get("hostname")
    return bool(served_hostnames(host.lower() if isinstance(host, str) else "", names))


INSECURE_FRONTEND = "InsecureFrontendValidationMode"


def insecure_frontend(gateway: Mapping[str, Any]) -> bool:
    """Rule 5: the Gateway's ``spec.tls.frontend`` validates some port with ``AllowInsecureFallback``."""
    spec = gateway.get("spec")
    tls = spec.get("tls") if isinstance(spec, Mapping) else None
    frontend = tls.get("frontend") if isinstance(tls, Mapping) else None
    if not isinstance(frontend, Mapping):
        return False
    per_port = frontend.get("perPort")
    configs = [frontend.get("default")]
    configs += [p.get("tls") for p in (per_port if isinstance(per_port, list) else ()) if isinstance(p, Mapping)]
    return any(
        isinstance(c, Mapping)
        and isinstance(c.get("validation"), Mapping)
        and c["validation"].get("mode") == INSECURE_FALLBACK
        for c in configs
    )


def gateway_ports(listeners: Sequence[JudgedListener], listener_sets: Sequence[ListenerSetVerdict] = ()) -> list[int]:
    """Rule 8: the ports the Gateway serves on, its own listeners' first, each once."""
    from_sets = [item.port for verdict in listener_sets if verdict.valid for item in verdict.judged if item.ready]
    return list(dict.fromkeys([*(item.port for item in listeners if item.port), *from_sets]))


def listener_set_server_ports(verdict: ListenerSetVerdict) -> list[int]:
    """Rule 10: the ports of a ListenerSet's listeners istiod builds a server for (not conflicted, not a TLS listener
    without ``tls``), each once."""
    return list(dict.fromkeys(item.port for item in verdict.judged if not item.conflicted[0] and not item.bad_tls))


def ingress_status(
    gateway: Mapping[str, Any],
    found: Deployed,
    listeners: Sequence[JudgedListener],
    *,
    host: str,
    addresses: Sequence[Mapping[str, str]],
    attached: Mapping[str, int] | None = None,
    listener_sets: Sequence[ListenerSetVerdict] = (),
    resolved: tuple[bool, str, str] = (True, "ResolvedRefs", "All references resolved"),
    bound: Bound | None = None,
) -> dict[str, Any]:
    """The wanted ``status`` (rules 1-9); ``host`` is the Service's hostname, ``resolved`` the Gateway's own
    ``ResolvedRefs`` (:func:`~ambit.controlplane.translate.listeners.backend_client_certificate`), ``bound`` a
    manual deployment's Services (rule 9)."""
    generation = (gateway.get("metadata") or {}).get("generation")
    valid = sum(1 for item in listeners if item.ready)  # istiod counts the listeners it programmed
    unsupported = bound.requested.unsupported if bound is not None else None
    if unsupported is not None:
        accepted = condition("Accepted", False, "UnsupportedAddress", unsupported[:MESSAGE_MAX], generation)
    elif found.invalid_parameters is not None:
        accepted = invalid_parameters(found.invalid_parameters, generation)
    elif listeners and valid == 0:
        accepted = condition(
            "Accepted", False, "ListenersNotValid", "None of the Gateway's listeners are valid", generation
        )
    elif valid < len(listeners):
        message = "One or more of the Gateway's listeners are invalid"
        accepted = condition("Accepted", True, "ListenersNotValid", message, generation)
    else:
        accepted = condition("Accepted", True, "Accepted", "Resource accepted", generation)
    valid_sets = [verdict for verdict in listener_sets if verdict.valid]
    ports = gateway_ports(listeners, listener_sets)
    if bound is not None:
        programmed = bound_programmed(bound, generation)
    else:
        programmed = _programmed(found, host, ports, addresses, generation)
    status: dict[str, Any] = {"conditions": [accepted, programmed, condition("ResolvedRefs", *resolved, generation)]}
    if insecure_frontend(gateway):
        message = "Gateway is operating in AllowInsecureFallback mode for frontend validation"
        status["conditions"].append(condition(INSECURE_FRONTEND, True, "ConfigurationChanged", message, generation))
    else:
        status["retired"] = [INSECURE_FRONTEND]
    if bound is not None and not bound.requested.services:
        return status  # rule 9: istiod stops here, leaving the listeners and addresses as they are
    status["attachedListenerSets"] = len(valid_sets) or None
    if bound is not None:
        current = dig(gateway, "status", "addresses")
        status["addresses"] = reported_addresses(gateway, bound.resolution) or current
    else:
        status["addresses"] = [dict(a) for a in addresses] if found.problem is None and addresses else None
    raw = {str(item.get("name")): item for item in listeners_of(gateway)}
    status["listeners"] = [
        listener_status(item, raw.get(item.name, {}), generation, (attached or {}).get(item.name, 0))
        for item in listeners
    ]
    return status


def _programmed(
    found: Deployed, host: str, ports: Iterable[int], addresses: Sequence[Mapping[str, str]], generation: Any
) -> dict[str, Any]:
    """Rule 2 (for a ListenerSet too, with its own ports)."""
    assigned = english_join(sorted({f"{host}:{port}" for port in ports}))
    if found.problem is not None:
        programmed = condition("Programmed", False, "Invalid", found.problem[:MESSAGE_MAX], generation)
    elif not found.service_exists:
        message = f'Failed to assign to any requested addresses: hostname "{host}" not found'
        programmed = condition("Programmed", False, "AddressNotUsable", message, generation)
    elif not addresses:
        message = (
            f"Assigned to service(s) {assigned}, but failed to assign to all requested addresses: "
            f'address pending for hostname "{host}"'
        )
        programmed = condition("Programmed", False, "AddressNotAssigned", message, generation)
    else:
        message = f"Resource programmed, assigned to service(s) {assigned}"
        programmed = condition("Programmed", True, "Programmed", message[:MESSAGE_MAX], generation)
    return programmed


def listener_set_status(
    verdict: ListenerSetVerdict,
    found: Deployed,
    *,
    host: str,
    addresses: Sequence[Mapping[str, str]],
    attached: Mapping[str, int] | None = None,
    bound: Bound | None = None,
) -> dict[str, Any]:
    """Rules 7 and 10: the wanted ``status`` of a ListenerSet whose parent is one of our Gateways; ``bound`` is the
    parent's Services when it is a manual deployment, resolved on the ListenerSet's own ports."""
    generation = (verdict.obj.get("metadata") or {}).get("generation")
    if verdict.refusal is not None:
        reason, message = verdict.refusal
        conditions = [
            condition("Accepted", False, reason, message, generation),
            condition("Programmed", False, reason, message, generation),
        ]
        return {"conditions": conditions, "listeners": [], "addressless": True}
    unsupported = bound.requested.unsupported if bound is not None else None
    invalid = "None of the ListenerSet's listeners are valid"
    if unsupported is not None:
        message = f"Parent not accepted: {unsupported}"[:MESSAGE_MAX]
        accepted = condition("Accepted", False, "UnsupportedAddress", message, generation)
    elif verdict.valid:
        accepted = condition("Accepted", True, "Accepted", "Resource accepted", generation)
    else:
        accepted = condition("Accepted", False, "ListenersNotValid", invalid, generation)
    if not verdict.valid and (bound is None or bound.requested.services):
        programmed = condition("Programmed", False, "ListenersNotValid", invalid, generation)
    elif bound is not None:
        programmed = bound_programmed(bound, generation)
        if not bound.requested.services:  # rule 10: istiod stops before judging the listeners
            return {"conditions": [accepted, programmed], "addressless": True}
    else:
        ports = [item.port for item in verdict.judged if item.ready]
        programmed = _programmed(found, host, ports, addresses, generation)
    listeners = [
        listener_status(item, verdict.raw.get(item.name, {}), generation, (attached or {}).get(item.name, 0))
        for item in verdict.judged
    ]
    return {"conditions": [accepted, programmed], "listeners": listeners, "addressless": True}


def listener_status(item: JudgedListener, raw: Mapping[str, Any], generation: Any, attached: int) -> dict[str, Any]:
    """Rules 4 and 6: one listener's entry, a Gateway's or a ListenerSet's."""
    if item.conflicted[0]:
        return _conflicted_listener(item, raw, generation)
    ok = item.ready
    kinds, valid = supported_kinds(raw, INGRESS_ROUTE_KINDS)  # by protocol, accepted or not, as istiod
    resolved = item.resolved if valid else INVALID_ROUTE_KINDS
    return {
        "name": item.name,
        "attachedRoutes": attached,
        "supportedKinds": kinds,
        "conditions": [
            condition("Accepted", *item.accepted, generation),
            condition("Conflicted", *item.conflicted, generation),
            condition(
                "Programmed",
                ok,
                "Programmed" if ok else "Invalid",
                "No errors found"
                if ok
                else "Bad TLS configuration"
                if not item.resolved[0] or item.bad_tls
                else "The listener is not served",
                generation,
            ),
            condition("ResolvedRefs", *resolved, generation),
        ],
    }


def _conflicted_listener(item: JudgedListener, raw: Mapping[str, Any], generation: Any) -> dict[str, Any]:
    """Rule 6: istiod's ``ReportListenerConflict``."""
    _, reason, message = item.conflicted
    kinds, valid = supported_kinds(raw, INGRESS_ROUTE_KINDS)
    conditions = [
        condition("Accepted", False, reason, message, generation),
        condition("Conflicted", True, reason, message, generation),
        condition("Programmed", False, reason, message, generation),
    ]
    if not valid:
        conditions.append(condition("ResolvedRefs", *INVALID_ROUTE_KINDS, generation))
    # istiod builds no parent for it, so no route attaches: 0 whatever names it
    return {"name": item.name, "attachedRoutes": 0, "supportedKinds": kinds, "conditions": conditions}
