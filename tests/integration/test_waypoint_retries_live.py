"""The waypoint's retries and timeouts on loopback with real sockets (:mod:`ambit.waypoint.forwarding`): a retry
hides a failing endpoint, bodies are replayed (or not), timeouts answer 504 UT, nothing is retried once the
response started, and the metrics count client requests, not tries."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from tests.integration.waypoint_rig import (
    DEAD_VIP,
    ECHO_VIP,
    MIXED_VIP,
    HttpOverTunnel,
    Rig,
    echo_of,
    http_get,
    read_until_eof,
    started_rig,
)

from ambit.errors import AmbitError
from ambit.model.routes import BackendService, HttpRetry, RetryPolicy, RouteTable, Timeouts, WaypointConfig
from ambit.model.workload import Workload
from ambit.waypoint.decisions import Decision, Forward, RequestHead, Router
from ambit.waypoint.settings import WaypointLimits

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


def routing(retry: RetryPolicy = RetryPolicy(), timeouts: Timeouts = Timeouts()) -> Router:  # noqa: B008
    """A router that forwards every request to the Service addressed, with ``retry`` and ``timeouts``."""

    def router(table: RouteTable | None, destination: BackendService, request: RequestHead, r: float) -> Decision:
        return Forward(destination, request, retry=retry, timeouts=timeouts, route="HTTPRoute/app/retries")

    return router


def first_by_name(candidates: Sequence[Workload]) -> Workload:
    """The first candidate by name (dead-1, then echo-1, then echo-2): a retry that reached another endpoint was
    steered there by the waypoint, not by the balancing."""
    return min(candidates, key=lambda workload: workload.name)


def tries(rig: Rig, request: str) -> dict[str, int]:
    return {endpoint.name: endpoint.seen.count(request) for endpoint in rig.endpoints}


async def request_samples(rig: Rig) -> list[str]:
    status, text = await http_get(f"http://127.0.0.1:{rig.settings.stats_port}/metrics")
    assert status == 200
    return [line for line in text.splitlines() if line.startswith("istio_requests_total{")]


def total(samples: list[str]) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in samples)


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "access"]


async def test_a_retry_on_503_goes_to_the_other_endpoint_and_hides_the_failing_one(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="access")
    rig.endpoints[0].fail_status = 503  # echo-1 always answers 503
    rig.waypoint.context.choose = first_by_name
    rig.waypoint.context.router = routing(RetryPolicy(attempts=2, codes=(503,), backoff=0.01))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    for _ in range(5):
        status, _, body = await http.request("GET", "/echo")
        assert status == 200 and echo_of(body)["endpoint"] == "echo-2"
    await client.aclose()
    # one try at the failing endpoint per request (Envoy's previous-hosts predicate), then the other one
    assert tries(rig, "GET /echo") == {"echo-1": 5, "echo-2": 5}
    # one istio_requests_total per client request, with the final code: the 503s are not counted
    samples = await request_samples(rig)
    assert total(samples) == 5.0
    assert all('response_code="200"' in line and 'response_flags="-"' in line for line in samples)
    assert all('destination_workload="echo-2"' in line for line in samples)
    lines = access_lines(caplog)
    assert len(lines) == 5 and all(" attempts=2 " in line and "response_code=200" in line for line in lines)


async def test_a_mesh_default_of_zero_attempts_leaves_a_failing_first_try_unretried(rig: Rig) -> None:
    """The waypoint's own router and default route (no table for the Service): with Istio's default a 503 is
    retried at the other endpoint; once the config carries ``defaultHttpRetryPolicy: {attempts: 0}`` it is not."""
    rig.endpoints[0].fail_status = 503  # echo-1 always answers 503
    rig.waypoint.context.choose = first_by_name
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    status, _, body = await http.request("GET", "/echo")
    assert status == 200 and echo_of(body)["endpoint"] == "echo-2"
    rig.waypoint.context.routes.replace(
        WaypointConfig("app/waypoint", default_retry=HttpRetry(RetryPolicy(attempts=0)))
    )
    assert (await http.request("GET", "/echo"))[::2] == (503, b"echo-1 fails")
    await client.aclose()
    assert tries(rig, "GET /echo") == {"echo-1": 2, "echo-2": 1}


async def test_a_backend_that_never_answers_gets_504_at_the_request_timeout_with_flag_ut(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="access")
    rig.waypoint.context.router = routing(timeouts=Timeouts(request=1.0))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    loop = asyncio.get_running_loop()
    began = loop.time()
    status, headers, body = await HttpOverTunnel(stream).request("GET", "/slow")
    elapsed = loop.time() - began
    assert (status, body) == (504, b"upstream request timeout")
    assert 0.9 <= elapsed < 3.0, elapsed
    assert "x-request-id" not in headers  # Envoy echoes it only when told to always (istiod does not)
    assert headers["server"] == "istio-envoy"
    await client.aclose()
    samples = await request_samples(rig)
    assert len(samples) == 1 and 'response_code="504"' in samples[0] and 'response_flags="UT"' in samples[0]
    [line] = access_lines(caplog)
    assert line.startswith("request failed ") and "response_flags=UT" in line and " attempts=1 " in line


async def test_a_backend_request_timeout_is_retried_when_504_is_a_retry_code(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="access")
    rig.waypoint.context.router = routing(
        RetryPolicy(attempts=1, codes=(504,), backoff=0.01), Timeouts(backend_request=0.3)
    )
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    loop = asyncio.get_running_loop()
    began = loop.time()
    status, _, body = await HttpOverTunnel(stream).request("GET", "/slow")
    elapsed = loop.time() - began
    assert (status, body) == (504, b"upstream request timeout")
    assert 0.55 <= elapsed < 3.0, elapsed  # two tries of 0.3 s each
    await client.aclose()
    async with asyncio.timeout(10):
        while sum(tries(rig, "GET /slow").values()) < 2:  # noqa: ASYNC110 - the endpoints' side
            await asyncio.sleep(0.01)
    assert tries(rig, "GET /slow") == {"echo-1": 1, "echo-2": 1}  # the retry went to the other endpoint
    [line] = access_lines(caplog)
    assert "response_flags=UT" in line and " attempts=2 " in line


async def test_a_10_kib_post_body_is_replayed_intact_on_retry(rig: Rig) -> None:
    rig.endpoints[0].fail_status = 503
    rig.waypoint.context.choose = first_by_name
    rig.waypoint.context.router = routing(RetryPolicy(attempts=1, codes=(503,), backoff=0.01))
    payload = os.urandom(10 * 1024)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    http = HttpOverTunnel(stream)
    status, _, body = await http.request("POST", "/echo", body=payload)
    answer = echo_of(body)
    assert status == 200 and answer["endpoint"] == "echo-2"
    assert answer["body"] == len(payload) and answer["sha256"] == hashlib.sha256(payload).hexdigest()
    assert tries(rig, "POST /echo") == {"echo-1": 1, "echo-2": 1}
    # the tunnel carries the next request as usual
    assert (await http.request("GET", "/echo"))[0] == 200
    await client.aclose()


async def test_a_chunked_body_in_many_pieces_is_replayed_intact_on_retry(rig: Rig) -> None:
    rig.endpoints[0].fail_status = 503
    rig.waypoint.context.choose = first_by_name
    rig.waypoint.context.router = routing(RetryPolicy(attempts=1, codes=(503,), backoff=0.01))
    pieces = [os.urandom(n) for n in (1, 700, 4096, 3, 20_000)]
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    await stream.write(b"POST /echo HTTP/1.1\r\nhost: echo\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
    for piece in pieces:
        await stream.write(b"%x\r\n%s\r\n" % (len(piece), piece))
    await stream.write(b"0\r\n\r\n")
    answer = await read_until_eof(stream)
    assert answer.startswith(b"HTTP/1.1 200 ")
    echoed = echo_of(answer.partition(b"\r\n\r\n")[2])
    payload = b"".join(pieces)
    assert echoed["endpoint"] == "echo-2" and echoed["sha256"] == hashlib.sha256(payload).hexdigest()
    await client.aclose()


async def test_a_100_kib_body_streams_and_is_not_retried(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="access")
    rig.endpoints[0].fail_status = 503
    rig.waypoint.context.choose = first_by_name
    rig.waypoint.context.router = routing(RetryPolicy(attempts=2, codes=(503,), backoff=0.01))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    status, _, body = await HttpOverTunnel(stream).request("POST", "/echo", body=b"x" * 100 * 1024)
    assert (status, body) == (503, b"echo-1 fails")  # the last answer is forwarded as it came
    assert tries(rig, "POST /echo") == {"echo-1": 1, "echo-2": 0}
    await client.aclose()
    [line] = access_lines(caplog)
    assert " attempts=1 " in line and "bytes_sent=102400" in line


@pytest.mark.parametrize("timeouts", [Timeouts(backend_request=1.0), Timeouts(request=1.0)], ids=["try", "request"])
async def test_nothing_is_retried_once_response_bytes_went_out(
    rig: Rig, caplog: pytest.LogCaptureFixture, timeouts: Timeouts
) -> None:
    caplog.set_level("INFO", logger="access")
    rig.waypoint.context.router = routing(RetryPolicy(attempts=2, codes=(503, 504), backoff=0.01), timeouts)
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    await stream.write(b"GET /drip HTTP/1.1\r\nhost: echo.app.svc.cluster.local\r\n\r\n")
    received = b""
    with pytest.raises(AmbitError):  # the waypoint resets the client's stream: the response cannot complete
        async with asyncio.timeout(10):
            while chunk := await stream.read():
                received += chunk
    assert received.startswith(b"HTTP/1.1 200 ") and received.endswith(b"first half")
    assert tries(rig, "GET /drip") == {"echo-1": 1, "echo-2": 0}
    await client.aclose()
    samples = await request_samples(rig)
    assert len(samples) == 1 and 'response_code="200"' in samples[0] and 'response_flags="UT"' in samples[0]
    [line] = access_lines(caplog)
    assert " attempts=1 " in line


async def test_a_connect_failure_is_retried_on_another_endpoint(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="access")
    rig.waypoint.context.choose = first_by_name
    rig.waypoint.context.router = routing(RetryPolicy(attempts=2, codes=(503,), backoff=0.01))
    client, stream = await rig.tunnel(f"{MIXED_VIP}:80")
    http = HttpOverTunnel(stream)
    for _ in range(3):
        status, _, body = await http.request("POST", "/echo", body=b"payload")
        assert status == 200 and echo_of(body)["endpoint"] == "echo-1" and echo_of(body)["body"] == 7
    await client.aclose()
    lines = access_lines(caplog)
    assert len(lines) == 3 and all(" attempts=2 " in line and "dst.workload=echo-1" in line for line in lines)


async def test_connect_failures_on_every_try_answer_503_with_flags_uf_urx(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="access")
    rig.waypoint.context.router = routing(RetryPolicy(attempts=2, codes=(503,), backoff=0.01))
    client, stream = await rig.tunnel(f"{DEAD_VIP}:80")  # its one endpoint listens nowhere
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 503 and body.endswith(b"retried and the latest reset reason: remote connection failure")
    await client.aclose()
    [sample] = await request_samples(rig)
    assert 'response_code="503"' in sample and 'response_flags="UF,URX"' in sample
    [line] = access_lines(caplog)
    assert "response_flags=UF,URX" in line and " attempts=3 " in line


async def test_without_retry_on_connect_failure_an_unreachable_endpoint_answers_503_uf(rig: Rig) -> None:
    rig.waypoint.context.choose = first_by_name
    rig.waypoint.context.router = routing(RetryPolicy(attempts=2, codes=(503,), on_connect_failure=False))
    client, stream = await rig.tunnel(f"{MIXED_VIP}:80")
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo")
    assert status == 503
    assert body == b"upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"
    await client.aclose()
    [sample] = await request_samples(rig)
    assert 'response_flags="UF"' in sample and 'destination_workload="dead-1"' in sample
    assert sum(e.tunnels for e in rig.endpoints) == 0


async def test_retry_headers_from_a_client_do_not_buy_more_tries(rig: Rig) -> None:
    for endpoint in rig.endpoints:
        endpoint.fail_status = 503
    rig.waypoint.context.router = routing(RetryPolicy(attempts=1, codes=(503,), backoff=0.01))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    hostile = [
        ("x-envoy-max-retries", "50"),
        ("x-envoy-retry-on", "5xx,reset"),
        ("x-envoy-upstream-rq-timeout-ms", "1"),
    ]
    status, _, _ = await HttpOverTunnel(stream).request("GET", "/echo", headers=hostile)
    assert status == 503
    assert sum(tries(rig, "GET /echo").values()) == 2  # the route's one retry, no more
    await client.aclose()
    [sample] = await request_samples(rig)
    assert 'response_code="503"' in sample and 'response_flags="URX"' in sample  # Envoy's retry limit flag


async def test_retries_stop_at_the_request_deadline(rig: Rig) -> None:
    for endpoint in rig.endpoints:
        endpoint.fail_status = 503
    # tries at 0, 0.2, 0.6 and 1.4 s (backoff 0.2 s doubling); a fifth at 3.0 s would start after the deadline
    rig.waypoint.context.router = routing(RetryPolicy(attempts=10, codes=(503,), backoff=0.2), Timeouts(request=2.0))
    client, stream = await rig.tunnel(f"{ECHO_VIP}:80")
    loop = asyncio.get_running_loop()
    began = loop.time()
    status, _, body = await HttpOverTunnel(stream).request("GET", "/echo")
    assert loop.time() - began >= 1.3  # the fourth try waited its backoff
    # the last answer, not the 504 of the deadline: so it came before the deadline, however loaded the machine
    assert status == 503 and re.match(rb"echo-\d fails", body)
    assert sum(tries(rig, "GET /echo").values()) == 4
    [sample] = await request_samples(rig)
    assert 'response_flags="-"' in sample  # the deadline, not the retry limit, stopped the retries
    await client.aclose()
