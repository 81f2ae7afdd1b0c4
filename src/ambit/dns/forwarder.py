"""Forwarding a pod's query to its resolvers, from inside the pod's netns (spec §9; the asyncio shell's upstream).

Theory of operation: :meth:`Forwarder.forward` sends the query (a fresh random id, the question as asked) over UDP
to each nameserver in turn, ``attempts`` rounds, each try bounded by ``timeout``; a truncated answer (TC) is asked
again over TCP from the same server. Every socket comes from the pod's socket factory, so it lives in the pod's
netns and carries the proxy's mark: the upstream sees the pod's own address, and the pod's rules do not send the
query back to 15053. The answer handed back carries the client's id.

Rules:

1. Each UDP try uses a new socket connected to the server (the kernel drops datagrams from anyone else), and a
   new random id; a datagram that does not parse, or is not the answer to our question and id
   (``Message.is_response``), is ignored and the try goes on waiting until its timeout.
2. TCP: one connection per query, the message framed by its two-byte length; the answer must be the response to
   the query too. A connect, read or write failure or a timeout fails the try.
3. Loopback nameservers are never asked: from a pod that would be the pod's own DNS capture or a stub it cannot
   have (:class:`UpstreamError` "no upstream").
4. All tries failing raise :class:`UpstreamError` with the last reason (``timeout``, ``refused``, ``error``,
   ``no upstream``); the caller answers SERVFAIL. Nothing here raises anything else for what the network does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
import socket
import struct
from typing import TYPE_CHECKING, Protocol

from ambit.dns.errors import UpstreamError
from ambit.dns.settings import Upstream

if TYPE_CHECKING:  # dnspython loads with the DNS proxy's first message the fast path declines
    import dns.message

MAX_UDP_ANSWER = 65535
MAX_TCP_ANSWER = 65535


class DnsSocketFactory(Protocol):
    """Where upstream sockets come from: the pod's netns (``ambit.proxy.sockets.NetnsSocketFactory``)."""

    async def tcp_socket(
        self, *, transparent: bool = False, family: socket.AddressFamily = socket.AF_INET
    ) -> socket.socket: ...

    async def udp_socket(self, *, family: socket.AddressFamily = socket.AF_INET) -> socket.socket: ...


def is_local_address(text: str) -> bool:
    """A nameserver that would be this host itself: loopback (also as an IPv4-mapped IPv6 address) or unspecified
    (``0.0.0.0``, ``::``, which mean "this host" to connect). Forwarding there would loop back into the proxy."""
    address = ipaddress.ip_address(text)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


class Forwarder:
    """Asks an :class:`Upstream`'s nameservers with sockets from ``sockets`` (rules 1-4)."""

    def __init__(self, sockets: DnsSocketFactory) -> None:
        self._sockets = sockets

    async def forward(self, query: dns.message.Message, upstream: Upstream) -> dns.message.Message:
        """``upstream``'s answer to ``query``, with ``query``'s id; raises :class:`UpstreamError`."""
        import dns.flags  # loaded with the query (dnspython's)

        servers = [s for s in upstream.nameservers if not is_local_address(s)]
        if not servers:
            raise UpstreamError("no nameserver to forward to (only loopback ones are configured)", "no upstream")
        client_id = query.id
        last = UpstreamError("no try was made", "error")
        for _ in range(max(1, upstream.attempts)):
            for server in servers:
                query.id = secrets.randbelow(0x10000)
                try:
                    wire = query.to_wire()
                    response = await self._udp(upstream, server, wire, query)
                    if response.flags & dns.flags.TC:
                        response = await self._tcp(upstream, server, wire, query)
                except UpstreamError as exc:
                    last = exc
                    continue
                finally:
                    query.id = client_id
                response.id = client_id
                return response
        raise last

    def _family(self, server: str) -> socket.AddressFamily:
        return socket.AF_INET6 if ":" in server else socket.AF_INET

    async def _udp(
        self, upstream: Upstream, server: str, wire: bytes, query: dns.message.Message
    ) -> dns.message.Message:
        loop = asyncio.get_running_loop()
        try:
            sock = await self._sockets.udp_socket(family=self._family(server))
        except Exception as exc:  # a socket factory failure is local, not the upstream's
            raise UpstreamError(f"cannot make a socket to ask {server}: {exc}", "error") from exc
        try:
            async with asyncio.timeout(upstream.timeout):
                sock.connect((server, upstream.port))
                await loop.sock_sendall(sock, wire)
                while True:
                    data = await loop.sock_recv(sock, MAX_UDP_ANSWER)
                    response = _response_to(query, data)
                    if response is not None:
                        return response
        except TimeoutError:
            raise UpstreamError(f"{server} did not answer in {upstream.timeout}s", "timeout") from None
        except ConnectionRefusedError:
            raise UpstreamError(f"{server} refused the query (port unreachable)", "refused") from None
        except OSError as exc:
            raise UpstreamError(f"cannot ask {server}: {exc.strerror or exc}", "error") from None
        finally:
            sock.close()

    async def _tcp(
        self, upstream: Upstream, server: str, wire: bytes, query: dns.message.Message
    ) -> dns.message.Message:
        loop = asyncio.get_running_loop()
        try:
            sock = await self._sockets.tcp_socket(family=self._family(server))
        except Exception as exc:
            raise UpstreamError(f"cannot make a socket to ask {server}: {exc}", "error") from exc
        try:
            async with asyncio.timeout(upstream.timeout):
                await loop.sock_connect(sock, (server, upstream.port))
                await loop.sock_sendall(sock, struct.pack("!H", len(wire)) + wire)
                (length,) = struct.unpack("!H", await read_exactly(loop, sock, 2))
                response = _response_to(query, await read_exactly(loop, sock, length))
        except TimeoutError:
            raise UpstreamError(f"{server} did not answer over TCP in {upstream.timeout}s", "timeout") from None
        except ConnectionRefusedError:
            raise UpstreamError(f"{server} refused the TCP connection", "refused") from None
        except (OSError, EOFError) as exc:
            raise UpstreamError(f"cannot ask {server} over TCP: {exc}", "error") from None
        finally:
            with contextlib.suppress(OSError):
                sock.close()
        if response is None:
            raise UpstreamError(f"{server} answered something else over TCP", "error")
        return response


async def read_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from the stream ``sock``; EOFError when it closes first."""
    data = bytearray()
    while len(data) < n:
        chunk = await loop.sock_recv(sock, n - len(data))
        if not chunk:
            raise EOFError("the connection closed early")
        data += chunk
    return bytes(data)


def _response_to(query: dns.message.Message, data: bytes) -> dns.message.Message | None:
    """The answer to ``query`` in ``data``, or None (rule 1)."""
    import dns.exception
    import dns.message

    try:
        response = dns.message.from_wire(data)
    except (dns.exception.DNSException, ValueError, UnicodeError, IndexError, KeyError, TypeError):
        return None
    try:
        ok = query.is_response(response)
    except (dns.exception.DNSException, ValueError):
        return None
    return response if ok else None
