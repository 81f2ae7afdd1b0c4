"""Sockets the proxy opens for a pod, created inside the pod's network namespace (spec §1.3, §2.1, §6.3 step 8, §12).

Theory of operation: a socket belongs to the netns of the thread that called ``socket()``, for its whole life;
``setsockopt``, ``bind`` and ``connect`` act on that netns from any thread. So each pod gets one
:class:`NetnsSocketFactory` with one dedicated, long-lived thread that ``setns(fd, CLONE_NEWNET)``'d into the pod
once and never leaves; the event loop thread never changes namespace. The thread keeps a small pool of spare
sockets filled, so :meth:`NetnsSocketFactory.tcp_socket` usually takes one without a thread hop; when the pool is
empty it asks the thread for one and waits. The pool is topped up once it is down to half (one request in flight
at a time), not after every socket taken, so the thread (and the GIL hand-over) is not woken per connection. There
is one pool per IP family: the IPv4 one from the start, the IPv6 one from the pod's first IPv6 socket on (a pod that
never uses IPv6 holds no IPv6 spares).
:class:`HostSocketFactory` makes the same sockets in the caller's own netns (node-netns uses, tests).

Every socket is non-blocking, close-on-exec, ``TCP_NODELAY``, keepalive on (ztunnel's 180 s idle / 180 s interval /
9 probes) and carries ``SO_MARK`` 0x539: the pod's rules never redirect marked traffic, and mark its connections so
that replies route back to the proxy. ``transparent=True`` adds ``IP_TRANSPARENT``, which lets :func:`connect` bind
a source address the netns does not own: inbound delivery connects to the local pod *from the remote client's IP*.
``udp_socket`` makes a marked UDP socket the same way (the DNS proxy asks the pod's resolvers from inside the pod).
A loopback leg (``connect(..., loopback=True)``: inbound delivery to the pod's own application) gets a congestion
control that does not pace (:func:`use_loopback_congestion`).
:func:`connect` dials a numeric address itself (no name lookup) and, since a connection to a local pod is usually
set up before ``connect()`` returns, checks that first and only then waits on the loop.

Invariants: the factory thread only ever runs in the pod's netns; a socket handed to the caller is the caller's to
close; after :meth:`NetnsSocketFactory.aclose` the thread is gone and every spare and the dup'd netns fd closed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import errno
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ambit.proxy.errors import ProxyConnectError, SocketFactoryError
from ambit.proxy.sockaddr import SOCKADDR_IN6_SIZE, SOCKADDR_IN_SIZE, SockaddrError, decode_sockaddr

log = logging.getLogger("ambit.proxy.sockets")

PROXY_MARK = 0x539
CLONE_NEWNET = 0x40000000
IP_TRANSPARENT = 19
IP_BIND_ADDRESS_NO_PORT = 24
IPV6_TRANSPARENT = 75
SO_ORIGINAL_DST = 80
"""``SO_ORIGINAL_DST`` (level ``SOL_IP``) and ``IP6T_SO_ORIGINAL_DST`` (level ``SOL_IPV6``): both 80."""
KEEPALIVE_IDLE = 180
KEEPALIVE_INTERVAL = 180
KEEPALIVE_PROBES = 9

LOOPBACK_CONGESTION = (b"cubic", b"reno")
"""The congestion control of a loopback leg: the first of these the kernel takes (``reno`` is always built in)."""

_CONNECT_REASONS = {
    errno.ECONNREFUSED: "refused",
    errno.ETIMEDOUT: "timeout",
    errno.EHOSTUNREACH: "unreachable",
    errno.ENETUNREACH: "unreachable",
    errno.ECONNRESET: "reset",
    errno.EADDRNOTAVAIL: "source address not available",
}


class SocketFactory(Protocol):
    """Where the proxy's TCP sockets come from (the netns seam)."""

    async def tcp_socket(
        self, *, transparent: bool = False, family: socket.AddressFamily = socket.AF_INET
    ) -> socket.socket: ...


def use_loopback_congestion(sock: socket.socket) -> bool:
    """Give a TCP socket between the proxy and its pod's own application a congestion control that does not pace;
    whether one of :data:`LOOPBACK_CONGESTION` was taken (if none is, the netns default stays and the leg works the
    same, at that default's cost).

    Why: such a leg never leaves the pod's netns (``lo``), so nothing on it can be congested. But it runs with the
    netns default, which is the node's; where that is ``bbr`` (the one algorithm in Linux that asks for pacing) and
    the device has no ``fq`` qdisc, as ``lo`` never has, TCP paces every send itself with a timer. On a 2-vCPU
    machine with ``bbr`` as its default, the bench lab's node proxies spent about 15% less CPU per byte of one bulk
    stream with their loopback legs on ``cubic``, and moved about 10% more (docs/native-data-path.md, session 47).
    The legs towards other nodes keep the node's choice: there it is the operator's to make.
    """
    for name in LOOPBACK_CONGESTION:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name)
        except OSError:  # not built, or not allowed to this process: the next one
            continue
        return True
    return False


