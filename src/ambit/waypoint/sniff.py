"""Which protocol a stream tunnelled to the waypoint speaks: declared by its Service port, else sniffed.

Istio's waypoint decides by the destination port's declared protocol and sniffs only when none is declared. The
control plane derives the declaration (``Port.app_protocol`` in the workload state, spec §4.1) with
:mod:`ambit.model.port_protocols`; :func:`protocol_for` reads a Kubernetes port with those same rules,
and :func:`declared_protocol` maps the workload state's value.

Rules:

1. Declared protocols: HTTP11 is HTTP/1.1, HTTP2 and GRPC are HTTP/2 (prior knowledge), TCP and TLS are opaque
   bytes (TLS the waypoint cannot read); UNKNOWN means sniff.
2. :func:`sniff` reads the first bytes the client sent. The HTTP/2 connection preface
   (``PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n``) is HTTP/2. An HTTP/1.x request line (a method token, one space, a
   request target of visible characters, one space, ``HTTP/1.`` and a digit, then CRLF or a bare LF) is HTTP/1.1.
   Bytes that can no longer become either are TCP, decided as soon as one byte rules both out (a TLS ClientHello's
   first byte does).
3. While the bytes are a prefix of either form, the answer is None: read more. The shell stops waiting when
   ``limit`` bytes have come without a decision (then TCP) or when its sniff timer fires: it calls again with
   ``final=True`` (also at end of stream), which turns every undecided answer into TCP. No bytes yet is undecided.
4. Sniffing never raises, whatever the bytes.
5. A port declared HTTP (HTTP/1.1, HTTP/2 or gRPC) takes both HTTP/1.1 and HTTP/2 with prior knowledge, as
   Envoy's automatic codec (Istio's waypoint listener) does: :func:`h2_prior_knowledge` is True for bytes that
   begin with the whole preface, False as soon as they stop being a prefix of it (or, ``final``, when no more
   will be read), None while they still are one. Nothing else is sniffed on such a port: whatever is not the
   preface is HTTP/1.1's to answer (400 for garbage), never relayed as opaque bytes. The declaration decides
   the protocol spoken upstream, not the client's (:func:`ambit.waypoint.traffic_policy.plan_upstream_h2`).
"""

from __future__ import annotations

import enum

from ambit.model.field_names import TCHAR_BYTES
from ambit.model.port_protocols import kube_port_app_protocol
from ambit.model.workload import AppProtocol

__all__ = [
    "H2_PREFACE",
    "SNIFF_LIMIT",
    "Protocol",
    "declared_protocol",
    "h2_prior_knowledge",
    "protocol_for",
    "sniff",
]

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SNIFF_LIMIT = 8192
"""Bytes read at most before deciding; a longer request line than this is not HTTP the waypoint will take."""

_VISIBLE = frozenset(range(0x21, 0x7F))
_VERSION = b"HTTP/1."
_DIGITS = frozenset(b"0123456789")


class Protocol(enum.Enum):
    HTTP1 = "HTTP/1.1"
    HTTP2 = "HTTP/2"
    TCP = "TCP"


_DECLARED = {
    AppProtocol.HTTP11: Protocol.HTTP1,
    AppProtocol.HTTP2: Protocol.HTTP2,
    AppProtocol.GRPC: Protocol.HTTP2,
    AppProtocol.TCP: Protocol.TCP,
    AppProtocol.TLS: Protocol.TCP,
}


def declared_protocol(app_protocol: AppProtocol) -> Protocol | None:
    """The protocol a workload-state port declares (rule 1); None: sniff."""
    return _DECLARED.get(app_protocol)


def protocol_for(port_name: str, app_protocol: str | None, port: int = 0) -> Protocol | None:
    """The protocol a Kubernetes Service port declares by its ``appProtocol`` or its name's prefix (istiod's rules,
    see :mod:`ambit.model.port_protocols`); None: sniff."""
    entry: dict[str, str] = {"name": port_name}
    if app_protocol is not None:
        entry["appProtocol"] = app_protocol
    return declared_protocol(kube_port_app_protocol(entry, port))


def _request_line(data: bytes) -> Protocol | None:
    """HTTP1 for a complete request line, TCP for bytes that cannot start one, None for a prefix of one."""
    size = len(data)
    i = 0
    while i < size and data[i] in TCHAR_BYTES:
        i += 1
    if i == size:
        return None
    if i == 0 or data[i] != 0x20:
        return Protocol.TCP
    i += 1
    start = i
    while i < size and data[i] in _VISIBLE:
        i += 1
    if i == size:
        return None
    if i == start or data[i] != 0x20:
        return Protocol.TCP
    i += 1
    version = data[i : i + len(_VERSION)]
    if not _VERSION.startswith(version):
        return Protocol.TCP
    i += len(version)
    if i == size:
        return None
    if data[i] not in _DIGITS:
        return Protocol.TCP
    i += 1
    if i == size:
        return None
    if data[i] == 0x0A:
        return Protocol.HTTP1
    if data[i] != 0x0D:
        return Protocol.TCP
    if i + 1 == size:
        return None
    return Protocol.HTTP1 if data[i + 1] == 0x0A else Protocol.TCP


def sniff(data: bytes, *, final: bool = False, limit: int = SNIFF_LIMIT) -> Protocol | None:
    """The protocol of a stream that began with ``data`` (rules 2 and 3); None: read more and call again."""
    head = data[: len(H2_PREFACE)]
    if head == H2_PREFACE:
        return Protocol.HTTP2
    decided = None if H2_PREFACE.startswith(head) else _request_line(data[:limit])
    if decided is None and (final or len(data) >= limit):
        return Protocol.TCP
    return decided


def h2_prior_knowledge(data: bytes, *, final: bool = False) -> bool | None:
    """Whether a stream to a port declared HTTP that began with ``data`` is HTTP/2 (rule 5); None: read more
    and call again."""
    head = data[: len(H2_PREFACE)]
    if head == H2_PREFACE:
        return True
    if final or not H2_PREFACE.startswith(head):
        return False
    return None
