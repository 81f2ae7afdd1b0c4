"""The mesh config (Istio's ``MeshConfig``), read as istiod reads it: the ``mesh`` key of the ConfigMap ``istio`` in
the control plane's namespace, YAML, followed live.

Theory of operation: pure. :func:`parse_mesh_config` turns the YAML text into a frozen :class:`MeshConfig` holding
the fields Ambit applies, or raises :class:`MeshConfigError` with one line naming the field and what was expected.
:func:`mesh_config_of` picks the ConfigMap out of the cached ConfigMaps on every translation and keeps, in a
caller-owned :class:`MeshConfigMemo`, the last config that parsed (istiod's watcher keeps its previous mesh when the
new text does not load, and so does its ``serviceEntryVisibility`` matcher).

Rules:

1. No ConfigMap, no ``mesh`` key, or an empty text: the defaults (every field unset).
2. Every other MeshConfig field is ignored (Ambit applies only these); a known field of the wrong shape, a YAML
   error, an alias, or a text over :data:`MAX_MESH_BYTES` is an error: the previous good config stays in force and
   the problem is reported as a :class:`Skipped` of the ConfigMap's ``data.mesh`` (a Warning Event), once.
3. Field names are protobuf JSON names, camelCase or snake_case (``serviceEntryVisibility`` or
   ``service_entry_visibility``), as istiod's YAML-to-proto conversion accepts both.
4. ``serviceEntryVisibility`` (istiod's ``ServiceEntryVisibilityMatcher``): set at all means *configured* (the
   ``istio.io/VisibilityApplied`` condition is written). ``defaultVisibility`` applies when no policy matches;
   ``policies`` are tried in order, the first whose ``matchingRules`` all select the ServiceEntry's namespace
   labels wins (no rules: it matches every namespace). A rule is ``namespaceSelector`` (``matchLabels``,
   ``matchExpressions``); a rule without a known matcher never matches (istiod's forward compatibility). A
   visibility is ``PUBLIC``, ``NAMESPACE`` or ``NONE``; unset (or ``UNSPECIFIED``) is ``PUBLIC``.
5. ``defaultServiceExportTo``, ``defaultVirtualServiceExportTo``, ``defaultDestinationRuleExportTo``: the
   ``exportTo`` of a ServiceEntry or Service, a VirtualService, a DestinationRule that gives none (istiod's
   default ``*``).
6. Bounds: at most :data:`MAX_POLICIES` policies, :data:`MAX_DISCOVERY_SELECTORS` discovery selectors,
   :data:`MAX_REQUIREMENTS` label requirements in each of ``serviceEntryVisibility`` and ``discoverySelectors``;
   aliases are refused before anything is constructed (:mod:`ambit.model.untrusted_yaml`).
7. ``discoverySelectors`` (istiod's discovery namespaces filter): a list of label selectors, ORed: a namespace is
   discovered when any of them selects its labels. Unset, null or an empty list: every namespace; an empty selector
   ``{}`` selects every namespace. A selector is ``matchLabels`` (a map of strings) and ``matchExpressions`` (each
   ``key``, ``operator`` ``In``/``NotIn``/``Exists``/``DoesNotExist``, ``values``), every one must hold. Keys and values
   follow Kubernetes' label grammar, ``In`` and ``NotIn`` need values, ``Exists`` and ``DoesNotExist`` take none
   (``labels.NewRequirement``); anything else is an error (istiod then keeps its previous filter; here the previous
   mesh config stays, rule 2). What the filter hides is :mod:`ambit.controlplane.translate.discovery`'s.
8. ``defaultConfig`` (the proxies' default ProxyConfig): only ``gatewayTopology.numTrustedProxies`` and
   ``gatewayTopology.forwardClientCertDetails`` are read, for the ingress gateways
   (:mod:`ambit.controlplane.translate.gateway_topology`); a ``defaultConfig`` that is not an object, a count out
   of range, or a mode Istio does not name, is an error (rule 2).
9. ``extensionProviders``: the external authorizers (``envoyExtAuthzHttp``, ``envoyExtAuthzGrpc``) read by
   :mod:`ambit.controlplane.translate.extension_providers` (its rules); an invalid list is an error (rule 2).
10. ``defaultHttpRetryPolicy``: an ``HTTPRetry`` (``attempts``, ``perTryTimeout``, ``retryOn``, ``backoff``, read by
    :mod:`ambit.controlplane.translate.http_retry` as a VirtualService's ``retries`` is): the retries of every
    VirtualService rule, HTTPRoute rule and GRPCRoute rule that states none, and of the waypoints' default route
    (istiod's ``TranslateRoute`` and ``BuildDefaultHTTPOutboundRoute``). ``attempts: 0`` disables those retries.
    Unset or null: Istio's default (2 retries on a connection failure and 503). An invalid one is an error (rule 2).
11. ``localityLbSetting``: the mesh-wide locality load balancing (``enabled``, ``distribute``, ``failover``,
    ``failoverPriority``), read and judged as a DestinationRule's is (:mod:`ambit.controlplane.translate.locality_lb`;
    istiod's ``ValidateMeshConfig`` runs the same ``ValidateLocalityLbSetting``). It applies to every backend whose
    DestinationRule states none, after the Service's traffic distribution (:mod:`ambit.model.locality_lb` rule 7).
    Unset or null: Istio's default ``{enabled: true}``. An invalid one is an error (rule 2).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from ambit.controlplane.translate.extension_providers import parse_extension_providers
from ambit.controlplane.translate.gateway_topology import forward_client_cert, num_trusted_proxies
from ambit.controlplane.translate.http_retry import read_http_retry
from ambit.controlplane.translate.locality_lb import read_locality_lb
from ambit.controlplane.translate.shapes import ShapeError
from ambit.controlplane.translate.skips import ObjectKind, Skipped, skipped
from ambit.controlplane.translate.virtualservice_values import BadField
from ambit.errors import AmbitError
from ambit.model import untrusted_yaml
from ambit.model.extauthz import ExtAuthzProvider
from ambit.model.ingress import ForwardClientCert
from ambit.model.labels import (
    SPEC_OPERATORS,
    LabelSelector,
    Operator,
    Requirement,
    label_key_problem,
    label_value_problem,
    selector_from_spec,
)
from ambit.model.locality_lb import MESH_DEFAULT as MESH_LOCALITY
from ambit.model.locality_lb import LocalityLbSetting
from ambit.model.routes import ISTIO_RETRY, HttpRetry

T = TypeVar("T")
MESH_CONFIG_MAP = "istio"
MESH_KEY = "mesh"
CONFIG_MAP = ObjectKind("v1", "ConfigMap")
MAX_MESH_BYTES = 1_572_864
"""etcd's default request limit: no ConfigMap the API server stores is larger."""
MAX_POLICIES = 1_000
MAX_REQUIREMENTS = 10_000
MAX_DISCOVERY_SELECTORS = 1_000

