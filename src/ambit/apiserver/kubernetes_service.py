"""The ``default/kubernetes`` Service: how pods find the API server (kube-apiserver's own reconciler).

Rules:

1. The Service ``kubernetes`` in ``default`` has the first address of the Service range (the allocator never hands
   it to another Service, :mod:`ambit.apiserver.service_ips`), one port ``https`` 443 to the port the API server
   serves on, labels ``component: apiserver`` and ``provider: kubernetes``, and no selector.
2. Its EndpointSlice ``kubernetes`` (label ``kubernetes.io/service-name: kubernetes``, not the EndpointSlice
   controller's ``managed-by``, so that controller leaves it alone) lists the advertised address, ready, with that
   port. The mesh's control plane turns such a hand-made endpoint into a workload of its own, so a captured pod
   reaches ``kubernetes.default.svc`` like any Service.
3. Both are written at start when there is an address to advertise: ``--advertise-address``, else the listening
   address when it is one specific, non-loopback IP. An API server on loopback only has nothing pods could reach.
   At each start the Service's ports and the slice's endpoints and ports are brought back to these; the rest
   (labels added by users) is left as stored.
"""

from __future__ import annotations

import ipaddress

from ambit.apiserver.requests import JsonObject

NAME, NAMESPACE = "kubernetes", "default"
SERVICE_FIELDS = ("spec.ports",)
SLICE_FIELDS = ("endpoints", "ports", "addressType")


def kubernetes_address(service_cidr: str) -> str:
    """Rule 1: the first address of the Service range."""
    return str(ipaddress.ip_network(service_cidr.split(",", maxsplit=1)[0].strip()).network_address + 1)


def advertised_address(advertise: str, host: str) -> str:
    """Rule 3: the address to list as the API server's endpoint, or ``""`` when there is none."""
    if advertise:
        return str(ipaddress.ip_address(advertise))
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return ""
    return "" if address.is_loopback or address.is_unspecified else str(address)


def kubernetes_service(service_cidr: str, port: int) -> JsonObject:
    address = kubernetes_address(service_cidr)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"component": "apiserver", "provider": NAME}},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": address,
            "clusterIPs": [address],
            "sessionAffinity": "None",
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
        },
    }


def kubernetes_endpoint_slice(address: str, port: int) -> JsonObject:
    family = "IPv6" if ipaddress.ip_address(address).version == 6 else "IPv4"
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": NAME}},
        "addressType": family,
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
