"""What the data path needs to know about the node proxy it runs in, given once when the proxy starts."""

from __future__ import annotations

from dataclasses import dataclass

from ambit.model.identity import DEFAULT_TRUST_DOMAIN
from ambit.tls.socket_transport import TlsTransportKind


@dataclass(frozen=True, slots=True)
class ProxySettings:
    node: str
    """The node this proxy serves (workloads with this ``node`` are local)."""
    network: str = ""
    """The network this node is on (addresses are looked up as ``network/IP``)."""
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    """The mesh's trust domain: peers from another one are refused."""
    tls_transport: TlsTransportKind = "socket"
    """HBONE's TLS transport, dialling and accepting: the event loop's or TLS on the socket itself."""
