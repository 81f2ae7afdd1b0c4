"""Listening sockets inside a pod's network namespace, created by a thread that joined it (spec §0, §1.3).

Theory of operation: a socket belongs to the netns of the thread that created it, for its whole life. So
:func:`open_pod_listeners` starts one helper thread per call; it ``setns(fd, CLONE_NEWNET)`` (through libc: Python
3.11 has no ``os.setns``), creates and binds every socket, and exits. The event-loop thread never changes namespace,
and the helper is never reused (a thread left in a pod's netns could create the next pod's sockets there).

Both IP families, as ztunnel binds its wildcard ``[::]`` when IPv6 is on (its ``IPV6_ENABLED``, on by default; the
node proxy's ``ipv6`` setting): the capture ports 15001, 15006 and 15008 on ``0.0.0.0`` and on ``[::]``, the DNS
proxy on ``127.0.0.1`` and ``[::1]`` (spec §0: localhost). The IPv6 sockets are ``IPV6_V6ONLY``, separate from the
IPv4 ones, not one dual-stack socket per port: a dual-stack socket reports its IPv4 peers and destinations as
``::ffff:a.b.c.d`` and its IPv4 redirects answer only ``SO_ORIGINAL_DST`` at the IPv4 level, so every address
the data path sees would need unmapping; with one socket per family an address is always in its own form, the
IPv4 path is untouched, and the IPv6 ones can be left out as a set. They cost three descriptors more per pod.

The IPv6 listeners are ``optional``: a pod whose netns has no IPv6 (no ``::1`` on ``lo``: IPv6 disabled by
sysctl, or no IPv6 in the kernel) gets the IPv4 ones only, and no error; its rules redirect no IPv6 then. Where
the netns has IPv6, they are required like the rest. Every socket carries ``SO_MARK`` 0x539 (the rules never
redirect marked traffic) and SO_REUSEADDR/SO_REUSEPORT (a new proxy binds beside the old one during an upgrade).
The capture ports 15001 and 15006 are transparent (``IP_TRANSPARENT``, ``IPV6_TRANSPARENT``), as ztunnel's are.
The outbound capture port's connections all come from the pod's own applications over ``lo``, so its listeners
get a congestion control that does not pace, which the connections they accept inherit
(:func:`ambit.proxy.sockets.use_loopback_congestion`). All sockets are non-blocking and close-on-exec. If any
socket fails, all are closed and a :class:`ListenerError` naming the address, port and protocol is raised (the pod's
own application listening on 15001, 15006 or 15008 is the usual cause: the node agent shows it to the pod's owner in
an Event): a pod has all its listeners or none, but for the optional ones in a netns without IPv6. With IPv6 the
in-pod rules redirect the pod's IPv6 traffic to ``[::]`` and its IPv6 DNS to ``::1``, so without these the pod's
IPv6 connections and queries would be refused.

Hand-over: SO_REUSEPORT lets a successor proxy bind beside the old one, and the old one stops accepting by
closing its listeners. A listener that closes resets the connections still waiting in its accept queue unless the
netns has ``net.ipv4.tcp_migrate_req`` set, which moves them to another listener of the same reuseport group. The
helper thread sets it in the pod's netns (the sysctl is per netns and only concerns reuseport groups), best effort:
where /proc/sys is read-only (a node proxy in an unprivileged container, the ztunnel DaemonSet's) the node agent
has set it when it installed the pod's redirection (:mod:`ambit.redirect.apply`), and without either the hand-over
still works, with that small window.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import errno
import os
import socket
import threading
from dataclasses import dataclass

from ambit.errors import AmbitError
from ambit.proxy.sockets import use_loopback_congestion

CLONE_NEWNET = 0x40000000
IP_TRANSPARENT = 19
IPV6_TRANSPARENT = 75
PROXY_MARK = 0x539


class ListenerError(AmbitError):
    """The pod's listeners could not be created (setns or a bind failed)."""


class Port(enum.IntEnum):
    OUTBOUND = 15001
    INBOUND_PLAINTEXT = 15006
    INBOUND_HBONE = 15008
    DNS = 15053


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    port: Port
    host: str
    kind: socket.SocketKind
    transparent: bool = False
    optional: bool = False
    """Skipped, not an error, when the netns has no IPv6 (the IPv6 listeners; see the module docstring)."""

    @property
    def family(self) -> socket.AddressFamily:
        return socket.AF_INET6 if ":" in self.host else socket.AF_INET


