"""What a server session believes a client holds (session rules 11 and 12): a shared base set plus differences,
checked against a plain dict model over random histories of pushes, reconnects and rebases."""

from __future__ import annotations

import gc
import weakref

from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.api import discovery_pb2 as dpb
from ambit.xds import session as session_module
from ambit.xds.held_versions import HeldVersions
from ambit.xds.resource_set import ResourceSet, XdsResource
from ambit.xds.session import ServerSession
from ambit.xds.snapshot_map import SnapshotMap

A = "type.googleapis.com/istio.workload.Address"
NAMES = [f"Kubernetes//Pod/ns/pod-{i:03d}" for i in range(40)]


def _resource(name: str, version: str) -> XdsResource:
    return XdsResource.built(name, version, any_pb2.Any())


def _set(versions: dict[str, str]) -> ResourceSet:
    return ResourceSet.build(_resource(n, v) for n, v in versions.items())


def _versions(current: ResourceSet) -> dict[str, str]:
    return {name: r.version for name, r in current.by_name.items()}


# An edit: (name index, version or None to remove).
edits = st.lists(st.tuples(st.integers(0, len(NAMES) - 1), st.one_of(st.none(), st.sampled_from("abc"))), max_size=12)


@settings(max_examples=150, deadline=None)
@given(start=edits, rounds=st.lists(edits, max_size=8), rebase_after=st.integers(0, 6))
def test_a_wildcard_session_holds_exactly_what_it_was_sent_and_shares_the_set(
    start: list[tuple[int, str | None]], rounds: list[list[tuple[int, str | None]]], rebase_after: int
) -> None:
    original = session_module.REBASE_AFTER
    session_module.REBASE_AFTER = rebase_after
    try:
        model: dict[str, str] = {NAMES[i]: v for i, v in start if v is not None}
        current = _set(model)
        session = ServerSession()
        (opened,) = session.receive(dpb.DeltaDiscoveryRequest(type_url=A), current).deltas
        client = {r.name: r.version for r in opened.resources}
        for edit in rounds:
            upserts = [_resource(NAMES[i], v) for i, v in edit if v is not None]
            removed = [NAMES[i] for i, v in edit if v is None]
            following = current.updated(upserts, removed)
            changed = {r.name for r in upserts} | set(removed)
            for delta in session.push(A, following, changed).deltas:
                client.update((r.name, r.version) for r in delta.resources)
                for name in delta.removed:
                    client.pop(name)
            current = following
            assert client == _versions(current) == session.held(A)
            state = session._types[A]
            assert len(state.held) == len(client)
            assert state.held.differences <= max(rebase_after, 0) + len(changed)
    finally:
        session_module.REBASE_AFTER = original


@given(holds=st.dictionaries(st.sampled_from(NAMES), st.sampled_from("abc")), now=edits)
def test_a_reconnect_is_sent_exactly_what_differs_and_then_holds_the_set(
    holds: dict[str, str], now: list[tuple[int, str | None]]
) -> None:
    current = _set({NAMES[i]: v for i, v in now if v is not None})
    wanted = _versions(current)
    request = dpb.DeltaDiscoveryRequest(type_url=A, initial_resource_versions=holds)
    (delta,) = ServerSession().receive(request, current).deltas
    sent = [r.name for r in delta.resources]
    assert sent == sorted(n for n, v in wanted.items() if holds.get(n) != v)  # nothing unchanged is resent
    assert list(delta.removed) == sorted(set(holds) - set(wanted))


def test_a_client_in_sync_holds_the_set_itself_not_a_copy() -> None:
    current = _set({n: "a" for n in NAMES})
    sessions = [ServerSession(prefix=f"s{k}") for k in range(3)]
    for session in sessions:
        session.receive(dpb.DeltaDiscoveryRequest(type_url=A), current)
    following = current.updated([_resource(NAMES[0], "b")], [NAMES[1]])
    for session in sessions:
        session.push(A, following, {NAMES[0], NAMES[1]})
        held = session._types[A].held
        assert held.base is following and held.differences == 0  # rule 13: it holds the new set itself
        assert held.get(NAMES[0]) == "b" and NAMES[1] not in held and held.get(NAMES[2]) == "a"
    reconnect = dpb.DeltaDiscoveryRequest(type_url=A, initial_resource_versions=_versions(following))
    restarted = ServerSession()
    (answer,) = restarted.receive(reconnect, following).deltas
    assert not answer.resources and not answer.removed  # in sync: an empty answer, nothing resent
    assert restarted._types[A].held.base is following and restarted._types[A].held.differences == 0


def test_held_versions_rebase_keeps_the_content() -> None:
    old = _set({"a": "1", "b": "1", "c": "1"})
    new = old.updated([_resource("a", "2"), _resource("d", "1")], ["b"])
    held = HeldVersions()
    held.adopt(old)
    held.set("a", "2")
    held.discard("c")
    held.set("e", "9")
    before = dict(held.as_dict())
    held.rebase(new)
    assert held.base is new and dict(held.as_dict()) == before == {"a": "2", "b": "1", "e": "9"}
    assert held.differences == 4  # b held though gone, c and d not held, e its own
    assert len(held) == 3


