"""The flow log: the last connections a proxy saw, kept in a bounded ring and read page by page (``ambit flows``).

Theory of operation
-------------------
Every connection a node proxy or waypoint ends already makes one :class:`~ambit.telemetry.accesslog.ConnectionRecord`
for its access log. :meth:`FlowRing.add` keeps that record (and the response flag it failed with) with a sequence
number and the wall-clock time; nothing is formatted on the hot path. A reader asks for the flows after the last
sequence it saw (:meth:`FlowRing.page`); the admin endpoint answers ``GET /flows?after=N&limit=M`` with
:func:`page_json`, and ``ambit flows`` parses it back with :func:`read_page` (bounded: a page is what a proxy
says, and a proxy may be hostile or broken).

Rules:

1. The ring holds at most ``capacity`` flows (default :data:`DEFAULT_CAPACITY`); the oldest is dropped first.
   Sequence numbers start at 1 and never repeat within a process, so ``after`` is a cursor: a reader that fell more
   than ``capacity`` behind is told how many flows it missed (``dropped``) and goes on from the oldest kept one.
2. A page holds at most ``limit`` flows (1 to :data:`MAX_PAGE`) in sequence order; ``next`` is the sequence to ask
   after next time (the last one returned, or ``after`` when there is nothing new). A cursor beyond the newest
   flow (the proxy restarted) starts over from the oldest kept flow, counted as nothing dropped.
3. Verdict: ``denied`` when the connection failed with the ``DENY`` flag (an authorization policy: the reason says
   which) or was closed by a policy change, ``failed`` for any other error, else ``allowed``; a waypoint's request
   by :func:`request_verdict`. ``mtls`` is true when either side's identity is known, which the proxies record only
   for mutual TLS.
4. :class:`FlowFilter` selects by namespace and pod (either side) and by verdict; an empty field selects all.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ambit.errors import AmbitError
from ambit.telemetry.accesslog import ConnectionRecord

DEFAULT_CAPACITY = 4096
MAX_PAGE = 1000
MAX_PAGE_BYTES = 8 * 1024 * 1024
"""What a reader accepts as one page (1,000 flows of long names stay far below it)."""
MAX_FIELD = 1024
"""Longest string field a reader keeps."""
DENY_FLAG = "DENY"
RBAC_FLAG = "RBAC"
"""A waypoint's flag for a request its authorization denied (Envoy's)."""
POLICY_CHANGE = "connection closed due to policy change"
"""How a relay closed by a policy change ends (the node proxy's re-check): a denial too."""
VERDICTS = ("allowed", "denied", "failed")


class FlowError(AmbitError):
    """A flow page or query that cannot be read: says what was wrong."""


@dataclass(frozen=True, slots=True)
class Flow:
    """One ended connection, as a reader sees it."""

    seq: int
    time: float
    """Seconds since the epoch when the connection ended."""
    direction: str
    verdict: str
    mtls: bool
    src_addr: str = ""
    src_workload: str = ""
    src_namespace: str = ""
    src_identity: str = ""
    dst_addr: str = ""
    dst_service: str = ""
    dst_workload: str = ""
    dst_namespace: str = ""
    dst_identity: str = ""
    bytes_sent: int = 0
    bytes_recv: int = 0
    duration_ms: int = 0
    reason: str = ""
    flag: str = ""
    proxy: str = ""
    """Which proxy reported it (filled in by the reader: a node's name, a waypoint)."""
    method: str = ""
    """For a request through a waypoint: its method, path, answer and route; empty for a connection."""
    path: str = ""
    response_code: int = 0
    route: str = ""


_STRINGS = (
    "direction",
    "verdict",
    "src_addr",
    "src_workload",
    "src_namespace",
    "src_identity",
    "dst_addr",
    "dst_service",
    "dst_workload",
    "dst_namespace",
    "dst_identity",
    "reason",
    "flag",
    "proxy",
    "method",
    "path",
    "route",
)
_INTS = ("seq", "bytes_sent", "bytes_recv", "duration_ms", "response_code")


def verdict_of(record: ConnectionRecord, flag: str) -> str:
    if not record.error:
        return "allowed"
    return "denied" if flag == DENY_FLAG or record.error.startswith(POLICY_CHANGE) else "failed"


@dataclass(frozen=True, slots=True)
class Page:
    flows: tuple[Flow, ...]
    next: int
    dropped: int = 0


class FlowRing:
    """The last ``capacity`` ended connections of one proxy (rule 1); ``add`` is O(1) and allocates one tuple."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, *, clock: Callable[[], float] = time.time) -> None:
        if capacity < 1:
            raise ValueError("a flow ring holds at least one flow")
        self._ring: collections.deque[tuple[int, float, ConnectionRecord | Flow | FlowSource, str]] = collections.deque(
            maxlen=capacity
        )
        self._seq = 0
        self._clock = clock

    @property
    def newest(self) -> int:
        return self._seq

    def add(self, record: ConnectionRecord, flag: str = "") -> None:
        self._seq += 1
        self._ring.append((self._seq, self._clock(), record, flag))

    def add_request(self, flow: Flow | FlowSource) -> None:
        """A request (a waypoint's): ``flow`` as the waypoint saw it, or what makes it when a page is read (the
        record the access log made anyway: nothing is converted on the hot path); ``seq`` and ``time`` are set
        here."""
        self._seq += 1
        self._ring.append((self._seq, self._clock(), flow, ""))

    def page(self, after: int = 0, limit: int = MAX_PAGE) -> Page:
        """The flows after sequence ``after``, at most ``limit`` of them (rule 2)."""
        limit = max(1, min(limit, MAX_PAGE))
        if not self._ring:
            return Page((), min(after, self._seq))
        oldest = self._ring[0][0]
        if after > self._seq:  # a cursor from before a restart
            after = 0
        dropped = max(0, oldest - after - 1) if after else 0
        start = max(after + 1, oldest) - oldest
        flows = tuple(_flow(*self._ring[i]) for i in range(start, min(start + limit, len(self._ring))))
        return Page(flows, flows[-1].seq if flows else after, dropped)


def request_verdict(response_code: int, flag: str) -> str:
    """A request's verdict: ``denied`` by authorization (flag ``RBAC``, or a 401/403 answer for a token), ``failed``
    for a 5xx or a flagged failure, else ``allowed``."""
    if flag == RBAC_FLAG or response_code in (401, 403):
        return "denied"
    if response_code >= 500 or response_code == 0 or flag not in ("", "-"):
        return "failed"
    return "allowed"


class FlowSource(Protocol):
    """A record that knows its flow (a waypoint's request record); asked only when a page is read."""

    def flow(self) -> Flow: ...


def _flow(seq: int, when: float, record: ConnectionRecord | Flow | FlowSource, flag: str) -> Flow:
    if isinstance(record, Flow):
        return dataclasses.replace(record, seq=seq, time=when)
    if not isinstance(record, ConnectionRecord):
        return dataclasses.replace(record.flow(), seq=seq, time=when)
    return Flow(
        seq=seq,
        time=when,
        direction=record.direction,
        verdict=verdict_of(record, flag),
        mtls=bool(record.src_identity or record.dst_identity),
        src_addr=record.src_addr,
        src_workload=record.src_workload,
        src_namespace=record.src_namespace,
        src_identity=record.src_identity,
        dst_addr=record.dst_addr,
        dst_service=record.dst_service,
        dst_workload=record.dst_workload,
        dst_namespace=record.dst_namespace,
        dst_identity=record.dst_identity,
        bytes_sent=record.bytes_sent,
        bytes_recv=record.bytes_recv,
        duration_ms=round(max(record.duration_seconds, 0.0) * 1000),
        reason=record.error,
        flag=str(flag) if flag not in ("", "-") else "",
    )


def flow_to_json(flow: Flow) -> dict[str, Any]:
    out: dict[str, Any] = {"seq": flow.seq, "time": flow.time, "mtls": flow.mtls}
    for name in _STRINGS:
        if value := getattr(flow, name):
            out[name] = value[:MAX_FIELD]  # a reader refuses longer fields (a path may be longer)
    for name in _INTS[1:]:
        out[name] = getattr(flow, name)
    return out


def page_json(page: Page) -> str:
    return json.dumps(
        {"next": page.next, "dropped": page.dropped, "flows": [flow_to_json(f) for f in page.flows]},
        separators=(",", ":"),
    )


def parse_query(query: Mapping[str, str]) -> tuple[int, int]:
    """``after`` and ``limit`` of a ``/flows`` query; :class:`FlowError` for anything else than small integers."""
    values = []
    for name, default in (("after", 0), ("limit", MAX_PAGE)):
        text = query.get(name, "")
        if not text:
            values.append(default)
            continue
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            raise FlowError(f"{name} must be a non-negative integer, not {text[:32]!r}")
        values.append(int(text))
    if not 1 <= values[1] <= MAX_PAGE:
        raise FlowError(f"limit must be 1 to {MAX_PAGE}")
    return values[0], values[1]


def read_flow(obj: object, proxy: str = "") -> Flow:
    """One flow of a page; :class:`FlowError` naming the field that is wrong."""
    if not isinstance(obj, dict):
        raise FlowError("a flow is not an object")
    fields: dict[str, Any] = {"proxy": proxy}
    for name in _STRINGS:
        value = obj.get(name, "")
        if not isinstance(value, str) or len(value) > MAX_FIELD:
            raise FlowError(f"flow field {name} is not a string of at most {MAX_FIELD} characters")
        if value:
            fields[name] = value
    fields["proxy"] = proxy or fields.get("proxy", "")
    for name in _INTS:
        value = obj.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise FlowError(f"flow field {name} is not a non-negative integer")
        fields[name] = value
    when = obj.get("time", 0.0)
    if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when) or when < 0:
        raise FlowError("flow field time is not a time")
    mtls = obj.get("mtls", False)
    if not isinstance(mtls, bool):
        raise FlowError("flow field mtls is not a boolean")
    verdict = fields.get("verdict", "")
    if verdict not in VERDICTS:
        raise FlowError(f"flow field verdict must be one of {', '.join(VERDICTS)}")
    return Flow(time=float(when), mtls=mtls, **fields)


def read_page(body: bytes | str, proxy: str = "") -> Page:
    """A ``/flows`` answer; :class:`FlowError` if it is not one (too big, not JSON, a field of the wrong type)."""
    if len(body) > MAX_PAGE_BYTES:
        raise FlowError(f"a flow page larger than {MAX_PAGE_BYTES} bytes")
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise FlowError(f"a flow page that is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FlowError("a flow page is not an object")
    flows = obj.get("flows", [])
    if not isinstance(flows, list) or len(flows) > MAX_PAGE:
        raise FlowError(f"a flow page holds a list of at most {MAX_PAGE} flows")
    cursor, dropped = obj.get("next", 0), obj.get("dropped", 0)
    for name, value in (("next", cursor), ("dropped", dropped)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise FlowError(f"page field {name} is not a non-negative integer")
    return Page(tuple(read_flow(f, proxy) for f in flows), cursor, dropped)


@dataclass(frozen=True, slots=True)
class FlowFilter:
    """Rule 4: which flows a reader wants."""

    namespace: str = ""
    pod: str = ""
    verdict: str = ""

    def __post_init__(self) -> None:
        if self.verdict and self.verdict not in VERDICTS:
            raise FlowError(f"verdict must be one of {', '.join(VERDICTS)}, not {self.verdict!r}")

    def __call__(self, flow: Flow) -> bool:
        if self.namespace and self.namespace not in (flow.src_namespace, flow.dst_namespace):
            return False
        if self.pod and self.pod not in (flow.src_workload, flow.dst_workload):
            return False
        return not self.verdict or flow.verdict == self.verdict


def select(flows: Iterator[Flow] | tuple[Flow, ...], wanted: FlowFilter) -> list[Flow]:
    return [f for f in flows if wanted(f)]


def _side(workload: str, namespace: str, addr: str) -> str:
    return f"{namespace}/{workload}" if workload else addr or "?"


def render_line(flow: Flow) -> str:
    """One human line: time, proxy, source → destination, verdict, security, bytes, duration, reason."""
    stamp = time.strftime("%H:%M:%S", time.localtime(flow.time)) + f".{int(flow.time * 1000) % 1000:03d}"
    src = _side(flow.src_workload, flow.src_namespace, flow.src_addr)
    dst = _side(flow.dst_workload, flow.dst_namespace, flow.dst_addr)
    if flow.dst_service:
        dst += f" ({flow.dst_service})"
    verdict = flow.verdict.upper()
    security = "mTLS" if flow.mtls else "plaintext"
    line = f"{stamp} {flow.proxy or '-'} {flow.direction or '-'} {src} -> {dst} {verdict} {security}"
    if flow.method:
        line += f" {flow.method} {json.dumps(flow.path, ensure_ascii=True)} {flow.response_code}"
    line += f" sent={flow.bytes_sent} recv={flow.bytes_recv} {flow.duration_ms}ms"
    if flow.reason:
        line += f" reason={json.dumps(flow.reason, ensure_ascii=True)}"
    return line


__all__ = [
    "DEFAULT_CAPACITY",
    "MAX_PAGE",
    "Flow",
    "FlowError",
    "FlowFilter",
    "FlowRing",
    "Page",
    "flow_to_json",
    "page_json",
    "parse_query",
    "read_flow",
    "read_page",
    "render_line",
    "request_verdict",
    "select",
    "verdict_of",
]