IPV4_LISTENERS: tuple[ListenerSpec, ...] = (
    ListenerSpec(Port.OUTBOUND, "0.0.0.0", socket.SOCK_STREAM, transparent=True),
    ListenerSpec(Port.INBOUND_PLAINTEXT, "0.0.0.0", socket.SOCK_STREAM, transparent=True),
    ListenerSpec(Port.INBOUND_HBONE, "0.0.0.0", socket.SOCK_STREAM),
    ListenerSpec(Port.DNS, "127.0.0.1", socket.SOCK_DGRAM),
    ListenerSpec(Port.DNS, "127.0.0.1", socket.SOCK_STREAM),
)
IPV6_LISTENERS: tuple[ListenerSpec, ...] = (
    ListenerSpec(Port.OUTBOUND, "::", socket.SOCK_STREAM, transparent=True, optional=True),
    ListenerSpec(Port.INBOUND_PLAINTEXT, "::", socket.SOCK_STREAM, transparent=True, optional=True),
    ListenerSpec(Port.INBOUND_HBONE, "::", socket.SOCK_STREAM, optional=True),
    ListenerSpec(Port.DNS, "::1", socket.SOCK_DGRAM, optional=True),
    ListenerSpec(Port.DNS, "::1", socket.SOCK_STREAM, optional=True),
)
POD_LISTENERS: tuple[ListenerSpec, ...] = IPV4_LISTENERS + IPV6_LISTENERS
"""Every in-pod listener with IPv6 on (the default)."""
NO_SUCH_ADDRESS = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
"""What binding ``::1`` fails with in a netns without IPv6: no ``::1`` on ``lo``, or no IPv6 at all."""


def pod_listeners(*, ipv6: bool) -> tuple[ListenerSpec, ...]:
    """The in-pod listeners: both families, or IPv4 only when IPv6 is turned off (``IPV6_ENABLED=false``)."""
    return POD_LISTENERS if ipv6 else IPV4_LISTENERS


@dataclass(frozen=True, slots=True)
class PodListener:
    spec: ListenerSpec
    sock: socket.socket


def _setns(fd: int, nstype: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them: no library search
    if libc.setns(fd, nstype) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def _bind(spec: ListenerSpec) -> socket.socket:
    sock = socket.socket(spec.family, spec.kind | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        if spec.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, PROXY_MARK)
        if spec.transparent and spec.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_TRANSPARENT, 1)
        elif spec.transparent:
            sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
        if spec.port == Port.OUTBOUND and spec.kind == socket.SOCK_STREAM:
            use_loopback_congestion(sock)
        sock.bind((spec.host, int(spec.port)))
        if spec.kind == socket.SOCK_STREAM:
            sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock


MIGRATE_REQ_SYSCTL = "/proc/sys/net/ipv4/tcp_migrate_req"


def _allow_request_migration() -> None:
    """Best effort: queued connections of a closing listener move to its reuseport siblings (module docstring).
    ``/proc/sys/net`` shows the netns of the thread that opens it, so this is the pod's."""
    with contextlib.suppress(OSError), open(MIGRATE_REQ_SYSCTL, "w") as sysctl:
        sysctl.write("1")


def _where(spec: ListenerSpec) -> str:
    """``0.0.0.0:15008/tcp``, ``[::1]:15053/udp``: what an error names."""
    host = f"[{spec.host}]" if spec.family == socket.AF_INET6 else spec.host
    return f"{host}:{int(spec.port)}/{'tcp' if spec.kind == socket.SOCK_STREAM else 'udp'}"


def _netns_has_ipv6() -> bool:
    """Whether the calling thread's netns has IPv6: ``::1`` can be bound (ztunnel's localhost check)."""
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    except OSError as exc:
        if exc.errno in NO_SUCH_ADDRESS:
            return False
        raise
    with probe:
        try:
            probe.bind(("::1", 0))
        except OSError as exc:
            if exc.errno in NO_SUCH_ADDRESS:
                return False
            raise
    return True


def _open_in_netns(netns_fd: int, specs: tuple[ListenerSpec, ...]) -> list[PodListener]:
    """Runs on the helper thread only: it joins the netns and never leaves it."""
    _setns(netns_fd, CLONE_NEWNET)
    _allow_request_migration()
    if any(spec.optional for spec in specs) and not _netns_has_ipv6():
        specs = tuple(spec for spec in specs if not spec.optional)
    opened: list[PodListener] = []
    try:
        for spec in specs:
            try:
                opened.append(PodListener(spec, _bind(spec)))
            except OSError as exc:
                raise ListenerError(f"cannot listen on {_where(spec)}: {exc.strerror or exc}") from exc
    except BaseException:
        for listener in opened:
            listener.sock.close()
        raise
    return opened


def open_pod_listeners(netns_fd: int, specs: tuple[ListenerSpec, ...] = POD_LISTENERS) -> list[PodListener]:
    """Create ``specs`` inside the netns ``netns_fd`` (borrowed); blocking, so call it via ``asyncio.to_thread``.

    Raises :class:`ListenerError` naming what failed.
    """
    result: list[PodListener] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            result.extend(_open_in_netns(netns_fd, specs))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    helper = threading.Thread(target=work, name=f"inpod setns fd {netns_fd}", daemon=True)
    helper.start()
    helper.join()
    if failure:
        if isinstance(failure[0], ListenerError):
            raise failure[0]
        raise ListenerError(f"cannot open the pod listeners: {failure[0]}") from failure[0]
    return result
