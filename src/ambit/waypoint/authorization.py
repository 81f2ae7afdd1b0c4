"""Authorization at the waypoint: the policies bound to it (spec §7.5), judged per request, or once per TCP
connection, by the one engine (:mod:`ambit.rbac`).

Theory of operation: the control plane sends the waypoint, in its WaypointConfig, exactly the policies bound to
it (:mod:`ambit.controlplane.translate.waypoint_policies`). :class:`WaypointAuthorizer` splits them per destination
(rule 1) into an :class:`~ambit.rbac.Applicable`, cached until the config changes. The HTTP shell calls
:func:`check_request` with the tunnel and each request head before routing; the TCP shell calls
:func:`check_connection` once per connection. The shell answers a denial (403 ``RBAC: access denied`` with no
response flag, as Envoy's HTTP RBAC filter sets none, or a refused/closed TCP tunnel with flag ``DENY``) and logs
:func:`denial_detail`.

Rules:

1. The policies of a request are the WAYPOINT-scoped ones and the SERVICE-scoped ones that list the destination
   Service's key (``namespace/hostname``); a workload-addressed tunnel has only the WAYPOINT ones.
2. The connection is the tunnel: the peer's verified identity (mutual TLS, always present), the peer's address as
   source, the addressed IP and port as destination (a Service's VIP and port for a Service target).
3. The request: method, the authority as received, the path normalized as Istio's default (MeshConfig
   ``pathNormalization`` ``DEFAULT`` = ``BASE``: Envoy's ``normalize_path``, RFC 3986) without the query: percent
   encodings of unreserved characters (``A-Z a-z 0-9 - . _ ~``) decoded, the other encodings' hex digits
   upper-cased, dot segments removed (RFC 3986 §5.2.4). Slashes are not merged and ``%2F`` stays encoded (Istio's
   defaults). An absolute-form target is read for its path. The path is normalized only for the decision; the
   request is forwarded as received.
4. The remote IP is the peer's address: ``X-Forwarded-For`` is not trusted (Istio's default of zero trusted
   proxies), so a client cannot choose the address ``remoteIpBlocks`` sees. At an ingress gateway that trusts N
   proxies in front of it (``gatewayTopology.numTrustedProxies``, carried as the connection manager's
   ``xff_num_trusted_hops``), it is the address those proxies vouch for (:mod:`ambit.waypoint.forwarded_for`).
5. The request identity is what RequestAuthentication validated (None until a token is validated: a positive
   ``requestPrincipals`` list then fails, a negative one holds).
6. TCP through the waypoint has no request: the engine applies rule 13 of :mod:`ambit.rbac` (an ALLOW rule with
   L7 fields never matches, a DENY ignores its L7 fields).
7. CUSTOM policies are not the engine's: :meth:`WaypointAuthorizer.custom` gives them, per destination, to the
   external authorization step (:mod:`ambit.waypoint.ext_authz`), which runs before :func:`check_request` and
   :func:`check_connection` (a TCP connection is checked only by a gRPC provider, its rule 10).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ambit.hbone.errors import AuthorityError
from ambit.hbone.headers import parse_authority
from ambit.model.policy import Action, Scope
from ambit.model.requestauth import RequestIdentity
from ambit.model.routes import WaypointConfig
from ambit.model.workload import IPAddress
from ambit.rbac import Applicable, Connection, Decision, Request, decide
from ambit.waypoint.destinations import ServiceTarget
from ambit.waypoint.ext_authz import CustomPolicies
from ambit.waypoint.forwarded_for import trusted_client

if TYPE_CHECKING:
    from ambit.waypoint.context import Tunnel, WaypointContext
    from ambit.waypoint.decisions import RequestHead

__all__ = [
    "DENIED_BODY",
    "WaypointAuthorizer",
    "check_connection",
    "check_request",
    "connection_of",
    "denial_detail",
    "normalize_path",
    "request_of",
]

DENIED_BODY = b"RBAC: access denied"

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


def _decode_unreserved(match: re.Match[str]) -> str:
    byte = int(match.group(1), 16)
    return chr(byte) if byte in _UNRESERVED else f"%{match.group(1).upper()}"


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4."""
    out: list[str] = []
    rest = path
    while rest:
        if rest.startswith("../"):
            rest = rest[3:]
        elif rest.startswith("./") or rest.startswith("/./"):
            rest = rest[2:]
        elif rest == "/.":
            rest = "/"
        elif rest.startswith("/../"):
            rest = rest[3:]
            if out:
                out.pop()
        elif rest == "/..":
            rest = "/"
            if out:
                out.pop()
        elif rest in (".", ".."):
            rest = ""
        else:
            start = 1 if rest.startswith("/") else 0
            end = rest.find("/", start)
            end = len(rest) if end < 0 else end
            out.append(rest[:end])
            rest = rest[end:]
    return "".join(out)


