"""HTTP/1.1 messages written as bytes, sans-IO: heads checked and serialized, bodies framed.

Theory of operation: :func:`request_head` and :func:`response_head` turn a head into bytes after checking every
token and value (a rewritten header may carry anything); :func:`body_framing` reads how a head frames its body
and a :class:`BodyWriter` frames the pieces and checks their sum. Misuse (a value HTTP/1.1 cannot carry, a body
longer or shorter than its ``Content-Length``) raises :class:`FramingError`; each side of
:mod:`ambit.waypoint.http1` turns it into its own :class:`~ambit.waypoint.errors.HttpProtocolError`.

Rules:

1. Names are tokens; values are visible latin-1 characters with single blanks or tabs inside, none at either end;
   a request target is visible characters; a method is a token; a status has three digits.
2. ``Transfer-Encoding`` may only say ``chunked``, and wins over a ``Content-Length`` (which is then dropped);
   several ``Content-Length`` values must agree.
3. A body is framed by its ``Content-Length`` (exactly that many bytes), chunked, not at all (``HEAD`` answers,
   204, 304, 1xx: no byte may be sent) or by the connection's close (an answer to an HTTP/1.0 client without a
   length). Trailers need chunked framing.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence

from ambit.model.field_names import TOKEN

_VALUE = re.compile(r"(?:[\x21-\x7e\x80-\xff](?:[ \t]*[\x21-\x7e\x80-\xff])*)?")
_TARGET = re.compile(r"[\x21-\x7e\x80-\xff]+")


class FramingError(Exception):
    """What we were asked to write is not valid HTTP/1.1 (rules 1-3)."""


class Framing(enum.Enum):
    LENGTH = "content-length"
    CHUNKED = "chunked"
    NONE = "none"
    CLOSE = "until close"


_REMEMBERED_LONGEST = 64
_REMEMBERED_MOST = 512
_GOOD_NAMES: set[str] = set()
_GOOD_VALUES: set[str] = set()
"""Names and values already found to follow rule 1, so that those every message repeats (``host``,
``content-type``, ``keep-alive``...) are checked once rather than per message. Bounded whatever peers send: only
strings of at most ``_REMEMBERED_LONGEST`` characters are remembered, and past ``_REMEMBERED_MOST`` of them a set
starts afresh."""


def _checked(good: set[str], pattern: re.Pattern[str], text: str) -> bool:
    """Whether ``text`` follows ``pattern``; remembered in ``good`` when it does and is short enough."""
    if pattern.fullmatch(text) is None:
        return False
    if len(text) <= _REMEMBERED_LONGEST:
        if len(good) >= _REMEMBERED_MOST:
            good.clear()
        good.add(text)
    return True


def _fields(headers: Sequence[tuple[str, str]]) -> bytes:
    names, values = _GOOD_NAMES, _GOOD_VALUES
    for name, value in headers:
        if (name not in names and not _checked(names, TOKEN, name)) or (
            value not in values and not _checked(values, _VALUE, value)
        ):
            raise FramingError(f"illegal header {name!r}: {value!r}")
    return "".join([f"{name}: {value}\r\n" for name, value in headers]).encode("latin-1")


def request_head(method: str, target: str, headers: Sequence[tuple[str, str]]) -> bytes:
    if not TOKEN.fullmatch(method):
        raise FramingError(f"illegal method {method!r}")
    if not _TARGET.fullmatch(target):
        raise FramingError(f"illegal request target {target!r}")
    return f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + _fields(headers) + b"\r\n"


def response_head(status: int, reason: str, headers: Sequence[tuple[str, str]], version: str = "1.1") -> bytes:
    """The status line (``HTTP/<version>``) and fields; an illegal status or phrase is a :class:`FramingError`."""
    if not 100 <= status <= 999:
        raise FramingError(f"illegal status {status}")
    phrase = reason.encode("latin-1", "replace")
    if b"\r" in phrase or b"\n" in phrase:
        raise FramingError(f"illegal reason phrase {reason!r}")
    return b"HTTP/%s %d %s\r\n" % (version.encode("ascii"), status, phrase) + _fields(headers) + b"\r\n"


def body_framing(headers: Sequence[tuple[str, str]]) -> tuple[Framing | None, int, list[tuple[str, str]]]:
    """How ``headers`` frame a body (rule 2): ``(LENGTH, n, headers)``, ``(CHUNKED, 0, headers without any
    Content-Length)``, or ``(None, 0, headers)`` when they say nothing."""
    length: str | None = None
    lengths_agree = True
    coding: str | None = None
    codings = 0
    for name, value in headers:
        if name == "content-length":
            stripped = value.strip()
            if length is not None and stripped != length:
                lengths_agree = False
            length = stripped
        elif name == "transfer-encoding":
            coding = value
            codings += 1
    if coding is not None:
        if codings > 1 or coding.strip().lower() != "chunked":
            raise FramingError("only Transfer-Encoding: chunked is supported")
        return Framing.CHUNKED, 0, [(n, v) for n, v in headers if n != "content-length"]
    if length is None:
        return None, 0, list(headers)
    if not lengths_agree or not length.isascii() or not length.isdigit():
        raise FramingError("conflicting or malformed Content-Length")
    return Framing.LENGTH, int(length), list(headers)


def connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    """The options of every ``Connection`` header, lower-cased."""
    tokens: set[str] = set()
    for name, value in headers:
        if name == "connection":
            tokens.update(part.strip().lower() for part in value.split(",") if part.strip())
    return tokens


class BodyWriter:
    """The body of one outgoing message, framed as its head said (rule 3)."""

    __slots__ = ("framing", "remaining")

    def __init__(self, framing: Framing, length: int = 0) -> None:
        self.framing = framing
        self.remaining = length

    def data(self, data: bytes) -> bytes:
        framing = self.framing
        if framing is Framing.CHUNKED:
            return b"%x\r\n%s\r\n" % (len(data), data)
        if framing is Framing.LENGTH:
            if len(data) > self.remaining:
                raise FramingError("too much data for declared Content-Length")
            self.remaining -= len(data)
            return data
        if framing is Framing.CLOSE:
            return data
        raise FramingError("this message has no body")

    def end(self, trailers: Sequence[tuple[str, str]] = ()) -> bytes:
        if self.framing is Framing.CHUNKED:
            return b"0\r\n" + _fields(trailers) + b"\r\n"
        if trailers:
            raise FramingError("trailers need chunked framing")
        if self.framing is Framing.LENGTH and self.remaining:
            raise FramingError("too little data for declared Content-Length")
        return b""
