"""Whether a text names a host: a DNS host name the node proxy may look up (a ``Workload.hostname``, spec §4.1), or
an IP address literal.

Rules:

1. A host name (RFC 1035 §2.3.4 sizes, RFC 1123 host names): at most 253 characters without the optional trailing
   dot; labels of 1 to 63 letters, digits, ``-`` and ``_`` (service names such as ``_sip._tcp`` use it), not
   starting or ending with ``-``; at least one label; no wildcard. Letters are compared case-insensitively by
   callers, so the name is kept as given. A dotted quad passes this check too: callers that tell the two apart
   ask :func:`is_ip` first.
2. An IP literal (:func:`is_ip`) is a ``str`` the standard library reads as an address: an IPv4 dotted quad in
   decimal without leading zeros, or IPv6 in any of its text forms, with or without a zone id (``fe80::1%eth0``).
   Brackets (``[::1]``), surrounding white space (a trailing newline too) and anything that is not a ``str`` (an
   int or packed bytes, which ``ipaddress.ip_address`` would take) are not. Callers that refuse zone ids (mesh
   addresses are global: :func:`ambit.model.workload.parse_ip`) or accept more say so where they call it.
"""

from __future__ import annotations

import ipaddress
import string

MAX_NAME = 253
MAX_LABEL = 63
_LABEL_CHARS = frozenset(string.ascii_letters + string.digits + "-_")


def is_ip(text: object) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address literal (rule 2)."""
    if not isinstance(text, str):
        return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def check_dns_name(text: str) -> str:
    """The problem with ``text`` as a host name to resolve, or ``""`` when it is one (rule 1)."""
    name = text[:-1] if text.endswith(".") else text
    if not name:
        return "empty host name"
    if len(name) > MAX_NAME:
        return f"host name longer than {MAX_NAME} characters"
    for label in name.split("."):
        if not label:
            return f"empty label in host name {text!r}"
        if len(label) > MAX_LABEL:
            return f"label longer than {MAX_LABEL} characters in host name {text!r}"
        if not _LABEL_CHARS.issuperset(label) or label[0] == "-" or label[-1] == "-":
            return f"not a host name: {text!r}"
    return ""
