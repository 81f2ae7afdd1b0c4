"""Which HTTP header names and values a configuration may ask a proxy to write (route filters, EnvoyFilter patches).

1. A name is an RFC 9110 token (:func:`ambit.model.field_names.is_token`): no pseudo-headers (``:authority``), no
   spaces, nothing outside visible ASCII.
2. Framing headers (:data:`FRAMING_HEADERS`) are the proxy's own business on each hop: no configuration writes them.
3. A value never holds CR, LF or NUL, which would split or end a header on the wire.

Pure: the control plane judges objects with these rules, and the proxies judge what reaches them again.
"""

from __future__ import annotations

import re

__all__ = ["FRAMING_HEADERS", "has_line_break", "is_framing"]

FRAMING_HEADERS = frozenset(
    {
        "connection",
        "content-length",
        "http2-settings",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

_LINE_BREAK = re.compile(r"[\r\n\x00]")


def is_framing(name: str) -> bool:
    """Rule 2, in any case."""
    return name.lower() in FRAMING_HEADERS


def has_line_break(value: str) -> bool:
    """Rule 3: whether ``value`` holds CR, LF or NUL."""
    return _LINE_BREAK.search(value) is not None
