"""External authorization (AuthorizationPolicy CUSTOM; Envoy's ``ext_authz`` HTTP filter behind istiod's shadow
RBAC filter): which requests an external authorizer decides, what it is asked, and what its answer does.

Theory of operation: pure. :class:`CustomPolicies` holds the CUSTOM policies that apply to one destination;
:meth:`CustomPolicies.step` says, for one request, whether nothing is to be asked, the request is denied outright,
or which authorizer to ask. :func:`http_check_head` builds the check request for an ``envoyExtAuthzHttp``
provider (:func:`check_attributes` the ``AttributeContext`` of a gRPC one), :func:`judge_http_answer` and
:func:`judge_grpc_answer` read the answers, :func:`on_error` says what an authorizer that could not be asked means.
The shell (:mod:`ambit.waypoint.ext_authz_client`) does the I/O; the exchange (:mod:`ambit.waypoint.exchange`)
answers a :class:`CheckDenied` and applies a :class:`CheckAllowed` with :func:`apply_allowed`.

Rules:

1. Order (istiod's filter chain): CUSTOM is decided before DENY and ALLOW; a request the authorizer allows then
   meets the DENY and ALLOW policies as any other.
2. Trigger: a request is sent to the authorizer only when a rule of an applicable CUSTOM policy matches it (istiod's
   shadow RBAC filter sets the metadata ``ext_authz`` is enabled by). A dry-run CUSTOM policy triggers it too
   (istiod's documented limitation: its rules are the RBAC filter's ``rules``, which also set the metadata).
3. One provider per destination: when the applicable CUSTOM policies name more than one authorizer, istiod (without
   ``PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS``, default off) generates deny rules for all of them: a request
   matching any of their rules is denied 403 ``RBAC: access denied``.
4. The HTTP check request (Envoy's ``ext_authz_http_impl.cc``): the original method, the path with the provider's
   ``pathPrefix`` before it, the original ``:authority`` as ``Host``, ``authorization`` and the request headers
   the provider's ``includeRequestHeadersInCheck`` patterns name (case-insensitive), then its
   ``includeAdditionalHeadersInCheck`` headers (set, replacing any of the same name), and ``content-length``: 0
   without ``includeRequestBodyInCheck``, else the length of the body read ahead
   (:mod:`ambit.waypoint.ext_authz_body`), which follows. A client's own ``x-envoy-auth-partial-body`` is never
   passed on (Envoy drops it from every check, so a client cannot claim its body was cut or whole); the waypoint's
   own one (``true`` when the body was cut) goes in a gRPC check, and in an HTTP check only when the provider's
   patterns name it (Envoy's HTTP check copies only the headers its matchers allow).
5. The HTTP answer: 200 allows; the answer headers ``headersToUpstreamOnAllow`` names are set on the request
   (replacing those of the same name) and those ``headersToDownstreamOnAllow`` names are added to the response. A
   5xx answer is an error (rule 7). Any other status denies with that status, the authorizer's body and the answer
   headers ``headersToDownstreamOnDeny`` names, with ``content-length``, ``www-authenticate`` and ``location``
   always among them; with no list, every answer header but ``host``. Hop-by-hop and framing headers are the
   waypoint's own (never copied).
6. A denial carries the response flag ``UAEX`` (Envoy's ``UnauthorizedExternalService``).
7. An error (the authorizer cannot be reached or resolved, times out after its ``timeout``, answers 5xx, breaks
   off, or answers more than :data:`MAX_ANSWER_BODY` bytes or :data:`MAX_ANSWER_HEADERS` headers) lets the request
   through when the provider says ``failOpen``; otherwise it is answered ``statusOnError`` (default 403), empty,
   flag ``UAEX``.
8. A gRPC provider (``envoy.service.auth.v3.Authorization/Check``, :mod:`ambit.waypoint.ext_authz_wire`) is sent
   the request's method, path, host, scheme, protocol, ``x-request-id`` and every header (the pseudo-headers
   ``:authority``, ``:method``, ``:path`` among them, as Envoy's header map holds them), the source and destination
   peers (address, port, SPIFFE principal), and with ``includeRequestBodyInCheck`` the body read ahead (``body``, or
   ``raw_body`` with ``packAsBytes``) and ``x-envoy-auth-partial-body`` among the headers. Its ``CheckResponse``
   with status OK allows: the ``ok_response`` headers edit the request in their order (rule 11), then its
   ``headers_to_remove`` are removed (never a pseudo-header or ``host``); its ``response_headers_to_add`` edit the
   response (rule 11). Any other status denies with the ``denied_response``'s status (403 when unset), body and
   headers (rule 11's response edits, in order, of an empty list). A call that fails (a non-OK
   ``grpc-status``, no message) is an error (rule 7), and so is an answer header whose name is not an HTTP token or
   whose value holds a control character (it could not be written, or would split a head).
9. An HTTP authorizer's allowing answer may name, in ``x-envoy-auth-headers-to-remove`` (comma-separated), request
   headers to remove before forwarding (Envoy's HTTP form of ``headers_to_remove``); never a pseudo-header or
   ``host``.
10. A TCP connection through the waypoint meets the CUSTOM rules as a DENY rule meets it (HTTP fields ignored,
    istiod's TCP filter chain) before the DENY and ALLOW policies: a gRPC provider is asked about it (the peers
    only; a denial closes it with flag ``UAEX``, an error too unless ``failOpen``); an HTTP provider is not (istiod
    ignores a CUSTOM policy with an HTTP provider on a TCP chain); several providers deny it.
11. A gRPC answer's ``HeaderValueOption`` says how its header is written
    (:mod:`ambit.waypoint.ext_authz_edits`).
12. The route cache: istiod's ``ext_authz`` filter leaves ``clear_route_cache`` off, so Envoy forwards by the route
    it picked before the check: the authorizer's request edits (and removals) reach the backend, the DENY and ALLOW
    policies and the route's own header edits, but not the route match, which reads the headers as they were
    (:attr:`~ambit.waypoint.decisions.RequestHead.route_headers`). An HTTP filter of an EnvoyFilter that edits the
    request afterwards clears the cache, and the route is then picked on the headers as they are.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ambit.model.envoyfilter import HeaderAction, HeaderOp
from ambit.model.extauthz import ExtAuthzProvider, HeaderPattern, any_matches
from ambit.model.field_names import is_token
from ambit.model.policy import Action, Policy
from ambit.rbac import Connection, Request, matching_rule
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.envoy_patches import apply_header_ops
from ambit.waypoint.ext_authz_edits import RequestEdit, edit_request_headers, request_edit, response_op
from ambit.waypoint.ext_authz_wire import CheckAnswer, CheckAttributes, HeaderOption

__all__ = [
    "HEADERS_TO_REMOVE",
    "MAX_ANSWER_BODY",
    "MAX_ANSWER_HEADERS",
    "PARTIAL_BODY",
    "UAEX",
    "CheckAllowed",
    "CheckDenied",
    "CustomPolicies",
    "DeniedOutright",
    "Verdict",
    "apply_allowed",
    "check_attributes",
    "http_check_head",
    "judge_grpc_answer",
    "judge_http_answer",
    "on_error",
]

UAEX = "UAEX"
HEADERS_TO_REMOVE = "x-envoy-auth-headers-to-remove"
PARTIAL_BODY = "x-envoy-auth-partial-body"
MAX_ANSWER_BODY = 64 * 1024
"""Bytes of an authorizer's answer body the waypoint reads (a longer one is an error, rule 7)."""
MAX_ANSWER_HEADERS = 100
"""Headers of an authorizer's answer the waypoint takes (more is an error, rule 7)."""

