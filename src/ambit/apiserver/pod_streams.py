"""``pods/log``, ``pods/exec``, ``pods/attach`` and ``pods/portforward``: the API server checks a request and
proxies it to the pod's node's kubelet.

Theory of operation. A request reaches here authenticated and authorized like any other (``http.py``'s middlewares:
RBAC, the node authorizer; a WebSocket ``GET`` on ``pods/exec`` is authorized as ``create``, as kube 1.32 does,
see :func:`ambit.apiserver.rbac_policy.request_attributes`; ``pods/portforward`` alike). :func:`plan_logs`,
:func:`plan_exec` and :func:`plan_port_forward` decide from the stored Pod alone which container and node the
request goes to, or which of kube's errors it gets; the shell then connects to
``<kubelet socket dir>/<node>/kubelet.sock`` (``--kubelet-socket-dir``; the lab's nodes serve
:mod:`ambit.lab.runtime.kubelet_server` there) and copies bytes back (logs) or WebSocket messages both ways (exec,
port-forward).

Rules:
1. The container: the one named; else the only one; else the ``kubectl.kubernetes.io/default-container``
   annotation's; else kube's 400 ``a container name must be specified for pod P, choose one of: [a b]``. A name the
   pod does not have is kube's 400 ``container c is not valid for pod p``.
2. Logs: ``previous=true`` is kube's 400 for a container with no previous instance (the lab keeps none); a pod not
   yet on a node, or whose container is waiting, is kube's 400 ``container "c" in pod "p" is waiting to start:
   REASON``. Options are checked here (:mod:`ambit.k8s.pod_logs`: 400 or 422) before the kubelet sees them.
3. Exec: a pod with no node is 400 ``pod p does not have a host assigned``; a completed pod is 400 ``cannot exec
   into a container in a completed pod; current phase is PHASE``. Only WebSocket upgrades offering a subprotocol of
   :data:`ambit.k8s.remotecommand.PROTOCOLS` are served; any other request (SPDY's POST included) is 400
   ``Upgrade request required``, after the checks above and the kubelet's (asked the same path without an
   upgrade), so a client falling back to SPDY sees the same errors.
4. A kubelet that cannot be reached (no ``--kubelet-socket-dir``, no socket, nobody listening) is kube's 500
   ``error dialing backend: ...``; a kubelet's own refusal is passed on with its code and message.
5. Relays are bounded: one chunk or message is in flight per direction and the next is read only when the last was
   written (aiohttp's writers wait for the socket to drain; its WebSocket readers stop reading at their queue's
   limit), so a client that never reads stalls its kubelet's command instead of growing our memory. Either side
   closing ends both; an idle log stream notices its client's departure within ``poll_interval``.
6. The subprotocol is the kubelet's choice among those the client offered (v5 first): v4 has no stdin half-close, so
   a v4 client's stdin ends only when it closes the connection, as with kube.
7. Port-forward: a pod with no node is 400 ``pod p does not have a host assigned``; a pod not running is 400
   ``unable to forward port because pod is not running. Current status=PHASE`` (kubectl's own words: it checks
   before it asks). Only a WebSocket upgrade offering ``SPDY/3.1+portforward.k8s.io`` (kubectl 1.31 and later: the
   SPDY session tunnelled in binary messages) is served, relayed message by message to the kubelet's
   ``/portForward/NS/POD``, which speaks the session itself (:mod:`ambit.k8s.portforward`); SPDY's own upgrade (a
   POST, kubectl's fallback) is 400 ``Upgrade request required`` after the checks above, as for exec. The API
   server parses no SPDY: a session is counted against its user's bound of open pod streams
   (``max_pod_streams_per_user``, with logs and exec; 429 beyond it) and the kubelet bounds the streams within one.
8. ``pods/attach`` (authorized as ``create``, like exec) is planned and relayed as exec is, with attach's options
   (no command) and kube's ``cannot attach into a container in a completed pod`` wording; what an attach can do is
   the kubelet's to say (:mod:`ambit.lab.runtime.kubelet_server` rule 7).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ambit.apiserver import errors
from ambit.k8s.pod_logs import LogOptionsError, parse_log_options
from ambit.k8s.portforward import WEBSOCKET_PROTOCOL as PORT_FORWARD_PROTOCOL
from ambit.k8s.remotecommand import PROTOCOLS, ExecOptionsError, parse_attach_options, parse_exec_options

DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"
CHUNK = 32 * 1024
MAX_MESSAGE = 1024 * 1024
MAX_ERROR_BODY = 64 * 1024
KUBELET_ASK_TIMEOUT = 10.0
"""Seconds the kubelet gets to say whether it would serve an exec or attach (rule 3's SPDY fallback)."""


@dataclass(frozen=True, slots=True)
class KubeletTarget:
    """Where a request goes: the node, and the kubelet path with its query."""

    node: str
    path: str
    query: tuple[tuple[str, str], ...]


def choose_container(pod: Mapping[str, Any], requested: str) -> str:
    """Rule 1; raises :class:`~ambit.apiserver.errors.ApiError`."""
    name = str((pod.get("metadata") or {}).get("name") or "")
    spec = pod.get("spec") or {}
    names = [str(c.get("name")) for c in spec.get("containers") or () if isinstance(c, Mapping)]
    others = [str(c.get("name")) for c in spec.get("initContainers") or () if isinstance(c, Mapping)]
    others += [str(c.get("name")) for c in spec.get("ephemeralContainers") or () if isinstance(c, Mapping)]
    if requested:
        if requested not in names and requested not in others:
            raise errors.bad_request(f"container {requested} is not valid for pod {name}")
        return requested
    if len(names) == 1:
        return names[0]
    default = str(((pod.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_CONTAINER_ANNOTATION) or "")
    if default and default in names:
        return default
    raise errors.bad_request(
        f"a container name must be specified for pod {name}, choose one of: [{' '.join(names + others)}]"
    )


def _waiting_reason(pod: Mapping[str, Any], container: str) -> str | None:
    """Why ``container`` waits (None when it runs or ran)."""
    if not (pod.get("spec") or {}).get("nodeName"):
        return "ContainerCreating"
    status = pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or ():
            if isinstance(cs, Mapping) and cs.get("name") == container:
                state = cs.get("state") or {}
                if "waiting" in state:
                    return str((state.get("waiting") or {}).get("reason") or "ContainerCreating")
                return None
    return "ContainerCreating"


def plan_logs(pod: Mapping[str, Any], query: Mapping[str, str]) -> KubeletTarget:
    """Rules 1 and 2 for a ``pods/log`` request."""
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    try:
        options = parse_log_options(query)
    except LogOptionsError as exc:
        if exc.code == 422:
            raise errors.unprocessable(f'PodLogOptions "{name}" is invalid: {exc.message}') from None
        raise errors.bad_request(exc.message) from None
    container = choose_container(pod, options.container)
    if options.previous:
        raise errors.bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
    reason = _waiting_reason(pod, container)
    if reason is not None:
        raise errors.bad_request(f'container "{container}" in pod "{name}" is waiting to start: {reason}')
    forwarded = tuple(
        (k, query[k]) for k in ("follow", "tailLines", "limitBytes", "sinceSeconds", "timestamps") if k in query
    )
    node = str((pod.get("spec") or {}).get("nodeName"))
    return KubeletTarget(node, f"/containerLogs/{ns}/{name}/{container}", forwarded)


def plan_exec(pod: Mapping[str, Any], query: Mapping[str, Sequence[str]]) -> KubeletTarget:
    """Rules 1 and 3 (but the upgrade) for a ``pods/exec`` request."""
    try:
        options = parse_exec_options(query)
    except ExecOptionsError as exc:
        raise errors.bad_request(str(exc)) from None
    forwarded = [("command", word) for word in options.command]
    forwarded += [(k, "true") for k in ("stdin", "stdout", "stderr", "tty") if getattr(options, k)]
    return _stream_target(pod, "exec", options.container, forwarded)


def plan_attach(pod: Mapping[str, Any], query: Mapping[str, Sequence[str]]) -> KubeletTarget:
    """Rules 1 and 3 (but the upgrade) for a ``pods/attach`` request (rule 7)."""
    try:
        options = parse_attach_options(query)
    except ExecOptionsError as exc:
        raise errors.bad_request(str(exc)) from None
    forwarded = [(k, "true") for k in ("stdin", "stdout", "stderr", "tty") if getattr(options, k)]
    return _stream_target(pod, "attach", options.container, forwarded)


def _stream_target(
    pod: Mapping[str, Any], action: str, requested: str, forwarded: list[tuple[str, str]]
) -> KubeletTarget:
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    container = choose_container(pod, requested)
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if not node:
        raise errors.bad_request(f"pod {name} does not have a host assigned")
    phase = str((pod.get("status") or {}).get("phase") or "")
    if phase in ("Succeeded", "Failed"):
        raise errors.bad_request(f"cannot {action} into a container in a completed pod; current phase is {phase}")
    return KubeletTarget(node, f"/{action}/{ns}/{name}/{container}", tuple(forwarded))


def plan_port_forward(pod: Mapping[str, Any]) -> KubeletTarget:
    """Rule 7 (but the upgrade) for a ``pods/portforward`` request."""
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if not node:
        raise errors.bad_request(f"pod {name} does not have a host assigned")
    phase = str((pod.get("status") or {}).get("phase") or "")
    if phase != "Running":
        raise errors.bad_request(f"unable to forward port because pod is not running. Current status={phase}")
    return KubeletTarget(node, f"/portForward/{ns}/{name}", ())


def offered_protocols(header: str) -> tuple[str, ...]:
    """The subprotocols a client offers that we speak, in the client's order."""
    offered = [p.strip() for p in header.split(",")]
    return tuple(p for p in offered if p in PROTOCOLS)


class PodStreams:
    """The shell of rules 4 and 5: connects to kubelets' sockets under ``socket_dir``."""

    def __init__(self, socket_dir: Path | None, poll_interval: float = 1.0) -> None:
        self.socket_dir = socket_dir
        self.poll_interval = poll_interval
        """How often an idle log stream checks that its client is still there."""

    def _socket(self, node: str) -> Path:
        if self.socket_dir is None:
            raise errors.internal(
                "error dialing backend: no kubelet endpoint is configured (the API server runs without "
                "--kubelet-socket-dir)"
            )
        if not node or "/" in node or node in (".", ".."):
            raise errors.internal(f"error dialing backend: invalid node name {node!r}")
        return self.socket_dir / node / "kubelet.sock"

    async def _probe(self, node: str) -> None:
        """Raise rule 4's error when ``node``'s kubelet cannot be reached."""
        path = self._socket(node)
        try:
            _, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), 10)
        except (OSError, TimeoutError) as exc:
            raise _dial_error(path, exc) from None
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    async def _kubelet_refusal(self, target: KubeletTarget) -> None:
        """Raise the kubelet's refusal of ``target`` (what it would have answered the WebSocket), asked without an
        upgrade; nothing when it would have served it (it answers ``Upgrade request required`` after its checks)."""
        session, path = self._session(target.node)
        async with session:
            try:
                async with session.get(
                    f"http://{target.node}{target.path}",
                    params=target.query,
                    timeout=aiohttp.ClientTimeout(total=KUBELET_ASK_TIMEOUT),
                ) as upstream:
                    refusal = await _kubelet_error(upstream)
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                raise _dial_error(path, exc) from None
        if not (upstream.status == 400 and refusal.message == "Upgrade request required"):
            raise _upgrade_error(upstream.status, refusal.message)

    def _session(self, node: str) -> tuple[aiohttp.ClientSession, Path]:
        path = self._socket(node)
        connector = aiohttp.UnixConnector(path=str(path))
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(sock_connect=10)), path

    async def logs(self, request: web.Request, pod: Mapping[str, Any]) -> web.StreamResponse:
        target = plan_logs(pod, request.query)
        session, path = self._session(target.node)
        async with session:
            try:
                upstream = await session.get(f"http://{target.node}{target.path}", params=target.query)
            except aiohttp.ClientConnectionError as exc:
                raise _dial_error(path, exc) from None
            async with upstream:
                if upstream.status != 200:
                    raise await _kubelet_error(upstream)
                response = web.StreamResponse(headers={"Content-Type": "text/plain"})
                await response.prepare(request)

                async def copy() -> None:
                    async for chunk in upstream.content.iter_chunked(CHUNK):
                        await response.write(chunk)

                await _until_either_ends(copy(), _client_gone(request, self.poll_interval))
                return response

    async def exec(self, request: web.Request, pod: Mapping[str, Any]) -> web.StreamResponse:
        target = plan_exec(pod, {k: request.query.getall(k) for k in request.query})
        return await self._upgraded(request, target)

    async def attach(self, request: web.Request, pod: Mapping[str, Any]) -> web.StreamResponse:
        target = plan_attach(pod, {k: request.query.getall(k) for k in request.query})
        return await self._upgraded(request, target)

    async def _upgraded(self, request: web.Request, target: KubeletTarget) -> web.StreamResponse:
        """Rules 3 to 6 for a WebSocket to the kubelet (exec and attach)."""
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        protocols = offered_protocols(request.headers.get("Sec-WebSocket-Protocol", ""))
        if request.method != "GET" or not upgrade or not protocols:
            await self._kubelet_refusal(target)  # a client falling back to SPDY sees the WebSocket attempt's error
            raise errors.bad_request("Upgrade request required")
        session, path = self._session(target.node)
        async with session:
            try:
                upstream = await session.ws_connect(
                    f"http://{target.node}{target.path}",
                    params=target.query,
                    protocols=protocols,
                    max_msg_size=MAX_MESSAGE,
                )
            except aiohttp.WSServerHandshakeError as exc:
                raise _upgrade_error(exc.status, exc.message) from None
            except aiohttp.ClientConnectionError as exc:
                raise _dial_error(path, exc) from None
            async with upstream:
                chosen = upstream.protocol or protocols[0]
                client = web.WebSocketResponse(protocols=(chosen,), max_msg_size=MAX_MESSAGE)
                await client.prepare(request)
                await _relay(client, upstream)
                return client

    async def port_forward(self, request: web.Request, pod: Mapping[str, Any]) -> web.StreamResponse:
        """Rule 7; the caller counts the session against its user's bound."""
        target = plan_port_forward(pod)
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if request.method != "GET" or not upgrade or PORT_FORWARD_PROTOCOL not in offered:
            await self._probe(target.node)
            raise errors.bad_request("Upgrade request required")
        session, path = self._session(target.node)
        async with session:
            try:
                upstream = await session.ws_connect(
                    f"http://{target.node}{target.path}", protocols=(PORT_FORWARD_PROTOCOL,), max_msg_size=MAX_MESSAGE
                )
            except aiohttp.WSServerHandshakeError as exc:
                raise _upgrade_error(exc.status, exc.message) from None
            except aiohttp.ClientConnectionError as exc:
                raise _dial_error(path, exc) from None
            async with upstream:
                client = web.WebSocketResponse(protocols=(PORT_FORWARD_PROTOCOL,), max_msg_size=MAX_MESSAGE)
                await client.prepare(request)
                await _relay(client, upstream)
                return client


