"""HTTP/1.1 messages read from bytes, sans-IO: llhttp (through httptools) parses, events come out in order.

Theory of operation: a :class:`MessageReader` reads one direction of one connection (requests on the downstream
side, responses on the upstream side). :meth:`~MessageReader.receive` hands bytes to the parser at once; its
callbacks queue what they saw (a :class:`ParsedHead`, :class:`~ambit.waypoint.http1_events.BodyData` pieces, a
:class:`~ambit.waypoint.http1_events.MessageEnded` with the trailers, a parse error, the peer's clean close) and
:meth:`~MessageReader.pop` hands them out one by one. What a head means (a request's authority, a refused
version, a skipped ``100 Continue``) is the caller's business (:mod:`ambit.waypoint.http1`). No socket, task or
clock is touched here.

Rules:

1. Everything is parsed as it arrives and queued in order; a parse error is queued after what came before it and
   ends the reader (nothing after it is parsed). The caller takes the events of one message at a time and feeds
   bytes only when the queue is empty, so what is queued ahead (pipelined requests) is bounded by one read.
2. While a head is incomplete, the bytes fed since it began are counted, and beyond ``max_head_bytes`` the reader
   fails (431 for a request head): a peer can make us hold at most one read beyond the bound.
3. The parser stops, and later bytes are held raw, after an upgrade (llhttp ends HTTP after an ``Upgrade``
   request, a ``CONNECT`` or a 101 answer) and, in head-only mode (the answer to a ``HEAD`` request, whose framing
   headers describe a body that is not sent), after the final head: heads are then fed one at a time, up to their
   blank line. :meth:`~MessageReader.restart` gives the held bytes to a fresh parser, for the next message.
4. End of input (``receive(b"")``) ends a response body framed by the connection's close; inside any other
   message it is an error; between messages it is :data:`~ambit.waypoint.http1_events.Signal.CLOSED`.
5. Header names are lower-cased and values decoded as latin-1 without surrounding blanks; fields that follow the
   last chunk are trailers. llhttp is strict: obsolete line folding, bare LF line ends, invalid tokens, a
   ``Content-Length`` with a ``Transfer-Encoding``, duplicate or malformed lengths and transfer codings other than
   a final ``chunked`` in a request are all errors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import httptools

from ambit.waypoint.errors import HttpProtocolError
from ambit.waypoint.http1_events import BodyData, MessageEnded, Signal

_NO_BODY_STATUSES = frozenset((204, 304))
_FRAMING_NAMES = frozenset(("content-length", "transfer-encoding"))
_DECODED_LONGEST = 64
_DECODED_MOST = 512
_FIELDS: dict[tuple[bytes, bytes], tuple[str, str]] = {}
"""Header fields as rule 5 gives them, by their name's and value's bytes, for those every message repeats
(``host: ...``, ``content-length: ...``, ``connection: keep-alive``...): one look-up instead of decoding,
lower-casing and stripping each time. Bounded whatever peers send: only fields whose name and value come to at most
``_DECODED_LONGEST`` bytes are remembered, and past ``_DECODED_MOST`` of them the table starts afresh."""


def _decoded(name: bytes, value: bytes) -> tuple[str, str]:
    field = (name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t"))
    if len(name) + len(value) <= _DECODED_LONGEST:
        if len(_FIELDS) >= _DECODED_MOST:
            _FIELDS.clear()
        _FIELDS[name, value] = field
    return field


class ParsedHead:
    """One request or response head as llhttp read it (a request has ``method`` and ``target``, a response
    ``status`` and ``reason``); ``framed``: it has a ``Content-Length`` or ``Transfer-Encoding`` field."""

    __slots__ = ("framed", "headers", "method", "reason", "status", "target", "version")

    def __init__(self, version: str, headers: list[tuple[str, str]], framed: bool) -> None:
        self.version = version
        self.headers = headers
        self.framed = framed
        self.method = ""
        self.target = ""
        self.status = 0
        self.reason = ""


Item = ParsedHead | BodyData | MessageEnded | HttpProtocolError | Signal
ErrorFactory = Callable[[str, int], HttpProtocolError]


class MessageReader:
    """Requests (``response=False``) or responses read from one connection's bytes (rules 1-5)."""

    __slots__ = (
        "_eof",
        "_error",
        "_failed",
        "_framed",
        "_head",
        "_head_bytes",
        "_head_only",
        "_headers",
        "_held",
        "_in_head",
        "_in_message",
        "_max_head",
        "_parser",
        "_pieces",
        "_queue",
        "_response",
        "_stopped",
        "_trailers",
        "_until_close",
    )

    def __init__(self, *, response: bool, max_head_bytes: int, error: ErrorFactory) -> None:
        self._response = response
        self._max_head = max_head_bytes
        self._error = error
        self._queue: deque[Item] = deque()
        self._held = bytearray()
        self._eof = False
        self._failed = False
        self._head_only = False
        self._new_parser()

    def _new_parser(self) -> None:
        self._parser: httptools.HttpRequestParser | httptools.HttpResponseParser = (
            httptools.HttpResponseParser(self) if self._response else httptools.HttpRequestParser(self)
        )
        self._stopped = False
        self._in_head = True
        self._in_message = False
        self._head_bytes = 0
        self._until_close = False
        self._pieces: list[bytes] = []
        self._headers: list[tuple[str, str]] = []
        self._framed = False
        self._trailers: list[tuple[str, str]] | None = None
        self._head: ParsedHead | None = None

    # --- what the caller uses ----------------------------------------------------------------------------------

    @property
    def eof(self) -> bool:
        return self._eof

    @property
    def begun(self) -> bool:
        """Bytes of a message wait: queued, held, or a head the parser has begun."""
        return bool(self._queue) or bool(self._held) or (self._in_message and self._in_head)

    @property
    def held(self) -> bytes:
        """The bytes after the point where the parser stopped (rule 3)."""
        return bytes(self._held)

    def head_only(self) -> None:
        """The next response answers a ``HEAD`` request: it ends with its head (rule 3)."""
        self._head_only = True

    def receive(self, data: bytes) -> None:
        """Bytes from the peer; ``b""`` is the end of its input (rule 4)."""
        if not data:
            if not self._eof:
                self._eof = True
                self._end_of_input()
            return
        if self._failed:
            return
        if self._stopped or self._head_only:
            self._held += data
            if not self._stopped:
                self._feed_heads()
            return
        self._feed(data)

    def pop(self) -> Item | None:
        """The next thing read, or None when more bytes are needed."""
        if self._queue:
            return self._queue.popleft()
        if self._eof and not self._in_message and not self._failed and not self._stopped:
            return Signal.CLOSED
        return None

    def restart(self) -> None:
        """Between messages: a parser that stopped (rule 3) is replaced, and the held bytes are fed to the new one."""
        if not self._stopped:
            return
        self._head_only = False
        self._new_parser()
        held, self._held = bytes(self._held), bytearray()
        if held:
            self._feed(held)
        if self._eof:
            self._end_of_input()

    # --- feeding -------------------------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._stopped = True
            self._held += data[exc.args[0] :]
            return
        except httptools.HttpParserError as exc:
            reason = str(exc) or "malformed HTTP/1.1"
            version = "invalid http version" in reason.lower() or "HTTP/2" in reason  # rule 3 of http1: 505
            self._fail(reason, 505 if version and not self._response else 400)
            return
        if self._in_head and self._head_bytes > self._max_head and not self._stopped:
            self._fail(f"head larger than {self._max_head} bytes", 431)

    def _feed_heads(self) -> None:
        """Head-only mode: feed whole heads, each up to its blank line, until the final one stopped the parser."""
        while not (self._stopped or self._failed):
            end = self._held.find(b"\r\n\r\n")
            if end < 0:
                if len(self._held) > self._max_head:
                    self._fail(f"head larger than {self._max_head} bytes", 431)
                return
            head = bytes(self._held[: end + 4])
            del self._held[: end + 4]
            self._feed(head)

    def _end_of_input(self) -> None:
        if self._failed or self._stopped:
            return
        if self._head_only and self._held:
            self._fail("connection closed inside a message head", 400)
        elif self._in_message:
            if self._until_close and not self._in_head:
                self._in_message = False
                self._queue.append(MessageEnded(()))
            else:
                self._fail("peer closed connection without sending complete message", 400)

    def _fail(self, reason: str, status: int) -> None:
        self._failed = True
        self._in_message = False
        self._queue.append(self._error(reason, status))

    # --- httptools callbacks (they never raise: httptools would turn that into a parse error) --------------------

    def on_message_begin(self) -> None:
        self._in_message = True
        self._pieces = []
        self._headers = []
        self._framed = False
        self._trailers = None

    def on_url(self, piece: bytes) -> None:
        self._pieces.append(piece)

    def on_status(self, piece: bytes) -> None:
        self._pieces.append(piece)

    def on_header(self, name: bytes, value: bytes) -> None:
        field = _FIELDS.get((name, value))
        if field is None:
            field = _decoded(name, value)
        if self._trailers is None:
            self._headers.append(field)
            if field[0] in _FRAMING_NAMES:
                self._framed = True
        else:
            self._trailers.append(field)

    def on_headers_complete(self) -> None:
        parser = self._parser
        self._in_head = False
        self._head_bytes = 0
        self._trailers = []
        head = ParsedHead(parser.get_http_version(), self._headers, self._framed)
        text = b"".join(self._pieces).decode("latin-1")
        if isinstance(parser, httptools.HttpResponseParser):
            head.status, head.reason = parser.get_status_code(), text
            self._until_close = head.status >= 200 and head.status not in _NO_BODY_STATUSES and not self._framed
        else:
            head.method, head.target = parser.get_method().decode("ascii", "replace"), text
        self._head = head
        self._queue.append(head)
        if self._head_only and head.status >= 200:  # rule 3: the answer to HEAD has no body, whatever it says
            self._queue.append(MessageEnded(()))
            self._in_message = False
            self._in_head = True
            self._stopped = True

    def on_body(self, data: bytes) -> None:
        self._queue.append(BodyData(data))

    def on_message_complete(self) -> None:
        if self._stopped:  # a head-only answer already ended at its head
            return
        self._in_message = False
        self._in_head = True
        self._head_bytes = 0
        head = self._head
        if head is not None and 100 <= head.status < 200:  # an interim answer: the final one follows
            return
        self._queue.append(MessageEnded(tuple(self._trailers or ())))
