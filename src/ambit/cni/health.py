"""The node agent's probe endpoints: ``/healthz`` and ``/readyz`` over plain HTTP/1.1 (istio-cni's :8000).

Theory of operation: the kubelet asks ``GET /readyz`` every few seconds on a fresh connection (its prober sends
no keep-alive). The node agent runs in the host's network namespace and listens on every address, so every pod on
the node, and anything that can route to the node's addresses, can reach this port. What it answers is harmless
(``ok`` or ``not ready``); what it must not do is let a client hold the agent's file descriptors or memory, since
the agent needs both for its real work (ZDS, pod namespaces, the plugin's socket). Rules:

1. :func:`probe_answer` decides, purely, from the method, the target and readiness: ``GET``/``HEAD``
   ``/healthz`` 200 ``ok``; ``/readyz`` 200 ``ok`` or 503 ``not ready``; another path 404; another method 405.
   The query string is ignored.
2. One request per connection: the answer says ``Connection: close`` and the connection is closed after it. A
   request body is never read.
3. A connection has :attr:`HealthSettings.deadline` seconds from accept to the end of its answer (slowloris heads,
   clients that never read); past it, it is closed without an answer.
4. A request head over :attr:`HealthSettings.max_head_bytes` is answered 431, a malformed one 400 (h11's verdict),
   then closed; at most that many bytes of a head are buffered.
5. At most :attr:`HealthSettings.max_connections` connections are open at once, and at most
   :attr:`HealthSettings.max_per_peer` from one peer address, so one hostile pod cannot fill the table the
   kubelet's probe needs. A connection past either bound is closed at once, unanswered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass

import h11

__all__ = ["HealthEndpoints", "HealthSettings", "ProbeAnswer", "probe_answer"]

log = logging.getLogger("ambit.cni.health")

_READ = 4096


@dataclass(frozen=True, slots=True)
class HealthSettings:
    max_connections: int = 128
    """Connections open at once (rule 5)."""
    max_per_peer: int = 16
    """Connections open at once from one peer address (rule 5)."""
    deadline: float = 5.0
    """Seconds from accept to the end of the answer (rule 3); the kubelet's own probe timeout is 1-5 s."""
    max_head_bytes: int = 8192
    """Largest request head buffered (rule 4)."""


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    status: int
    body: bytes


def probe_answer(method: bytes, target: bytes, *, ready: bool) -> ProbeAnswer:
    """What ``method target`` gets (rule 1)."""
    path = target.split(b"?", 1)[0]
    if path == b"/healthz":
        answer = ProbeAnswer(200, b"ok")
    elif path == b"/readyz":
        answer = ProbeAnswer(200, b"ok") if ready else ProbeAnswer(503, b"not ready")
    else:
        return ProbeAnswer(404, b"not found")
    if method not in (b"GET", b"HEAD"):
        return ProbeAnswer(405, b"method not allowed")
    return answer


class HealthEndpoints:
    """The probe server at ``address`` (rules 1-5); ``ready`` is read at each request. ``aclose()`` stops it."""

    def __init__(self, address: tuple[str, int], settings: HealthSettings | None = None) -> None:
        self.address = address
        self.settings = settings or HealthSettings()
        self.ready = False
        self.counts: Counter[str] = Counter()
        """Connections ended early, by reason: ``refused`` (rule 5), ``deadline`` (rule 3), ``malformed`` (rule 4)."""
        self._server: asyncio.Server | None = None
        self._open = 0
        self._per_peer: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def open_connections(self) -> int:
        return self._open

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.address[0], self.address[1], reuse_address=True, limit=self.settings.max_head_bytes
        )

    def bound_port(self) -> int:
        """The port listened on (the one the kernel chose when ``address`` asked for 0)."""
        assert self._server is not None, "start() first"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def aclose(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._server.wait_closed()
        self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if peer else ""
        if self._open >= self.settings.max_connections or self._per_peer[host] >= self.settings.max_per_peer:
            self._count("refused", host)
            writer.transport.abort()
            return
        self._open += 1
        self._per_peer[host] += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            async with asyncio.timeout(self.settings.deadline):
                await self._serve(reader, writer)
        except TimeoutError:
            self._count("deadline", host)
        except ConnectionError:
            pass
        except Exception:  # one connection's failure never takes the endpoint down
            log.exception("probe connection from %s failed", host)
        finally:
            writer.transport.abort()
            self._open -= 1
            self._per_peer[host] -= 1
            if not self._per_peer[host]:
                del self._per_peer[host]
            if task is not None:
                self._tasks.discard(task)

    def _count(self, reason: str, peer: str) -> None:
        self.counts[reason] += 1
        log.debug("probe connection from %s ended: %s", peer, reason)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.settings.max_head_bytes)
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._count("malformed", str(writer.get_extra_info("peername")))
                writer.write(_error_answer(exc.error_status_hint))
                await writer.drain()
                return
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(_READ))
                continue
            if isinstance(event, h11.Request):
                answer = probe_answer(event.method, event.target, ready=self.ready)
                writer.write(_answer_bytes(conn, answer, head_only=event.method == b"HEAD"))
                writer.close()  # after what was written is sent (rule 2); abort() in _accept only if it never is
                await writer.wait_closed()
            return  # a Request was answered, or the peer closed (ConnectionClosed)


def _answer_bytes(conn: h11.Connection, answer: ProbeAnswer, *, head_only: bool) -> bytes:
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(answer.body)).encode()),
        (b"connection", b"close"),
    ]
    out = conn.send(h11.Response(status_code=answer.status, headers=headers)) or b""
    if not head_only:
        out += conn.send(h11.Data(data=answer.body)) or b""
    return out + (conn.send(h11.EndOfMessage()) or b"")


def _error_answer(status: int) -> bytes:
    reason = {431: b"Request Header Fields Too Large"}.get(status, b"Bad Request")
    return b"HTTP/1.1 %d %s\r\ncontent-length: 0\r\nconnection: close\r\n\r\n" % (status, reason)
