"""The per-connection access log: one line per completed (or failed) connection, like ztunnel's ``access`` target.

Theory of operation
-------------------
The proxy builds a :class:`ConnectionRecord` when a connection ends and hands it to :meth:`AccessLog.write`.
:func:`format_access_log` is pure: it turns the record into one line, either logfmt-style text::

    connection complete src.addr=198.18.1.5:43122 src.workload=web-0 src.namespace=default \
dst.addr=198.18.2.7:15008 dst.hbone_addr=198.18.2.7:8080 dst.service=echo.default.svc.cluster.local \
direction="outbound" bytes_sent=11 bytes_recv=22 duration="13ms"

or one JSON object with the same dotted keys plus ``"message"``. Rules:

- Fields come in a fixed order (src, dst, direction, bytes, duration, error) and empty string fields are left out,
  so ``src.identity`` / ``dst.identity`` appear only when the proxy knew the peer through mTLS.
- ``bytes_sent`` / ``bytes_recv`` are from this proxy's side (not flipped per reporter), ``duration`` is whole
  milliseconds (``"13ms"``).
- Text values are bare unless they are empty or contain whitespace, quotes, ``=`` or backslashes; then they are
  JSON-quoted, so a line is always one line. ``direction``, ``duration`` and ``error`` are always quoted.
- A record with an ``error`` is a ``connection failed`` line, written at WARNING; others at INFO.

The sink is a plain :class:`logging.Logger` (``"access"`` by default), so levels and handlers are the
application's logging configuration, not ours; lines reach it through an
:class:`~ambit.telemetry.access_sink.AccessSink`, which batches them per event-loop iteration and writes them past
the ``logging`` machinery when the process's plain stream handler is the only one listening (the same bytes).
With a ``flows`` ring (:class:`~ambit.telemetry.flows.FlowRing`), every record also goes there, whatever the log
level, for ``GET /flows`` on the admin port (``ambit flows``).
"""

from __future__ import annotations

import json as _json
import logging
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ambit.telemetry.access_sink import AccessSink

if TYPE_CHECKING:
    from ambit.telemetry.flows import FlowRing

COMPLETE = "connection complete"
FAILED = "connection failed"


@dataclass(frozen=True, slots=True)
class ConnectionRecord:
    direction: str  # "outbound" | "inbound"
    src_addr: str
    dst_addr: str  # the actual TCP destination (e.g. ip:15008 for HBONE)
    dst_hbone_addr: str = ""  # the CONNECT authority
    src_workload: str = ""
    src_namespace: str = ""
    src_identity: str = ""  # only with mTLS
    src_cluster: str = ""
    dst_service: str = ""
    dst_workload: str = ""
    dst_namespace: str = ""
    dst_identity: str = ""  # only with mTLS
    dst_cluster: str = ""
    bytes_sent: int = 0
    bytes_recv: int = 0
    duration_seconds: float = 0.0
    error: str = ""

    def ended(self, *, bytes_sent: int, bytes_recv: int, duration_seconds: float, error: str) -> ConnectionRecord:
        """This record with the connection's outcome: ``dataclasses.replace``, without its per-field machinery."""
        return ConnectionRecord(
            self.direction,
            self.src_addr,
            self.dst_addr,
            self.dst_hbone_addr,
            self.src_workload,
            self.src_namespace,
            self.src_identity,
            self.src_cluster,
            self.dst_service,
            self.dst_workload,
            self.dst_namespace,
            self.dst_identity,
            self.dst_cluster,
            bytes_sent,
            bytes_recv,
            duration_seconds,
            error,
        )


# (log key, record attribute) for the string fields, in output order.
_STRING_FIELDS: tuple[tuple[str, str], ...] = (
    ("src.addr", "src_addr"),
    ("src.workload", "src_workload"),
    ("src.namespace", "src_namespace"),
    ("src.identity", "src_identity"),
    ("src.cluster", "src_cluster"),
    ("dst.addr", "dst_addr"),
    ("dst.hbone_addr", "dst_hbone_addr"),
    ("dst.service", "dst_service"),
    ("dst.workload", "dst_workload"),
    ("dst.namespace", "dst_namespace"),
    ("dst.identity", "dst_identity"),
    ("dst.cluster", "dst_cluster"),
)
_NEEDS_QUOTES = frozenset(' \t\r\n"=\\')