def _new_udp_socket(family: socket.AddressFamily, mark: int | None) -> socket.socket:
    """A marked, unbound UDP socket in the calling thread's netns (the DNS proxy's upstream queries)."""
    sock = socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        if mark is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
    except BaseException:
        sock.close()
        raise
    return sock


def _new_tcp_socket(family: socket.AddressFamily, mark: int | None) -> socket.socket:
    """A configured, unconnected TCP socket in the calling thread's netns."""
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        if mark is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
    except BaseException:
        sock.close()
        raise
    return sock


def _make_transparent(sock: socket.socket, family: socket.AddressFamily) -> None:
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_TRANSPARENT, 1)
    else:
        sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)


def _configured(sock: socket.socket, transparent: bool, family: socket.AddressFamily) -> socket.socket:
    """``sock`` (of ``family``, which the caller knows: ``sock.family`` is an enum made per read) made ready."""
    try:
        if transparent:
            _make_transparent(sock, family)
    except OSError as exc:
        sock.close()
        raise SocketFactoryError(f"cannot make a transparent socket: {exc.strerror}") from exc
    return sock


class HostSocketFactory:
    """Sockets in the calling process's own netns; ``mark=None`` skips ``SO_MARK`` (it needs CAP_NET_ADMIN)."""

    def __init__(self, *, mark: int | None = PROXY_MARK) -> None:
        self._mark = mark

    async def tcp_socket(
        self, *, transparent: bool = False, family: socket.AddressFamily = socket.AF_INET
    ) -> socket.socket:
        try:
            sock = _new_tcp_socket(family, self._mark)
        except OSError as exc:
            raise SocketFactoryError(f"cannot create a socket: {exc.strerror}") from exc
        return _configured(sock, transparent, family)

    async def udp_socket(self, *, family: socket.AddressFamily = socket.AF_INET) -> socket.socket:
        try:
            return _new_udp_socket(family, self._mark)
        except OSError as exc:
            raise SocketFactoryError(f"cannot create a socket: {exc.strerror}") from exc


def enter_netns(fd: int) -> None:
    """Move the calling thread into the network namespace ``fd`` (for good: call it on a thread of its own)."""
    libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them: no library search
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


_STOP = object()


@dataclass(frozen=True, slots=True)
class _Refill:
    """Top the pool of ``family`` up."""

    family: socket.AddressFamily


@dataclass(frozen=True, slots=True)
class _SocketRequest:
    """A caller waiting (on the loop) for a socket the pool did not have."""

    future: asyncio.Future[socket.socket]
    family: socket.AddressFamily
    kind: socket.SocketKind = socket.SOCK_STREAM


