"""RequestAuthentication (security.istio.io v1, v1beta1) → the :class:`RequestAuthentication` each waypoint enforces.

Theory of operation: :func:`translate_request_authentication` converts one object once: its JWT rules become
:class:`~ambit.model.requestauth.JwtRule` and its ``targetRef``/``targetRefs`` become :class:`Target`s. Then
:func:`bind_to_waypoints` gives each ready waypoint the policies that reach it, as istiod does for a waypoint
proxy. Pure: no I/O, and equal inputs give equal outputs (policies sorted by key).

Rules:

1. Only ``targetRefs`` attach a policy to a waypoint. A ``selector`` policy, and one with neither (namespace- or
   mesh-wide), is for workloads with a proxy of their own: ignored at waypoints, as upstream ignores it there, and
   not reported; it keeps its labels (:attr:`RequestAuthTranslation.workload_labels`) for the ingress gateways it
   selects (:mod:`ambit.controlplane.translate.gateway_policies`).
2. A target is a ``gateway.networking.k8s.io`` ``Gateway`` (that waypoint or ingress gateway, every request), the
   ``GatewayClass`` ``istio-waypoint`` (only from the root namespace: every waypoint), a core ``Service`` or a
   ``networking.istio.io`` ``ServiceEntry`` (the requests for its hosts, at the waypoint it is bound to). A
   target's ``namespace``, if set, must be the policy's. Any other target is skipped with a reason, and the rest
   of the policy still applies: so is any other GatewayClass, ``istio`` included, as istiod's policy matcher
   attaches a GatewayClass target only to waypoints and only by that name (an ingress gateway is reached by
   targeting its Gateway, or by a selector).
3. Istio's validation, each failure skipping the whole policy (the admission webhook would have refused it): both
   ``selector`` and target refs, both ``targetRef`` and ``targetRefs``; a rule without ``issuer``; an empty
   audience; ``jwks`` and ``jwksUri`` both set; a ``jwksUri`` that is not an http(s) URL with a host; ``jwks``
   that is not a key set with a usable key; an empty header name, query parameter or cookie name; a claim header
   with an empty header or claim; a header name that is not an HTTP token; a ``timeout`` that is not a positive
   duration (``5s``, ``1.5s``, ``500ms``, ``1m``).
4. A rule without ``jwks`` or ``jwksUri`` would have istiod discover the key set from the issuer's OpenID
   configuration, which Ambit does not do: the policy is skipped with that reason.
5. A waypoint gets a policy once: with no services when a Gateway or GatewayClass target reaches it (it applies to
   every request), else with the keys of its targeted Services and ServiceEntry hosts bound to that waypoint (as
   primary or as canary).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.model.field_names import is_token
from ambit.model.requestauth import ClaimToHeader, JwtHeader, JwtRule, RequestAuthentication, jwks_uri_problem
from ambit.requestauth import JwksRejected, parse_jwks

__all__ = [
    "REQUEST_AUTHENTICATION",
    "WAYPOINT_CLASS",
    "RequestAuthTranslation",
    "Target",
    "bind_to_waypoints",
    "translate_request_authentication",
]

REQUEST_AUTHENTICATION = ObjectKind("security.istio.io/v1", "RequestAuthentication")
WAYPOINT_CLASS = "istio-waypoint"
GATEWAY_GROUP = "gateway.networking.k8s.io"
ISTIO_NETWORKING = "networking.istio.io"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True, order=True)
class Target:
    kind: str
    """``Gateway``, ``GatewayClass``, ``Service`` or ``ServiceEntry``."""
    namespace: str
    """The policy's (a GatewayClass is cluster-scoped: empty)."""
    name: str


@dataclass(frozen=True, slots=True)
class RequestAuthTranslation:
    policy: RequestAuthentication | None
    """None: invalid (rule 3), or no target left."""
    targets: tuple[Target, ...] = ()
    workload_labels: tuple[tuple[str, str], ...] | None = None
    """A policy without targetRefs (rule 1): the labels a workload needs (``selector.matchLabels``; empty for none:
    every workload of its namespace, or of the mesh from the root namespace). None for a targetRefs policy."""


def _header(value: Any, field: str) -> str:
    name = shapes.text(value, field, required=True)
    if not is_token(name):
        raise shapes.ShapeError(field, f"{name!r} is not a valid HTTP header name")
    return name.lower()


def parse_duration(text: str) -> float | None:
    """A Go-style duration (``1m30s``, ``1.5s``, ``500ms``) in seconds; None if it is not one."""
    if not text:
        return None
    total, at = 0.0, 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != at:
            return None
        total += float(match.group(1)) * _UNITS[match.group(2)]
        at = match.end()
    return total if at == len(text) else None


