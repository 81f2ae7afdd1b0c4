"""AuthorizationPolicy with ``targetRefs`` → the waypoint's L7 :class:`Policy`, with its ``WaypointAccepted`` status
(spec §7.1, §7.5, §10.3).

Theory of operation: :func:`translate_waypoint_policy` turns one AuthorizationPolicy that has ``targetRef`` or
``targetRefs`` (those the node proxy never gets: :mod:`~ambit.controlplane.translate.policies` rule 2) into the
policies a waypoint enforces, every L4 and L7 field kept, and the ``WaypointAccepted`` condition istiod computes for
it. Targets are resolved against a :class:`TargetIndex` (the waypoints, GatewayClasses, Services and ServiceEntries
of the same translation); :meth:`WaypointPolicyTranslation.for_waypoint` says what one waypoint receives. A policy
without targetRefs is for the proxies of the workloads it selects; :func:`translate_selected_policy` gives it with
its L7 fields for the ingress gateways (:mod:`ambit.controlplane.translate.gateway_policies`). Pure.

Rules:

1. Targets, each judged on its own (istiod's ``WaypointPolicyStatusCollection``): a ``Gateway`` of class
   ``istio-waypoint`` (``gateway.networking.k8s.io``) binds the policy to that waypoint, "bound to ns/name", and
   one of class ``istio`` to that ingress gateway (:meth:`WaypointPolicyTranslation.for_gateway`), the same; a
   ``GatewayClass`` (same group) binds it to every waypoint, only from the root namespace ("AuthorizationPolicy must
   be in the root namespace ..." Invalid otherwise) and only to a class whose controller is
   ``istio.io/mesh-controller`` (Invalid otherwise), "bound to <class>"; a ``Service`` (group ``""`` or ``core``)
   or ``ServiceEntry`` (``networking.istio.io``) binds it to requests for that service at the waypoint the service
   uses (and at its canary waypoint too, if it has one), "bound to ns/waypoint", or ``AncestorNotBound`` "Service
   ns/name is not bound to a waypoint". A target that does not exist is ``TargetNotFound``. Any other group or kind
   is ``Invalid``, and so is a target in another namespace than the policy (cross-namespace attachment would let
   one namespace widen another's ALLOW set).
2. Flattening, as istiod: one target gives its own condition; several give True when any is bound, reason
   ``Accepted``, or ``PartiallyInvalid`` when some are not, with the message "Invalid targetRefs: <ancestors>"
   listing ``Kind.group:ns/name`` of the unbound ones; none bound is False ``Invalid``.
3. Scope: the Gateway and GatewayClass targets give one policy of scope WAYPOINT; the Service and ServiceEntry
   targets one of scope SERVICE whose ``services`` are the targets' service keys (``namespace/hostname``; one per
   ServiceEntry host). A policy may give both (same name; a waypoint evaluates each where it applies).
4. Action: ALLOW (the default), DENY and AUDIT as they are. CUSTOM names an external authorizer in
   ``provider.name``: one of the mesh config's ``extensionProviders`` (:mod:`~ambit.controlplane.translate.
   extension_providers`) gives a policy of action CUSTOM carrying it (its rules choose the requests the authorizer
   decides). A provider that is missing or not a usable authorizer is enforced as istiod's builder does ("failed
   to process CUSTOM action ..., will generate deny configs"): a DENY of the policy's rules, and the message says
   so.
5. Rules, in istiod's shape: ``to`` is one clause of matches (one per operation: hosts lower-cased, notHosts,
   methods, notMethods, paths, notPaths, ports, notPorts); ``from`` one clause (one per source: principals,
   notPrincipals, requestPrincipals, notRequestPrincipals, namespaces, notNamespaces, serviceAccounts,
   notServiceAccounts, ipBlocks, notIpBlocks, remoteIpBlocks, notRemoteIpBlocks; trustDomains are ignored, as
   istiod does); each ``when`` one clause of one match. A rule with none matches every request.
6. ``when`` keys (istiod's list): ``source.ip``, ``source.namespace``, ``source.principal``, ``remote.ip``,
   ``destination.ip``, ``destination.port``, ``connection.sni``, ``request.auth.principal``,
   ``request.auth.audiences``, ``request.auth.presenter``, ``request.headers[<name>]`` (name lower-cased),
   ``request.auth.claims[<a>][<b>]...`` (a nested claim path).
7. Values: strings by :meth:`StringMatch.of_pattern`, paths with ``{*}``/``{**}`` as path templates
   (:mod:`ambit.model.path_templates`); service accounts and IPs as the L4 translation reads them. A value that
   cannot be read (a port that is not 1..65535, an unparsable IP or CIDR, an invalid path template), an unknown
   or malformed ``when`` key, or ``experimental.envoy.filters.*`` is a problem. As istiod treats a value it cannot
   generate, an ALLOW rule with a problem never matches (it is dropped: narrower), and a DENY,
   AUDIT or CUSTOM ignores the unreadable condition (wider). Either way the condition is False, ``Invalid``, naming
   the first problems: the policy is enforced more restrictively than written.
8. Dry run (``istio.io/dry-run``, Go's ParseBool): the policy is sent with ``dry_run`` set; the waypoint only
   reports what it would have done.
9. An object without the schema's shape is not sent and is reported as :class:`Skipped` (rule 9 of the L4
   translation); it gets no condition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.policies import (
    AUTHORIZATION_POLICY,
    DEFAULT_ROOT_NAMESPACE,
    DRY_RUN_ANNOTATION,
    PolicyStatus,
    cidrs,
    parse_go_bool,
    service_accounts,
    string_matches,
)
from ambit.controlplane.translate.skips import Skipped, skipped
from ambit.model.extauthz import ExtAuthzProvider
from ambit.model.path_templates import is_path_template, template_problem
from ambit.model.policy import Action, Cidr, Clause, KeyedMatch, Match, Policy, Rule, Scope, StringMatch

__all__ = [
    "MESH_CONTROLLER",
    "WAYPOINT_ACCEPTED",
    "SelectedPolicy",
    "ServiceTarget",
    "TargetIndex",
    "WaypointPolicyTranslation",
    "policies_for",
    "translate_selected_policy",
    "translate_waypoint_policy",
]

WAYPOINT_ACCEPTED = "WaypointAccepted"
MESH_CONTROLLER = "istio.io/mesh-controller"
GATEWAY_GROUP = "gateway.networking.k8s.io"
NETWORKING_GROUP = "networking.istio.io"
ACCEPTED, INVALID, PARTIALLY_INVALID = "Accepted", "Invalid", "PartiallyInvalid"
ANCESTOR_NOT_BOUND, TARGET_NOT_FOUND = "AncestorNotBound", "TargetNotFound"
_PORT = re.compile(r"[0-9]{1,5}")
_BRACKETS = re.compile(r"\[([^\[\]]+)\]")
_MAX_PROBLEMS = 3

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ServiceTarget:
    """A Service or ServiceEntry as a target: its service keys and the waypoint it uses (None: none), and its canary
    waypoint, which enforces the same service-scoped policies."""

    keys: tuple[str, ...]
    waypoint: str | None = None
    canary: str | None = None


@dataclass(frozen=True, slots=True)
class TargetIndex:
    """What targets can name, from the same translation."""

    waypoints: frozenset[str] = frozenset()
    """``ns/name`` of every Gateway of class ``istio-waypoint``."""
    gateways: frozenset[str] = frozenset()
    """``ns/name`` of every ingress Gateway (class ``istio``)."""
    gateway_classes: Mapping[str, str] = field(default_factory=dict)
    """GatewayClass name → its ``controllerName``."""
    services: Mapping[str, ServiceTarget] = field(default_factory=dict)
    """``ns/name`` of a Service → its target."""
    service_entries: Mapping[str, ServiceTarget] = field(default_factory=dict)
    """``ns/name`` of a ServiceEntry → its target."""


@dataclass(frozen=True, slots=True)
class WaypointPolicyTranslation:
    """The policies of one targetRefs AuthorizationPolicy and where they go, and its ``WaypointAccepted`` status."""

    waypoint_policy: Policy | None = None
    """Scope WAYPOINT: for the waypoints in :attr:`waypoints` (every one with :attr:`every_waypoint`)."""
    waypoints: frozenset[str] = frozenset()
    every_waypoint: bool = False
    gateways: frozenset[str] = frozenset()
    """The ingress Gateways it targets: they get :attr:`waypoint_policy` (every request through them)."""
    service_policy: Policy | None = None
    """Scope SERVICE: for the waypoint each of its services uses (:attr:`service_waypoints`)."""
    service_waypoints: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Service key → the waypoints that front it: the one it uses, then its canary (bound targets only)."""
    status: PolicyStatus | None = None

    def for_waypoint(self, key: str) -> tuple[Policy, ...]:
        """What waypoint ``key`` receives: the WAYPOINT policy if bound to it, the SERVICE policy narrowed to the
        services that use it."""
        out: list[Policy] = []
        if self.waypoint_policy is not None and (self.every_waypoint or key in self.waypoints):
            out.append(self.waypoint_policy)
        if self.service_policy is not None:
            services = tuple(s for s in self.service_policy.services if key in self.service_waypoints.get(s, ()))
            if services:
                out.append(replace(self.service_policy, services=services))
        return tuple(out)

    def for_gateway(self, key: str) -> tuple[Policy, ...]:
        """What ingress gateway ``key`` receives: the WAYPOINT policy if a target names it."""
        return (self.waypoint_policy,) if self.waypoint_policy is not None and key in self.gateways else ()


