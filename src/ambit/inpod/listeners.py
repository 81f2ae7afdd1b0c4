"""Listening sockets inside a pod's network namespace, created by a thread that joined it (spec §0, §1.3).

Theory of operation: a socket belongs to the netns of the thread that created it, for its whole life. So
:func:`open_pod_listeners` starts one helper thread per call; it ``setns(fd, CLONE_NEWNET)`` (through libc: Python
3.11 has no ``os.setns``), creates and binds every socket, and exits. The event-loop thread never changes namespace,
and the helper is never reused (a thread left in a pod's netns could create the next pod's sockets there).

Every socket carries ``SO_MARK`` 0x539 (the rules never redirect marked traffic) and SO_REUSEADDR/SO_REUSEPORT
(a new proxy binds beside the old one during an upgrade). The capture ports 15001 and 15006 are IP_TRANSPARENT,
as ztunnel's are. All sockets are non-blocking and close-on-exec. If any socket fails, all are closed and a
:class:`ListenerError` naming the address, port and protocol is raised (the pod's own application listening on
15001, 15006 or 15008 is the usual cause: the node agent shows it to the pod's owner in an Event): a pod has all
its listeners or none, but for the ``optional`` ones: the DNS proxy's IPv6 pair on
``[::1]:15053`` (spec §0: localhost, 127.0.0.1 and ::1), which a pod whose netns has no IPv6 (no ``::1`` on ``lo``,
or no IPv6 in the kernel) goes without. With IPv6 the in-pod rules redirect the pod's IPv6 DNS to ``::1``, so
without that pair its IPv6 DNS would be refused.

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

CLONE_NEWNET = 0x40000000
IP_TRANSPARENT = 19
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
    """Skipped, not an error, when the netns has no such address (an IPv6 listener in a netns without IPv6)."""

    @property
    def family(self) -> socket.AddressFamily:
        return socket.AF_INET6 if ":" in self.host else socket.AF_INET


POD_LISTENERS: tuple[ListenerSpec, ...] = (
    ListenerSpec(Port.OUTBOUND, "0.0.0.0", socket.SOCK_STREAM, transparent=True),
    ListenerSpec(Port.INBOUND_PLAINTEXT, "0.0.0.0", socket.SOCK_STREAM, transparent=True),
    ListenerSpec(Port.INBOUND_HBONE, "0.0.0.0", socket.SOCK_STREAM),
    ListenerSpec(Port.DNS, "127.0.0.1", socket.SOCK_DGRAM),
    ListenerSpec(Port.DNS, "127.0.0.1", socket.SOCK_STREAM),
    ListenerSpec(Port.DNS, "::1", socket.SOCK_DGRAM, optional=True),
    ListenerSpec(Port.DNS, "::1", socket.SOCK_STREAM, optional=True),
)
NO_SUCH_ADDRESS = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
"""What binding an address the netns does not have fails with: no ``::1`` on ``lo``, or no IPv6 at all."""


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
        if spec.transparent:
            sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
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


def _open_in_netns(netns_fd: int, specs: tuple[ListenerSpec, ...]) -> list[PodListener]:
    """Runs on the helper thread only: it joins the netns and never leaves it."""
    _setns(netns_fd, CLONE_NEWNET)
    _allow_request_migration()
    opened: list[PodListener] = []
    try:
        for spec in specs:
            try:
                opened.append(PodListener(spec, _bind(spec)))
            except OSError as exc:
                if not (spec.optional and exc.errno in NO_SUCH_ADDRESS):
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
