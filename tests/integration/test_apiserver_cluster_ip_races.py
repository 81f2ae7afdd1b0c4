"""Service creates that wait in admission while other creates land (ambit.apiserver.service_ips rules 2 and 3):
two creates never store one cluster IP, whether both were handed one or both asked for the same."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from admission_hook import JsonObject, allow, serving, validating_configuration
from apiserver_client import ApiClient

from ambit.apiserver.server import ApiServer

SERVICES = "/api/v1/namespaces/default/services"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def service(name: str, **spec: object) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": [{"port": 80}], **spec}}


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(apiserver) as client:
        yield client


async def test_creates_landing_while_one_waits_in_admission_get_other_addresses(api: ApiClient, tmp_path: Path) -> None:
    cut_in: list[int] = []

    async def others_first(review: JsonObject) -> JsonObject:
        name = review["request"]["name"]
        if name == "first" and not cut_in:
            replies = await asyncio.gather(
                *(api.post(SERVICES, service(f"other-{i}")) for i in range(5)),
                api.post(SERVICES, service("asker", clusterIP=str(review["request"]["object"]["spec"]["clusterIP"]))),
            )
            cut_in.extend(reply.status for reply in replies)
        return allow(review)

    async with serving(tmp_path, others_first) as hook:
        config = validating_configuration(
            "ips.example.com", hook, group="", resource="services", operations=("CREATE",)
        )
        await api.create(VALIDATING, config)
        first = await api.post(SERVICES, service("first"))
    assert first.status == 201, first.body
    assert cut_in == [201] * 5 + [422]  # the asker wanted the address "first" was handed while in admission
    stored = (await api.get(SERVICES)).body["items"]
    addresses = [item["spec"]["clusterIP"] for item in stored]
    assert len(addresses) == len(set(addresses)) == 6  # the five and first