@dataclass(frozen=True, slots=True)
class SelectedPolicy:
    """An AuthorizationPolicy without targetRefs as a proxy of the selected workloads enforces it, every L7 field
    kept: scope WAYPOINT (every request), and the labels a workload needs (empty: every workload of the policy's
    namespace, or of the mesh from the root namespace)."""

    policy: Policy
    labels: tuple[tuple[str, str], ...] = ()


class _Values:
    """Reads the values of one rule, collecting the problems of rule 7."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        self.bad = False

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.bad = True

    def ports(self, values: list[str], path: str) -> tuple[int, ...]:
        out = []
        for value in values:
            if _PORT.fullmatch(value) and 1 <= int(value) <= 65535:
                out.append(int(value))
            else:
                self.problem(f"{path}: invalid port {value!r}")
        return tuple(out)

    def cidrs(self, values: list[str], path: str) -> tuple[Cidr, ...]:
        out: list[Cidr] = []
        for value in values:
            parsed = cidrs((value,))
            if parsed:
                out.extend(parsed)
            else:
                self.problem(f"{path}: invalid IP address or CIDR {value!r}")
        return tuple(out)

    def paths(self, values: list[str], path: str) -> tuple[tuple[StringMatch, ...], tuple[str, ...]]:
        """Istio's string forms, and the path templates (:mod:`ambit.model.path_templates`) apart."""
        out, templates = [], []
        for value in values:
            if is_path_template(value):
                problem = template_problem(value)
                if problem is None:
                    templates.append(value)
                else:
                    self.problem(f"{path}: invalid path template {value[:64]!r}: {problem}")
            elif "{" in value or "}" in value:
                self.problem(f"{path}: invalid path {value[:64]!r}: contains '{{' or '}}' beyond a path template")
            else:
                out.append(StringMatch.of_pattern(value))
        return tuple(out), tuple(templates)


