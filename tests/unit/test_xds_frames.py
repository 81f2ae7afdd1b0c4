"""Responses encoded once for many clients (issue 22's fan-out): a frame's bytes parse to the message the session's
delta builds, for any resources, removals and nonce; equal deltas of one snapshot share one body; the cache keeps
only the last snapshots per type and stays within its byte bound."""

from __future__ import annotations

import logging

import pytest
from google.protobuf import any_pb2
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ambit.api import discovery_pb2 as dpb
from ambit.xds import service as xds_service
from ambit.xds.convert import ADDRESS_TYPE_URL as A
from ambit.xds.frames import Frame, FrameCache, FrameSettings
from ambit.xds.resource_set import ResourceSet, XdsResource
from ambit.xds.service import XdsService
from ambit.xds.session import Delta, ServerSession
from ambit.xds.table import AddressTable

T = "type.googleapis.com/istio.workload.Address"
TEXT = st.text(max_size=12)
RESOURCES = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=12),
        TEXT,
        st.binary(max_size=40),
        st.lists(TEXT, max_size=3).map(tuple),
        st.booleans(),
    ),
    max_size=12,
    unique_by=lambda r: r[0],
)


def _resource(
    name: str, version: str, value: bytes = b"", aliases: tuple[str, ...] = (), *, built: bool = True
) -> XdsResource:
    body = any_pb2.Any(type_url="type.googleapis.com/istio.workload.Address", value=value or name.encode())
    if built:
        return XdsResource.built(name, version, body, aliases)
    return XdsResource(name, version, body, aliases)


@settings(max_examples=300, deadline=None)
@given(RESOURCES, st.lists(TEXT, max_size=6).map(tuple), TEXT, st.sampled_from([T, "", "x/y"]))
def test_a_frame_parses_to_the_message_the_delta_builds(
    resources: list[tuple[str, str, bytes, tuple[str, ...], bool]], removed: tuple[str, ...], nonce: str, type_url: str
) -> None:
    sent = tuple(_resource(n, v, b, a, built=w) for n, v, b, a, w in resources)
    delta = Delta(type_url, nonce, sent, removed)
    old = dpb.DeltaDiscoveryResponse(
        type_url=type_url, nonce=nonce, resources=[r.to_wire() for r in sent], removed_resources=removed
    )
    frame = FrameCache().frame(ResourceSet.build(sent), delta)
    assert dpb.DeltaDiscoveryResponse.FromString(frame.data()) == old == delta.message()
    assert len(frame) == len(frame.data())


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from("abcdef"), st.integers(0, 3)),
        st.tuples(st.just("remove"), st.sampled_from("abcdef"), st.just(0)),
        st.tuples(st.just("subscribe"), st.sampled_from(["a", "b", "/10.0.0.1", "*", "zz"]), st.just(0)),
        st.tuples(st.just("unsubscribe"), st.sampled_from(["a", "b", "*"]), st.just(0)),
    ),
    max_size=20,
)


@settings(max_examples=150, deadline=None)
@given(OPS, st.booleans())
def test_every_response_of_a_session_framed_parses_to_its_message(
    ops: list[tuple[str, str, int]], wildcard: bool
) -> None:
    """Two sessions fed the same changes: each response, as a frame, is the message the old path sent."""
    truth: dict[str, XdsResource] = {}
    current = ResourceSet.build(())
    cache = FrameCache()
    sessions = [ServerSession("p"), ServerSession("q")]
    opening = dpb.DeltaDiscoveryRequest(type_url=T, resource_names_subscribe=[] if wildcard else ["a"])

    def check(deltas: tuple[Delta, ...]) -> None:
        for delta in deltas:
            parsed = dpb.DeltaDiscoveryResponse.FromString(cache.frame(current, delta).data())
            assert parsed == delta.message()

    for session in sessions:
        check(session.receive(opening, current).deltas)
    for kind, name, version in ops:
        if kind in ("put", "remove"):
            if kind == "put":
                truth[name] = _resource(name, str(version), aliases=("/10.0.0.1",) if name == "a" else ())
            else:
                truth.pop(name, None)
            current = ResourceSet.build(truth.values())
            for session in sessions:
                check(session.push(T, current, {name}).deltas)
        else:
            request = dpb.DeltaDiscoveryRequest(type_url=T)
            getattr(request, f"resource_names_{kind}").append(name)
            for session in sessions:
                check(session.receive(request, current).deltas)