Obj = Mapping[str, Any]


class MeshConfigError(AmbitError):
    """The ``mesh`` text is not a usable MeshConfig (bad YAML, or a field Ambit reads of the wrong shape)."""


class MeshVisibility(enum.Enum):
    """A ServiceEntry's visibility resolved from ``serviceEntryVisibility`` (istiod's ``ServiceVisibility``)."""

    PUBLIC = "PUBLIC"
    NAMESPACE = "NAMESPACE"
    NONE = "NONE"


_VISIBILITIES = {
    "UNSPECIFIED": MeshVisibility.PUBLIC,
    "PUBLIC": MeshVisibility.PUBLIC,
    "NAMESPACE": MeshVisibility.NAMESPACE,
    "NONE": MeshVisibility.NONE,
}


@dataclass(frozen=True, slots=True)
class VisibilityPolicy:
    visibility: MeshVisibility
    rules: tuple[LabelSelector | None, ...] = ()
    """One namespace selector per matching rule; None for a rule without a known matcher (never matches)."""

    def matches(self, namespace_labels: Mapping[str, str]) -> bool:
        return all(rule is not None and rule.matches(namespace_labels) for rule in self.rules)


@dataclass(frozen=True, slots=True)
class ServiceEntryVisibility:
    """``MeshConfig.serviceEntryVisibility`` compiled (rule 4)."""

    default: MeshVisibility = MeshVisibility.PUBLIC
    policies: tuple[VisibilityPolicy, ...] = ()
    apply_to_sidecars: bool = False
    """Read for completeness; Ambit has no sidecars."""

    def visibility_for(self, namespace_labels: Mapping[str, str]) -> MeshVisibility:
        """The visibility of a ServiceEntry in a namespace with ``namespace_labels``: the first matching policy's."""
        for policy in self.policies:
            if policy.matches(namespace_labels):
                return policy.visibility
        return self.default


