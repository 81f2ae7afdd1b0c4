"""A reconnect's held versions compared by their encoded entries (:mod:`ambit.xds.opening`, session rule 12): the
server's path (:func:`parse_request`, then the digest) answers every request exactly as the message path does (the
request parsed as the declared map, then compared name by name), over random sets, holdings, entry orders,
duplicate entries and entries encoded in another field order."""

from __future__ import annotations

import random

from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.protobuf_wire import ln

from ambit.api import discovery_pb2 as dpb
from ambit.xds.opening import Reconnect, parse_request
from ambit.xds.resource_set import ResourceSet, XdsResource
from ambit.xds.session import ServerSession

A = "type.googleapis.com/istio.workload.Address"
NAMES = [f"Kubernetes//Pod/ns/pod-{i:03d}" for i in range(24)]
VERSIONS = ["a", "b", "0123456789abcdef", ""]


def _set(versions: dict[str, str]) -> ResourceSet:
    return ResourceSet.build(XdsResource.built(n, v, any_pb2.Any()) for n, v in versions.items())


def _entry(name: str, version: str, *, swapped: bool) -> bytes:
    """A map entry of field 5: key then value as protobuf writes it, or value first (valid, but not canonical)."""
    return ln(5, ln(2, version), ln(1, name)) if swapped else ln(5, ln(1, name), ln(2, version))


def _answer(output: object) -> tuple[tuple[str, ...], tuple[str, ...]]:
    (delta,) = output.deltas  # type: ignore[attr-defined]
    return tuple(r.name for r in delta.resources), delta.removed


held_entries = st.lists(
    st.tuples(st.sampled_from([*NAMES, "gone"]), st.sampled_from(VERSIONS), st.booleans()), max_size=30
)


@settings(max_examples=300, deadline=None)
@given(
    table=st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VERSIONS[:3]), min_size=1),
    exact=st.booleans(),
    extra=held_entries,
    seed=st.integers(0, 2**32),
    swap_some=st.booleans(),
    subscribe=st.sampled_from([[], ["*"], [NAMES[0]]]),
)
def test_the_digest_path_answers_every_opening_as_the_parsed_map_does(
    table: dict[str, str],
    exact: bool,
    extra: list[tuple[str, str, bool]],
    seed: int,
    swap_some: bool,
    subscribe: list[str],
) -> None:
    current = _set(table)
    draw = random.Random(seed)
    entries = [(n, v, False) for n, v in table.items()] if exact else []
    entries += [(n, v, s and swap_some) for n, v, s in extra]  # changes, unknown names, duplicates, odd encodings
    draw.shuffle(entries)
    head = dpb.DeltaDiscoveryRequest(type_url=A, resource_names_subscribe=subscribe, node=dpb.Node(id="n1"))
    data = head.SerializeToString() + b"".join(_entry(n, v, swapped=s) for n, v, s in entries)
    message = dpb.DeltaDiscoveryRequest.FromString(data)  # the straightforward reading: the map protobuf gives
    parsed = parse_request(data)
    if not entries:
        assert parsed == message
        return
    assert isinstance(parsed, Reconnect) and parsed.request == head
    holds = dict(message.initial_resource_versions)
    verdict = current.holds_entries(parsed.versions)
    if verdict:  # the digest says "the set" only of the set
        assert holds == table
    canonical = not any(s for _, _, s in entries) and len({n for n, _, _ in entries}) == len(entries)
    if canonical and holds == table:  # and always of the set, in any order, encoded as protobuf encodes it
        assert verdict
    straight, fast = ServerSession(), ServerSession()
    assert _answer(fast.receive(parsed, current)) == _answer(straight.receive(message, current))
    assert fast.held(A) == straight.held(A)


