"""Which admission webhooks a request goes to: kube-apiserver's ``ShouldCallHook``, pure.

Rule 1: a request about an admission configuration kind itself (webhook configurations, admission policies and
their bindings) goes to no webhook, so a broken webhook cannot lock out its own repair.
Rule 2: any one of the webhook's ``rules`` must match. A rule matches when its scope, operations, apiGroups,
apiVersions and resources all do; ``*`` is a wildcard in each. Resources name the main resource (``pods``), one
subresource (``pods/status``), every subresource (``pods/*``, ``*/status``) or everything (``*/*``); a bare ``*``
is every main resource and no subresource.
Rule 3: scope ``Namespaced`` wants a namespace, ``Cluster`` wants none; a Namespace object is cluster-scoped even
though kube-apiserver gives its requests a namespace (its own name).
Rule 4: ``namespaceSelector`` applies to namespaced requests and to Namespace objects, never to other
cluster-scoped resources; ``objectSelector`` matches if the new or the old object's labels match. An absent or
empty selector selects everything.
Rule 5: selector errors surface only once the rules match (a malformed selector is a 500; a namespace that does
not exist is a 404, as kube-apiserver answers when its namespace lookup fails).

``matchPolicy: Equivalent`` is treated as ``Exact`` (there are no equivalent resources to convert between) and
``matchConditions`` are not looked at here; :mod:`ambit.apiserver.admission` decides what to do with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.apiserver.errors import ApiError, not_found
from ambit.apiserver.selectors import label_selector_from_spec
from ambit.model.labels import LabelSelector

_EXEMPT_KINDS = frozenset(
    {
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionAttributes:
    """One write, as admission sees it."""

    operation: str
    """``CREATE``, ``UPDATE``, ``DELETE`` (or ``CONNECT``)."""
    group: str
    version: str
    resource: str
    """The plural resource name, e.g. ``pods``."""
    subresource: str = ""
    """``""`` for the main resource, else e.g. ``status``."""
    kind_group: str
    kind_version: str
    kind: str
    """The object's group, version and kind (for a subresource, the subresource's kind, e.g. Scale)."""
    namespace: str = ""
    name: str = ""
    object: dict[str, Any] | None = None
    """The object being written; None for DELETE."""
    old_object: dict[str, Any] | None = None
    """The stored object for UPDATE and DELETE; None for CREATE."""
    user_info: Mapping[str, Any] = field(default_factory=dict)
    """``authentication.k8s.io/v1`` UserInfo as JSON: ``username``, ``uid``, ``groups``, ``extra``."""
    dry_run: bool = False
    namespace_labels: Mapping[str, str] | None = None
    """Labels of the request's namespace, for namespaceSelector. For a Namespace object, its own labels (taken
    from the object, or the old object on DELETE, when None). None on a namespaced request means the namespace
    does not exist: a matching webhook with a non-empty namespaceSelector then yields 404, as in kube."""
    options: Mapping[str, Any] | None = None
    """The request's Create/Update/DeleteOptions; a minimal one is sent when None."""


def is_exempt(attrs: AdmissionAttributes) -> bool:
    """Requests about admission configuration objects are never sent to webhooks (rule 1)."""
    return attrs.kind_group == "admissionregistration.k8s.io" and attrs.kind in _EXEMPT_KINDS


def webhook_matches(webhook: Mapping[str, Any], attrs: AdmissionAttributes) -> bool:
    """Whether kube-apiserver would call ``webhook`` for ``attrs``, ``matchConditions`` aside.

    Raises :class:`ApiError` (500 for a malformed selector, 404 for a missing namespace) only when the rules
    match.
    """
    if is_exempt(attrs):
        return False
    if not any(rule_matches(rule, attrs) for rule in webhook.get("rules") or ()):
        return False
    return _namespace_matches(webhook.get("namespaceSelector"), attrs) and _object_matches(
        webhook.get("objectSelector"), attrs
    )


def rule_matches(rule: Mapping[str, Any], attrs: AdmissionAttributes) -> bool:
    """One RuleWithOperations (rules 2 and 3)."""
    return (
        _scope_matches(rule.get("scope"), attrs)
        and _exact_or_wildcard(rule.get("operations"), attrs.operation)
        and _exact_or_wildcard(rule.get("apiGroups"), attrs.group)
        and _exact_or_wildcard(rule.get("apiVersions"), attrs.version)
        and any(_resource_matches(entry, attrs) for entry in rule.get("resources") or ())
    )


def _exact_or_wildcard(items: Any, requested: str) -> bool:
    return any(item in ("*", requested) for item in items or ())


def _scope_matches(scope: Any, attrs: AdmissionAttributes) -> bool:
    if scope is None or scope == "*":
        return True
    is_namespace = (attrs.group, attrs.version, attrs.resource) == ("", "v1", "namespaces")
    if scope == "Namespaced":
        return not is_namespace and attrs.namespace != ""
    if scope == "Cluster":
        return is_namespace or attrs.namespace == ""
    return False


def _resource_matches(entry: Any, attrs: AdmissionAttributes) -> bool:
    resource, _, subresource = str(entry).partition("/")
    return resource in ("*", attrs.resource) and subresource in ("*", attrs.subresource)


def _namespace_matches(spec: Any, attrs: AdmissionAttributes) -> bool:
    is_namespace = attrs.resource == "namespaces"  # kube-apiserver looks at the resource name alone here
    if not attrs.namespace and not is_namespace:
        return True
    selector = _parse_selector(spec, "namespaceSelector")
    if selector is None:
        return True
    labels = attrs.namespace_labels
    if labels is None and is_namespace:
        own = attrs.old_object if attrs.operation == "DELETE" else attrs.object
        labels = _labels_of(own) if own is not None else None
    if labels is None:
        raise not_found("namespaces", attrs.namespace or attrs.name)
    return selector.matches(labels)


def _object_matches(spec: Any, attrs: AdmissionAttributes) -> bool:
    selector = _parse_selector(spec, "objectSelector")
    if selector is None:
        return True
    return any(obj is not None and selector.matches(_labels_of(obj)) for obj in (attrs.object, attrs.old_object))


def _parse_selector(spec: Any, field_name: str) -> LabelSelector | None:
    """None for an absent or empty selector, which selects everything."""
    try:
        selector = label_selector_from_spec(spec)
    except ApiError as exc:
        why = f"{field_name}: {exc.message}"
        raise ApiError(
            500, "InternalError", f"Internal error occurred: {why}", details={"causes": [{"message": why}]}
        ) from None
    return None if selector.selects_everything else selector


def _labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    metadata = obj.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}
