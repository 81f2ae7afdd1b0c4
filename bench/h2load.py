"""h2load (nghttp2's HTTP load generator) as the L7 benchmark drives and reads it: its command line, its summary,
and its per-request log.

Theory of operation: the benchmark runs ``h2load`` once per measurement and reads two things back, both pure
functions of text here (no process is started in this module):

1. the summary it prints (:func:`parse_summary`): ``finished in``, the requests line, the status codes line;
   the request rate is h2load's own (requests done in the main duration over that duration, warm-up excluded);
2. the file ``--log-file`` writes (:func:`parse_log`): a line per request, ``<start µs since the epoch> TAB
   <status> TAB <duration µs>``; a failed request has a status of -1 or below. Percentiles are computed from the
   durations of the requests that got a 2xx (:func:`latencies`), by linear interpolation
   (:func:`bench.report.percentile`).

Rules:

1. Output that is not h2load's report (an error instead, a truncated run) raises :class:`H2loadError`, and only
   that: a caller ends the run with one clear line, never a KeyError or ValueError.
2. A run where more than :data:`TOLERATED` of the requests done failed, errored, timed out or got anything but a
   2xx is an error: a benchmark of a path that refuses requests measures refusals. Fewer are returned (and
   reported by the caller, never hidden); their latencies are left out of the percentiles. A run that spoke another
   protocol than the load asked for is an error too (an HTTP/2 load answered over HTTP/1.1 measures HTTP/1.1).
3. :class:`Load` says what one run is: HTTP/1.1 or HTTP/2, the connections (``-c``), the streams per HTTP/2
   connection (``-m``), the duration and warm-up (``-D``, ``--warm-up-time``) or a request count (``-n``), a rate
   per connection (``--rps``), extra headers, and ``--connect-to`` (TLS with the URL's host name as the server name
   while connecting to an address).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ambit.errors import AmbitError
from bench.report import percentile

HTTP1, HTTP2 = "HTTP/1.1", "HTTP/2"
TOLERATED = 0.005
"""The share of requests that may go wrong in a run (rule 2)."""
PROTOCOLS = (HTTP1, HTTP2)


class H2loadError(AmbitError):
    """h2load printed something other than a report of a clean run, or its log cannot be read."""


@dataclass(frozen=True, slots=True)
class Load:
    """One h2load run; see rule 3."""

    protocol: str
    connections: int
    streams: int = 1
    """Concurrent streams per connection (HTTP/2 only; HTTP/1.1 has one request in flight per connection)."""
    seconds: float = 0.0
    warm_up: float = 0.0
    requests: int = 0
    """A request count instead of a duration (``-n``), when ``seconds`` is 0."""
    rate_per_connection: int = 0
    headers: tuple[str, ...] = ()

    @property
    def in_flight(self) -> int:
        return self.connections * (self.streams if self.protocol == HTTP2 else 1)

    def argv(self, url: str, log_file: str, connect_to: str = "") -> list[str]:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}")
        if (self.seconds > 0) == (self.requests > 0):
            raise ValueError("a load has either a duration or a request count")
        argv = ["h2load", "-c", str(self.connections), "-t", "1"]
        if self.protocol == HTTP1:
            argv.append("--h1")
        else:
            argv += ["-m", str(self.streams)]
        if self.seconds > 0:
            argv += ["-D", _duration(self.seconds)]
            if self.warm_up > 0:
                argv += [f"--warm-up-time={_duration(self.warm_up)}"]
        else:
            argv += ["-n", str(self.requests)]
        if self.rate_per_connection:
            argv += [f"--rps={self.rate_per_connection}"]
        for header in self.headers:
            argv += ["-H", header]
        if connect_to:
            argv += [f"--connect-to={connect_to}"]
        return [*argv, f"--log-file={log_file}", url]


def _duration(seconds: float) -> str:
    """h2load reads a fraction of a second only with a unit (``1500ms``; ``1.5`` is an error)."""
    return f"{round(seconds * 1000)}ms"


@dataclass(frozen=True, slots=True)
class Summary:
    """What h2load printed at the end of a run."""

    seconds: float
    """``finished in``: the whole run, warm-up included."""
    requests_per_second: float
    """h2load's rate: requests done in the main duration over that duration (over the whole run with ``-n``)."""
    done: int
    succeeded: int
    failed: int
    errored: int
    timeout: int
    status_2xx: int
    other_statuses: str = ""
    """The 3xx, 4xx and 5xx counts as h2load printed them."""
    protocol: str = ""
    """The application protocol h2load spoke (``h2``, ``h2c``, ``http/1.1``), empty when it printed none."""