@dataclass(frozen=True, slots=True)
class MeshConfig:
    """The MeshConfig fields Ambit applies; the default instance is an unset mesh config."""

    service_entry_visibility: ServiceEntryVisibility | None = None
    """None: not configured (every ServiceEntry is public, no ``VisibilityApplied`` condition)."""
    default_service_export_to: tuple[str, ...] | None = None
    """None: unset (istiod's ``*``)."""
    default_virtual_service_export_to: tuple[str, ...] | None = None
    default_destination_rule_export_to: tuple[str, ...] | None = None
    discovery_selectors: tuple[LabelSelector, ...] = ()
    """Rule 7: a namespace is discovered when any selects its labels; none: every namespace is."""
    trusted_proxies: int | None = None
    """Rule 8: ``defaultConfig.gatewayTopology.numTrustedProxies``; None: unset (0)."""
    forward_client_cert: ForwardClientCert | None = None
    """Rule 8: ``defaultConfig.gatewayTopology.forwardClientCertDetails``; None: unset (gateways ``SANITIZE_SET``)."""
    ext_authz_providers: tuple[ExtAuthzProvider, ...] = ()
    """Rule 9: the usable external authorizers, in the list's order."""
    default_http_retry: HttpRetry = ISTIO_RETRY
    """Rule 10: the retries of a route rule that states none, and of the waypoints' default route."""
    locality_lb: LocalityLbSetting = MESH_LOCALITY
    """Rule 11: the locality load balancing of a backend whose DestinationRule states none."""

    def find_ext_authz(self, name: str) -> ExtAuthzProvider | None:
        """The external authorizer called ``name`` (rule 9), or None."""
        return next((p for p in self.ext_authz_providers if p.name == name), None)

    def discovers(self, namespace_labels: Mapping[str, str]) -> bool:
        """Whether ``discoverySelectors`` admit a namespace with ``namespace_labels`` (rule 7)."""
        selectors = self.discovery_selectors
        return not selectors or any(s.matches(namespace_labels) for s in selectors)

    def entry_visibility(self, namespace_labels: Mapping[str, str]) -> MeshVisibility | None:
        """The visibility ``serviceEntryVisibility`` gives a ServiceEntry there, or None when it is not configured."""
        sev = self.service_entry_visibility
        return None if sev is None else sev.visibility_for(namespace_labels)


DEFAULT_MESH_CONFIG = MeshConfig()


def _get(obj: Obj, camel: str, snake: str) -> Any:
    return obj[camel] if camel in obj else obj.get(snake)


class _Budget:
    def __init__(self) -> None:
        self.requirements = 0

    def spend(self, selector: LabelSelector, where: str) -> None:
        self.requirements += len(selector.requirements)
        if self.requirements > MAX_REQUIREMENTS:
            raise MeshConfigError(f"{where}: more than {MAX_REQUIREMENTS} label requirements in all")


def _visibility(value: Any, where: str) -> MeshVisibility:
    if value is None:
        return MeshVisibility.PUBLIC
    if not isinstance(value, str) or value.upper() not in _VISIBILITIES:
        raise MeshConfigError(f"{where}: {value!r} is not one of PUBLIC, NAMESPACE, NONE")
    return _VISIBILITIES[value.upper()]