def _hosts(values: list[str]) -> tuple[StringMatch, ...]:
    return string_matches(v.lower() for v in values)


def _claim_path(rest: str) -> tuple[str, ...] | None:
    """``[a][b]`` → ``("a", "b")``; None when the rest is not one or more bracketed names."""
    parts = _BRACKETS.findall(rest)
    return tuple(parts) if parts and "".join(f"[{p}]" for p in parts) == rest else None


def _when_match(key: str, values: list[str], not_values: list[str], path: str, read: _Values) -> Match | None:
    """One ``when`` condition as a match (rule 6), or None (a problem) for an unknown or malformed key."""
    if key == "source.ip":
        return Match(source_ips=read.cidrs(values, path), not_source_ips=read.cidrs(not_values, path))
    if key == "remote.ip":
        return Match(remote_ips=read.cidrs(values, path), not_remote_ips=read.cidrs(not_values, path))
    if key == "destination.ip":
        return Match(destination_ips=read.cidrs(values, path), not_destination_ips=read.cidrs(not_values, path))
    if key == "destination.port":
        return Match(destination_ports=read.ports(values, path), not_destination_ports=read.ports(not_values, path))
    pos, neg = string_matches(values), string_matches(not_values)
    if key == "source.namespace":
        return Match(namespaces=pos, not_namespaces=neg)
    if key == "source.principal":
        return Match(principals=pos, not_principals=neg)
    if key == "request.auth.principal":
        return Match(request_principals=pos, not_request_principals=neg)
    if key == "request.auth.audiences":
        return Match(audiences=pos, not_audiences=neg)
    if key == "request.auth.presenter":
        return Match(presenters=pos, not_presenters=neg)
    if key == "connection.sni":
        return Match(sni=pos, not_sni=neg)
    if key.startswith("request.headers"):
        name = _claim_path(key.removeprefix("request.headers"))
        if name is None or len(name) != 1:
            read.problem(f"{path}: malformed header key {key!r}")
            return None
        keyed = KeyedMatch((name[0].lower(),), string_matches(values), string_matches(not_values))
        return Match(request_headers=(keyed,))
    if key.startswith("request.auth.claims"):
        claim = _claim_path(key.removeprefix("request.auth.claims"))
        if claim is None:
            read.problem(f"{path}: malformed claim key {key!r}")
            return None
        return Match(request_claims=(KeyedMatch(claim, string_matches(values), string_matches(not_values)),))
    read.problem(f"{path}: unknown attribute {key!r}")
    return None


