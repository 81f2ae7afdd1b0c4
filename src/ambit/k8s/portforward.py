"""Kubernetes' port-forward protocol (``portforward.k8s.io``) over SPDY/3.1, the kubelet's side, sans-IO.

Theory of operation. ``kubectl port-forward`` holds one SPDY session to the pod (tunnelled in binary WebSocket
messages, ``SPDY/3.1+portforward.k8s.io``; the bytes are the same either way). For each local connection it opens
two streams whose SYN_STREAM headers name ``streamType`` (``error`` or ``data``), ``port`` and ``requestID``; once
both halves of a request are there the kubelet connects to ``localhost:port`` in the pod's network namespace and
copies bytes between that connection and the data stream. :class:`PortForwardSession` is fed the session's bytes
and returns commands (imperative: :class:`OpenConnection`, :class:`SendToPod`, ...) for the shell
(:mod:`ambit.lab.runtime.port_forward`) to carry out; what the shell learns from the pod it reports back
(:meth:`~PortForwardSession.connected`, :meth:`~PortForwardSession.pod_data`, ...), and the bytes to send to the
client collect in :meth:`~PortForwardSession.data_to_send`.

Rules:
1. Every stream the client opens is answered with SYN_REPLY (kubectl waits for it) unless refused: a stream whose
   headers are not a known ``streamType`` and a port in 1-65535, an id not above the last one, or one beyond
   ``max_streams`` open at once gets RST_STREAM (REFUSED_STREAM for the bound, PROTOCOL_ERROR otherwise). A missing
   ``requestID`` is derived from the stream id as kube does for old clients (the error stream's id; the data
   stream's id minus 2). A second stream of the same type for a request is refused.
2. A request whose two streams are open yields one :class:`OpenConnection`. Client data on the data stream before
   the shell reports the connection is passed on in order (the shell carries commands out in order, so it arrives
   after the connect); client data on the error stream is ignored (kubectl only half-closes it).
3. The client's FIN on the data stream is :class:`ShutdownPodWrite` (a half-close). The pod's end of output ends
   the forward, as with kube's runtimes (the copy from the pod is the one they wait for; kubectl waits for the
   error stream's end before it closes its local connection, so waiting for the client's FIN too would deadlock):
   our FIN on the data stream, our FIN on the error stream and :class:`CloseConnection`. A reset of either stream
   by the client, or a connection that could not be made, ends the forward too.
4. A failed connect is reported on the error stream as kube words it (:func:`forward_error`), then rule 3.
5. PINGs the client starts (odd ids) are echoed. SETTINGS, WINDOW_UPDATE, HEADERS and SYN_REPLY are accepted and
   ignored: kube's SPDY peers (kubectl and the kubelet both use moby/spdystream) neither send nor honour SPDY/3.1
   window updates, so a sender that waited for them would stall every forward after 64 KiB. Back-pressure is the
   transport's instead: the shell reads the session only when the pod took the last data, and reads a pod only
   when the session's transport took the last frame.
6. A protocol error in the session's bytes, or the client's GOAWAY, ends the session: our GOAWAY (with the error's
   status), :class:`CloseConnection` for every open forward and :class:`SessionEnded`; later input is ignored.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ambit.k8s import spdy

PROTOCOL = "portforward.k8s.io"
WEBSOCKET_PROTOCOL = "SPDY/3.1+" + PROTOCOL
"""The WebSocket subprotocol that carries the SPDY session tunnelled in binary messages."""
DEFAULT_MAX_STREAMS = 256


class StreamType(enum.Enum):
    ERROR = "error"
    DATA = "data"


# -- commands for the shell ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OpenConnection:
    request_id: str
    port: int


@dataclass(frozen=True, slots=True)
class SendToPod:
    request_id: str
    data: bytes


@dataclass(frozen=True, slots=True)
class ShutdownPodWrite:
    request_id: str


@dataclass(frozen=True, slots=True)
class CloseConnection:
    request_id: str


@dataclass(frozen=True, slots=True)
class SessionEnded:
    reason: str


Command = OpenConnection | SendToPod | ShutdownPodWrite | CloseConnection | SessionEnded


def forward_error(port: int, pod: str, netns: str, ipv4_error: str, ipv6_error: str) -> str:
    """The error stream's text for a port nothing listens on, in kube's words (kubelet over a CRI runtime: the pod
    is named by its sandbox and the uid left empty)."""
    return (
        f"error forwarding port {port} to pod {pod}, uid : failed to connect to localhost:{port} inside namespace "
        f'"{netns}", IPv4: {ipv4_error} IPv6 {ipv6_error} '
    )


@dataclass(slots=True)
class _Forward:
    """One request: its two streams, and whether the client or the pod ended its output."""

    request_id: str
    port: int = 0
    error_stream: int = 0
    data_stream: int = 0
    opened: bool = False
    client_done: bool = False
    pod_done: bool = False


@dataclass(slots=True)
class PortForwardSession:
    """The kubelet's end of one port-forward session (rules 1 to 6)."""

    max_streams: int = DEFAULT_MAX_STREAMS
    max_frame: int = 1024 * 1024
    _parser: spdy.SpdyParser = field(init=False)
    _out: spdy.SpdySerializer = field(default_factory=spdy.SpdySerializer, init=False)
    _send: bytearray = field(default_factory=bytearray, init=False)
    _forwards: dict[str, _Forward] = field(default_factory=dict, init=False)
    _by_stream: dict[int, str] = field(default_factory=dict, init=False)
    _last_stream: int = field(default=0, init=False)
    ended: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._parser = spdy.SpdyParser(max_frame=self.max_frame)

    def data_to_send(self) -> bytes:
        out = bytes(self._send)
        self._send.clear()
        return out

    def open_forwards(self) -> int:
        return len(self._forwards)

    # -- the client's bytes ------------------------------------------------------------------------------------
    def receive(self, data: bytes) -> list[Command]:
        if self.ended:
            return []
        try:
            events = self._parser.feed(data)
        except spdy.SpdyProtocolError as exc:
            return self._end(f"protocol error: {exc}", exc.status)
        commands: list[Command] = []
        for event in events:
            commands += self._on(event)
            if self.ended:
                break
        return commands

    def _on(self, event: spdy.Event) -> list[Command]:
        if isinstance(event, spdy.StreamOpened):
            return self._opened(event)
        if isinstance(event, spdy.DataReceived):
            return self._data(event.stream_id, event.data, event.fin)
        if isinstance(event, spdy.HeadersReceived) and event.fin:
            return self._data(event.stream_id, b"", True)
        if isinstance(event, spdy.StreamReset):
            forward = self._forward_of(event.stream_id)
            return self._finish(forward, "", reset=True) if forward is not None else []
        if isinstance(event, spdy.PingReceived):
            if event.ping_id & 1:
                self._send += self._out.ping(event.ping_id)
            return []
        if isinstance(event, spdy.GoAwayReceived):
            return self._end("the client went away", spdy.GoAwayStatus.OK)
        return []  # rule 5: SETTINGS, WINDOW_UPDATE, SYN_REPLY, HEADERS without FIN

    def _refuse(self, stream_id: int, status: spdy.RstStatus) -> list[Command]:
        self._send += self._out.rst_stream(stream_id, status)
        return []

    def _opened(self, event: spdy.StreamOpened) -> list[Command]:
        sid = event.stream_id
        if sid <= self._last_stream or not sid & 1:
            return self._refuse(sid, spdy.RstStatus.PROTOCOL_ERROR)
        self._last_stream = sid
        if len(self._by_stream) >= self.max_streams:
            return self._refuse(sid, spdy.RstStatus.REFUSED_STREAM)
        kind_text = spdy.header_value(event.headers, "streamType") or ""
        port_text = spdy.header_value(event.headers, "port") or ""
        kind = next((k for k in StreamType if k.value == kind_text), None)
        port = int(port_text) if port_text.isascii() and port_text.isdigit() and len(port_text) <= 5 else 0
        if kind is None or not 0 < port <= 65535:
            return self._refuse(sid, spdy.RstStatus.PROTOCOL_ERROR)
        request_id = spdy.header_value(event.headers, "requestID")
        if request_id is None:
            request_id = str(sid if kind is StreamType.ERROR else sid - 2)
        forward = self._forwards.get(request_id) or _Forward(request_id)
        if (forward.error_stream if kind is StreamType.ERROR else forward.data_stream) or forward.opened:
            return self._refuse(sid, spdy.RstStatus.PROTOCOL_ERROR)
        self._forwards[request_id] = forward
        self._by_stream[sid] = request_id
        if kind is StreamType.ERROR:
            forward.error_stream = sid
        else:
            forward.data_stream, forward.port = sid, port
        self._send += self._out.syn_reply(sid)
        commands: list[Command] = []
        if forward.error_stream and forward.data_stream:
            forward.opened = True
            commands.append(OpenConnection(request_id, forward.port))
        if event.fin and kind is StreamType.DATA:
            commands += self._data(sid, b"", True)
        return commands

    def _forward_of(self, stream_id: int) -> _Forward | None:
        request_id = self._by_stream.get(stream_id)
        return self._forwards.get(request_id) if request_id is not None else None

    def _data(self, stream_id: int, data: bytes, fin: bool) -> list[Command]:
        forward = self._forward_of(stream_id)
        if forward is None or stream_id != forward.data_stream or forward.client_done:
            return []  # the error stream's bytes, or a forward already over
        commands: list[Command] = []
        if data:
            commands.append(SendToPod(forward.request_id, data))
        if fin:
            forward.client_done = True
            commands.append(ShutdownPodWrite(forward.request_id))
        return commands

    # -- what the shell learnt ---------------------------------------------------------------------------------
    def connect_failed(self, request_id: str, message: str) -> list[Command]:
        forward = self._forwards.get(request_id)
        return self._finish(forward, message) if forward is not None else []

    def pod_data(self, request_id: str, data: bytes) -> None:
        forward = self._forwards.get(request_id)
        if forward is not None and not forward.pod_done and data:
            for at in range(0, len(data), self.max_frame):
                self._send += self._out.data(forward.data_stream, data[at : at + self.max_frame])

    def pod_closed(self, request_id: str) -> list[Command]:
        """The pod's end of output (rule 3)."""
        forward = self._forwards.get(request_id)
        if forward is None or forward.pod_done:
            return []
        forward.pod_done = True
        self._send += self._out.data(forward.data_stream, b"", fin=True)
        return self._finish(forward, "")

    def close(self) -> list[Command]:
        """Our side ends the session (the shell is shutting down)."""
        return self._end("closed", spdy.GoAwayStatus.OK)

    # -- endings -----------------------------------------------------------------------------------------------
    def _finish(self, forward: _Forward, error: str, *, reset: bool = False) -> list[Command]:
        del self._forwards[forward.request_id]
        for sid in (forward.error_stream, forward.data_stream):
            self._by_stream.pop(sid, None)
        if not reset:
            if forward.error_stream:
                self._send += self._out.data(forward.error_stream, error.encode(), fin=True)
            if forward.data_stream and not forward.pod_done:
                self._send += self._out.data(forward.data_stream, b"", fin=True)
        return [CloseConnection(forward.request_id)] if forward.opened else []

    def _end(self, reason: str, status: spdy.GoAwayStatus) -> list[Command]:
        if self.ended:
            return []
        self.ended = True
        self._send += self._out.goaway(self._last_stream, status)
        commands: list[Command] = [CloseConnection(f.request_id) for f in self._forwards.values() if f.opened]
        self._forwards.clear()
        self._by_stream.clear()
        commands.append(SessionEnded(reason))
        return commands