def _selector(value: Any, where: str, budget: _Budget) -> LabelSelector:
    if value is None:
        value = {}
    selector = selector_from_spec(value)
    if selector is None:
        raise MeshConfigError(
            f"{where}: expected a label selector (matchLabels: a map; matchExpressions: a list of key, operator "
            "In/NotIn/Exists/DoesNotExist, values)"
        )
    for req in selector.requirements:
        if not isinstance(req.key, str) or not all(isinstance(v, str) for v in req.values):
            raise MeshConfigError(f"{where}: label keys and values must be strings")
    budget.spend(selector, where)
    return selector


def _rule(value: Any, where: str, budget: _Budget) -> LabelSelector | None:
    if not isinstance(value, Mapping):
        raise MeshConfigError(f"{where}: expected an object with namespaceSelector")
    if "namespaceSelector" in value or "namespace_selector" in value:
        return _selector(_get(value, "namespaceSelector", "namespace_selector"), f"{where}.namespaceSelector", budget)
    return None


def _policy(value: Any, where: str, budget: _Budget) -> VisibilityPolicy:
    if not isinstance(value, Mapping):
        raise MeshConfigError(f"{where}: expected an object with visibility and matchingRules")
    rules = _get(value, "matchingRules", "matching_rules") or []
    if not isinstance(rules, list):
        raise MeshConfigError(f"{where}.matchingRules: expected a list")
    return VisibilityPolicy(
        visibility=_visibility(value.get("visibility"), f"{where}.visibility"),
        rules=tuple(_rule(r, f"{where}.matchingRules[{i}]", budget) for i, r in enumerate(rules)),
    )


def _service_entry_visibility(value: Any) -> ServiceEntryVisibility:
    where = "serviceEntryVisibility"
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise MeshConfigError(f"{where}: expected an object")
    policies = value.get("policies") or []
    if not isinstance(policies, list):
        raise MeshConfigError(f"{where}.policies: expected a list")
    if len(policies) > MAX_POLICIES:
        raise MeshConfigError(f"{where}.policies: {len(policies)} policies, at most {MAX_POLICIES}")
    apply = _get(value, "applyToSidecars", "apply_to_sidecars")
    if apply is not None and not isinstance(apply, bool):
        raise MeshConfigError(f"{where}.applyToSidecars: expected true or false")
    budget = _Budget()
    return ServiceEntryVisibility(
        default=_visibility(_get(value, "defaultVisibility", "default_visibility"), f"{where}.defaultVisibility"),
        policies=tuple(_policy(p, f"{where}.policies[{i}]", budget) for i, p in enumerate(policies)),
        apply_to_sidecars=bool(apply),
    )


def _strict_requirement(key: Any, operator: Any, values: Any, where: str) -> Requirement:
    """One requirement, checked as ``labels.NewRequirement`` checks it."""
    key = "" if key is None else key  # protobuf's default for an absent string, as istiod reads it
    operator = "" if operator is None else operator
    if not isinstance(key, str):
        raise MeshConfigError(f"{where}.key: expected a string")
    if (problem := label_key_problem(key)) is not None:
        raise MeshConfigError(f"{where}: invalid label key {key!r}: {problem}")
    op = SPEC_OPERATORS.get(operator) if isinstance(operator, str) else None
    if op is None:
        raise MeshConfigError(f"{where}: operator {operator!r} is not one of In, NotIn, Exists, DoesNotExist")
    if values is None:
        values = []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise MeshConfigError(f"{where}.values: expected a list of strings")
    if op in (Operator.IN, Operator.NOT_IN) and not values:
        raise MeshConfigError(f"{where}: operator {operator} needs at least one value")
    if op in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and values:
        raise MeshConfigError(f"{where}: operator {operator} takes no values")
    for value in values:
        if (problem := label_value_problem(value)) is not None:
            raise MeshConfigError(f"{where}: invalid label value {value!r} for key {key!r}: {problem}")
    return Requirement(key, op, tuple(values))


