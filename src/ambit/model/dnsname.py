"""Whether a text is a DNS host name the node proxy may look up (a ``Workload.hostname``, spec §4.1).

Rules (RFC 1035 §2.3.4 sizes, RFC 1123 host names): at most 253 characters without the optional trailing dot;
labels of 1 to 63 letters, digits, ``-`` and ``_`` (service names such as ``_sip._tcp`` use it), not starting or
ending with ``-``; at least one label; no wildcard. Letters are compared case-insensitively by callers, so the
name is kept as given.
"""

from __future__ import annotations

import string

MAX_NAME = 253
MAX_LABEL = 63
_LABEL_CHARS = frozenset(string.ascii_letters + string.digits + "-_")


def check_dns_name(text: str) -> str:
    """The problem with ``text`` as a host name to resolve, or ``""`` when it is one."""
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
