"""The API server's HTTP edge itself: authentication, health, the serving certificate."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from apiserver_client import (
    ApiClient,
    Reply,
    assert_status,
    configmap,
    ssl_context_from_kubeconfig,
)

from ambit.apiserver.server import ApiServer

# -- tests of the HTTP edge -----------------------------------------------------------------------------------


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(apiserver) as client:
        yield client


@pytest.mark.parametrize(
    "authorization",
    ["", "Bearer", "Bearer ", "Bearer not-a-token", "Basic YWRtaW46YWRtaW4=", "Bearer eyJhbGciOiJub25lIn0.e30."],
)
async def test_request_without_a_valid_bearer_token_is_401(apiserver: ApiServer, authorization: str) -> None:
    context = ssl_context_from_kubeconfig(apiserver.kubeconfig)
    headers = {"Authorization": authorization} if authorization else {}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
        session.get(f"{apiserver.url}/api/v1/namespaces/default/configmaps", headers=headers) as response,
    ):
        body = await response.json()
    assert_status(Reply(response.status, body, "application/json"), 401, "Unauthorized")


async def test_write_without_a_token_is_401_and_stores_nothing(apiserver: ApiServer, api: ApiClient) -> None:
    assert apiserver.manager is not None
    before = apiserver.manager.store.resource_version
    reply = await api.request("POST", "/api/v1/namespaces/default/configmaps", configmap("x"), token="")
    assert_status(reply, 401, "Unauthorized")
    assert apiserver.manager.store.resource_version == before
    assert not await api.exists("/api/v1/namespaces/default/configmaps/x")


async def test_health_and_version_need_no_token(api: ApiClient) -> None:
    for path in ("/healthz", "/livez", "/readyz"):
        reply = await api.request("GET", path, token="")
        assert (reply.status, reply.body) == (200, "ok")
    reply = await api.request("GET", "/version", token="")
    assert reply.status == 200
    assert reply.body["gitVersion"].startswith("v1.")


async def test_server_certificate_is_refused_without_the_kubeconfig_ca(apiserver: ApiServer) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(f"{apiserver.url}/healthz")