def _rule(raw: object, path: str, namespace: str, problems: list[str]) -> tuple[Rule, bool]:
    """One rule (rule 5) and whether it had a problem (rule 7); a problem's condition is left out."""
    rule = shapes.mapping(raw, path)
    read = _Values(problems)
    clauses: list[Clause] = []
    to_matches = []
    for i, to in enumerate(shapes.list_of(rule.get("to"), f"{path}.to")):
        at = f"{path}.to[{i}].operation"
        op = shapes.mapping(shapes.mapping(to, f"{path}.to[{i}]").get("operation"), at)

        def ops(name: str, op: Mapping[str, Any] = op, at: str = at) -> list[str]:
            return shapes.strings(op.get(name), f"{at}.{name}")

        paths, path_templates = read.paths(ops("paths"), f"{at}.paths")
        not_paths, not_path_templates = read.paths(ops("notPaths"), f"{at}.notPaths")
        to_matches.append(
            Match(
                hosts=_hosts(ops("hosts")),
                not_hosts=_hosts(ops("notHosts")),
                methods=tuple(ops("methods")),
                not_methods=tuple(ops("notMethods")),
                paths=paths,
                not_paths=not_paths,
                path_templates=path_templates,
                not_path_templates=not_path_templates,
                destination_ports=read.ports(ops("ports"), f"{at}.ports"),
                not_destination_ports=read.ports(ops("notPorts"), f"{at}.notPorts"),
            )
        )
    if to_matches:
        clauses.append(Clause(tuple(to_matches)))
    from_matches = []
    for i, item in enumerate(shapes.list_of(rule.get("from"), f"{path}.from")):
        at = f"{path}.from[{i}].source"
        src = shapes.mapping(shapes.mapping(item, f"{path}.from[{i}]").get("source"), at)

        def srcs(name: str, src: Mapping[str, Any] = src, at: str = at) -> list[str]:
            return shapes.strings(src.get(name), f"{at}.{name}")

        from_matches.append(
            Match(
                principals=string_matches(srcs("principals")),
                not_principals=string_matches(srcs("notPrincipals")),
                request_principals=string_matches(srcs("requestPrincipals")),
                not_request_principals=string_matches(srcs("notRequestPrincipals")),
                namespaces=string_matches(srcs("namespaces")),
                not_namespaces=string_matches(srcs("notNamespaces")),
                service_accounts=service_accounts(srcs("serviceAccounts"), namespace),
                not_service_accounts=service_accounts(srcs("notServiceAccounts"), namespace),
                source_ips=read.cidrs(srcs("ipBlocks"), f"{at}.ipBlocks"),
                not_source_ips=read.cidrs(srcs("notIpBlocks"), f"{at}.notIpBlocks"),
                remote_ips=read.cidrs(srcs("remoteIpBlocks"), f"{at}.remoteIpBlocks"),
                not_remote_ips=read.cidrs(srcs("notRemoteIpBlocks"), f"{at}.notRemoteIpBlocks"),
            )
        )
    if from_matches:
        clauses.append(Clause(tuple(from_matches)))
    for i, raw_when in enumerate(shapes.list_of(rule.get("when"), f"{path}.when")):
        at = f"{path}.when[{i}]"
        when = shapes.mapping(raw_when, at)
        key = when.get("key")
        if not isinstance(key, str):
            raise shapes.ShapeError(f"{at}.key", "expected a string")
        match = _when_match(
            key,
            shapes.strings(when.get("values"), f"{at}.values"),
            shapes.strings(when.get("notValues"), f"{at}.notValues"),
            at,
            read,
        )
        if match is not None:
            clauses.append(Clause((match,)))
    # An operation, source or condition without a field matches everything (Envoy's ``any``), and so does one
    # whose only values were unreadable (rule 7): a clause holding one always holds and is left out.
    return Rule(tuple(c for c in clauses if all(not m.is_empty for m in c.matches))), read.bad


