"""The regular headers of an HBONE CONNECT (spec §6.1) and the parser of its ``:authority``.

- ``forwarded: for="<client ip:port>"`` plus ``;host=<service hostname>`` when a service is known (RFC 7239: the
  ``for`` value contains ``:`` and so is always quoted).
- ``baggage``: W3C baggage, ``key=value`` members joined by ``,``; values are percent-encoded on the way out and
  decoded tolerantly on the way in (malformed members are skipped, properties after ``;`` are ignored).
- ``traceparent: 00-<32 hex trace id>-<16 hex parent id>-00`` built from caller-supplied random bytes, so this module
  stays pure and testable.
- ``:authority`` is ``IPv4:port``, ``[IPv6]:port`` or ``hostname:port`` with a port in 1..65535; anything else is an
  :class:`AuthorityError`.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Mapping
from urllib.parse import quote, unquote

from ambit.hbone.errors import AuthorityError, HboneError
from ambit.model.field_names import TOKEN

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?", re.IGNORECASE)
_PORT = re.compile(r"[1-9][0-9]{0,4}")
_DOTTED_DIGITS = re.compile(r"[0-9]+(?:\.[0-9]+)*")
"""What an IPv4 literal is made of: dot-separated runs of ASCII digits, none empty (one regex match per tunnel, not
a Python generator over the parts)."""
_MAX_AUTHORITY = 300
# Characters left bare in baggage values: W3C baggage-octet minus '%' (which introduces an escape).
_BAGGAGE_SAFE = "!#$&'()*+-./:<=>?@[]^_`{|}~"


def connect_headers(
    *,
    forwarded_for: str,
    host: str | None = None,
    baggage: Mapping[str, str] = {},
    traceparent: str | None = None,
) -> list[tuple[str, str]]:
    """Return the regular (non-pseudo) headers of an HBONE CONNECT, in the order ztunnel sends them."""
    if '"' in forwarded_for or "\\" in forwarded_for:
        raise HboneError(f"forwarded_for {forwarded_for!r} must not contain quotes or backslashes")
    forwarded = f'for="{forwarded_for}"'
    if host is not None:
        forwarded += f";host={host}" if TOKEN.fullmatch(host) else f';host="{host}"'
    headers = [("forwarded", forwarded)]
    if baggage:
        headers.append(("baggage", encode_baggage(baggage)))
    if traceparent is not None:
        headers.append(("traceparent", traceparent))
    return headers


def new_traceparent(random: bytes) -> str:
    """Format 24 random bytes as a W3C ``traceparent`` (16 for the trace id, 8 for the parent id), not sampled."""
    if len(random) != 24:
        raise HboneError(f"new_traceparent needs 24 random bytes, got {len(random)}")
    trace, parent = random[:16].hex(), random[16:].hex()
    # W3C forbids all-zero ids; flipping the last bit keeps the function pure and the odds unchanged.
    if not random[:16].strip(b"\0"):
        trace = trace[:-1] + "1"
    if not random[16:].strip(b"\0"):
        parent = parent[:-1] + "1"
    return f"00-{trace}-{parent}-00"


def encode_baggage(items: Mapping[str, str]) -> str:
    """Encode ``items`` as a W3C baggage header value; keys must be HTTP tokens."""
    members = []
    for key, value in items.items():
        if not TOKEN.fullmatch(key):
            raise HboneError(f"baggage key {key!r} is not an HTTP token")
        members.append(f"{key}={quote(value, safe=_BAGGAGE_SAFE)}")
    return ",".join(members)


def decode_baggage(text: str) -> dict[str, str]:
    """Decode a baggage header value, skipping members that are not ``key=value``; later duplicates win."""
    items: dict[str, str] = {}
    for member in text.split(","):
        pair = member.split(";", 1)[0]
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not TOKEN.fullmatch(key):
            continue
        items[key] = unquote(value.strip(), errors="replace")
    return items


def hostport(ip: object, port: int) -> str:
    """``ip:port``, with brackets around an IPv6 address (as in a CONNECT authority or a log line)."""
    text = str(ip)
    return f"[{text}]:{port}" if ":" in text else f"{text}:{port}"


@functools.lru_cache(maxsize=4096)
def _normal_ipv4(text: str) -> str:
    """The normal form of an IPv4 literal, remembered (every tunnel's authority names one, nearly always one seen
    before); ValueError for no address, every time (never cached); bounded against peers naming ever new ones."""
    return str(ipaddress.IPv4Address(text))


def parse_authority(authority: str) -> tuple[str, int]:
    """Split a CONNECT authority into (host, port); IP literals come back normalised, brackets removed."""
    if len(authority) > _MAX_AUTHORITY:
        raise AuthorityError(f"authority is longer than {_MAX_AUTHORITY} characters")
    host, sep, port_text = authority.rpartition(":")
    if not sep or not _PORT.fullmatch(port_text) or int(port_text) > 65535:
        raise AuthorityError(f"authority {authority!r} has no valid port (expected host:1-65535)")
    port = int(port_text)
    if host.startswith("[") and host.endswith("]") and "%" not in host:
        try:
            return str(ipaddress.IPv6Address(host[1:-1])), port
        except ValueError:
            raise AuthorityError(f"authority {authority!r} has an invalid IPv6 literal") from None
    if _DOTTED_DIGITS.fullmatch(host):
        try:
            return _normal_ipv4(host), port
        except ValueError:
            raise AuthorityError(f"authority {authority!r} has an invalid IPv4 address") from None
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise AuthorityError(f"authority {authority!r} is not IPv4:port, [IPv6]:port or hostname:port")
    return host, port