async def _relay(client: web.WebSocketResponse, kubelet: aiohttp.ClientWebSocketResponse) -> None:
    """Copy binary messages both ways until either side closes (rule 5)."""

    async def down() -> None:
        async for msg in kubelet:
            if msg.type is aiohttp.WSMsgType.BINARY:
                await client.send_bytes(msg.data)

    async def up() -> None:
        async for msg in client:
            if msg.type is aiohttp.WSMsgType.BINARY:
                await kubelet.send_bytes(msg.data)

    try:
        await _until_either_ends(down(), up())
    finally:
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
            await kubelet.close()
        with contextlib.suppress(ConnectionResetError):
            await client.close()


async def _client_gone(request: web.Request, interval: float) -> None:
    """Returns when the client's connection is gone (an idle follow writes nothing that would notice)."""
    while True:  # aiohttp tells a handler nothing of a lost connection but through its transport
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        await asyncio.sleep(interval)


async def _until_either_ends(*coroutines: Coroutine[Any, Any, None]) -> None:
    """Run ``coroutines`` until one ends, then cancel the others (rule 5: either side closing ends both)."""
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(c) for c in coroutines]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionResetError, aiohttp.ClientError):
                await task


def _dial_error(path: Path, exc: Exception) -> errors.ApiError:
    cause = exc if isinstance(exc, OSError) and exc.strerror else exc.__cause__ or exc
    why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
    return errors.internal(f"error dialing backend: dial unix {path}: connect: {why}")


def _upgrade_error(status: int, message: str) -> errors.ApiError:
    reasons = {400: "BadRequest", 403: "Forbidden", 404: "NotFound"}
    code = status if status in reasons else 500
    return errors.ApiError(code, reasons.get(code, "InternalError"), f"unable to upgrade connection: {message}")


async def _kubelet_error(upstream: aiohttp.ClientResponse) -> errors.ApiError:
    raw = await upstream.content.read(MAX_ERROR_BODY)
    message = raw.decode(errors="replace").strip()
    reason = ""
    with contextlib.suppress(ValueError):
        doc = json.loads(raw)
        if isinstance(doc, dict):
            message, reason = str(doc.get("message") or message), str(doc.get("reason") or "")
    code = upstream.status if 400 <= upstream.status < 600 else 500
    return errors.ApiError(code, reason or ("InternalError" if code >= 500 else "BadRequest"), message)