def _discovery_selector(value: Any, where: str, budget: _Budget) -> LabelSelector:
    if not isinstance(value, Mapping):
        raise MeshConfigError(f"{where}: expected a label selector (matchLabels, matchExpressions)")
    match_labels = _get(value, "matchLabels", "match_labels")
    expressions = _get(value, "matchExpressions", "match_expressions")
    if match_labels is None:
        match_labels = {}
    if expressions is None:
        expressions = []
    if not isinstance(match_labels, Mapping):
        raise MeshConfigError(f"{where}.matchLabels: expected a map of label keys to values")
    if not isinstance(expressions, list):
        raise MeshConfigError(f"{where}.matchExpressions: expected a list")
    requirements: list[Requirement] = []
    for key, label in match_labels.items():
        if not isinstance(label, str):
            raise MeshConfigError(f"{where}.matchLabels[{key!r}]: expected a string value")
        requirements.append(_strict_requirement(key, "In", [label], f"{where}.matchLabels"))
    for i, expr in enumerate(expressions):
        here = f"{where}.matchExpressions[{i}]"
        if not isinstance(expr, Mapping):
            raise MeshConfigError(f"{here}: expected an object with key, operator and values")
        requirements.append(_strict_requirement(expr.get("key"), expr.get("operator"), expr.get("values"), here))
    selector = LabelSelector(tuple(requirements))
    budget.spend(selector, where)
    return selector


def _discovery_selectors(value: Any) -> tuple[LabelSelector, ...]:
    where = "discoverySelectors"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise MeshConfigError(f"{where}: expected a list of label selectors")
    if len(value) > MAX_DISCOVERY_SELECTORS:
        raise MeshConfigError(f"{where}: {len(value)} selectors, at most {MAX_DISCOVERY_SELECTORS}")
    budget = _Budget()
    return tuple(_discovery_selector(v, f"{where}[{i}]", budget) for i, v in enumerate(value))


def _export_to(raw: Obj, camel: str, snake: str) -> tuple[str, ...] | None:
    value = _get(raw, camel, snake)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MeshConfigError(f"{camel}: expected a list of namespaces")
    return tuple(v.strip() for v in value)


