"""What a waypoint honours of the EnvoyFilters bound to it: header edits at two places of its HTTP chain, and
HTTP/2 towards some backends.

Ambit has no Envoy, so an EnvoyFilter's configuration patches are not applied to Envoy configuration. The control
plane (:mod:`ambit.controlplane.translate.envoyfilters`) picks the patches istiod would give a waypoint and turns
the few it can honour into these values; the rest it reports. The L7 engine reads only these values.

Theory of operation (the places follow Envoy's filter chain as istiod builds it for a waypoint):

- :attr:`ProxyPatches.filters`: HTTP filters inserted into the chain (an ``envoy.lua`` filter whose code is a list
  of header edits). They run, in chain order, after authentication and authorization and before routing, so the
  route match sees what they changed, as Envoy's router does after a Lua filter edited the headers. Their
  ``response`` edits run on the answer after every route-level edit (Envoy encodes through the chain backwards).
- :attr:`ProxyPatches.routes`: ``request_headers_to_add`` / ``..._to_remove`` and the response pair merged into
  a virtual host or a route configuration. They run on the forwarded request after the route's own header
  filters, virtual-host patches before route-configuration ones (Envoy's default order, the least specific level
  last); within one level every removal runs before every addition (one Envoy header parser per level), and
  likewise on the response, before the filters' edits.
  A :class:`PatchScope` says which destinations (Service hostname and port) a patch is for.
- :attr:`ProxyPatches.upstream_h2`: backends spoken to in HTTP/2 (h2c, or ALPN h2 over originated TLS) because a
  cluster patch set ``http2_protocol_options``.

Answers the waypoint makes itself get the response edits Envoy would run on its local replies: the filters' on
every one, the route-level ones on those its router makes for a matched route (:mod:`ambit.waypoint.exchange`
rule 7 says which).

Every value is frozen and hashable.

A patch's ``match.proxy.proxyVersion`` is a regular expression searched in the version a proxy states
(:data:`ambit.ISTIO_VERSION`). Rules (istiod's, whose expressions are Go's RE2; the webhook and the control
plane's translation both use :func:`version_pattern_problem` and :func:`version_matches`):

1. An expression longer than :data:`MAX_VERSION_PATTERN` characters is not compiled: the webhook warns, and the
   patch matches no proxy (istiod fails closed).
2. An expression that does not compile, or uses what RE2 lacks (look-around, back-references, atomic groups), is
   refused by the webhook; one that got past it anyway has its version match ignored (istiod compiles it to
   nothing, and a patch without a version match applies to every version).
3. An empty version matches no expression.
"""

from __future__ import annotations

import enum
import re
import warnings
from dataclasses import dataclass

MAX_VERSION_PATTERN = 1024
"""Rule 1: istiod's bound on a ``proxyVersion`` expression."""


class HeaderAction(enum.Enum):
    """Envoy's ``HeaderValueOption.append_action``, and removal."""

    APPEND = "APPEND_IF_EXISTS_OR_ADD"
    """Add one more value (Lua ``headers():add``; the default)."""
    ADD_IF_ABSENT = "ADD_IF_ABSENT"
    OVERWRITE = "OVERWRITE_IF_EXISTS_OR_ADD"
    """Replace every value with this one, or add it (Lua ``headers():replace``; ``append: false``)."""
    OVERWRITE_IF_EXISTS = "OVERWRITE_IF_EXISTS"
    REMOVE = "REMOVE"
    """Drop every value (Lua ``headers():remove``; ``request_headers_to_remove``)."""


@dataclass(frozen=True, slots=True)
class HeaderOp:
    """One header edit; ``name`` is lower-case, ``value`` is empty for :attr:`HeaderAction.REMOVE`."""

    action: HeaderAction
    name: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class PatchScope:
    """The destinations a patch applies to: ``hostname`` ``""`` is any Service, ``port`` 0 any port."""

    hostname: str = ""
    port: int = 0

    def covers(self, hostname: str, port: int) -> bool:
        return (not self.hostname or self.hostname == hostname) and (not self.port or self.port == port)


EVERYWHERE = PatchScope()


@dataclass(frozen=True, slots=True)
class HeaderPatch:
    """The header edits of one configuration patch."""

    source: str
    """``namespace/name`` of the EnvoyFilter and the patch's index, e.g. ``app/inbound[1]`` (for logs)."""
    request: tuple[HeaderOp, ...] = ()
    response: tuple[HeaderOp, ...] = ()
    scope: PatchScope = EVERYWHERE
    level: int = 0
    """For :attr:`ProxyPatches.routes`: 0 a virtual-host merge, 1 a route-configuration merge."""


def _level_order(patches: list[HeaderPatch], side: str) -> tuple[HeaderOp, ...]:
    ops: list[HeaderOp] = []
    for level in (0, 1):
        chosen = [op for p in patches if p.level == level for op in getattr(p, side)]
        ops.extend(op for op in chosen if op.action is HeaderAction.REMOVE)
        ops.extend(op for op in chosen if op.action is not HeaderAction.REMOVE)
    return tuple(ops)


