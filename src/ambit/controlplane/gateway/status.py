"""The status of waypoint Gateways and of their GatewayClass, as istiod writes them (spec §10.3), decided without
I/O.

Theory of operation: the controller tells :func:`gateway_status` what it found for one Gateway (a
:class:`Deployed`: whether its Service exists, whether its Deployment has a ready replica, or the problem that
stopped it) and gets the whole wanted ``status``; :func:`plan_status` compares it with the status the Gateway
has and returns the merge patch to write, or None. :func:`class_status` does the same for a GatewayClass.

Rules:

1. Gateway conditions, each with ``observedGeneration`` = the Gateway's ``metadata.generation``:
   ``Accepted`` True/``Accepted`` "Resource accepted" (``ListenersNotValid`` when some listener is invalid,
   False when all are; False/``InvalidParameters`` before that when its ``parametersRef`` is unusable, with
   istiod's message); ``Programmed`` (below); ``ResolvedRefs`` True/``ResolvedRefs`` "All references
   resolved".
2. ``Programmed``: a problem (an unrenderable Gateway, an object someone else owns, an API server refusal) is
   False/``Invalid`` with the problem as message; no Service yet is False/``AddressNotUsable`` ("hostname ... not
   found"); a Service but no ready replica False/``AddressNotAssigned`` ("no instances found for hostname ...");
   a ready replica True/``Programmed`` "Resource programmed, assigned to service(s) <host>:15008".
3. ``status.addresses`` once Programmed: the Service's cluster IPs (``IPAddress``, every family, sorted as text)
   then ``{type: Hostname, value: <name>.<ns>.svc.<domain>}``, as istiod reports both for the waypoint class (its
   address type is unset: "consumers choose"), so ``kubectl get gateway`` shows the IP as for Istio; as in
   istiod, addresses once reported stay while the Gateway is otherwise fine (a waypoint scaled to zero keeps
   them), and go when there is a problem.
4. One listener status per listener with a string name: ``attachedRoutes`` as counted by the caller,
   ``supportedKinds`` by its protocol as istiod lists them (:mod:`ambit.controlplane.translate.route_kinds`: none
   for the HBONE listener), and
   conditions ``Accepted`` (False/``UnsupportedProtocol`` unless port 15008 protocol HBONE), ``Conflicted``
   False/``NoConflicts``, ``Programmed`` True and ``ResolvedRefs`` True, or False/``InvalidRouteKinds`` when its
   ``allowedRoutes.kinds`` names a kind it does not support.
5. ``lastTransitionTime`` changes only when a condition's status flips or it is new; conditions of other types
   (another controller's) are kept, except the types the wanted status lists as ``retired`` (ours, no longer
   true: removed, as istiod removes them). Nothing is written when everything but the transition times is as
   wanted.
6. A GatewayClass handled by this controller gets ``Accepted`` True/``Accepted`` "Handled by Istio controller".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.gateway.render import service_hostname
from ambit.controlplane.translate.ingress import listener_admits
from ambit.controlplane.translate.route_kinds import ALL_ROUTE_KINDS, INVALID_ROUTE_KINDS, supported_kinds

__all__ = [
    "Deployed",
    "attached_routes",
    "class_status",
    "cluster_ips",
    "condition",
    "dig",
    "gateway_status",
    "invalid_parameters",
    "listeners_of",
    "plan_status",
]

Obj = Mapping[str, Any]

HBONE_PORT = 15008
GATEWAY_GROUP = "gateway.networking.k8s.io"
MESSAGE_MAX = 1024
"""Problems (an API server's refusal may be long) are cut to this many characters in a condition's message."""
WAYPOINT_LISTENER_MESSAGE = 'Expected a single listener on port 15008 with protocol "HBONE"'


@dataclass(frozen=True, slots=True)
class Deployed:
    """What the controller found for one Gateway."""

    service_exists: bool = False
    ready: bool = False
    """Its Deployment reports at least one ready replica."""
    problem: str | None = None
    cluster_ips: tuple[str, ...] = ()
    """Its Service's cluster IPs (rule 3), as the Service lists them."""
    invalid_parameters: str | None = None
    """Why the Gateway's ``parametersRef`` cannot be used (:mod:`.overlay` rule 1): its ``Accepted`` says so."""


def cluster_ips(service: Obj | None) -> tuple[str, ...]:
    """Rule 3: a Service's cluster IPs (``spec.clusterIPs``, else ``spec.clusterIP``); none for a headless Service
    or text that is not an address."""
    spec = (service or {}).get("spec")
    if not isinstance(spec, Mapping):
        return ()
    listed = spec.get("clusterIPs")
    values = listed if isinstance(listed, list) and listed else [spec.get("clusterIP")]
    out: list[str] = []
    for value in values:
        if isinstance(value, str) and len(value) <= 64:
            try:
                out.append(str(ipaddress.ip_address(value)))
            except ValueError:
                continue  # "None" (headless) or garbage
    return tuple(out)


def condition(type_: str, ok: bool, reason: str, message: str, generation: Any) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation if isinstance(generation, int) else 0,
    }


