"""One Event, two APIs: events.k8s.io/v1 Events are core/v1 Events in storage, as in kube-apiserver."""

from __future__ import annotations

from apiserver_client import ApiClient

from ambit.apiserver.server import ApiServer

CORE = "/api/v1/namespaces/default/events"
NEW = "/apis/events.k8s.io/v1/namespaces/default/events"

NEW_EVENT = {
    "apiVersion": "events.k8s.io/v1",
    "kind": "Event",
    "metadata": {"name": "web.1", "namespace": "default"},
    "eventTime": "2026-01-01T00:00:00.000000Z",
    "type": "Warning",
    "reason": "EnrolFailed",
    "note": "the node agent could not write the redirection rules",
    "action": "Enrol",
    "reportingController": "ambit.io/nodeagent",
    "reportingInstance": "node-1",
    "regarding": {"kind": "Pod", "namespace": "default", "name": "web", "uid": "u-1"},
}


async def test_an_event_written_through_events_k8s_io_is_a_core_event(apiserver: ApiServer) -> None:
    async with ApiClient.for_server(apiserver) as api:
        created = await api.create(NEW, NEW_EVENT)
        assert created["apiVersion"] == "events.k8s.io/v1"
        assert created["note"] == NEW_EVENT["note"] and "message" not in created
        core = await api.must_get(f"{CORE}/web.1")
        assert core["apiVersion"] == "v1"
        assert core["message"] == NEW_EVENT["note"]
        assert core["involvedObject"]["name"] == "web"
        assert core["reportingComponent"] == "ambit.io/nodeagent"
        assert core["metadata"]["uid"] == created["metadata"]["uid"]
        listed = await api.get(CORE)
        assert listed.names() == ["web.1"]


async def test_a_core_event_reads_back_through_events_k8s_io(apiserver: ApiServer) -> None:
    async with ApiClient.for_server(apiserver) as api:
        await api.create(
            CORE,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "old.1"},
                "involvedObject": {"kind": "Pod", "namespace": "default", "name": "db"},
                "reason": "Started",
                "message": "started container",
                "type": "Normal",
                "count": 3,
            },
        )
        new = await api.must_get(f"{NEW}/old.1")
        assert new["apiVersion"] == "events.k8s.io/v1"
        assert new["regarding"]["name"] == "db"
        assert new["note"] == "started container"
        assert new["deprecatedCount"] == 3
        listed = (await api.get(NEW)).body
        assert listed["kind"] == "EventList" and listed["items"][0]["note"] == "started container"


async def test_field_selectors_and_patches_use_each_api_s_own_names(apiserver: ApiServer) -> None:
    async with ApiClient.for_server(apiserver) as api:
        await api.create(NEW, NEW_EVENT)
        assert (await api.get(NEW, fieldSelector="regarding.name=web")).names() == ["web.1"]
        assert (await api.get(NEW, fieldSelector="regarding.name=other")).names() == []
        assert (await api.get(CORE, fieldSelector="involvedObject.name=web")).names() == ["web.1"]
        patched = await api.patch(
            f"{NEW}/web.1", {"series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}, "note": "again"}
        )
        assert patched.status == 200, patched.body
        assert patched.body["series"]["count"] == 2 and patched.body["note"] == "again"
        assert (await api.must_get(f"{CORE}/web.1"))["message"] == "again"


async def test_a_core_watch_sees_events_written_through_events_k8s_io(apiserver: ApiServer) -> None:
    async with ApiClient.for_server(apiserver) as api:
        async with api.watch(CORE) as core_watch, api.watch(NEW) as new_watch:
            await api.create(NEW, NEW_EVENT)
            core_event = await core_watch.next()
            new_event = await new_watch.next()
        assert core_event is not None and new_event is not None
        assert core_event["object"]["message"] == NEW_EVENT["note"]
        assert new_event["object"]["note"] == NEW_EVENT["note"]
        assert new_event["object"]["apiVersion"] == "events.k8s.io/v1"
