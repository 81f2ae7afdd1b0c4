"""Ingress Gateways deployed by hand (Gateway API's static addresses; istiod's "manual deployment"): which
Gateways are, which Services they name, and which pods behind those Services serve them. Pure.

Theory of operation: a Gateway of class ``istio`` whose ``spec.addresses`` name a Service by hostname is served by
the proxies behind that Service, which the user deploys (``ambit gateway`` with ``GATEWAY_NAME`` set to the
Gateway's name): the deployment controller deploys nothing for it and judges its status from the Service
(:mod:`ambit.controlplane.gateway.static_addresses`), and the translation lets the pods behind the Service read its
config (:func:`backing_pod`).

Rules:

1. Managed (deployed by the controller): no addresses, or exactly one whose ``type`` is ``IPAddress`` or left out
   (that IP is the Service's ``loadBalancerIP``). Anything else (one ``Hostname``, several addresses, another type)
   is a manual deployment.
2. Requested services of a manual deployment: each ``Hostname`` address, a name without a dot being a Service of
   the Gateway's namespace (``<value>.<namespace>.svc.<domain>``). Addresses of any other type (``IPAddress``
   when none is given, as the CRD defaults it) are ignored.
3. Backing pods: the pods of the Gateway's namespace that a requested Service of that namespace selects (a
   non-empty ``spec.selector`` its labels hold), not being deleted and not finished. The first by name gives the
   config's reader (its ``serviceAccountName``, else ``default``) and the labels policies select the gateway by
   (:mod:`ambit.controlplane.translate.gateway_policies`); a pod of another account cannot read the config. No
   such pod: no reader, the config is served to no one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.fields import strings as _strings

__all__ = [
    "HOSTNAME",
    "IP_ADDRESS",
    "Requested",
    "backing_pod",
    "is_managed",
    "requested_services",
    "service_key",
]

Obj = Mapping[str, Any]

HOSTNAME = "Hostname"
IP_ADDRESS = "IPAddress"


def _addresses(gateway: Obj) -> list[Obj]:
    spec = gateway.get("spec")
    addresses = spec.get("addresses") if isinstance(spec, Mapping) else None
    return [a for a in addresses if isinstance(a, Mapping)] if isinstance(addresses, list) else []


def is_managed(gateway: Obj) -> bool:
    """Rule 1."""
    addresses = _addresses(gateway)
    if not addresses:
        return True
    return len(addresses) == 1 and addresses[0].get("type") in (None, IP_ADDRESS)


@dataclass(frozen=True, slots=True)
class Requested:
    """Rule 2: the Services a manual deployment is bound to (fully qualified hostnames, in the spec's order) and the
    values of the addresses ignored for their type."""

    services: tuple[str, ...]
    ignored: tuple[str, ...] = ()
    namespace: str = ""
    """The Gateway's: where its Services are looked for."""

    @property
    def unsupported(self) -> str | None:
        """``Accepted``'s message when some address was ignored."""
        return f"only Hostname is supported, ignoring [{' '.join(self.ignored)}]" if self.ignored else None


def requested_services(gateway: Obj, domain: str) -> Requested:
    """Rule 2 (for a Gateway that is not managed)."""
    namespace = str((gateway.get("metadata") or {}).get("namespace") or "")
    services: list[str] = []
    ignored: list[str] = []
    for address in _addresses(gateway):
        value = address.get("value")
        value = value if isinstance(value, str) else ""
        if (address.get("type") or IP_ADDRESS) != HOSTNAME:  # no type: the CRD's default, IPAddress
            ignored.append(value)
        elif "." in value:
            services.append(value)
        else:
            services.append(f"{value}.{namespace}.svc.{domain}")
    return Requested(tuple(services), tuple(ignored), namespace)


def service_key(hostname: str, domain: str) -> tuple[str, str] | None:
    """(namespace, name) of a Service hostname ``<name>.<namespace>.svc.<domain>``; None for any other name."""
    suffix = f".svc.{domain}"
    if not hostname.endswith(suffix):
        return None
    parts = hostname[: -len(suffix)].split(".")
    return (parts[1], parts[0]) if len(parts) == 2 and all(parts) else None


def backing_pod(requested: Requested, domain: str, services: Iterable[Obj], pods: Iterable[Obj]) -> Obj | None:
    """Rule 3: the first pod by name behind the requested Services of the Gateway's namespace."""
    names = {
        key[1] for host in requested.services if (key := service_key(host, domain)) and key[0] == requested.namespace
    }
    selectors = []
    for service in services:
        meta = service.get("metadata")
        spec = service.get("spec")
        if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
            continue
        if meta.get("namespace") == requested.namespace and meta.get("name") in names:
            selector = _strings(spec.get("selector"))
            if selector:
                selectors.append(selector)
    if not selectors:
        return None
    found: list[tuple[str, Obj]] = []
    for pod in pods:
        meta = pod.get("metadata")
        if (
            not isinstance(meta, Mapping)
            or meta.get("namespace") != requested.namespace
            or meta.get("deletionTimestamp")
        ):
            continue
        status = pod.get("status")
        if isinstance(status, Mapping) and status.get("phase") in ("Succeeded", "Failed"):
            continue
        labels = _strings(meta.get("labels"))
        if any(all(labels.get(k) == v for k, v in selector.items()) for selector in selectors):
            found.append((str(meta.get("name") or ""), pod))
    return min(found, key=lambda item: item[0])[1] if found else None