def _rule(rule: Any, field: str) -> JwtRule:
    rule = shapes.mapping(rule, field, required=True)
    issuer = shapes.text(rule.get("issuer"), f"{field}.issuer", required=True)
    audiences = tuple(
        shapes.text(a, f"{field}.audiences[{i}]", required=True)
        for i, a in enumerate(shapes.list_of(rule.get("audiences"), f"{field}.audiences"))
    )
    jwks = shapes.text(rule.get("jwks"), f"{field}.jwks")
    uri = shapes.text(rule.get("jwksUri"), f"{field}.jwksUri")
    if jwks and uri:
        raise shapes.ShapeError(f"{field}.jwksUri", "only one of jwks or jwksUri may be set")
    if uri:
        problem = jwks_uri_problem(uri)
        if problem is not None:
            raise shapes.ShapeError(f"{field}.jwksUri", problem)
    elif jwks:
        parsed = parse_jwks(jwks)
        if isinstance(parsed, JwksRejected):
            raise shapes.ShapeError(f"{field}.jwks", f"jwks parse error: {parsed.reason}")
    else:
        raise shapes.ShapeError(
            f"{field}.jwksUri", "neither jwks nor jwksUri is set, and OpenID discovery from the issuer is not supported"
        )
    headers = []
    for i, item in enumerate(shapes.list_of(rule.get("fromHeaders"), f"{field}.fromHeaders")):
        where = f"{field}.fromHeaders[{i}]"
        location = shapes.mapping(item, where, required=True)
        headers.append(
            JwtHeader(
                _header(location.get("name"), f"{where}.name"), shapes.text(location.get("prefix"), f"{where}.prefix")
            )
        )
    params = tuple(
        shapes.text(p, f"{field}.fromParams[{i}]", required=True)
        for i, p in enumerate(shapes.list_of(rule.get("fromParams"), f"{field}.fromParams"))
    )
    cookies = tuple(
        shapes.text(c, f"{field}.fromCookies[{i}]", required=True)
        for i, c in enumerate(shapes.list_of(rule.get("fromCookies"), f"{field}.fromCookies"))
    )
    payload_header = rule.get("outputPayloadToHeader")
    claims = []
    for i, entry in enumerate(shapes.list_of(rule.get("outputClaimToHeaders"), f"{field}.outputClaimToHeaders")):
        where = f"{field}.outputClaimToHeaders[{i}]"
        item = shapes.mapping(entry, where, required=True)
        claims.append(
            ClaimToHeader(
                _header(item.get("header"), f"{where}.header"),
                shapes.text(item.get("claim"), f"{where}.claim", required=True),
            )
        )
    forward = rule.get("forwardOriginalToken", False)
    if not isinstance(forward, bool):
        raise shapes.ShapeError(f"{field}.forwardOriginalToken", f"expected a boolean, got {type(forward).__name__}")
    timeout = 5.0
    if rule.get("timeout") is not None:
        text = shapes.text(rule.get("timeout"), f"{field}.timeout")
        seconds = parse_duration(text)
        if seconds is None or seconds <= 0:
            raise shapes.ShapeError(f"{field}.timeout", f"{text!r} is not a positive duration like 5s")
        timeout = seconds
    delimited = tuple(
        shapes.text(c, f"{field}.spaceDelimitedClaims[{i}]", required=True)
        for i, c in enumerate(shapes.list_of(rule.get("spaceDelimitedClaims"), f"{field}.spaceDelimitedClaims"))
    )
    return JwtRule(
        issuer=issuer,
        audiences=audiences,
        jwks=jwks,
        jwks_uri=uri,
        from_headers=tuple(headers),
        from_params=params,
        from_cookies=cookies,
        output_payload_to_header=_header(payload_header, f"{field}.outputPayloadToHeader") if payload_header else "",
        output_claim_to_headers=tuple(claims),
        forward_original_token=forward,
        timeout_seconds=timeout,
        space_delimited_claims=delimited,
    )


_TARGET_KINDS = {
    (GATEWAY_GROUP, "Gateway"),
    (GATEWAY_GROUP, "GatewayClass"),
    ("", "Service"),
    (ISTIO_NETWORKING, "ServiceEntry"),
}


def _target(ref: Any, field: str, namespace: str, root_namespace: str) -> Target:
    ref = shapes.mapping(ref, field, required=True)
    group = shapes.text(ref.get("group"), f"{field}.group")
    kind = shapes.text(ref.get("kind"), f"{field}.kind", required=True)
    name = shapes.text(ref.get("name"), f"{field}.name", required=True)
    ref_namespace = shapes.text(ref.get("namespace"), f"{field}.namespace")
    if (group, kind) not in _TARGET_KINDS:
        raise shapes.ShapeError(f"{field}.kind", f"unsupported target {kind!r} in group {group!r}")
    if ref_namespace and ref_namespace != namespace:
        raise shapes.ShapeError(
            f"{field}.namespace", "cross-namespace references are not supported: must be empty or the same"
        )
    if kind == "GatewayClass":
        if namespace != root_namespace:
            raise shapes.ShapeError(
                f"{field}.kind", f"a GatewayClass can be targeted only from the root namespace {root_namespace!r}"
            )
        if name != WAYPOINT_CLASS:
            raise shapes.ShapeError(
                f"{field}.name",
                f"only the GatewayClass {WAYPOINT_CLASS!r} can be targeted (it reaches every waypoint); "
                "target an ingress gateway's Gateway instead",
            )
        return Target(kind, "", name)
    return Target(kind, namespace, name)


