"""The API client's sockets: every one it opens is closed, whatever interrupts it.

httpcore2 (under httpx2) can leave a connected socket behind in two ways, both seen as "unclosed transport"
ResourceWarnings and, in a long-running process, as file descriptors held until the garbage collector finds them:

- a task cancelled during the TLS handshake: the handshake's cleanup catches ``Exception`` only, so the
  ``CancelledError`` passes by and the plain socket under it is dropped open;
- a pool closed while a connection is still being made: the pool forgets the half-made connection, which then
  completes and is never closed.

:class:`TrackedSockets` wraps the pool's network backend. It closes the socket under a handshake that did not
finish, for any reason, and it remembers every stream it handed out until that stream is closed, so closing the
client closes what the pool lost track of; a connection that completes after that is closed at once.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2 as httpx

from ambit.k8s.errors import KubeClientError


class TrackedStream(httpcore2.AsyncNetworkStream):
    """One socket (plain or TLS) handed to the pool; forgotten by its owner when closed."""

    def __init__(self, inner: httpcore2.AsyncNetworkStream, owner: TrackedSockets) -> None:
        self._inner = inner
        self._owner = owner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        self._owner.forget(self)
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            secured = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        except Exception as exc:
            await self.aclose()
            if self._owner.closed:  # the client closed under the handshake: say so as a connection error
                raise httpcore2.ConnectError("the API client is closed") from exc
            raise
        except BaseException:
            # A cancellation. The plain socket's close starts synchronously (the transport is closed before the
            # first await), so the cancellation cannot interrupt it.
            await self.aclose()
            raise
        self._owner.forget(self)  # the TLS stream owns the socket now
        return await self._owner.admit(secured)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class TrackedSockets(httpcore2.AsyncNetworkBackend):
    """A network backend that closes every socket it opened when :meth:`aclose` is called."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend) -> None:
        self._inner = inner
        self._open: set[TrackedStream] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def open_count(self) -> int:
        return len(self._open)

    def adopt(self, stream: httpcore2.AsyncNetworkStream) -> TrackedStream:
        tracked = TrackedStream(stream, self)
        self._open.add(tracked)
        return tracked

    def forget(self, stream: TrackedStream) -> None:
        self._open.discard(stream)

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return await self.admit(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(path, timeout, socket_options)
        return await self.admit(stream)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)

    async def admit(self, stream: httpcore2.AsyncNetworkStream) -> httpcore2.AsyncNetworkStream:
        if self._closed:
            await stream.aclose()
            raise httpcore2.ConnectError("the API client is closed")
        return self.adopt(stream)

    async def aclose(self) -> None:
        """Close every socket still open; sockets that connect later are closed at once."""
        self._closed = True
        while self._open:
            await self._open.pop().aclose()


def tracked_transport(
    *, verify: ssl.SSLContext | str | bool, limits: httpx.Limits, trust_env: bool
) -> tuple[httpx.AsyncHTTPTransport, TrackedSockets]:
    """httpx's default transport with its pool's network backend wrapped in :class:`TrackedSockets`."""
    transport = httpx.AsyncHTTPTransport(verify=verify, limits=limits, trust_env=trust_env)
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if not isinstance(pool, httpcore2.AsyncConnectionPool) or not isinstance(backend, httpcore2.AsyncNetworkBackend):
        # httpx2's internals moved: refuse to run with a client that leaks sockets silently.
        raise KubeClientError("httpx2's transport has no connection pool to attach socket tracking to")
    sockets = TrackedSockets(backend)
    pool._network_backend = sockets
    return transport, sockets