@dataclass(frozen=True, slots=True)
class _Bound:
    ancestor: str
    bound: bool
    reason: str
    message: str


def _target_key(target: Mapping[str, Any], at: str, namespace: str) -> tuple[str, str, str, str]:
    group = shapes.text(target.get("group"), f"{at}.group")
    kind = shapes.text(target.get("kind"), f"{at}.kind")
    name = shapes.text(target.get("name"), f"{at}.name")
    target_ns = shapes.text(target.get("namespace"), f"{at}.namespace") or namespace
    return group, kind, name, target_ns


@dataclass(frozen=True, slots=True)
class _Body:
    action_name: str
    action: Action
    dry_run: bool
    rules: list[Rule]
    problems: list[str]
    ext_authz: ExtAuthzProvider | None = None
    missing_provider: str | None = None
    """Rule 4: the provider name of a CUSTOM policy whose authorizer is not usable (it is enforced as DENY)."""


def _custom(spec: Obj, providers: Iterable[ExtAuthzProvider]) -> tuple[ExtAuthzProvider | None, str]:
    """Rule 4: the authorizer a CUSTOM policy names, and that name."""
    provider = shapes.mapping(spec.get("provider"), "spec.provider")
    name = provider.get("name")
    name = name if isinstance(name, str) else ""
    return next((p for p in providers if p.name == name), None), name


def _body(meta: Obj, spec: Obj, namespace: str, providers: Iterable[ExtAuthzProvider]) -> _Body:
    """The action (rule 4), dry run (rule 8) and rules (rules 5-7) of one policy, and the problems found."""
    action_name = spec.get("action") or "ALLOW"
    if action_name not in ("ALLOW", "DENY", "AUDIT", "CUSTOM"):
        raise shapes.ShapeError("spec.action", f"expected ALLOW, DENY, AUDIT or CUSTOM, got {action_name!r}")
    ext_authz, missing = None, None
    if action_name == "CUSTOM":
        ext_authz, provider_name = _custom(spec, providers)
        action = Action.CUSTOM if ext_authz is not None else Action.DENY
        missing = None if ext_authz is not None else provider_name
    else:
        action = Action[action_name]
    annotations = shapes.mapping(meta.get("annotations"), "metadata.annotations")
    dry_run = parse_go_bool(str(annotations.get(DRY_RUN_ANNOTATION) or ""))
    problems: list[str] = []
    rules: list[Rule] = []
    for i, raw in enumerate(shapes.list_of(spec.get("rules"), "spec.rules")):
        rule, bad = _rule(raw, f"spec.rules[{i}]", namespace, problems)
        if bad and action is Action.ALLOW:
            continue  # rule 7: narrower
        rules.append(rule)
    return _Body(action_name, action, dry_run, rules, problems, ext_authz, missing)