class NetnsSocketFactory:
    """One pod's sockets, made by a thread living in the pod's netns, with a pool of ``spares`` ready ones per IP
    family (IPv6 from the first IPv6 socket asked for on).

    Each pool is a deque: the thread appends, the event loop pops (both atomic in CPython). Requests go to the
    thread through a queue: a :class:`_Refill` (top a pool up), ``_STOP``, or a future to answer with a new socket.
    """

    def __init__(self, netns_fd: int, *, name: str, spares: int = 8, mark: int = PROXY_MARK) -> None:
        self.name = name
        self._fd = os.dup(netns_fd)
        self._target = spares
        self._low_water = spares // 2  # refill once the pool is down to this
        # Per family: a _Refill is queued or running (set by the loop, cleared by the thread).
        self._refill_asked = {socket.AF_INET: False, socket.AF_INET6: False}
        self._mark = mark
        self._pools: dict[socket.AddressFamily, collections.deque[socket.socket]] = {
            socket.AF_INET: collections.deque(),
            socket.AF_INET6: collections.deque(),
        }
        self._jobs: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def spare_count(self) -> int:
        """How many ready sockets the pools hold now (both families)."""
        return sum(len(pool) for pool in self._pools.values())

    @property
    def thread_name(self) -> str:
        return f"netns sockets {self.name}"

    async def start(self) -> None:
        """Start the thread and wait until it joined the netns and made a marked socket; raise if it could not."""
        if self._closed or self._thread is not None:
            raise SocketFactoryError(f"socket factory {self.name}: already started or closed")
        self._loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=self.thread_name, daemon=True)
        self._thread.start()
        try:
            await ready
        except BaseException:
            await self.aclose()
            raise

    async def tcp_socket(
        self, *, transparent: bool = False, family: socket.AddressFamily = socket.AF_INET
    ) -> socket.socket:
        if self._closed or self._loop is None:
            raise SocketFactoryError(f"socket factory {self.name}: not running")
        sock: socket.socket | None = None
        pool = self._pools.get(family)
        if pool is not None:
            try:  # noqa: SIM105 - per connection: contextlib.suppress is three Python calls more
                sock = pool.popleft()
            except IndexError:  # none spare (the factory's thread may empty the pool as it stops)
                pass
        future: asyncio.Future[socket.socket] | None = None
        if sock is None:  # the slow way: asked first, so the thread answers before it refills
            future = self._loop.create_future()
            self._jobs.put(_SocketRequest(future, family))
        if pool is not None and len(pool) <= self._low_water < self._target and not self._refill_asked[family]:
            self._refill_asked[family] = True
            self._jobs.put(_Refill(family))
        if future is not None:
            sock = await future
        assert sock is not None
        return _configured(sock, transparent, family)

    async def udp_socket(self, *, family: socket.AddressFamily = socket.AF_INET) -> socket.socket:
        """A marked UDP socket in the pod's netns (no pool: made by the thread on request)."""
        if self._closed or self._loop is None:
            raise SocketFactoryError(f"socket factory {self.name}: not running")
        future: asyncio.Future[socket.socket] = self._loop.create_future()
        self._jobs.put(_SocketRequest(future, family, socket.SOCK_DGRAM))
        return await future

    async def aclose(self) -> None:
        """Stop the thread, close the spares and the netns fd; idempotent."""
        if self._closed:
            return
        self._closed = True
        thread, self._thread = self._thread, None
        try:
            if thread is not None:
                self._jobs.put(_STOP)
                await asyncio.to_thread(thread.join)
        finally:  # even when cancelled: the thread stops on its own and closes what it still adds
            while True:  # requests the thread did not get to
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is _STOP:  # cancelled before the thread took it: it is still the thread's to see
                    self._jobs.put(_STOP)
                    break
                if isinstance(job, _SocketRequest):
                    self._answer(job.future, None, SocketFactoryError(f"socket factory {self.name}: closed"))
            self._close_spares()
            os.close(self._fd)

    # -- the thread -------------------------------------------------------------------------------------------------

    def _answer(self, future: asyncio.Future[socket.socket], sock: socket.socket | None, exc: Exception | None) -> None:
        """On the loop: hand the socket over, unless the caller stopped waiting (then it is ours to close)."""
        if future.done():
            if sock is not None:
                sock.close()
        elif sock is not None:
            future.set_result(sock)
        elif exc is not None:
            future.set_exception(exc)

    def _post(self, callback: Callable[..., object], *args: object) -> bool:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            return False
        return True

    def _run(self, ready: asyncio.Future[None]) -> None:
        try:
            enter_netns(self._fd)
            _new_tcp_socket(socket.AF_INET, self._mark).close()
        except OSError as exc:
            error = SocketFactoryError(f"socket factory {self.name}: cannot make sockets in the netns: {exc}")
            self._post(_settle, ready, error)
            return
        self._post(_settle, ready, None)
        self._refill()
        try:
            while (job := self._jobs.get()) is not _STOP:
                try:
                    self._serve(job)
                except Exception:  # the thread must keep answering: a request left unanswered hangs its caller
                    log.exception("socket factory %s: request failed", self.name)
        finally:
            self._close_spares()  # aclose drains too; this catches a refill that raced with it

    def _serve(self, job: object) -> None:
        if isinstance(job, _Refill):
            self._refill(job.family)
            return
        assert isinstance(job, _SocketRequest)
        try:
            if job.kind == socket.SOCK_DGRAM:
                sock = _new_udp_socket(job.family, self._mark)
            else:
                sock = _new_tcp_socket(job.family, self._mark)
        except OSError as exc:
            failure = SocketFactoryError(f"socket factory {self.name}: cannot create a socket: {exc.strerror}")
            self._post(self._answer, job.future, None, failure)
        else:
            if not self._post(self._answer, job.future, sock, None):
                sock.close()

    def _refill(self, family: socket.AddressFamily = socket.AF_INET) -> None:
        self._refill_asked[family] = False  # first: a socket taken from now on may ask again
        pool = self._pools[family]
        while len(pool) < self._target and not self._closed:
            try:
                pool.append(_new_tcp_socket(family, self._mark))
            except OSError as exc:
                log.warning("socket factory %s: cannot refill spares: %s", self.name, exc)
                return

    def _close_spares(self) -> None:
        for pool in self._pools.values():
            while pool:
                pool.popleft().close()