def test_clients_sent_the_same_resources_of_one_snapshot_share_one_encoding() -> None:
    current = ResourceSet.build(_resource(f"w{i}", "1") for i in range(100))
    cache = FrameCache()
    frames: list[Frame] = []
    for n in range(5):
        session = ServerSession(f"s{n}")
        (delta,) = session.receive(dpb.DeltaDiscoveryRequest(type_url=T), current).deltas
        frames.append(cache.frame(current, delta))
    assert (cache.encodings, cache.reuses) == (1, 4)
    assert all(f.body is frames[0].body for f in frames)
    assert len({f.tail for f in frames}) == 5  # each client its own nonce
    assert [dpb.DeltaDiscoveryResponse.FromString(f.data()).nonce for f in frames] == [f"s{n}-1" for n in range(5)]


def test_a_different_snapshot_removal_or_version_is_encoded_again() -> None:
    one = _resource("a", "1")
    first, second = ResourceSet.build([one]), ResourceSet.build([one])
    cache = FrameCache()
    cache.frame(first, Delta(T, "n-1", (one,)))
    cache.frame(second, Delta(T, "n-2", (one,)))  # an equal set, but another snapshot (rule 2)
    cache.frame(first, Delta(T, "n-3", (one,), ("gone",)))
    cache.frame(first, Delta(T, "n-4", (_resource("a", "2"),)))
    cache.frame(first, Delta(T, "n-5", (one,)))
    assert (cache.encodings, cache.reuses) == (4, 1)


def test_the_cache_keeps_only_the_last_snapshots_of_each_type() -> None:
    cache = FrameCache(FrameSettings(snapshots=2))
    sets = [ResourceSet.build([_resource("a", str(v))]) for v in range(4)]
    for current in sets:
        cache.frame(current, Delta(T, "n", tuple(current.by_name.values())))
        cache.frame(current, Delta("other", "n", ()))
    assert len(cache) == 4  # two snapshots of each of two types
    cache.frame(sets[3], Delta(T, "n", tuple(sets[3].by_name.values())))
    assert cache.reuses == 1
    cache.frame(sets[0], Delta(T, "n", tuple(sets[0].by_name.values())))  # retired: made again
    assert cache.encodings == 9 and len(cache) == 4


def test_the_cache_stays_within_its_byte_bound_and_keeps_the_body_just_made() -> None:
    cache = FrameCache(FrameSettings(max_bytes=1000))
    current = ResourceSet.build(_resource(f"w{i}", "1", b"x" * 100) for i in range(30))
    every = tuple(current.by_name.values())
    for i in range(30):
        cache.frame(current, Delta(T, "n", every[i : i + 3]))
        assert cache.size <= 1000 + 400
    big = cache.frame(current, Delta(T, "n", every))
    assert len(big.body) > 1000 and 0 < cache.size - len(big.body) <= 1000  # the rest within the bound, beyond it
    assert cache.frame(current, Delta(T, "n-2", every)).body is big.body


@settings(max_examples=150, deadline=None)
@given(RESOURCES)
def test_the_answer_to_a_wildcard_client_holding_nothing_is_the_one_rule_4_gives(
    resources: list[tuple[str, str, bytes, tuple[str, ...], bool]],
) -> None:
    """Session rule 9: the shared answer equals the general path's (forced here by a held name that is gone)."""
    current = ResourceSet.build(_resource(n, v, b, a, built=w) for n, v, b, a, w in resources)
    assume("\x00gone" not in current.by_name)
    fresh, known = ServerSession("f"), ServerSession("k")
    (shared,) = fresh.receive(dpb.DeltaDiscoveryRequest(type_url=T), current).deltas
    held = {"\x00gone": "1"}  # a name that is not in the set
    held_request = dpb.DeltaDiscoveryRequest(type_url=T, initial_resource_versions=held)
    (general,) = known.receive(held_request, current).deltas
    assert general.resources == shared.resources
    assert general.removed == ("\x00gone",)
    assert shared.removed == ()
    assert fresh.held(T) == {n: v for n, v, *_ in resources} == {k: v for k, v in known.held(T).items()}
    again = fresh.push(T, current, None)
    assert again.deltas == ()  # it holds everything now: nothing is resent
    second = ServerSession("g").receive(dpb.DeltaDiscoveryRequest(type_url=T), current).deltas
    assert not resources or second[0].resources is shared.resources  # one tuple for every such client


def test_a_frame_over_what_node_proxies_accept_is_sent_whole_and_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(xds_service, "LARGEST_CLIENT_MESSAGE", 100)
    table = AddressTable()
    service = XdsService(table, lambda metadata: None)
    current = ResourceSet.build(_resource(f"w{i}", "1", b"x" * 50) for i in range(3))
    frame = service.frames.frame(current, Delta(A, "n-1", tuple(current.by_name.values())))
    with caplog.at_level(logging.WARNING, logger="ambit.xds.server"):
        assert service._serialize(frame) == frame.data()
        assert service._serialize(frame) == frame.data()
    assert service.stats.oversized == 2
    assert len([r for r in caplog.records if "over what node proxies accept" in r.message]) == 1