Headers = tuple[tuple[str, str], ...]
Peers = tuple[tuple[str, int, str], tuple[str, int, str]]

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_ALWAYS_ASKED = frozenset({"authorization"})
_ALWAYS_TO_CLIENT = (HeaderPattern("content-length"), HeaderPattern("www-authenticate"), HeaderPattern("location"))
_OWN = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "te",
        "trailer",
        "content-length",
        "host",
        ":status",
        ":path",
        ":method",
        ":authority",
        ":scheme",
    }
)
"""Framing and hop-by-hop headers: the waypoint writes its own (rule 5)."""


@dataclass(frozen=True, slots=True)
class CheckAllowed:
    upstream: tuple[RequestEdit, ...] = ()
    """Written on the forwarded request, in order (rules 5, 11)."""
    downstream: tuple[HeaderOp, ...] = ()
    """Edits of the response, in order (rules 5, 11)."""
    remove: tuple[str, ...] = ()
    """Removed from the forwarded request (rule 8)."""
    reason: str = ""
    """Why an error let the request through (rule 7); empty for a real allow."""


@dataclass(frozen=True, slots=True)
class CheckDenied:
    status: int
    headers: Headers
    body: bytes
    reason: str
    """For the access log."""
    flags: str = UAEX


Verdict = CheckAllowed | CheckDenied