def invalid_parameters(message: str, generation: Any) -> dict[str, Any]:
    """``Accepted`` False/``InvalidParameters`` (rule 1)."""
    return condition("Accepted", False, "InvalidParameters", message[:MESSAGE_MAX], generation)


def dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...``, or None where a level is missing or not a map."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def listeners_of(gateway: Obj) -> list[Mapping[str, Any]]:
    listeners = dig(gateway, "spec", "listeners")
    return [item for item in listeners if isinstance(item, Mapping)] if isinstance(listeners, list) else []


def _is_waypoint_listener(listener: Obj) -> bool:
    return listener.get("port") == HBONE_PORT and listener.get("protocol") == "HBONE"


def gateway_status(
    gateway: Obj, found: Deployed, *, domain: str, attached: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The wanted ``status`` of a waypoint Gateway (rules 1-4), without transition times."""
    meta = gateway.get("metadata") or {}
    generation = meta.get("generation")
    host = service_hostname(str(meta.get("name", "")), str(meta.get("namespace", "")), domain)
    listeners = listeners_of(gateway)
    valid = sum(1 for item in listeners if _is_waypoint_listener(item))
    if found.invalid_parameters is not None:
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
    if found.problem is not None:
        programmed = condition("Programmed", False, "Invalid", found.problem[:MESSAGE_MAX], generation)
    elif not found.service_exists:
        message = f'Failed to assign to any requested addresses: hostname "{host}" not found'
        programmed = condition("Programmed", False, "AddressNotUsable", message, generation)
    elif not found.ready:
        message = f'Failed to assign to any requested addresses: no instances found for hostname "{host}"'
        programmed = condition("Programmed", False, "AddressNotAssigned", message, generation)
    else:
        message = f"Resource programmed, assigned to service(s) {host}:{HBONE_PORT}"
        programmed = condition("Programmed", True, "Programmed", message, generation)
    resolved = condition("ResolvedRefs", True, "ResolvedRefs", "All references resolved", generation)
    status: dict[str, Any] = {"conditions": [accepted, programmed, resolved]}
    current = (gateway.get("status") or {}).get("addresses") if isinstance(gateway.get("status"), Mapping) else None
    if found.problem is None and found.ready:
        ips = [{"type": "IPAddress", "value": ip} for ip in sorted(set(found.cluster_ips))]
        status["addresses"] = [*ips, {"type": "Hostname", "value": host}]
    elif found.problem is None and isinstance(current, list) and current:
        status["addresses"] = current  # never taken back while the Gateway is fine (rule 3)
    status["listeners"] = [
        _listener_status(item, generation, (attached or {}).get(str(item.get("name")), 0))
        for item in listeners
        if isinstance(item.get("name"), str)
    ]
    return status


def _listener_status(listener: Obj, generation: Any, attached: int) -> dict[str, Any]:
    ok = _is_waypoint_listener(listener)
    accepted = (
        condition("Accepted", True, "Accepted", "No errors found", generation)
        if ok
        else condition("Accepted", False, "UnsupportedProtocol", WAYPOINT_LISTENER_MESSAGE, generation)
    )
    kinds, valid = supported_kinds(listener, ALL_ROUTE_KINDS)
    resolved = (True, "ResolvedRefs", "No errors found") if valid else INVALID_ROUTE_KINDS
    return {
        "name": listener["name"],
        "attachedRoutes": attached,
        "supportedKinds": kinds,
        "conditions": [
            accepted,
            condition("Conflicted", False, "NoConflicts", "No errors found", generation),
            condition("Programmed", True, "Programmed", "No errors found", generation),
            condition("ResolvedRefs", *resolved, generation),
        ],
    }


def class_status(gateway_class: Obj) -> dict[str, Any]:
    """Rule 6."""
    generation = (gateway_class.get("metadata") or {}).get("generation")
    return {"conditions": [condition("Accepted", True, "Accepted", "Handled by Istio controller", generation)]}


_COMPARED = ("type", "status", "reason", "message", "observedGeneration")


def _merge_conditions(current: Any, wanted: Sequence[dict[str, Any]], now: str) -> tuple[list[dict[str, Any]], bool]:
    """Rule 5 for one list of conditions: the list to write and whether it differs from ``current``."""
    have = [dict(c) for c in current if isinstance(c, Mapping)] if isinstance(current, list) else []
    changed = not isinstance(current, list) or len(have) != len(current)
    for want in wanted:
        index = next((i for i, c in enumerate(have) if c.get("type") == want["type"]), None)
        new = {**want, "lastTransitionTime": now}
        if index is None:
            have.append(new)
            changed = True
            continue
        old = have[index]
        if all(old.get(k) == new[k] for k in _COMPARED):
            continue
        if old.get("status") == new["status"] and isinstance(old.get("lastTransitionTime"), str):
            new["lastTransitionTime"] = old["lastTransitionTime"]
        have[index] = new
        changed = True
    return have, changed


def plan_status(obj: Obj, wanted: Mapping[str, Any], now: str) -> dict[str, Any] | None:
    """The merge patch that gives ``obj`` the ``wanted`` status (rule 5), or None when it has it already."""
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    out: dict[str, Any] = {}
    changed = False
    conditions, differs = _merge_conditions(status.get("conditions"), wanted.get("conditions") or (), now)
    retired = wanted.get("retired") or ()
    kept = [c for c in conditions if c.get("type") not in retired]
    out["conditions"] = kept
    changed |= differs or len(kept) != len(conditions)
    if "listeners" in wanted:
        have = status.get("listeners")
        old_listeners = {
            item.get("name"): item for item in (have if isinstance(have, list) else ()) if isinstance(item, Mapping)
        }
        listeners = []
        for want in wanted["listeners"]:
            old = old_listeners.get(want["name"]) or {}
            merged, differs = _merge_conditions(old.get("conditions"), want["conditions"], now)
            entry = {**want, "conditions": merged}
            changed |= differs or any(old.get(k) != entry[k] for k in ("attachedRoutes", "supportedKinds"))
            listeners.append(entry)
        changed |= len(old_listeners) != len(listeners)
        out["listeners"] = listeners or None  # none: removed, as istiod leaves the field out
        if not wanted.get("addressless"):
            addresses = wanted.get("addresses")
            changed |= status.get("addresses") != addresses
            out["addresses"] = addresses  # None removes them (a merge patch)
    if "attachedListenerSets" in wanted:
        count = wanted["attachedListenerSets"]
        changed |= status.get("attachedListenerSets") != count
        out["attachedListenerSets"] = count
    if not changed:
        return None
    meta = obj.get("metadata") or {}
    return {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": out}


def attached_routes(
    gateway: Obj,
    routes: Sequence[Obj],
    *,
    origin: tuple[str, str] = (GATEWAY_GROUP, "Gateway"),
    listeners: Sequence[Obj] | None = None,
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, int]:
    """How many of ``routes`` attach to each listener of ``gateway`` (rule 4): a ``parentRefs`` entry naming the
    Gateway (group and kind default to the Gateway API's), its ``sectionName`` and ``port`` when given, from a
    namespace the listener admits (``allowedRoutes.namespaces.from``: ``Same``, the default, ``All``, or
    ``Selector`` matched against ``namespace_labels``, namespace → labels, the Gateway's own namespace included
    only when selected, nothing when the selector does not parse; without ``namespace_labels``, ``Selector``
    counts the Gateway's own namespace only). Each route counts once per listener. For a ListenerSet,
    ``origin`` is its (group, kind) and ``listeners`` its listeners with their ports defaulted."""
    meta = gateway.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    counts: dict[str, int] = {}
    for listener in listeners_of(gateway) if listeners is None else listeners:
        lname = listener.get("name")
        if not isinstance(lname, str):
            continue
        allowed = dig(listener, "allowedRoutes", "namespaces", "from") or "Same"
        counts[lname] = 0
        for route in routes:
            rns = dig(route, "metadata", "namespace")
            if allowed == "Selector" and namespace_labels is not None:
                if not (isinstance(rns, str) and listener_admits(listener, str(namespace), rns, namespace_labels)):
                    continue
            elif rns != namespace and allowed != "All":
                continue
            refs = dig(route, "spec", "parentRefs")
            for ref in refs if isinstance(refs, list) else ():
                if (
                    isinstance(ref, Mapping)
                    and ref.get("group", GATEWAY_GROUP) == origin[0]
                    and ref.get("kind", "Gateway") == origin[1]
                    and ref.get("name") == name
                    and ref.get("namespace", rns) == namespace
                    and ref.get("sectionName", lname) == lname
                    and ref.get("port", listener.get("port")) == listener.get("port")
                ):
                    counts[lname] += 1
                    break
    return counts
