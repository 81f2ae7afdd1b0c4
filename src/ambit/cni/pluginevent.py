"""The node agent's plugin event server: ``POST /cmdadd`` from the ``ambit-cni`` plugin, over a UNIX socket.

The body is what :mod:`ambit.cni.plugin` sends (Istio's ``CNIPluginAddEvent``)::

    {"netns": "/run/netns/x", "podName": "p", "podNamespace": "ns", "podUid": "...",
     "ips": [{"interface": 0, "address": "198.18.1.5/24", "gateway": "198.18.1.1"}]}

:func:`parse_add_event` is pure: a body that is not such an object raises :class:`BadAddEventError` with one line
naming the field and what was expected. The server answers 400 with that line, 200 when the handler returns, 403
with the handler's one-line reason when it refuses the event
(:class:`~ambit.cni.addcheck.AddEventRefusedError`: another node's pod, a netns that is not this pod's sandbox),
and 500 with it when it raises any other :class:`ambit.cni.enrolment.EnrolmentError`. Any other
exception is logged with its traceback here and answered 500 with its type: the plugin never sees a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ambit.cni.addcheck import AddEventRefusedError
from ambit.cni.enrolment import EnrolmentError
from ambit.errors import AmbitError

log = logging.getLogger("ambit.cni.pluginevent")


class PluginEventSocketError(AmbitError):
    """The plugin event socket cannot be served safely where it was asked for."""


class BadAddEventError(AmbitError):
    """The plugin sent a body we cannot use (the plugin's fault: HTTP 400)."""


@dataclass(frozen=True, slots=True)
class PodIP:
    interface: int | None
    address: str
    gateway: str | None


@dataclass(frozen=True, slots=True)
class AddEvent:
    netns: str
    pod_name: str
    pod_namespace: str
    pod_uid: str | None
    ips: tuple[PodIP, ...]


def _string(obj: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise BadAddEventError(f"bad /cmdadd body: field {key!r}: expected a non-empty string, got {value!r}")
    return value


def parse_add_event(body: bytes) -> AddEvent:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadAddEventError(f"bad /cmdadd body: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise BadAddEventError("bad /cmdadd body: expected a JSON object")
    ips_raw = obj.get("ips")
    if ips_raw is None:
        ips_raw = []
    if not isinstance(ips_raw, list):
        raise BadAddEventError("bad /cmdadd body: field 'ips': expected a list")
    ips: list[PodIP] = []
    for i, item in enumerate(ips_raw):
        if not isinstance(item, dict):
            raise BadAddEventError(f"bad /cmdadd body: ips[{i}]: expected an object")
        interface = item.get("interface")
        if interface is not None and (not isinstance(interface, int) or isinstance(interface, bool)):
            raise BadAddEventError(f"bad /cmdadd body: ips[{i}].interface: expected an integer")
        address = _string(item, "address")
        gateway = _string(item, "gateway", required=False)
        assert address is not None
        ips.append(PodIP(interface, address, gateway))
    netns, name, namespace = _string(obj, "netns"), _string(obj, "podName"), _string(obj, "podNamespace")
    assert netns is not None and name is not None and namespace is not None
    return AddEvent(netns, name, namespace, _string(obj, "podUid", required=False), tuple(ips))


AddHandler = Callable[[AddEvent], Awaitable[None]]


class PluginEventServer:
    """Serves ``POST /cmdadd`` on ``socket_path``; ``start()`` / ``aclose()``."""

    def __init__(self, socket_path: str, on_add: AddHandler, *, max_body: int = 64 * 1024) -> None:
        self.socket_path = socket_path
        self._on_add = on_add
        app = web.Application(client_max_size=max_body)
        app.router.add_post("/cmdadd", self._cmdadd)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self) -> None:
        sock = _bind_private_socket(self.socket_path)
        try:
            await self._runner.setup()
            await web.SockSite(self._runner, sock).start()
        except BaseException:
            sock.close()
            raise

    async def aclose(self) -> None:
        await self._runner.cleanup()

    async def _cmdadd(self, request: web.Request) -> web.Response:
        try:
            event = parse_add_event(await request.read())
        except BadAddEventError as exc:
            return web.Response(status=400, text=str(exc))
        try:
            await self._on_add(event)
        except AddEventRefusedError as exc:
            return web.Response(status=403, text=str(exc))
        except EnrolmentError as exc:
            return web.Response(status=500, text=str(exc))
        except Exception as exc:  # never a traceback to the plugin: log it here, answer one line
            log.exception("cmdadd for %s/%s failed", event.pod_namespace, event.pod_name)
            return web.Response(status=500, text=f"node agent error: {type(exc).__name__}: {exc}")
        return web.Response(status=200, text="ok")


def _bind_private_socket(path: str) -> socket.socket:
    """A listening UNIX socket at ``path``, mode 0600 whatever the umask, in a directory nobody else may write to.

    Only the owner (root on a node: the plugin runs as root) may connect: ``/cmdadd`` enrols pods. The umask is set
    for the bind alone (no ``await`` in between, so no other task creates files under it) and the mode is set
    again after, as :mod:`ambit.zds.server` does. A directory we create is 0700; an existing one that others could
    write to (and so replace the socket in; not sticky) is tightened when it is ours, refused when it is not.
    """
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
    info = os.stat(directory)
    # Sticky (as /tmp): others may write there but cannot remove or rename our socket, so it is left alone.
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        if info.st_uid != os.geteuid():
            raise PluginEventSocketError(
                f"plugin event socket directory {directory} is writable by others and not ours to tighten"
            )
        os.chmod(directory, stat.S_IMODE(info.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a socket left by a previous agent (bind() would fail)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old_umask = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