def parse_mesh_config(text: str) -> MeshConfig:
    """The MeshConfig in ``text`` (rules 1-11); raises :class:`MeshConfigError` with one line for bad input."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_MESH_BYTES:
        raise MeshConfigError(f"the mesh config is larger than {MAX_MESH_BYTES} bytes")
    try:
        raw = untrusted_yaml.load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        place = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = "refused" if isinstance(exc, untrusted_yaml.YamlAliasError) else "not YAML"
        raise MeshConfigError(f"{what}{place}: {exc.problem or exc.context or 'malformed'}") from None
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise MeshConfigError(f"not YAML: {type(exc).__name__}") from None
    if raw is None:
        return DEFAULT_MESH_CONFIG
    if not isinstance(raw, Mapping):
        raise MeshConfigError(f"expected a YAML object (MeshConfig fields), not {type(raw).__name__}")
    sev_present = "serviceEntryVisibility" in raw or "service_entry_visibility" in raw
    sev = _get(raw, "serviceEntryVisibility", "service_entry_visibility")
    return MeshConfig(
        # An explicit null is unset, as protobuf JSON reads it.
        service_entry_visibility=_service_entry_visibility(sev) if sev_present and sev is not None else None,
        default_service_export_to=_export_to(raw, "defaultServiceExportTo", "default_service_export_to"),
        default_virtual_service_export_to=_export_to(
            raw, "defaultVirtualServiceExportTo", "default_virtual_service_export_to"
        ),
        default_destination_rule_export_to=_export_to(
            raw, "defaultDestinationRuleExportTo", "default_destination_rule_export_to"
        ),
        discovery_selectors=_discovery_selectors(_get(raw, "discoverySelectors", "discovery_selectors")),
        trusted_proxies=_topology_field(_get(raw, "defaultConfig", "default_config"), num_trusted_proxies),
        forward_client_cert=_topology_field(_get(raw, "defaultConfig", "default_config"), forward_client_cert),
        ext_authz_providers=_extension_providers(_get(raw, "extensionProviders", "extension_providers")),
        default_http_retry=_default_http_retry(_get(raw, "defaultHttpRetryPolicy", "default_http_retry_policy")),
        locality_lb=_locality_lb(_get(raw, "localityLbSetting", "locality_lb_setting")),
    )


def _locality_lb(value: Any) -> LocalityLbSetting:
    """Rule 11."""
    if value is None:
        return MESH_LOCALITY
    if isinstance(value, Mapping) and "failover_priority" in value and "failoverPriority" not in value:
        value = {("failoverPriority" if k == "failover_priority" else k): v for k, v in value.items()}  # rule 3
    try:
        setting, _ = read_locality_lb(value, "localityLbSetting")
    except ShapeError as exc:
        raise MeshConfigError(str(exc)) from None
    return setting


def _default_http_retry(value: Any) -> HttpRetry:
    """Rule 10."""
    try:
        return read_http_retry(value, "defaultHttpRetryPolicy", ISTIO_RETRY)
    except BadField as bad:
        raise MeshConfigError(f"{bad.field}: {bad.reason}") from None


def _extension_providers(value: Any) -> tuple[ExtAuthzProvider, ...]:
    """Rule 9."""
    try:
        return parse_extension_providers(value)
    except ValueError as exc:
        raise MeshConfigError(str(exc)) from None


def _topology_field(default_config: Any, read: Callable[[Mapping[str, Any], str], T | None]) -> T | None:
    """Rule 8, one ``gatewayTopology`` field."""
    if default_config is None:
        return None
    if not isinstance(default_config, Mapping):
        raise MeshConfigError("defaultConfig: expected an object (ProxyConfig fields)")
    try:
        return read(default_config, "defaultConfig")
    except ValueError as exc:
        raise MeshConfigError(str(exc)) from None


@dataclass(slots=True)
class MeshConfigMemo:
    """The caller-owned memory of :func:`mesh_config_of`: the last good config, and the text it was parsed from."""

    config: MeshConfig = DEFAULT_MESH_CONFIG
    source: tuple[str, str] = ("", "")
    """(uid, resourceVersion) of the ConfigMap last read, so an unchanged one is not parsed again."""
    error: Skipped | None = None
    """The problem of the ConfigMap last read, reported again on each translation while it lasts."""


def _find(config_maps: Iterable[Obj], namespace: str) -> Obj | None:
    for cm in config_maps:
        meta = cm.get("metadata") or {}
        if meta.get("name") == MESH_CONFIG_MAP and meta.get("namespace") == namespace:
            return cm
    return None


def mesh_config_of(
    config_maps: Iterable[Obj], *, namespace: str, memo: MeshConfigMemo | None, skips: list[Skipped]
) -> MeshConfig:
    """The mesh config the ConfigMap ``istio`` of ``namespace`` gives (rules 1-2); ``memo`` keeps the last good one
    between calls (without one, a bad text gives the defaults)."""
    memo = memo if memo is not None else MeshConfigMemo()
    cm = _find(config_maps, namespace)
    if cm is None:
        memo.config, memo.source, memo.error = DEFAULT_MESH_CONFIG, ("", ""), None
        return memo.config
    meta = cm.get("metadata") or {}
    source = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
    if all(source) and source == memo.source:
        if memo.error is not None:
            skips.append(memo.error)
        return memo.config
    data = cm.get("data")
    text = data.get(MESH_KEY) if isinstance(data, Mapping) else None
    try:
        if text is not None and not isinstance(text, str):
            raise MeshConfigError("expected a string")
        config = parse_mesh_config(text or "")
    except MeshConfigError as exc:
        memo.error = skipped(CONFIG_MAP, cm, f"data.{MESH_KEY}", f"{exc}; the previous mesh config stays in force")
        skips.append(memo.error)
    else:
        memo.config, memo.error = config, None
    memo.source = source
    return memo.config
