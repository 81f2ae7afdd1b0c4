"""Decoding the ``struct sockaddr_in`` / ``sockaddr_in6`` bytes the kernel returns for a redirected connection's
original destination (``SO_ORIGINAL_DST``, ``IP6T_SO_ORIGINAL_DST``; spec §2.1); pure, no sockets.

Layouts (``<netinet/in.h>``): ``sockaddr_in`` is 16 bytes, the family (host byte order), the port (network order),
4 address bytes and 8 bytes of padding; ``sockaddr_in6`` is 28 bytes, the family, the port, the flow label (4),
16 address bytes and the scope id (4). The kernel fills the whole structure; anything shorter, or a family that is
not the one asked for, is refused with :class:`SockaddrError` rather than read past or guessed at.

An IPv4 destination reached through an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``, a dual-stack socket) comes
back as the IPv4 address: the proxy looks destinations up by address, and the mesh knows its workloads by their
IPv4 addresses, never by the mapped form.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from ambit.errors import AmbitError

SOCKADDR_IN_SIZE = 16
SOCKADDR_IN6_SIZE = 28
_FAMILY = struct.Struct("=H")
_PORT = struct.Struct("!H")


class SockaddrError(AmbitError):
    """The bytes are not a ``sockaddr_in``/``sockaddr_in6`` of the expected family (a kernel or caller mistake)."""


def decode_sockaddr(raw: bytes, family: socket.AddressFamily) -> tuple[str, int]:
    """``(ip, port)`` from ``raw``, a ``sockaddr_in`` (``AF_INET``) or ``sockaddr_in6`` (``AF_INET6``).

    The address is in its canonical text form (``fd00:ab::1``, not ``fd00:ab:0::1``); an IPv4-mapped IPv6 address
    comes back as the IPv4 address. Raises :class:`SockaddrError` for short input or a foreign family.
    """
    if family == socket.AF_INET:
        size, start, end = SOCKADDR_IN_SIZE, 4, 8
    elif family == socket.AF_INET6:
        size, start, end = SOCKADDR_IN6_SIZE, 8, 24
    else:
        raise SockaddrError(f"not an IP address family: {family!r}")
    if len(raw) < size:
        raise SockaddrError(f"a {family.name} socket address is {size} bytes, got {len(raw)}")
    (got,) = _FAMILY.unpack_from(raw)
    if got != family:
        raise SockaddrError(f"expected a {family.name} socket address, got family {got}")
    (port,) = _PORT.unpack_from(raw, 2)
    if start == 4:
        # ``inet_ntoa`` writes the dotted quad ``ipaddress`` would (four decimal octets, no leading zeros), in C:
        # the IPv4 case is per redirected connection, and ``ipaddress`` makes it in several Python calls.
        return socket.inet_ntoa(raw[4:8]), port
    ip = ipaddress.ip_address(raw[start:end])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), port


def encode_sockaddr(ip: str, port: int) -> bytes:
    """The ``sockaddr_in``/``sockaddr_in6`` the kernel would return for ``ip`` and ``port`` (flow label and scope
    0): the inverse of :func:`decode_sockaddr`, for tests and for checking what a rule should produce."""
    address = ipaddress.ip_address(ip)
    if isinstance(address, ipaddress.IPv4Address):
        return _FAMILY.pack(socket.AF_INET) + _PORT.pack(port) + address.packed + bytes(8)
    return _FAMILY.pack(socket.AF_INET6) + _PORT.pack(port) + bytes(4) + address.packed + bytes(4)