def _settle(future: asyncio.Future[None], error: Exception | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


async def connect(
    factory: SocketFactory,
    address: tuple[str, int],
    *,
    source_ip: str | None = None,
    timeout: float = 10.0,  # noqa: ASYNC109
    loopback: bool = False,
) -> socket.socket:
    """A TCP connection to ``address`` made by ``factory``; from ``source_ip`` (any address: transparent) if given;
    with :func:`use_loopback_congestion` if ``loopback`` (the caller knows the address is in the socket's netns).

    ``address`` is a numeric IP and a port (no name resolution). Raises :class:`ProxyConnectError` with the address
    and a reason (``refused``, ``timeout``, ``unreachable``...), or :class:`SocketFactoryError` when the factory
    cannot make the socket.
    """
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sock = await factory.tcp_socket(transparent=source_ip is not None, family=family)
    try:
        if source_ip is not None:
            # The port is chosen at connect() from the whole 4-tuple, not at bind() from the ports free for any
            # destination: a busy client's many connections (and their TIME_WAITs) do not exhaust the range.
            try:  # noqa: SIM105 - per connection: contextlib.suppress is three Python calls more
                sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            except OSError:  # an older kernel: bind() picks the port then
                pass
            sock.bind((source_ip, 0))
        if loopback:
            use_loopback_congestion(sock)
        err = sock.connect_ex(address)
        if err != 0:
            if err not in _CONNECT_PENDING:
                raise OSError(err, os.strerror(err))
            if not _established(sock):
                await _connected(sock, timeout)
    except TimeoutError:
        sock.close()
        raise ProxyConnectError(address, "timeout") from None
    except OSError as exc:
        sock.close()
        reason = _CONNECT_REASONS.get(exc.errno or 0, exc.strerror or str(exc))
        raise ProxyConnectError(address, reason) from exc
    except BaseException:
        sock.close()
        raise
    return sock


_CONNECT_PENDING = frozenset({errno.EINPROGRESS, errno.EINTR})


def _established(sock: socket.socket) -> bool:
    """Whether a connect that said "in progress" is done already (one system call, no loop registration).

    A connection to this host (a local pod, over a veth or loopback) is usually set up before ``connect`` returns:
    the kernel runs the whole handshake in the caller's context. A failed or still pending one is not connected.
    """
    try:
        sock.getpeername()
    except OSError:
        return False
    return True


async def _connected(sock: socket.socket, timeout: float) -> None:  # noqa: ASYNC109
    """Wait until the non-blocking connect on ``sock`` finished; raise its error, or TimeoutError after ``timeout``.

    Not ``loop.sock_connect``: uvloop's resolves the (numeric) address with a real ``getaddrinfo`` on its thread
    pool first, a thread hop per connection; nor ``asyncio.timeout``: a timer handle alone is enough here.
    """
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    waiter: asyncio.Future[None] = loop.create_future()
    loop.add_writer(fd, _settle, waiter, None)
    timer = loop.call_later(timeout, _settle, waiter, TimeoutError())
    try:
        await waiter
    finally:
        timer.cancel()
        loop.remove_writer(fd)
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err != 0:
        raise OSError(err, os.strerror(err))


def original_dst(sock: socket.socket) -> tuple[str, int] | None:
    """The pre-NAT destination of a connection the pod's rules redirected (``SO_ORIGINAL_DST`` for IPv4,
    ``IP6T_SO_ORIGINAL_DST`` for IPv6), or None when it was not redirected (no NAT entry: the kernel says ENOENT).

    A connection that arrived without NAT (a TPROXY rule, or a direct connection) has its destination as its local
    address: callers that can take one fall back to ``getsockname()``.
    """
    family = sock.family  # an enum made from the socket's number on every read: read once
    if family == socket.AF_INET6:
        level, size = socket.IPPROTO_IPV6, SOCKADDR_IN6_SIZE
    else:
        level, size = socket.SOL_IP, SOCKADDR_IN_SIZE
    try:
        raw = sock.getsockopt(level, SO_ORIGINAL_DST, size)  # IP6T_SO_ORIGINAL_DST has the same number, 80
        return decode_sockaddr(raw, family)
    except (OSError, SockaddrError):
        return None


def reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0): the peer learns at once that the connection was refused."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


def close_when_done(sock: socket.socket, _done: object) -> None:
    """Close ``sock``: a done callback, as ``functools.partial(close_when_done, sock)``, for the task that served it
    (closing it again after its transport did is harmless)."""
    sock.close()