_FINISHED = re.compile(r"^finished in ([\d.]+)(us|ms|s), ([\d.]+) req/s", re.MULTILINE)
_REQUESTS = re.compile(
    r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, "
    r"(\d+) timeout",
    re.MULTILINE,
)
_STATUS = re.compile(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", re.MULTILINE)
_ALPN = re.compile(r"^Application protocol: (\S+)", re.MULTILINE)
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_summary(text: str) -> Summary:
    """The figures of h2load's summary (rule 1); :class:`H2loadError` when it has none."""
    finished, requests, status = _FINISHED.search(text), _REQUESTS.search(text), _STATUS.search(text)
    if finished is None or requests is None or status is None:
        tail = text.strip().splitlines()[-3:]
        raise H2loadError(f"h2load printed no summary: {tail}")
    try:
        seconds = float(finished.group(1)) * _UNIT[finished.group(2)]
        rate = float(finished.group(3))
    except ValueError:
        raise H2loadError(f"h2load's 'finished' line is unreadable: {finished.group(0)!r}") from None
    _total, _started, done, succeeded, failed, errored, timeout = (int(g) for g in requests.groups())
    alpn = _ALPN.search(text)
    others = f"{status.group(2)} 3xx, {status.group(3)} 4xx, {status.group(4)} 5xx"
    protocol = alpn.group(1) if alpn else ""
    return Summary(seconds, rate, done, succeeded, failed, errored, timeout, int(status.group(1)), others, protocol)


def check_clean(summary: Summary, what: str, protocol: str = "") -> int:
    """Rule 2: at most :data:`TOLERATED` of the requests done failed, errored, timed out or got no 2xx, over
    ``protocol`` when given; how many did."""
    spoken = {"h2": HTTP2, "h2c": HTTP2, "http/1.1": HTTP1}.get(summary.protocol, summary.protocol)
    if protocol and spoken != protocol:
        raise H2loadError(f"{what}: h2load spoke {summary.protocol or 'nothing it named'}, not {protocol}")
    if summary.done == 0:
        raise H2loadError(f"{what}: no request was done")
    bad = max(summary.failed + summary.errored + summary.timeout, summary.done - summary.status_2xx)
    if bad > TOLERATED * summary.done:
        raise H2loadError(
            f"{what}: {summary.failed} failed, {summary.errored} errored, {summary.timeout} timed out, "
            f"{summary.status_2xx} of {summary.done} got a 2xx ({summary.other_statuses})"
        )
    return bad


@dataclass(frozen=True, slots=True)
class Logged:
    """One line of ``--log-file``."""

    started_us: int
    status: int
    duration_us: int


def parse_log(text: str) -> list[Logged]:
    """Every line of an h2load log file (rule 1: a line that is not three integers is an error)."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise H2loadError(f"h2load log line {number} has {len(fields)} fields: {line[:80]!r}")
        try:
            started, status, duration = (int(f) for f in fields)
        except ValueError:
            raise H2loadError(f"h2load log line {number} is not three integers: {line[:80]!r}") from None
        out.append(Logged(started, status, duration))
    return out


@dataclass(frozen=True, slots=True)
class Percentiles:
    p50: float
    p99: float
    """Microseconds, a request's start to its response's end as h2load saw it."""
    count: int


def latencies(logged: Sequence[Logged]) -> Percentiles:
    """p50 and p99 of the requests that got a 2xx; :class:`H2loadError` when there are none."""
    durations = [float(r.duration_us) for r in logged if 200 <= r.status < 300]
    if not durations:
        raise H2loadError("the h2load log holds no successful request")
    return Percentiles(percentile(durations, 50), percentile(durations, 99), len(durations))
