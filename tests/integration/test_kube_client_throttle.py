"""The Kubernetes client against an API server that limits its user (ambit.k8s.throttle): a 429 is waited out
as client-go waits it out, a budget below the server's limit is never refused, and a server that refuses forever
costs a bounded number of requests."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import AsyncIterator, Generator
from pathlib import Path

import httpx2 as httpx
import pytest
from apiserver_client import ApiClient, grant

from ambit.apiserver.limits import LimitSettings
from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.k8s import KubeApiStatusError, KubeClient, KubeClientSettings, kinds
from ambit.k8s.connection import Connection, load_kubeconfig

NS = "throttled"
SERVER_QPS, SERVER_BURST = 20.0, 5


class _Bearer(httpx.Auth):
    def __init__(self, token: str) -> None:
        self.token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


@pytest.fixture
async def limited(tmp_path: Path) -> AsyncIterator[tuple[ApiServer, str]]:
    """An API server that lets a user make 5 requests at once and 20 a second; a token of a service account that
    may edit namespace ``throttled`` (the admin is exempt from the limit, a service account is not)."""
    limits = LimitSettings(requests_per_second=SERVER_QPS, burst=SERVER_BURST)
    server = ApiServer(ApiServerSettings(data_dir=tmp_path / "apiserver", port=0, limits=limits))
    await server.start()
    try:
        async with ApiClient.for_server(server) as admin:
            await admin.create("/api/v1/namespaces", {"metadata": {"name": NS}})
            await admin.create(f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": "writer"}})
            await grant(admin, "edit", NS, "writer")
            reply = await admin.post(f"/api/v1/namespaces/{NS}/serviceaccounts/writer/token", {"spec": {}})
            assert reply.status == 201, reply.body
            yield server, str(reply.body["status"]["token"])
    finally:
        await server.aclose()


def client_for(server: ApiServer, token: str, **settings: object) -> KubeClient:
    conn = dataclasses.replace(load_kubeconfig(server.kubeconfig), auth=_Bearer(token), namespace=NS)
    return KubeClient(conn, KubeClientSettings(**settings))  # type: ignore[arg-type]


def configmap(i: int) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}}


async def create_all(client: KubeClient, count: int) -> list[BaseException | None]:
    async def one(i: int) -> BaseException | None:
        try:
            await client.create(kinds.CONFIG_MAPS, configmap(i), NS)
        except KubeApiStatusError as exc:
            return exc
        return None

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def test_without_retries_the_server_refuses_a_burst_beyond_its_limit(limited: tuple[ApiServer, str]) -> None:
    """The ground the other tests stand on: this server does refuse this user."""
    server, token = limited
    async with client_for(server, token, max_retries=0) as client:
        outcomes = await create_all(client, 20)
    refused = [o for o in outcomes if o is not None]
    assert refused, "the server let 20 requests at once through a burst of 5"
    assert all(isinstance(o, KubeApiStatusError) and o.status_code == 429 for o in refused), refused


async def test_a_refused_request_is_sent_again_after_retry_after_and_everything_gets_done(
    limited: tuple[ApiServer, str],
) -> None:
    server, token = limited
    async with client_for(server, token) as client:
        outcomes = await create_all(client, 20)
        assert outcomes == [None] * 20
        assert client.throttled > 0  # some waited out a 429
        items, _ = await client.list(kinds.CONFIG_MAPS, NS)
        names = {o["metadata"]["name"] for o in items}
    assert {f"cm-{i}" for i in range(20)} <= names


async def test_a_budget_under_the_servers_limit_is_never_refused(limited: tuple[ApiServer, str]) -> None:
    """As the control plane runs (istiod's 80 QPS, burst 160, under the server's 100 and 200): no 429 at all, even
    with no retries allowed, and the budget paced the requests.

    The client's budget paces when requests leave; the server counts when they arrive. Between the two, a loaded
    machine can hold requests back and let them arrive together (CI run r23, load 17 on two cores: a budget of 15/s
    and 4 against the server's 20/s and 5 had two requests refused). So the budget here leaves room for such
    bunching: at 5/s and 1 at once, more than the server's 5 arrive together only if requests are held back for
    over 0.8 s between the client's clock and the server's. Without the budget, 20 at once are refused (the first
    test)."""
    server, token = limited
    async with client_for(server, token, qps=SERVER_QPS / 4, burst=1, max_retries=0) as client:
        outcomes = await create_all(client, 20)
        assert outcomes == [None] * 20
        assert client.throttled > 0


async def test_a_server_that_refuses_forever_gets_a_bounded_number_of_requests() -> None:
    """A hostile or overloaded server answering 429 (Retry-After 0) to everything: the client sends the request
    ``max_retries`` + 1 times, each after at least 0.1 s, then gives the caller the 429."""
    seen = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                seen += 1
                body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","code":429,"reason":"TooManyRequests"}'
                head = f"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0\r\nContent-Length: {len(body)}\r\n"
                writer.write(head.encode() + b"Content-Type: application/json\r\n\r\n" + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        conn = Connection(f"http://127.0.0.1:{port}", ssl.create_default_context(), None)
        async with KubeClient(conn, KubeClientSettings(max_retries=3, trust_env=False)) as client:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(KubeApiStatusError) as refused:
                await client.get(kinds.CONFIG_MAPS, "x", "default")
            took = loop.time() - started
    finally:
        listener.close()
        await listener.wait_closed()
    assert refused.value.status_code == 429
    assert seen == 4
    assert 0.3 <= took < 5.0
