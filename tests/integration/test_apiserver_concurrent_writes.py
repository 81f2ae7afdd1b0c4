"""Writes that wait in admission while another write of the same object lands: none lands over a version it did
not read. A write carrying the ``resourceVersion`` it read is a 409; an unconditional one is applied again to the
new version (kube-apiserver's ``GuaranteedUpdate`` over etcd's compare-and-swap)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from admission_hook import JsonObject, allow, serving, validating_configuration
from apiserver_client import ApiClient, configmap

from ambit.apiserver.server import ApiServer

CMS = "/api/v1/namespaces/default/configmaps"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


@pytest.fixture
async def api(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(apiserver) as client:
        yield client


async def race(api: ApiClient, tmp_path: Path, body: JsonObject, *, merge: bool) -> tuple[int, JsonObject]:
    """Send ``body`` (a merge patch or a full update) for ConfigMap ``cm`` while its first admission call lets
    another patch (``data.other``) land first; the answer's code and the stored object."""
    cut_in: list[int] = []

    async def another_writer_first(review: JsonObject) -> JsonObject:
        if not cut_in:
            cut_in.append(0)
            cut_in[0] = (await api.patch(f"{CMS}/cm", {"data": {"other": "theirs"}})).status
        return allow(review)

    async with serving(tmp_path, another_writer_first) as hook:
        config = validating_configuration("race.example.com", hook, group="", resource="configmaps")
        await api.create(VALIDATING, config)
        reply = await (api.patch(f"{CMS}/cm", body) if merge else api.put(f"{CMS}/cm", body))
    assert cut_in == [200]
    return reply.status, await api.must_get(f"{CMS}/cm")


async def test_an_unconditional_patch_is_applied_again_to_the_version_that_landed_first(
    api: ApiClient, tmp_path: Path
) -> None:
    await api.create(CMS, {**configmap("cm"), "data": {"mine": "before"}})
    status, stored = await race(api, tmp_path, {"data": {"mine": "after"}}, merge=True)
    assert status == 200
    assert stored["data"] == {"mine": "after", "other": "theirs"}


async def test_an_update_carrying_the_version_it_read_is_a_conflict_and_the_other_write_stays(
    api: ApiClient, tmp_path: Path
) -> None:
    created = await api.create(CMS, {**configmap("cm"), "data": {"mine": "before"}})
    body = {**created, "data": {"mine": "after"}}
    status, stored = await race(api, tmp_path, body, merge=False)
    assert status == 409
    assert stored["data"] == {"mine": "before", "other": "theirs"}
