"""The XFCC header a waypoint forwards (:mod:`ambit.waypoint.client_cert`): a client's header never survives, the
verified identity is added only when the waypoint's Gateway asks for it, in Envoy's ``By=...;URI=...`` form."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.identity import SpiffeId
from ambit.waypoint.client_cert import XFCC, client_cert_element, plan_client_cert
from ambit.waypoint.decisions import RequestHead

WAYPOINT = SpiffeId("cluster.local", "app", "waypoint")
CLIENT = SpiffeId("cluster.local", "app", "client")
FORGED = "By=spiffe://cluster.local/ns/app/sa/echo;URI=spiffe://cluster.local/ns/app/sa/admin"


def head(*headers: tuple[str, str]) -> RequestHead:
    return RequestHead("GET", "/", "echo.app.svc.cluster.local", tuple(headers))


def test_the_element_names_the_waypoint_by_and_the_source_uri() -> None:
    assert client_cert_element(WAYPOINT, CLIENT) == (
        "By=spiffe://cluster.local/ns/app/sa/waypoint;URI=spiffe://cluster.local/ns/app/sa/client"
    )


def test_with_the_annotation_the_header_is_the_verified_identity_whatever_the_client_sent() -> None:
    sent = head(("accept", "*/*"), (XFCC, FORGED), ("x-a", "1"), (XFCC, "URI=spiffe://evil/ns/x/sa/y"))
    out = plan_client_cert(sent, include_identity=True, local=WAYPOINT, peer=CLIENT)
    assert out.headers == (("accept", "*/*"), ("x-a", "1"), (XFCC, client_cert_element(WAYPOINT, CLIENT)))


def test_without_the_annotation_a_client_header_is_removed_and_none_is_added() -> None:
    out = plan_client_cert(head((XFCC, FORGED), ("x-a", "1")), include_identity=False, local=WAYPOINT, peer=CLIENT)
    assert out.headers == (("x-a", "1"),)


def test_without_a_verified_peer_nothing_is_added() -> None:
    out = plan_client_cert(head((XFCC, FORGED)), include_identity=True, local=WAYPOINT, peer=None)
    assert out.header(XFCC) is None


def test_a_head_without_the_header_and_nothing_to_add_is_the_same_object() -> None:
    sent = head(("x-a", "1"))
    assert plan_client_cert(sent, include_identity=False, local=WAYPOINT, peer=CLIENT) is sent


HEADER_NAMES = st.sampled_from([XFCC, "x-a", "authorization", "x-forwarded-client-cert-x", "x-forwarded-for"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(HEADER_NAMES, st.text(max_size=40)), max_size=8),
    st.booleans(),
    st.none() | st.just(CLIENT),
)
def test_at_most_one_header_survives_and_it_is_ours(
    headers: list[tuple[str, str]], include: bool, peer: SpiffeId | None
) -> None:
    out = plan_client_cert(head(*headers), include_identity=include, local=WAYPOINT, peer=peer)
    ours = [v for n, v in out.headers if n == XFCC]
    assert ours == ([client_cert_element(WAYPOINT, CLIENT)] if include and peer else [])
    assert [h for h in out.headers if h[0] != XFCC] == [h for h in headers if h[0] != XFCC]
