"""The scale harness's shared held maps (bench.scale.shared_held): a wildcard client keeping its maps in the
worker's pool holds, reports and reopens exactly as the node proxy's ClientSession does, and clients in the same
state share one map."""

from __future__ import annotations

from bench.scale.shared_held import HeldPool, WildcardSession
from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.api import discovery_pb2 as dpb
from ambit.xds.client_session import ClientSession
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.session import AUTHORIZATION_TYPE_URL

TYPES = (ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL)
NAMES = st.sampled_from([f"n{i}" for i in range(8)])


def response(type_url: str, upserts: dict[str, str], removals: list[str], nonce: str) -> dpb.DeltaDiscoveryResponse:
    out = dpb.DeltaDiscoveryResponse(type_url=type_url, nonce=nonce, removed_resources=removals)
    for name, version in upserts.items():
        out.resources.append(dpb.Resource(name=name, version=version, resource=any_pb2.Any(type_url=type_url)))
    return out


RESPONSES = st.lists(
    st.tuples(
        st.sampled_from(TYPES),
        st.dictionaries(NAMES, st.sampled_from(["v1", "v2", "v3"]), max_size=5),
        st.lists(NAMES, max_size=3),
        st.booleans(),  # reconnect before it, with a tiny opening limit (rule 5's resync) or not
    ),
    max_size=25,
)


def pools() -> dict[str, HeldPool]:
    return {type_url: HeldPool() for type_url in TYPES}


@settings(max_examples=150, deadline=None)
@given(RESPONSES, st.booleans())
def test_a_shared_session_holds_and_reports_what_the_node_proxys_session_does(
    responses: list[tuple[str, dict[str, str], list[str], bool]], tiny: bool
) -> None:
    limit = 60 if tiny else 1 << 20
    decoders = {type_url: (lambda name, body: None) for type_url in TYPES}
    reference = ClientSession(decoders, max_initial_request=limit)
    shared = WildcardSession(pools(), node=dpb.Node(), max_initial_request=limit)
    for n, (type_url, upserts, removals, reconnect) in enumerate(responses):
        if reconnect:
            assert reference.initial_requests() == [
                dpb.DeltaDiscoveryRequest.FromString(r) for r in shared.initial_requests()
            ]
        message = response(type_url, upserts, removals, str(n))
        want, got = reference.apply(message), shared.apply(message)
        assert [name for name, _ in want.upserts] == list(got.upserts)
        assert want.removals == got.removals and want.reply == got.reply
        for t in TYPES:
            assert shared.count(t) == len(reference.held(t))
            assert dict(shared._held[t]) == reference.held(t)
        assert shared.synced == reference.synced


def test_clients_in_the_same_state_share_one_map_and_a_map_nobody_holds_is_forgotten() -> None:
    shared = pools()
    clients = [WildcardSession(shared, node=dpb.Node()) for _ in range(50)]
    everything = response(ADDRESS_TYPE_URL, {f"n{i}": "v1" for i in range(1000)}, [], "1")
    change = response(ADDRESS_TYPE_URL, {"n1": "v2"}, ["n2"], "2")
    for client in clients:
        client.apply(everything)
    for client in clients[:30]:
        client.apply(change)
    pool = shared[ADDRESS_TYPE_URL]
    assert pool.copies == 2  # everything, then everything changed: one map each, for 50 clients
    assert clients[0]._held[ADDRESS_TYPE_URL] is clients[29]._held[ADDRESS_TYPE_URL]
    assert clients[30]._held[ADDRESS_TYPE_URL] is clients[49]._held[ADDRESS_TYPE_URL]
    for client in clients[30:]:
        client.apply(change)
    assert len(pool) == 2  # the empty map (kept) and the changed one; nobody holds "everything" any more