MAX_TRUSTED_HOPS = 64
"""The most ``xff_num_trusted_hops`` a patch may set: more proxies than any real chain in front of a gateway."""


@dataclass(frozen=True, slots=True)
class ProxyPatches:
    """The honoured patches of every EnvoyFilter bound to one proxy, in the order istiod applies them."""

    filters: tuple[HeaderPatch, ...] = ()
    """HTTP filters before the router, in chain order (their scope is always :data:`EVERYWHERE`)."""
    routes: tuple[HeaderPatch, ...] = ()
    """Virtual-host merges, then route-configuration merges, each in the order the filters give them."""
    upstream_h2: tuple[PatchScope, ...] = ()
    """Backends (by Service hostname and port) spoken to in HTTP/2."""
    xff_trusted_hops: int | None = None
    """An ingress gateway's HTTP connection manager ``xff_num_trusted_hops`` (a NETWORK_FILTER merge; the last
    one wins); None: not patched (0, Istio's default without ``gatewayTopology``). Above 0 the client's
    ``X-Forwarded-Proto`` is trusted, as Envoy trusts it, so an ``https`` one is not redirected to HTTPS."""

    def __bool__(self) -> bool:
        return bool(self.filters or self.routes or self.upstream_h2 or self.xff_trusted_hops is not None)

    @property
    def trusts_forwarded_proto(self) -> bool:
        """Whether the client's ``X-Forwarded-Proto`` is believed (an edge proxy in front is trusted)."""
        return bool(self.xff_trusted_hops)

    def route_request_ops(self, hostname: str, port: int) -> tuple[HeaderOp, ...]:
        """The route-level request edits for a destination, in the order they run."""
        return _level_order([p for p in self.routes if p.scope.covers(hostname, port)], "request")

    def route_response_ops(self, hostname: str, port: int) -> tuple[HeaderOp, ...]:
        """The route-level response edits for a destination, in the order they run."""
        return _level_order([p for p in self.routes if p.scope.covers(hostname, port)], "response")

    def filter_request_ops(self) -> tuple[HeaderOp, ...]:
        return tuple(op for p in self.filters for op in p.request)

    def filter_response_ops(self) -> tuple[HeaderOp, ...]:
        return tuple(op for p in reversed(self.filters) for op in p.response)

    def wants_h2(self, hostname: str, port: int) -> bool:
        return any(s.covers(hostname, port) for s in self.upstream_h2)


NO_PATCHES = ProxyPatches()


_RE2_LACKS = (
    ("=", "a look-ahead"),
    ("!", "a look-ahead"),
    ("<=", "a look-behind"),
    ("<!", "a look-behind"),
    (">", "an atomic group"),
    ("P=", "a back-reference"),
    ("(", "a conditional"),
)


def _re2_lacks(pattern: str) -> str:
    """What of ``pattern`` Go's RE2 does not have (rule 2), or ``""``: one pass, never raises."""
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            if not in_class and pattern[i + 1 : i + 2] in tuple("123456789"):
                return "a back-reference"
            i += 2
        elif in_class:
            in_class = c != "]"
            i += 1
        elif c == "[":
            in_class = True
            i += 1
            i += pattern[i : i + 1] == "^"
            i += pattern[i : i + 1] == "]"  # a leading ] is a member, not the end
        else:
            if c == "(" and pattern[i + 1 : i + 2] == "?":
                rest = pattern[i + 2 : i + 4]
                for prefix, what in _RE2_LACKS:
                    if rest.startswith(prefix):
                        return what
            i += 1
    return ""


def version_pattern_problem(pattern: str) -> str:
    """Why the webhook refuses ``pattern`` as a ``proxyVersion`` (rule 2), or ``""``; never raises. Rule 1's
    length is not judged here."""
    lacking = _re2_lacks(pattern)
    if lacking:
        return f"invalid regex for proxy version: {lacking} is not supported (RE2 syntax)"
    try:
        _compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        return f"invalid regex for proxy version: {exc}"
    return ""


def _compile(pattern: str) -> re.Pattern[str]:
    # Python warns of a possible nested set ("[[") before deciding; RE2 reads a literal "[" there, as Python does
    # today. The warning is not the user's concern and must not escape as an error where warnings are errors.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return re.compile(pattern)


def version_matches(pattern: str | None, version: str) -> bool:
    """Whether a patch with ``pattern`` (None: no version match) applies to a proxy stating ``version``
    (rules 1-3)."""
    if pattern is None:
        return True
    if len(pattern) > MAX_VERSION_PATTERN or not version:
        return False
    if version_pattern_problem(pattern):
        return True
    return _compile(pattern).search(version) is not None
