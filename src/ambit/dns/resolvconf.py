"""A resolv.conf read as the resolver reads it: nameservers, search list and the options the forwarder uses.

Theory of operation: pure; :func:`parse_resolv_conf` takes the file's text and never raises on its content.
Rules (resolv.conf(5)):

1. ``nameserver ADDR``: a numeric IPv4 or IPv6 address (one with a zone id is dropped); at most three are
   kept, in order, as the C resolver does. Anything else on the line is ignored.
2. ``search D...`` and ``domain D``: the last of them wins; ``domain`` is a one-domain search list.
3. ``options``: ``timeout:N`` (seconds, 1-30, default 5), ``attempts:N`` (1-5, default 2), ``ndots:N`` (0-15,
   default 1); other options are ignored.
4. Lines starting with ``#`` or ``;`` are comments; so is anything after one on a line.
5. No usable nameserver: the C resolver's default, the local host (127.0.0.1). The DNS proxy refuses to forward
   to a loopback address (the pod's own 15053 or the node's stub), which :mod:`ambit.dns.server` checks.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

MAX_NAMESERVERS = 3
DEFAULT_TIMEOUT = 5.0
DEFAULT_ATTEMPTS = 2


@dataclass(frozen=True, slots=True)
class ResolvConf:
    nameservers: tuple[str, ...] = ("127.0.0.1",)
    search: tuple[str, ...] = field(default=())
    timeout: float = DEFAULT_TIMEOUT
    attempts: int = DEFAULT_ATTEMPTS
    ndots: int = 1


def _bounded(text: str, low: int, high: int) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return min(max(value, low), high)


def parse_resolv_conf(text: str) -> ResolvConf:
    """The settings in ``text`` (rules 1-5)."""
    servers: list[str] = []
    search: tuple[str, ...] = ()
    timeout, attempts, ndots = DEFAULT_TIMEOUT, DEFAULT_ATTEMPTS, 1
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0]
        words = line.split()
        if not words:
            continue
        keyword, args = words[0], words[1:]
        if keyword == "nameserver" and args and len(servers) < MAX_NAMESERVERS:
            try:
                address = ipaddress.ip_address(args[0])
            except ValueError:
                continue
            if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
                continue
            servers.append(str(address))
        elif keyword == "search":
            search = tuple(args)
        elif keyword == "domain" and args:
            search = (args[0],)
        elif keyword == "options":
            for option in args:
                name, _, value = option.partition(":")
                if name == "timeout" and (n := _bounded(value, 1, 30)) is not None:
                    timeout = float(n)
                elif name == "attempts" and (n := _bounded(value, 1, 5)) is not None:
                    attempts = n
                elif name == "ndots" and (n := _bounded(value, 0, 15)) is not None:
                    ndots = n
    return ResolvConf(
        nameservers=tuple(servers) or ("127.0.0.1",),
        search=search,
        timeout=timeout,
        attempts=attempts,
        ndots=ndots,
    )