def _translate(
    obj: Obj, index: TargetIndex, root_namespace: str, providers: Iterable[ExtAuthzProvider]
) -> WaypointPolicyTranslation:
    meta = shapes.mapping(obj.get("metadata"), "metadata")
    spec = shapes.mapping(obj.get("spec"), "spec")
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    if not name or not namespace:
        raise shapes.ShapeError("metadata", "name and namespace are required")
    refs = list(shapes.list_of(spec.get("targetRefs"), "spec.targetRefs"))
    single = spec.get("targetRef")
    if single:
        refs.insert(0, single)
    if not refs:
        return WaypointPolicyTranslation()
    body = _body(meta, spec, namespace, providers)
    gateways: set[str] = set()
    bindings: list[_Bound] = []
    waypoints: set[str] = set()
    every = False
    service_keys: list[str] = []
    service_waypoints: dict[str, tuple[str, ...]] = {}
    for i, raw_ref in enumerate(refs):
        at = "spec.targetRef" if single and i == 0 else f"spec.targetRefs[{i - (1 if single else 0)}]"
        group, kind, target, target_ns = _target_key(shapes.mapping(raw_ref, at), at, namespace)
        key = f"{target_ns}/{target}"
        ancestor = f"{kind}.{group or 'core'}:{key}"
        if target_ns != namespace and kind != "GatewayClass":
            bindings.append(_Bound(ancestor, False, INVALID, "cross namespace referencing is not currently supported"))
        elif kind == "GatewayClass" and group == GATEWAY_GROUP:
            if namespace != root_namespace:
                message = (
                    f"AuthorizationPolicy must be in the root namespace `{root_namespace}` "
                    "when referencing a GatewayClass"
                )
                bindings.append(_Bound(ancestor, False, INVALID, message))
            elif target not in index.gateway_classes:
                bindings.append(_Bound(ancestor, False, TARGET_NOT_FOUND, "not bound"))
            elif index.gateway_classes[target] != MESH_CONTROLLER:
                message = f"GatewayClass must use controller name `{MESH_CONTROLLER}` for waypoints"
                bindings.append(_Bound(ancestor, False, INVALID, message))
            else:
                every = True
                bindings.append(_Bound(ancestor, True, ACCEPTED, f"bound to {target}"))
        elif kind == "Gateway" and group == GATEWAY_GROUP:
            if key in index.waypoints:
                waypoints.add(key)
                bindings.append(_Bound(ancestor, True, ACCEPTED, f"bound to {key}"))
            elif key in index.gateways:
                gateways.add(key)
                bindings.append(_Bound(ancestor, True, ACCEPTED, f"bound to {key}"))
            else:
                bindings.append(_Bound(ancestor, False, TARGET_NOT_FOUND, "not bound"))
        elif (kind == "Service" and group in ("", "core")) or (kind == "ServiceEntry" and group == NETWORKING_GROUP):
            found = (index.services if kind == "Service" else index.service_entries).get(key)
            if found is None:
                bindings.append(_Bound(ancestor, False, TARGET_NOT_FOUND, f"{kind} {key} was not found"))
            elif found.waypoint is None:
                message = f"{kind} {key} is not bound to a waypoint"
                bindings.append(_Bound(ancestor, False, ANCESTOR_NOT_BOUND, message))
            else:
                for service_key in found.keys:
                    if service_key not in service_waypoints:
                        service_keys.append(service_key)
                        service_waypoints[service_key] = (
                            (found.waypoint,) if found.canary is None else (found.waypoint, found.canary)
                        )
                bindings.append(_Bound(ancestor, True, ACCEPTED, f"bound to {found.waypoint}"))
        else:
            bindings.append(_Bound(ancestor, False, INVALID, f"unsupported targetRef {group or 'core'}/{kind}"))
    status = _flatten(meta, bindings, body.problems, body.missing_provider)

    def policy(scope: Scope, services: tuple[str, ...] = ()) -> Policy:
        return Policy(name, namespace, scope, body.action, tuple(body.rules), body.dry_run, services, body.ext_authz)

    return WaypointPolicyTranslation(
        waypoint_policy=policy(Scope.WAYPOINT) if waypoints or every or gateways else None,
        waypoints=frozenset(waypoints),
        every_waypoint=every,
        gateways=frozenset(gateways),
        service_policy=policy(Scope.SERVICE, tuple(service_keys)) if service_keys else None,
        service_waypoints=service_waypoints,
        status=status,
    )