@dataclass(frozen=True, slots=True)
class DeniedOutright:
    """Rule 3: the request matched a CUSTOM rule of a destination whose policies name several authorizers."""

    policy: str


@dataclass(frozen=True, slots=True)
class CustomPolicies:
    """The CUSTOM policies of one destination (rules 2, 3)."""

    policies: tuple[Policy, ...]
    provider: ExtAuthzProvider | None
    """The one authorizer they name; None when they name several (rule 3)."""

    @classmethod
    def of(cls, policies: Iterable[Policy]) -> CustomPolicies | None:
        custom = tuple(p for p in policies if p.action is Action.CUSTOM and p.ext_authz is not None)
        if not custom:
            return None
        providers = {p.ext_authz for p in custom}
        return cls(custom, next(iter(providers)) if len(providers) == 1 else None)

    def step(self, conn: Connection, request: Request | None) -> ExtAuthzProvider | DeniedOutright | None:
        """The authorizer to ask about ``request`` (None: a TCP connection, rule 10), an outright denial (rule 3),
        or None: not for an authorizer."""
        for policy in self.policies:
            if matching_rule(policy, conn, request) is not None:
                return self.provider if self.provider is not None else DeniedOutright(policy.key)
        return None


def http_check_head(
    provider: ExtAuthzProvider, head: RequestHead, body: bytes = b"", partial: bool = False
) -> RequestHead:
    """The check request for ``head`` (rule 4), ``body`` being what was read ahead (``partial``: cut)."""
    asked = provider.include_request_headers
    headers = [
        (name, value)
        for name, value in head.headers
        if name.lower() != PARTIAL_BODY
        and (name.lower() in _ALWAYS_ASKED or (asked and any_matches(asked, name) and name.lower() not in _OWN))
    ]
    if provider.max_request_bytes is not None and any_matches(asked, PARTIAL_BODY):
        headers.append((PARTIAL_BODY, "true" if partial else "false"))
    if provider.include_additional_headers:
        added = {name for name, _ in provider.include_additional_headers}
        headers = [(n, v) for n, v in headers if n.lower() not in added]
        headers.extend(provider.include_additional_headers)
    headers.append(("content-length", str(len(body))))
    return RequestHead(
        method=head.method, path=provider.path_prefix + head.path, authority=head.authority, headers=tuple(headers)
    )


def _picked(answer: Headers, patterns: tuple[HeaderPattern, ...]) -> Headers:
    return tuple((n.lower(), v) for n, v in answer if n.lower() not in _OWN and any_matches(patterns, n))


def _ours(option: HeaderOption) -> bool:
    return option.name.lower() in _OWN


def judge_http_answer(provider: ExtAuthzProvider, status: int, headers: Headers, body: bytes) -> Verdict:
    """What the authorizer's answer means (rules 5-7)."""
    remove = ",".join(v for n, v in headers if n.lower() == HEADERS_TO_REMOVE) if status == 200 else ""
    headers = tuple((n, v) for n, v in headers if n.lower() != HEADERS_TO_REMOVE)  # Envoy's, never passed on
    if status == 200:
        return CheckAllowed(
            tuple(RequestEdit(n, v) for n, v in _picked(headers, provider.headers_to_upstream_on_allow)),
            tuple(
                HeaderOp(HeaderAction.APPEND, n, v)
                for n, v in _picked(headers, provider.headers_to_downstream_on_allow)
            ),
            tuple(n for n in (part.strip().lower() for part in remove.split(",")) if n and n not in _OWN),
        )
    if 500 <= status <= 599:
        return on_error(provider, f"ext_authz_error: the authorizer answered {status}")
    deny = provider.headers_to_downstream_on_deny
    if deny:
        kept = tuple(
            (n.lower(), v) for n, v in headers if any_matches(deny + _ALWAYS_TO_CLIENT, n) and n.lower() != "host"
        )
    else:
        kept = tuple((n.lower(), v) for n, v in headers if n.lower() != "host")
    kept = tuple((n, v) for n, v in kept if n not in _OWN)  # the waypoint frames the answer itself
    return CheckDenied(status, kept, body, f"ext_authz_denied: {provider.name} answered {status}")


