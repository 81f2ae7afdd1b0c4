"""HBONE: HTTP/2 CONNECT tunnels, sans-IO (spec §6). TLS and sockets belong to ``ambit.proxy``.

``HboneClientConnection`` opens tunnels, ``HboneServerConnection`` accepts them; both take bytes with
``receive_data`` (returning :mod:`ambit.hbone.events`) and give bytes with ``data_to_send``. ``connection.py``
explains the HTTP/2 engine and its layers (``state.py``: flow control and the stream table; ``budgets.py``;
``receiving.py``); ``settings.py`` has its parameters, ``wire.py`` the frame layout.
"""

from __future__ import annotations

from ambit.hbone.client import HboneClientConnection
from ambit.hbone.connection import HboneConnection
from ambit.hbone.errors import AuthorityError, HboneError, HboneProtocolError
from ambit.hbone.events import (
    ConnectionDraining,
    ConnectionTerminated,
    DataReceived,
    Event,
    PingAcknowledged,
    StreamEnded,
    StreamReset,
    StreamWritable,
    TunnelEstablished,
    TunnelRefused,
    TunnelRejected,
    TunnelRequested,
)
from ambit.hbone.headers import (
    connect_headers,
    decode_baggage,
    encode_baggage,
    new_traceparent,
    parse_authority,
)
from ambit.hbone.server import HboneServerConnection
from ambit.hbone.settings import HboneSettings

__all__ = [
    "AuthorityError",
    "ConnectionDraining",
    "ConnectionTerminated",
    "DataReceived",
    "Event",
    "HboneClientConnection",
    "HboneConnection",
    "HboneError",
    "HboneProtocolError",
    "HboneServerConnection",
    "HboneSettings",
    "PingAcknowledged",
    "StreamEnded",
    "StreamReset",
    "StreamWritable",
    "TunnelEstablished",
    "TunnelRefused",
    "TunnelRejected",
    "TunnelRequested",
    "connect_headers",
    "decode_baggage",
    "encode_baggage",
    "new_traceparent",
    "parse_authority",
]
