"""A service port's application protocol (``Port.app_protocol``, spec §4.1), as istiod derives it.

Rules (istiod's ``ConvertProtocol`` and ``toAppProtocolFromProtocol``):

1. A Kubernetes Service port: a UDP port has none (UNKNOWN). Otherwise the name to read is ``appProtocol`` when it
   is set, else the port's ``name``. Kubernetes' own ``appProtocol`` values map first: ``kubernetes.io/h2c`` is
   HTTP2, ``kubernetes.io/ws`` HTTP11, ``kubernetes.io/wss`` TLS.
2. The name is read up to its first ``-`` (``http-web`` is ``http``), case-insensitively (a ``grpc-web`` prefix is
   gRPC-Web, which has no Workload API value: UNKNOWN). ``http`` → HTTP11, ``http2`` → HTTP2, ``grpc`` → GRPC,
   ``https`` and ``tls`` → TLS, ``tcp`` → TCP; anything else (``udp``, ``mongo``, ``redis``, ``mysql``,
   ``http_proxy``, no name) is UNKNOWN, except on the well-known ports 25, 53, 3306 and 27017, which are TCP.
3. A ServiceEntry port's ``protocol`` is read whole with the same table (no prefix cut, no well-known ports).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ambit.model.workload import AppProtocol

__all__ = ["kube_port_app_protocol", "protocol_app_protocol"]

_BY_NAME = {
    "http": AppProtocol.HTTP11,
    "http2": AppProtocol.HTTP2,
    "grpc": AppProtocol.GRPC,
    "https": AppProtocol.TLS,
    "tls": AppProtocol.TLS,
    "tcp": AppProtocol.TCP,
}
_KUBERNETES_NAMES = {
    "kubernetes.io/h2c": AppProtocol.HTTP2,
    "kubernetes.io/ws": AppProtocol.HTTP11,
    "kubernetes.io/wss": AppProtocol.TLS,
}
_KNOWN_PROTOCOLS = {*_BY_NAME, "udp", "grpc-web", "http_proxy", "mongo", "redis", "mysql"}
"""Names istiod recognises; only an unrecognised one falls back to the well-known ports."""
_WELL_KNOWN_TCP_PORTS = frozenset({25, 53, 3306, 27017})


def protocol_app_protocol(name: str) -> AppProtocol:
    """The app protocol of an Istio protocol name (a ServiceEntry port's ``protocol``; rule 3)."""
    return _BY_NAME.get(name.lower(), AppProtocol.UNKNOWN)


def kube_port_app_protocol(port: Mapping[str, Any], number: int) -> AppProtocol:
    """The app protocol of one entry of a Kubernetes Service's ``spec.ports`` (rules 1 and 2)."""
    if str(port.get("protocol") or "TCP").upper() == "UDP":
        return AppProtocol.UNKNOWN
    declared = port.get("appProtocol")
    name = str(declared) if isinstance(declared, str) else str(port.get("name") or "")
    if isinstance(declared, str) and declared in _KUBERNETES_NAMES:
        return _KUBERNETES_NAMES[declared]
    if name[: len("grpc-web")].lower() == "grpc-web":
        return AppProtocol.UNKNOWN
    prefix = name.partition("-")[0].lower()
    if prefix not in _KNOWN_PROTOCOLS and number in _WELL_KNOWN_TCP_PORTS:
        return AppProtocol.TCP
    return _BY_NAME.get(prefix, AppProtocol.UNKNOWN)
