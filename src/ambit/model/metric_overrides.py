"""The Telemetry API's metric overrides as a waypoint applies them, and the tag-value expressions they carry.

Theory of operation: the control plane resolves every Telemetry that reaches a waypoint into one
:class:`ServiceMetrics` per destination service (``service_key`` empty: every request without an entry of its
own): which of Istio's standard metrics are dropped, and for each the tags to set (UPSERT, :class:`TagOverride`
with an :class:`Expression`) or to remove (REMOVE, no expression). The waypoint compiles them once per
configuration and looks one up per request by the addressed service.

A tag's value is a CEL expression in Istio; Ambit evaluates the subset that is cheap per request:

- a string literal, ``'test'`` or ``"test"`` (escapes ``\\\\``, ``\\'``, ``\\"``, ``\\n``, ``\\t``);
- an attribute: ``request.host``, ``request.method``, ``request.path``, ``request.url_path`` (the path without
  its query), ``request.id``, ``request.useragent``, ``request.referer``, ``request.scheme``,
  ``request.protocol``, ``response.code``, ``source.address``, ``source.port``, ``source.principal``,
  ``destination.address``, ``destination.port``, ``destination.principal``;
- one request header, ``request.headers['x-name']`` (the first value; absent reads as empty).

:func:`parse_expression` refuses anything else with :class:`ExpressionError` and a reason; the translation skips
such an override with that reason, and decoding refuses it. Expressions are at most :data:`MAX_EXPRESSION`
characters. Invariants: pure; an :class:`Expression` keeps the text it was parsed from, so the wire carries the
text and the waypoint parses it again with the same parser.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from ambit.errors import AmbitError

__all__ = [
    "MAX_EXPRESSION",
    "Attribute",
    "Expression",
    "ExpressionError",
    "IstioMetric",
    "MetricOverride",
    "RequestAttributes",
    "ServiceMetrics",
    "TagOverride",
    "evaluate",
    "parse_expression",
    "tag_name_problem",
]

MAX_EXPRESSION = 1024
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,127}")
RESERVED_LABELS = frozenset({"le", "quantile"})
"""Labels the exposition format gives a meaning to (histogram buckets, summary quantiles)."""


def tag_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a tag override's key (a Prometheus label name, at most 128 characters, not reserved
    nor ``__``-prefixed), or None."""
    if not isinstance(name, str) or not LABEL_NAME.fullmatch(name):
        return f"{str(name)[:64]!r} is not a valid metric label name"
    if name in RESERVED_LABELS or name.startswith("__"):
        return f"{name!r} is reserved by the metrics format"
    return None


class IstioMetric(enum.Enum):
    """Istio's standard metrics (``MetricSelector.IstioMetric`` without ``ALL_METRICS``)."""

    REQUEST_COUNT = "REQUEST_COUNT"
    REQUEST_DURATION = "REQUEST_DURATION"
    REQUEST_SIZE = "REQUEST_SIZE"
    RESPONSE_SIZE = "RESPONSE_SIZE"
    TCP_OPENED_CONNECTIONS = "TCP_OPENED_CONNECTIONS"
    TCP_CLOSED_CONNECTIONS = "TCP_CLOSED_CONNECTIONS"
    TCP_SENT_BYTES = "TCP_SENT_BYTES"
    TCP_RECEIVED_BYTES = "TCP_RECEIVED_BYTES"
    GRPC_REQUEST_MESSAGES = "GRPC_REQUEST_MESSAGES"
    GRPC_RESPONSE_MESSAGES = "GRPC_RESPONSE_MESSAGES"


class Attribute(enum.Enum):
    """What an expression reads; ``LITERAL`` is the expression's own string, ``REQUEST_HEADER`` a header."""

    LITERAL = "literal"
    REQUEST_HEADER = "request.headers"
    REQUEST_HOST = "request.host"
    REQUEST_METHOD = "request.method"
    REQUEST_PATH = "request.path"
    REQUEST_URL_PATH = "request.url_path"
    REQUEST_ID = "request.id"
    REQUEST_USERAGENT = "request.useragent"
    REQUEST_REFERER = "request.referer"
    REQUEST_SCHEME = "request.scheme"
    REQUEST_PROTOCOL = "request.protocol"
    RESPONSE_CODE = "response.code"
    SOURCE_ADDRESS = "source.address"
    SOURCE_PORT = "source.port"
    SOURCE_PRINCIPAL = "source.principal"
    DESTINATION_ADDRESS = "destination.address"
    DESTINATION_PORT = "destination.port"
    DESTINATION_PRINCIPAL = "destination.principal"


_NAMED = {a.value: a for a in Attribute if a not in (Attribute.LITERAL, Attribute.REQUEST_HEADER)}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t"}
_PATH = re.compile(r"[a-z_]+(?:\.[a-z_]+)*")