def judge_grpc_answer(provider: ExtAuthzProvider, answer: CheckAnswer) -> Verdict:
    """What a ``CheckResponse`` means (rule 8)."""
    every = (*answer.ok_headers, *answer.ok_response_headers, *answer.denied_headers)
    bad = next((o.name for o in every if not is_token(o.name.removeprefix(":")) or _CONTROL.search(o.value)), None)
    if bad is not None:
        return on_error(provider, f"ext_authz_error: {provider.name} answered an invalid header {bad[:64]!r}")
    if answer.code == 0:
        return CheckAllowed(
            tuple(request_edit(o) for o in answer.ok_headers if not _ours(o)),
            tuple(response_op(o) for o in answer.ok_response_headers if not _ours(o)),
            tuple(n.lower() for n in answer.ok_headers_to_remove if n.lower() not in _OWN),
        )
    status = answer.denied_status if 100 <= answer.denied_status <= 599 else 403
    ops = tuple(response_op(o) for o in answer.denied_headers if not _ours(o))
    headers = tuple(apply_header_ops((), ops))
    body = answer.denied_body.encode("utf-8")
    return CheckDenied(status, headers, body, f"ext_authz_denied: {provider.name} answered status {answer.code}")


def check_attributes(
    head: RequestHead,
    protocol: str,
    peers: Peers,
    body: bytes = b"",
    *,
    raw_body: bool = False,
    partial: bool | None = None,
) -> CheckAttributes:
    """The ``AttributeContext`` of ``head`` (rule 8); ``peers`` are (address, port, principal) of the source and
    the destination; ``body`` what was read ahead (``partial``: whether it was cut; None: no body is sent)."""
    length = head.header("content-length")
    pseudo: Headers = ((":authority", head.authority), (":method", head.method), (":path", head.path))
    if partial is not None:
        pseudo += ((PARTIAL_BODY, "true" if partial else "false"),)
    (source_ip, source_port, source_id), (dest_ip, dest_port, dest_id) = peers
    return CheckAttributes(
        method=head.method,
        path=head.path,
        host=head.authority,
        headers=pseudo + tuple((n, v) for n, v in head.headers if n != PARTIAL_BODY),
        request_id=head.header("x-request-id") or "",
        scheme=head.scheme,
        protocol=protocol,
        size=int(length) if length is not None and length.isdigit() and len(length) < 19 else -1,
        source_address=source_ip,
        source_port=source_port,
        source_principal=source_id,
        destination_address=dest_ip,
        destination_port=dest_port,
        destination_principal=dest_id,
        body=body,
        raw_body=raw_body,
    )


def apply_allowed(
    head: RequestHead, allowed: CheckAllowed, response_ops: tuple[HeaderOp, ...]
) -> tuple[RequestHead, tuple[HeaderOp, ...]]:
    """The request with the authorizer's upstream headers written in order, then those it names removed, routed
    on its headers as they were; and the response edits with its downstream ones first (rules 5, 8, 9, 11, 12)."""
    if allowed.upstream or allowed.remove:
        edited = edit_request_headers(head.headers, allowed.upstream)
        removed = set(allowed.remove)
        headers = tuple((n, v) for n, v in edited if n not in removed)
        if headers != head.headers:
            routed = head.headers if head.route_headers is None else head.route_headers
            head = dataclasses.replace(head, headers=headers, route_headers=routed)
    return head, allowed.downstream + response_ops


def on_error(provider: ExtAuthzProvider, reason: str) -> Verdict:
    """Rule 7."""
    if provider.fail_open:
        return CheckAllowed(reason=f"{reason} (failOpen)")
    return CheckDenied(provider.status_on_error, (), b"", reason)