def normalize_path(target: str) -> str:
    """The request target's path as policies see it (rule 3)."""
    if target == "*":
        return target
    if not target.startswith("/"):
        try:
            target = urlsplit(target).path or "/"
        except ValueError:
            return target.partition("?")[0]
    path = target.partition("?")[0].partition("#")[0]
    if "%" not in path and "/." not in path and path.startswith("/"):
        return path  # nothing to decode, no dot segment: the common case, no work
    return _remove_dot_segments(_ESCAPE.sub(_decode_unreserved, path))


_UNSPECIFIED = ipaddress.ip_address("0.0.0.0")


@functools.lru_cache(maxsize=1024)
def _ip(text: str) -> IPAddress | None:
    """``text`` as an address, or None; remembered for the most recent texts (a connection's every request asks for
    the same two, and parsing one costs more than the rest of :func:`connection_of`)."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def connection_of(tunnel: Tunnel) -> Connection:
    """The L4 side of every request of ``tunnel`` (rule 2)."""
    source_text = tunnel.peer_addr.rpartition(":")[0].strip("[]")
    target = tunnel.target
    if isinstance(target, ServiceTarget):
        try:
            host, _port = parse_authority(tunnel.authority)
        except AuthorityError:
            host = ""
        destination = _ip(host)
    else:
        destination = target.ip
    return Connection(_ip(source_text) or _UNSPECIFIED, tunnel.peer_identity, destination or _UNSPECIFIED, target.port)


def request_of(
    head: RequestHead, identity: RequestIdentity | None = None, remote_ip: IPAddress | None = None
) -> Request:
    """The L7 side of one request (rules 3 to 5)."""
    return Request(
        method=head.method,
        host=head.authority,
        path=normalize_path(head.path),
        headers=head.headers,
        identity=identity,
        remote_ip=remote_ip,
    )


def edge_client(ctx: WaypointContext, tunnel: Tunnel, head: RequestHead) -> tuple[IPAddress, IPAddress] | None:
    """Rule 4 at an ingress gateway: (peer, client address); None elsewhere (a waypoint's peer is a mesh proxy)."""
    if not ctx.edge:
        return None
    peer = connection_of(tunnel).source_ip
    return peer, trusted_client(head.headers, peer, ctx.routes.current.envoy_patches.xff_trusted_hops or 0)


class WaypointAuthorizer:
    """The applicable policies per destination (rule 1), rebuilt when the WaypointConfig object changes."""

    def __init__(self) -> None:
        self._config: WaypointConfig | None = None
        self._cache: dict[str, tuple[Applicable, CustomPolicies | None]] = {}

    def _split(self, config: WaypointConfig, service_key: str) -> tuple[Applicable, CustomPolicies | None]:
        if config is not self._config:
            self._config, self._cache = config, {}
        found = self._cache.get(service_key)
        if found is None:
            policies = [
                p
                for p in config.policies
                if p.scope is Scope.WAYPOINT or (p.scope is Scope.SERVICE and service_key in p.services)
            ]
            rest = [p for p in policies if p.action is not Action.CUSTOM]
            found = self._cache[service_key] = (Applicable.of(rest, ()), CustomPolicies.of(policies))
        return found

    def applicable(self, config: WaypointConfig, service_key: str) -> Applicable:
        """For ``service_key`` (empty: a workload-addressed tunnel), CUSTOM policies aside (rule 7)."""
        return self._split(config, service_key)[0]

    def custom(self, config: WaypointConfig, service_key: str) -> CustomPolicies | None:
        """The CUSTOM policies for ``service_key`` (rule 7), or None."""
        return self._split(config, service_key)[1]


def check_request(
    ctx: WaypointContext, tunnel: Tunnel, head: RequestHead, identity: RequestIdentity | None = None
) -> Decision:
    """The decision for one HTTP request of ``tunnel`` (rules 1 to 5)."""
    applicable = ctx.authorizer.applicable(ctx.routes.current, tunnel.service_key)
    if not (applicable.deny or applicable.allow or applicable.audit or applicable.dry_run):
        return applicable.allowed
    edge = edge_client(ctx, tunnel, head)
    return decide(applicable, connection_of(tunnel), request_of(head, identity, edge[1] if edge else None))


def check_connection(ctx: WaypointContext, tunnel: Tunnel) -> Decision:
    """The decision for a TCP connection through the waypoint (rules 1, 2 and 6)."""
    applicable = ctx.authorizer.applicable(ctx.routes.current, tunnel.service_key)
    if not (applicable.deny or applicable.allow or applicable.audit or applicable.dry_run):
        return applicable.allowed
    return decide(applicable, connection_of(tunnel))


def denial_detail(decision: Decision) -> str:
    """The access log's reason for a denial, in Envoy's words: ``rbac_access_denied_matched_policy[ns/name]``."""
    return f"rbac_access_denied_matched_policy[{decision.denied_by or 'none'}]: {decision.reason}"