def translate_request_authentication(obj: Obj, *, root_namespace: str, skips: list[Skipped]) -> RequestAuthTranslation:
    """One object's rules and targets (rules 1-4); what is left out goes to ``skips``."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    try:
        spec = shapes.mapping(obj.get("spec") or {}, "spec", required=True)
        single, many = spec.get("targetRef"), shapes.list_of(spec.get("targetRefs"), "spec.targetRefs")
        if single is not None and many:
            raise shapes.ShapeError("spec.targetRef", "only one of targetRef or targetRefs can be set")
        refs = (
            [("spec.targetRef", single)]
            if single is not None
            else [(f"spec.targetRefs[{i}]", r) for i, r in enumerate(many)]
        )
        if spec.get("selector") is not None and refs:
            raise shapes.ShapeError("spec.selector", "only one of selector or targetRefs can be set")
        rules = tuple(
            _rule(r, f"spec.jwtRules[{i}]") for i, r in enumerate(shapes.list_of(spec.get("jwtRules"), "spec.jwtRules"))
        )
    except shapes.ShapeError as exc:
        skips.append(skipped(REQUEST_AUTHENTICATION, obj, exc.field, exc.reason))
        return RequestAuthTranslation(None)
    if not refs:
        try:
            selector = shapes.mapping(spec.get("selector"), "spec.selector")
            labels = shapes.mapping(selector.get("matchLabels"), "spec.selector.matchLabels")
        except shapes.ShapeError as exc:
            skips.append(skipped(REQUEST_AUTHENTICATION, obj, exc.field, exc.reason))
            return RequestAuthTranslation(None)
        wanted = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        return RequestAuthTranslation(RequestAuthentication(name, namespace, rules), (), wanted)
    targets: set[Target] = set()
    for field, ref in refs:
        try:
            targets.add(_target(ref, field, namespace, root_namespace))
        except shapes.ShapeError as exc:
            skips.append(skipped(REQUEST_AUTHENTICATION, obj, exc.field, exc.reason))
    if not targets:
        return RequestAuthTranslation(None)
    return RequestAuthTranslation(RequestAuthentication(name, namespace, rules), tuple(sorted(targets)))


def bind_to_waypoints(
    translations: Iterable[RequestAuthTranslation],
    *,
    waypoints: Iterable[str],
    service_keys: Mapping[tuple[str, str, str], tuple[str, ...]],
    bound: Mapping[str, str],
    canaries: Mapping[str, str] | None = None,
    waypoint_class: bool = True,
) -> dict[str, tuple[RequestAuthentication, ...]]:
    """Each waypoint's policies (rule 5). ``waypoints``: the ready waypoints' keys; ``service_keys``: (kind,
    namespace, name) of a Service or ServiceEntry → its service keys; ``bound``: service key → the key of the
    waypoint it is bound to; ``canaries``: service key → its canary waypoint's key, which gets the same
    service-scoped policies. An ingress gateway's policies are the same call with its Gateways' keys, nothing
    bound and ``waypoint_class`` False: a GatewayClass target reaches waypoints only (rule 2)."""
    ready = set(waypoints)
    whole: dict[str, dict[str, RequestAuthentication]] = {w: {} for w in ready}
    partial: dict[str, dict[str, tuple[RequestAuthentication, set[str]]]] = {w: {} for w in ready}
    for translation in translations:
        policy = translation.policy
        if policy is None:
            continue
        for target in translation.targets:
            if target.kind == "Gateway":
                key = f"{target.namespace}/{target.name}"
                if key in ready:
                    whole[key][policy.key] = policy
            elif target.kind == "GatewayClass":
                if waypoint_class and target.name == WAYPOINT_CLASS:
                    for key in ready:
                        whole[key][policy.key] = policy
            else:
                for service_key in service_keys.get((target.kind, target.namespace, target.name), ()):
                    for waypoint in (bound.get(service_key), (canaries or {}).get(service_key)):
                        if waypoint in ready:
                            partial[waypoint].setdefault(policy.key, (policy, set()))[1].add(service_key)
    out: dict[str, tuple[RequestAuthentication, ...]] = {}
    for waypoint in sorted(ready):
        chosen = dict(whole[waypoint])
        for key, (policy, services) in partial[waypoint].items():
            if key not in chosen:
                chosen[key] = RequestAuthentication(
                    policy.name, policy.namespace, policy.rules, tuple(sorted(services))
                )
        if chosen:
            out[waypoint] = tuple(chosen[k] for k in sorted(chosen))
    return out