def test_the_changes_between_two_sets_are_found_once_and_cost_only_the_changed_buckets() -> None:
    old = _set({n: "a" for n in NAMES})
    new = old.updated([_resource(NAMES[3], "b"), _resource("extra", "a")], [NAMES[5]])
    assert new.changed_since(old) == {NAMES[3], NAMES[5], "extra"}
    assert new.changed_since(old) is new.changed_since(old)
    mine, theirs = SnapshotMap.of({"x": 1, "y": 2}), SnapshotMap.of({"x": 1, "z": 3})
    assert mine.differing_keys(theirs) == {"y", "z"}


@given(holds=st.dictionaries(st.sampled_from([*NAMES, "gone-1", "gone-2"]), st.sampled_from("abc")), now=edits)
def test_a_reconnect_that_differs_from_the_set_is_held_as_its_differences_on_the_set(
    holds: dict[str, str], now: list[tuple[int, str | None]]
) -> None:
    current = _set({NAMES[i]: v for i, v in now if v is not None})
    held = HeldVersions.against(current, holds)
    assert dict(held.as_dict()) == holds and len(held) == len(holds)
    assert held.base is current
    wanted = _versions(current)
    differing = {n for n in {*holds, *wanted} if holds.get(n) != wanted.get(n)}
    assert held.differences == len(differing)  # the names it agrees on with the set cost it nothing


def test_a_reconnect_one_change_behind_keeps_one_difference_and_the_sets_own_strings() -> None:
    current = _set({n: "a" for n in NAMES})
    following = current.updated([_resource(NAMES[7], "b")], [])
    request = dpb.DeltaDiscoveryRequest(type_url=A, initial_resource_versions=_versions(current))
    session = ServerSession()
    (answer,) = session.receive(request, following).deltas
    assert [r.name for r in answer.resources] == [NAMES[7]] and not answer.removed
    held = session._types[A].held
    assert held.base is following and held.differences == 0  # answered: it now holds the set itself
    behind = HeldVersions.against(following, request.initial_resource_versions)
    assert behind.differences == 1 and behind.get(NAMES[7]) == "a"
    ((name, _),) = behind.differing()
    assert name is following.by_name[NAMES[7]].name  # the set's string, not a copy from the request


def test_an_exact_reconnect_is_recognised_whatever_else_its_request_carries_and_the_probe_is_left_clean() -> None:
    current = _set({n: "a" for n in NAMES})
    request = dpb.DeltaDiscoveryRequest(
        type_url=A,
        node=dpb.Node(id="ztunnel~198.18.0.1~ztunnel-x.istio-system~istio-system.svc.cluster.local"),
        resource_names_subscribe=["*"],
        initial_resource_versions=_versions(current),
    )
    assert current.holds_exactly(request)
    assert [f.name for f, _ in current.versions_request().ListFields()] == ["initial_resource_versions"]
    request.initial_resource_versions[NAMES[3]] = "b"
    assert not current.holds_exactly(request)
    del request.initial_resource_versions[NAMES[3]]
    assert not current.holds_exactly(request)  # one name short
    assert [f.name for f, _ in current.versions_request().ListFields()] == ["initial_resource_versions"]


@settings(max_examples=100, deadline=None)
@given(start=edits, rounds=st.lists(st.tuples(edits, st.integers(0, 3)), max_size=8))
def test_clients_in_sync_share_each_push_and_get_every_difference(
    start: list[tuple[int, str | None]], rounds: list[tuple[list[tuple[int, str | None]], int]]
) -> None:
    """Rule 13: wildcard clients holding the same set get the same tuples (made once), each push brings every client
    to the new set even when the names given to the push miss some of the changes."""
    current = _set({NAMES[i]: v for i, v in start if v is not None})
    sessions = [ServerSession(prefix=f"s{k}") for k in range(3)]
    clients: list[dict[str, str]] = []
    for session in sessions:
        (opened,) = session.receive(dpb.DeltaDiscoveryRequest(type_url=A), current).deltas
        clients.append({r.name: r.version for r in opened.resources})
    for edit, missed in rounds:
        upserts = [_resource(NAMES[i], v) for i, v in edit if v is not None]
        removed = [NAMES[i] for i, v in edit if v is None]
        following = current.updated(upserts, removed)
        named = sorted({r.name for r in upserts} | set(removed))[missed:]  # the push is told fewer names
        deltas = [session.push(A, following, set(named)).deltas for session in sessions]
        for client, pushed in zip(clients, deltas, strict=True):
            for delta in pushed:
                client.update((r.name, r.version) for r in delta.resources)
                for name in delta.removed:
                    client.pop(name)
        for client, session in zip(clients, sessions, strict=True):
            assert client == _versions(following) == session.held(A)
            assert session._types[A].held.base is following and session._types[A].held.differences == 0
        if deltas[0]:
            first = deltas[0][0]
            assert all(d[0].resources is first.resources and d[0].removed is first.removed for d in deltas[1:])
            assert len({d[0].nonce for d in deltas}) == len(deltas)
        else:
            assert not any(deltas), "in sync for one client is in sync for all"
        current = following


def test_a_set_does_not_keep_the_sets_before_it_alive() -> None:
    """changed_since and transition_from remember their answers per older set, weakly: a chain of sets each asked
    about the one before must not hold every earlier set (it grew without bound under churn)."""
    first = _set({n: "a" for n in NAMES})
    probe = weakref.ref(first)
    current = first
    for k in range(20):
        following = current.updated([_resource(NAMES[k % len(NAMES)], f"v{k}")], [])
        following.changed_since(current)
        following.transition_from(current)
        current = following
    del first, following
    gc.collect()
    assert probe() is None
    assert current.transition_from(current).sent == ()  # a set against itself: nothing
