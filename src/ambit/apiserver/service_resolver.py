"""Where the API server dials a webhook named by a Service reference: a ready endpoint of that Service, as
kube-apiserver does with ``--enable-aggregator-routing`` (the API server runs outside every node's Service rules,
so a cluster IP would not reach; pod addresses do).

Rules:
1. The Service must exist and have a port whose ``port`` is the reference's. The port dialled is the one the
   EndpointSlice gives under that port's name (the endpoints controller resolved ``targetPort`` there), else a
   numeric ``targetPort``. An ExternalName Service is refused.
2. Endpoints come from the EndpointSlices labelled ``kubernetes.io/service-name=<name>`` in the namespace; ready
   ones only (``conditions.ready`` not false), in the order the slices and their endpoints are stored; the first
   one wins (the webhook is retried by its caller, not here).
3. No ready endpoint is an error naming the Service, which the admission step reports as a failure to call the
   webhook (its failurePolicy then decides).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ambit.apiserver.store import Store
from ambit.errors import AmbitError

SERVICES = ("", "services")
ENDPOINT_SLICES = ("discovery.k8s.io", "endpointslices")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class NoEndpointError(AmbitError):
    """The Service has no ready endpoint to dial (or does not exist)."""


def resolve_service(
    service: Mapping[str, Any] | None, slices: Sequence[Mapping[str, Any]], namespace: str, name: str, port: int
) -> str:
    """Rules 1-3 over given objects (pure): ``https://<address>:<port>``."""
    if service is None:
        raise NoEndpointError(f'service "{name}" not found in namespace "{namespace}"')
    spec = _mapping(service.get("spec"))
    if spec.get("type") == "ExternalName":
        raise NoEndpointError(f'service "{namespace}/{name}" is an ExternalName service')
    target: Any = None
    port_name = ""
    for entry in _list(spec.get("ports")):
        if isinstance(entry, Mapping) and entry.get("port") == port:
            target = entry.get("targetPort", port)
            port_name = str(entry.get("name") or "")
            break
    else:
        raise NoEndpointError(f'service "{namespace}/{name}" has no port {port}')
    for eps in slices:
        number = next(
            (
                p["port"]
                for p in _list(eps.get("ports"))
                if isinstance(p, Mapping) and str(p.get("name") or "") == port_name and type(p.get("port")) is int
            ),
            target if type(target) is int else None,
        )
        if number is None:
            continue
        for endpoint in _list(eps.get("endpoints")):
            if not isinstance(endpoint, Mapping) or _mapping(endpoint.get("conditions")).get("ready") is False:
                continue
            for address in _list(endpoint.get("addresses")):
                if isinstance(address, str) and address:
                    host = f"[{address}]" if ":" in address else address
                    return f"https://{host}:{number}"
    raise NoEndpointError(f'service "{namespace}/{name}" has no ready endpoint for port {port}')


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class StoreServiceResolver:
    """Rules 1-3 over the API server's own store (called by the admission controller for each webhook call)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __call__(self, namespace: str, name: str, port: int) -> str:
        found = self.store.get(SERVICES, namespace, name)
        slices = [
            item.obj
            for item in self.store.items(ENDPOINT_SLICES, namespace)
            if (item.obj.get("metadata", {}).get("labels") or {}).get(SERVICE_NAME_LABEL) == name
        ]
        return resolve_service(found.obj if found is not None else None, slices, namespace, name, port)
