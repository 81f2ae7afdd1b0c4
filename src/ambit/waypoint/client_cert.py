"""The ``x-forwarded-client-cert`` (XFCC) header a waypoint or gateway forwards: who the client is, as the proxy
verified it, never as the client says.

Theory of operation: :func:`plan_client_cert` is pure. Given a request head, whether the waypoint was asked to
include the client identity (its Gateway's ``ambient.istio.io/xfcc-include-client-identity: "true"``,
:attr:`ambit.model.routes.WaypointConfig.xfcc_client_identity`), its own identity and the tunnel's peer identity,
it returns the head to authenticate, authorize, route and forward. The request path calls it first, so policies
and routes see what the backend will see (Istio puts its XFCC filter before authentication and authorization).

Rules (Envoy's ``forward_client_cert_details`` as Istio configures a waypoint):

1. Every ``x-forwarded-client-cert`` header the client sent is removed, whatever its case or count: the peer of a
   waypoint's inner HTTP connection presents no certificate, so Envoy's default ``SANITIZE`` drops it; with the
   annotation Istio overwrites it. A workload cannot pass an identity to the backend through this header.
2. With the annotation, and a peer identity verified by mutual TLS (the HBONE client: the node proxy speaking for
   the source workload), one header is added: ``By=<own SPIFFE id>;URI=<peer SPIFFE id>``, Envoy's XFCC element
   with the fields Istio fills from its filter state (``io.istio.local_principal``, ``io.istio.peer_principal``).
   SPIFFE ids have no ``,``, ``;``, ``=`` or ``"`` (:mod:`ambit.model.identity`), so no value needs quoting.
3. Without a verified peer (an ingress gateway's clients, outside the mesh) nothing is added.
4. A head without the header, and nothing to add, is returned as it is (the common case costs one scan).
"""

from __future__ import annotations

import functools

from ambit.model.identity import SpiffeId
from ambit.waypoint.decisions import RequestHead

__all__ = ["XFCC", "client_cert_element", "plan_client_cert"]

XFCC = "x-forwarded-client-cert"


@functools.lru_cache(maxsize=1024)
def client_cert_element(local: SpiffeId, peer: SpiffeId) -> str:
    """Rule 2's XFCC element."""
    return f"By={local};URI={peer}"


def plan_client_cert(
    head: RequestHead, *, include_identity: bool, local: SpiffeId | None, peer: SpiffeId | None
) -> RequestHead:
    """The head as it goes on (rules 1-4). Header names in ``head`` are lower-case already."""
    present = False
    for name, _ in head.headers:  # a plain loop: this runs for every request
        if name == XFCC:
            present = True
            break
    add = include_identity and local is not None and peer is not None
    if not present and not add:
        return head
    headers = [(name, value) for name, value in head.headers if name != XFCC] if present else list(head.headers)
    if add:
        assert local is not None and peer is not None
        headers.append((XFCC, client_cert_element(local, peer)))
    # Every field spelled out: dataclasses.replace would cost more than the rest of this function.
    return RequestHead(head.method, head.path, head.authority, tuple(headers), head.scheme)