class ExpressionError(AmbitError):
    """A tag value Ambit cannot evaluate; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Expression:
    """A parsed tag value: what it reads and, for a literal or a header, its argument."""

    source: str
    """The text as written (sent on the wire)."""
    attribute: Attribute
    argument: str = ""
    """The literal's value, or the header's lower-case name."""


def _string(text: str, at: int) -> tuple[str, int]:
    """The string literal starting at ``text[at]`` (a quote) and the index after it."""
    quote, i = text[at], at + 1
    out: list[str] = []
    while i < len(text):
        char = text[i]
        if char == quote:
            return "".join(out), i + 1
        if char == "\\":
            if i + 1 >= len(text) or text[i + 1] not in _ESCAPES:
                raise ExpressionError(f"unsupported escape at offset {i}")
            out.append(_ESCAPES[text[i + 1]])
            i += 2
            continue
        if char in "\r\n":
            raise ExpressionError("a string literal cannot span lines")
        out.append(char)
        i += 1
    raise ExpressionError("unterminated string literal")


def parse_expression(text: str) -> Expression:
    """The :class:`Expression` ``text`` says, or :class:`ExpressionError` for what Ambit does not evaluate."""
    if len(text) > MAX_EXPRESSION:
        raise ExpressionError(f"longer than {MAX_EXPRESSION} characters")
    body = text.strip()
    if not body:
        raise ExpressionError("empty expression")
    if body[0] in "'\"":
        value, end = _string(body, 0)
        if end != len(body):
            raise ExpressionError("only a single string literal is supported, not an expression around it")
        return Expression(text, Attribute.LITERAL, value)
    if body.startswith("request.headers[") and body.endswith("]"):
        inner = body[len("request.headers[") : -1].strip()
        if not inner or inner[0] not in "'\"":
            raise ExpressionError("request.headers takes a quoted header name")
        name, end = _string(inner, 0)
        if end != len(inner) or not name:
            raise ExpressionError("request.headers takes one non-empty quoted header name")
        return Expression(text, Attribute.REQUEST_HEADER, name.lower())
    if _PATH.fullmatch(body) and body in _NAMED:
        return Expression(text, _NAMED[body])
    shown = body if len(body) <= 80 else body[:77] + "..."
    raise ExpressionError(
        f"unsupported expression {shown!r}: Ambit evaluates string literals, request.headers['name'] and "
        + ", ".join(sorted(_NAMED))
    )


@dataclass(frozen=True, slots=True)
class RequestAttributes:
    """What an expression can read of one finished request."""

    method: str = ""
    path: str = ""
    host: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    """(lower-case name, value) in arrival order."""
    scheme: str = "http"
    protocol: str = "HTTP/1.1"
    response_code: int = 0
    source_address: str = ""
    source_port: int = 0
    source_principal: str = ""
    destination_address: str = ""
    destination_port: int = 0
    destination_principal: str = ""

    def header(self, name: str) -> str:
        for key, value in self.headers:
            if key == name:
                return value
        return ""


def evaluate(expression: Expression, request: RequestAttributes) -> str:
    """The tag value ``expression`` gives for ``request`` (empty when the request has no such attribute)."""
    a = expression.attribute
    if a is Attribute.LITERAL:
        return expression.argument
    if a is Attribute.REQUEST_HEADER:
        return request.header(expression.argument)
    number = {
        Attribute.RESPONSE_CODE: request.response_code,
        Attribute.SOURCE_PORT: request.source_port,
        Attribute.DESTINATION_PORT: request.destination_port,
    }.get(a)
    if number is not None:
        return str(number) if number else ""
    return {
        Attribute.REQUEST_HOST: request.host,
        Attribute.REQUEST_METHOD: request.method,
        Attribute.REQUEST_PATH: request.path,
        Attribute.REQUEST_URL_PATH: request.path.partition("?")[0],
        Attribute.REQUEST_ID: request.header("x-request-id"),
        Attribute.REQUEST_USERAGENT: request.header("user-agent"),
        Attribute.REQUEST_REFERER: request.header("referer"),
        Attribute.REQUEST_SCHEME: request.scheme,
        Attribute.REQUEST_PROTOCOL: request.protocol,
        Attribute.SOURCE_ADDRESS: request.source_address,
        Attribute.SOURCE_PRINCIPAL: request.source_principal,
        Attribute.DESTINATION_ADDRESS: request.destination_address,
        Attribute.DESTINATION_PRINCIPAL: request.destination_principal,
    }[a]


@dataclass(frozen=True, slots=True)
class TagOverride:
    """One tag of one metric: set to ``value``'s result (UPSERT), or removed (``value`` None, REMOVE)."""

    name: str
    value: Expression | None = None


@dataclass(frozen=True, slots=True)
class MetricOverride:
    metric: IstioMetric
    disabled: bool = False
    """The metric is not reported."""
    tags: tuple[TagOverride, ...] = ()
    """By name."""


@dataclass(frozen=True, slots=True)
class ServiceMetrics:
    """The overrides of the requests for one destination service at one waypoint."""

    service_key: str
    """``namespace/hostname``; empty: the requests for services without an entry of their own."""
    disabled: bool = False
    """No metrics at all (every metric disabled, or the ``prometheus`` provider not in scope)."""
    overrides: tuple[MetricOverride, ...] = ()
    """By metric name."""