def test_an_exact_reconnect_in_any_order_is_recognised_by_its_digest_and_answered_empty() -> None:
    table = {n: f"v{i}" for i, n in enumerate(NAMES)}
    current = _set(table)
    entries = [ln(5, ln(1, n), ln(2, v)) for n, v in table.items()]
    random.Random(7).shuffle(entries)
    parsed = parse_request(dpb.DeltaDiscoveryRequest(type_url=A).SerializeToString() + b"".join(entries))
    assert isinstance(parsed, Reconnect) and current.holds_entries(parsed.versions)
    session = ServerSession()
    assert _answer(session.receive(parsed, current)) == ((), ())
    assert session._types[A].held.base is current and session._types[A].held.differences == 0


def test_an_exact_reconnect_with_one_entry_encoded_value_first_is_still_answered_empty() -> None:
    table = {n: "a" for n in NAMES}
    current = _set(table)
    entries = [ln(5, ln(1, n), ln(2, v)) for n, v in table.items()]
    entries[3] = ln(5, ln(2, "a"), ln(1, NAMES[3]))  # valid protobuf, not the runtime's encoding: no digest match
    parsed = parse_request(dpb.DeltaDiscoveryRequest(type_url=A).SerializeToString() + b"".join(entries))
    assert isinstance(parsed, Reconnect) and not current.holds_entries(parsed.versions)
    assert _answer(ServerSession().receive(parsed, current)) == ((), ())  # the name-by-name path agrees


def test_a_reconnect_repeating_one_entry_in_place_of_another_is_not_taken_for_the_set() -> None:
    table = {n: "a" for n in NAMES}
    current = _set(table)
    entries = [ln(5, ln(1, n), ln(2, "a")) for n in NAMES[:-1]] + [ln(5, ln(1, NAMES[0]), ln(2, "a"))]
    parsed = parse_request(dpb.DeltaDiscoveryRequest(type_url=A).SerializeToString() + b"".join(entries))
    assert isinstance(parsed, Reconnect) and len(parsed.versions) == len(table)
    assert not current.holds_entries(parsed.versions)
    assert _answer(ServerSession().receive(parsed, current)) == ((NAMES[-1],), ())


@given(
    type_url=st.text(max_size=20),
    nonce=st.text(max_size=8),
    subscribe=st.lists(st.text(max_size=8), max_size=3),
    node_id=st.text(max_size=8),
)
def test_a_request_without_held_versions_parses_as_the_message_does(
    type_url: str, nonce: str, subscribe: list[str], node_id: str
) -> None:
    request = dpb.DeltaDiscoveryRequest(
        type_url=type_url, response_nonce=nonce, resource_names_subscribe=subscribe, node=dpb.Node(id=node_id)
    )
    parsed = parse_request(request.SerializeToString())
    assert isinstance(parsed, dpb.DeltaDiscoveryRequest) and parsed == request


@settings(max_examples=100, deadline=None)
@given(
    nonce=st.text(max_size=8),
    subscribe=st.lists(st.text(max_size=6), max_size=3),
    unsubscribe=st.lists(st.text(max_size=6), max_size=3),
    error=st.one_of(st.none(), st.tuples(st.integers(0, 16), st.text(max_size=10))),
    cluster=st.text(max_size=6),
    held=st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VERSIONS), min_size=1, max_size=5),
)
def test_a_reconnect_keeps_every_other_field_of_the_request(
    nonce: str,
    subscribe: list[str],
    unsubscribe: list[str],
    error: tuple[int, str] | None,
    cluster: str,
    held: dict[str, str],
) -> None:
    request = dpb.DeltaDiscoveryRequest(
        type_url=A,
        node=dpb.Node(id="sidecar~10.0.0.1~ztunnel", cluster=cluster),
        resource_names_subscribe=subscribe,
        resource_names_unsubscribe=unsubscribe,
        response_nonce=nonce,
        initial_resource_versions=held,
    )
    if error is not None:
        request.error_detail.code, request.error_detail.message = error
    parsed = parse_request(request.SerializeToString())
    assert isinstance(parsed, Reconnect)
    request.ClearField("initial_resource_versions")
    assert parsed.request == request