def _fields(record: ConnectionRecord) -> list[tuple[str, str | int]]:
    out: list[tuple[str, str | int]] = [(key, getattr(record, attr)) for key, attr in _STRING_FIELDS]
    out = [(key, value) for key, value in out if value != ""]
    if record.direction:
        out.append(("direction", record.direction))
    out.append(("bytes_sent", record.bytes_sent))
    out.append(("bytes_recv", record.bytes_recv))
    out.append(("duration", f"{round(max(record.duration_seconds, 0.0) * 1000)}ms"))
    if record.error:
        out.append(("error", record.error))
    return out


def _dumps(obj: object) -> str:
    """JSON, readable (non-ASCII kept) yet always one line: every non-printable character is escaped.

    ``json.dumps`` escapes only C0 controls; U+0085, U+2028 and friends would otherwise split a log line.
    """
    text = _json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _json.dumps(c)[1:-1] for c in text)


_GET_STRINGS = operator.attrgetter(*(attr for _, attr in _STRING_FIELDS))
_TEXT_PREFIXES = tuple(f"{key}=" for key, _ in _STRING_FIELDS)
_QUOTED_DIRECTIONS = {"outbound": '"outbound"', "inbound": '"inbound"'}


def _format_text(message: str, record: ConnectionRecord) -> str:
    """The logfmt-style line: :func:`_fields` and the quoting rules, in one pass (it runs per connection).

    A string value is bare unless it needs quotes (``isprintable`` and ``isdisjoint`` run in C); ``direction``,
    ``duration`` and ``error`` are always quoted, and the first two never need escaping beyond the quotes.
    """
    values = _GET_STRINGS(record)
    joined = "".join(values)
    if joined.isprintable() and _NEEDS_QUOTES.isdisjoint(joined):
        # Every value bare (the usual line): both tests hold for the values together exactly when they hold for
        # each value, as each looks at characters one by one; two C calls per line instead of two per field.
        parts = [message, *[prefix + value for prefix, value in zip(_TEXT_PREFIXES, values, strict=True) if value]]
    else:
        parts = [message]
        for prefix, value in zip(_TEXT_PREFIXES, values, strict=True):
            if value:
                if value.isprintable() and _NEEDS_QUOTES.isdisjoint(value):
                    parts.append(prefix + value)
                else:
                    parts.append(prefix + _dumps(value))
    if direction := record.direction:
        parts.append("direction=" + (_QUOTED_DIRECTIONS.get(direction) or _dumps(direction)))
    parts.append(f"bytes_sent={record.bytes_sent}")
    parts.append(f"bytes_recv={record.bytes_recv}")
    parts.append(f'duration="{round(max(record.duration_seconds, 0.0) * 1000)}ms"')
    if record.error:
        parts.append("error=" + _dumps(record.error))
    return " ".join(parts)


def format_access_log(record: ConnectionRecord, *, json: bool = False) -> str:
    """One access-log line for ``record``: logfmt-style text, or a JSON object when ``json`` is true."""
    message = FAILED if record.error else COMPLETE
    if not json:
        return _format_text(message, record)
    obj: dict[str, Any] = {"message": message}
    obj.update(_fields(record))
    return _dumps(obj)


class AccessLog:
    """Writes :class:`ConnectionRecord` lines to a logger: INFO when complete, WARNING with an error, through an
    :class:`~ambit.telemetry.access_sink.AccessSink` (batched per loop iteration; :meth:`flush` when stopping)."""

    def __init__(
        self, *, json: bool = False, logger: logging.Logger | None = None, flows: FlowRing | None = None
    ) -> None:
        self._json = json
        self.sink = AccessSink(logger if logger is not None else logging.getLogger("access"))
        self.flows = flows

    def write(self, record: ConnectionRecord, flag: str = "") -> None:
        """Log ``record`` (and keep it in the flow ring); ``flag`` is the response flag it failed with."""
        if self.flows is not None:
            self.flows.add(record, flag)
        level = logging.WARNING if record.error else logging.INFO
        sink = self.sink
        if sink.enabled(level):  # skip formatting when nobody listens
            sink.emit(level, format_access_log(record, json=self._json))

    def flush(self) -> None:
        """Write the lines still waiting in the batch."""
        self.sink.flush()
