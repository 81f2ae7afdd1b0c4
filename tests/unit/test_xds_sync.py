"""The sync records of the xDS server (rules of :mod:`ambit.xds.sync`), with the clock passed in."""

from __future__ import annotations

import json

import pytest

from ambit.xds.sync import MAX_ERROR, MAX_TEXT, SyncRegistry, SyncStatus, TypeSync, classify

ADDRESS = "type.googleapis.com/istio.workload.Address"
AUTHZ = "type.googleapis.com/istio.security.Authorization"


@pytest.mark.parametrize(
    ("entry", "now", "expected"),
    [
        (None, 100.0, SyncStatus.NOT_SENT),
        (TypeSync(), 100.0, SyncStatus.NOT_SENT),
        (TypeSync("s1-1", 90.0, 3, "s1-1", 90.1), 100.0, SyncStatus.SYNCED),
        (TypeSync("s1-2", 90.0, 3, "s1-2", 90.1, "bad address"), 100.0, SyncStatus.ERROR),
        (TypeSync("s1-2", 97.0, 3, "s1-1", 90.1), 100.0, SyncStatus.PENDING),
        (TypeSync("s1-2", 95.0, 3, "s1-1", 90.1), 100.0, SyncStatus.PENDING),
        (TypeSync("s1-2", 94.9, 3, "s1-1", 90.1), 100.0, SyncStatus.STALE),
        (TypeSync("s1-2", 10.0, 3, "", 0.0), 100.0, SyncStatus.STALE),
        (TypeSync("s1-3", 10.0, 3, "s1-2", 11.0, "old nack"), 100.0, SyncStatus.STALE),
    ],
    ids=[
        "nothing opened",
        "opened, nothing sent",
        "last sent acked",
        "last sent nacked",
        "in flight 3 s",
        "in flight exactly stale_after",
        "in flight past stale_after",
        "never answered",
        "an older nack does not make the newest answered",
    ],
)
def test_each_type_is_classified_by_the_last_nonce_sent_and_the_clock(
    entry: TypeSync | None, now: float, expected: SyncStatus
) -> None:
    assert classify(entry, now, stale_after=5.0) is expected


def test_an_ack_of_an_older_response_does_not_sync_a_newer_push() -> None:
    record = SyncRegistry().open(1, "system:serviceaccount:istio-system:ztunnel", "Kubernetes", 0.0)
    record.sent(ADDRESS, "s1-1", 4, now=1.0)
    record.sent(ADDRESS, "s1-2", 1, now=2.0)
    record.answered(ADDRESS, "s1-1", now=2.1)
    assert classify(record.types[ADDRESS], 3.0) is SyncStatus.PENDING
    record.answered(ADDRESS, "s1-2", now=3.5)
    assert classify(record.types[ADDRESS], 100.0) is SyncStatus.SYNCED


def test_a_nack_is_an_error_until_a_later_push_is_acked() -> None:
    record = SyncRegistry().open(1, "a", "c", 0.0)
    record.sent(AUTHZ, "s1-1", 2, now=1.0)
    record.answered(AUTHZ, "s1-1", now=1.1, error="policy ns/p: rules[0]: bad")
    assert classify(record.types[AUTHZ], 2.0) is SyncStatus.ERROR
    record.sent(AUTHZ, "s1-2", 1, now=3.0)
    record.answered(AUTHZ, "s1-2", now=3.1)
    assert classify(record.types[AUTHZ], 4.0) is SyncStatus.SYNCED
    assert record.types[AUTHZ].error == ""


def test_the_registry_holds_one_record_per_stream_and_forgets_it_on_close() -> None:
    registry = SyncRegistry()
    first = registry.open(1, "a", "c", 0.0)
    assert registry.open(1, "a", "c", 5.0) is first and first.connected_at == 0.0
    registry.open(2, "b", "c", 1.0)
    assert len(registry) == 2
    registry.close(1)
    registry.close(1)
    assert len(registry) == 1 and registry.find(1) is None and registry.find(2) is not None


def test_what_a_client_says_about_itself_is_cut_and_kept_once() -> None:
    record = SyncRegistry().open(1, "x" * 10_000, "y" * 10_000, 0.0)
    record.describe("n" * 10_000, "v" * 10_000)
    record.describe("other", "2.0")
    record.sent(ADDRESS, "s1-1", 0, now=1.0)
    record.answered(ADDRESS, "s1-1", now=1.0, error="e" * 100_000)
    assert len(record.identity) == len(record.cluster) == MAX_TEXT
    assert record.node_id == "n" * MAX_TEXT and record.version == "v" * MAX_TEXT
    assert len(record.types[ADDRESS].error) == MAX_ERROR


def test_an_answer_for_a_type_never_opened_is_ignored() -> None:
    record = SyncRegistry().open(1, "a", "c", 0.0)
    record.answered(ADDRESS, "s1-9", now=1.0)
    assert record.types == {}


def test_the_document_lists_each_stream_with_its_types_status_and_is_json() -> None:
    registry = SyncRegistry()
    node = registry.open(2, "system:serviceaccount:istio-system:ztunnel", "Kubernetes", 10.0)
    node.describe("node-a", "1.0")
    node.opened(ADDRESS)
    node.sent(ADDRESS, "s2-1", 7, now=11.0)
    node.answered(ADDRESS, "s2-1", now=11.2)
    node.opened(AUTHZ)
    waypoint = registry.open(1, "system:serviceaccount:shop:waypoint", "Kubernetes", 5.0)
    waypoint.sent(ADDRESS, "s1-1", 1, now=12.0)
    document = registry.document(20.0, control_plane="istiod-0", stale_after=5.0)
    assert json.loads(json.dumps(document)) == document
    assert document["controlPlane"] == "istiod-0" and document["generatedAt"] == 20.0
    assert [c["stream"] for c in document["clients"]] == [1, 2]
    waypoint_doc, node_doc = document["clients"]
    assert waypoint_doc["types"][ADDRESS]["status"] == "STALE"
    assert node_doc["node"] == "node-a" and node_doc["version"] == "1.0" and node_doc["lastPushAt"] == 11.0
    assert node_doc["types"][ADDRESS] == {
        "status": "SYNCED",
        "sentNonce": "s2-1",
        "sentAt": 11.0,
        "resources": 7,
        "answeredNonce": "s2-1",
        "error": "",
    }
    assert node_doc["types"][AUTHZ]["status"] == "NOT SENT" and node_doc["types"][AUTHZ]["sentAt"] is None