def _flatten(
    meta: Mapping[str, Any], bindings: list[_Bound], problems: list[str], missing_provider: str | None
) -> PolicyStatus:
    """Rule 2, then rules 4 and 7 for the message."""
    if len(bindings) == 1:
        only = bindings[0]
        bound, reason, message = only.bound, only.reason, only.message
    else:
        bound = any(b.bound for b in bindings)
        unbound = [b.ancestor for b in bindings if not b.bound]
        reason = (PARTIALLY_INVALID if unbound else ACCEPTED) if bound else INVALID
        message = f"Invalid targetRefs: {', '.join(unbound)}" if unbound else ""
    if problems:
        shown = "; ".join(problems[:_MAX_PROBLEMS]) + ("; ..." if len(problems) > _MAX_PROBLEMS else "")
        bound, reason = False, INVALID
        message = (
            f"{message + '; ' if message else ''}invalid values ({shown}): enforced more restrictively than written "
            "(an ALLOW rule with one never matches, a DENY ignores the condition)"
        )
    if missing_provider is not None:
        message = (
            f"{message + '; ' if message else ''}the CUSTOM action's provider {missing_provider!r} is not an "
            "external authorizer of the mesh config's extensionProviders: requests matching its rules are denied"
        )
    generation = meta.get("generation")
    return PolicyStatus(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
        accepted=bound,
        reason=reason,
        message=message,
        type=WAYPOINT_ACCEPTED,
    )


def translate_waypoint_policy(
    obj: Obj,
    index: TargetIndex,
    *,
    root_namespace: str = DEFAULT_ROOT_NAMESPACE,
    skips: list[Skipped] | None = None,
    providers: Iterable[ExtAuthzProvider] = (),
) -> WaypointPolicyTranslation:
    """The waypoint policies and ``WaypointAccepted`` status of one AuthorizationPolicy (rules 1-9); one without
    targetRefs gives nothing, problems of shape go to ``skips``. ``providers`` are the mesh config's external
    authorizers (rule 4)."""
    try:
        return _translate(obj, index, root_namespace, providers)
    except shapes.ShapeError as exc:
        if skips is not None:
            skips.append(skipped(AUTHORIZATION_POLICY, obj, exc.field, f"{exc.reason}; the policy is not sent"))
        return WaypointPolicyTranslation()


def translate_selected_policy(obj: Obj, providers: Iterable[ExtAuthzProvider] = ()) -> SelectedPolicy | None:
    """An AuthorizationPolicy without targetRefs as the proxy of a workload it selects enforces it (rules 4-8, every
    L7 field kept); None for a targetRefs policy or one without the schema's shape (the L4 translation reports
    that: :mod:`ambit.controlplane.translate.policies` rule 9)."""
    try:
        meta = shapes.mapping(obj.get("metadata"), "metadata")
        spec = shapes.mapping(obj.get("spec"), "spec")
        name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
        if not name or not namespace or spec.get("targetRef") or shapes.list_of(spec.get("targetRefs"), "targetRefs"):
            return None
        body = _body(meta, spec, namespace, providers)
        selector = shapes.mapping(spec.get("selector"), "spec.selector")
        labels = shapes.mapping(selector.get("matchLabels"), "spec.selector.matchLabels")
    except shapes.ShapeError:
        return None
    policy = Policy(
        name, namespace, Scope.WAYPOINT, body.action, tuple(body.rules), body.dry_run, ext_authz=body.ext_authz
    )
    return SelectedPolicy(policy, tuple(sorted((str(k), str(v)) for k, v in labels.items())))


def policies_for(translations: Iterable[WaypointPolicyTranslation], waypoint: str) -> tuple[Policy, ...]:
    """Every policy waypoint ``waypoint`` receives, in key order then WAYPOINT before SERVICE."""
    out = [p for t in translations for p in t.for_waypoint(waypoint)]
    return tuple(sorted(out, key=lambda p: (p.namespace, p.name, p.scope.value)))
