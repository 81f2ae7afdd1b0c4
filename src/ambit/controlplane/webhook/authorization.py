"""Validation of ``security.istio.io`` AuthorizationPolicy (spec §7.1), following istiod's webhook.

Theory of operation. The spec is decoded strictly (unknown fields are errors, as protobuf JSON decoding is in
Istio) and checked top down:

- ``action`` is ALLOW (the default), DENY, AUDIT or CUSTOM. CUSTOM needs ``provider.name`` and ``rules`` (a
  CUSTOM policy without rules never triggers); ``provider`` with any other action is an error. DENY and AUDIT
  without rules are accepted with a warning: they match nothing. ALLOW without rules is the "allow nothing"
  policy and is fine.
- ``selector`` versus ``targetRef(s)``: :mod:`ambit.controlplane.webhook.attachment`.
- Each rule's ``from[].source`` and ``to[].operation`` must be present and set at least one field; every listed
  value is a non-empty string; IP blocks are addresses or CIDR prefixes; ports are decimal strings 1-65535;
  ``serviceAccounts`` excludes ``principals`` and ``namespaces`` and is ``name`` or ``namespace/name``; a
  ``paths``/``notPaths`` entry passes istiod's path template check
  (:func:`ambit.model.path_templates.admission_problem`).
- Each ``when[]`` has a known attribute ``key`` and at least one of ``values`` or ``notValues``; values of the IP
  and port attributes are checked like the source and operation fields.
- The ``istio.io/dry-run`` annotation, when present, is ``"true"`` or ``"false"``.
"""

from __future__ import annotations

import re
from typing import Any

from ambit.controlplane.webhook.attachment import check_attachment
from ambit.controlplane.webhook.fields import Fields, is_ip_or_cidr, port_number
from ambit.model.path_templates import admission_problem

ACTIONS = ("ALLOW", "DENY", "AUDIT", "CUSTOM")
_SPEC = ("selector", "targetRef", "targetRefs", "rules", "action", "provider")
_IP_FIELDS = ("ipBlocks", "notIpBlocks", "remoteIpBlocks", "notRemoteIpBlocks")
_STRING_SOURCE_FIELDS = (
    "principals",
    "notPrincipals",
    "requestPrincipals",
    "notRequestPrincipals",
    "namespaces",
    "notNamespaces",
    "serviceAccounts",
    "notServiceAccounts",
    "trustDomains",
    "notTrustDomains",
)
_OPERATION_FIELDS = ("hosts", "notHosts", "ports", "notPorts", "methods", "notMethods", "paths", "notPaths")
_PLAIN_KEYS = {
    "source.ip",
    "remote.ip",
    "source.namespace",
    "source.principal",
    "request.auth.principal",
    "request.auth.audiences",
    "request.auth.presenter",
    "destination.ip",
    "destination.port",
    "connection.sni",
}
_BRACKETED_KEY = re.compile(r"(request\.headers|request\.auth\.claims)\[(.+)\]")
_DRY_RUN = "istio.io/dry-run"


def validate_authorization_policy(obj: dict[str, Any]) -> Fields:
    f = Fields()
    metadata = f.mapping(obj.get("metadata"), "metadata")
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict) and _DRY_RUN in annotations and annotations[_DRY_RUN] not in ("true", "false"):
        f.error(f"metadata.annotations[{_DRY_RUN}]", 'must be "true" or "false"')
    namespace = metadata.get("namespace") if isinstance(metadata.get("namespace"), str) else None
    spec = f.mapping(obj.get("spec"), "spec", known=_SPEC)
    check_attachment(f, spec, namespace)
    action = f.enum(f.get(spec, "action"), "spec.action", ACTIONS) or "ALLOW"
    provider = f.mapping(f.get(spec, "provider"), "spec.provider", known=("name",))
    raw_rules = f.get(spec, "rules")
    if action == "CUSTOM":
        f.string(provider.get("name"), "spec.provider.name", required=True)
        if raw_rules is None:
            f.error("spec.rules", "a CUSTOM policy without rules never triggers; add an empty rule {} to match all")
    elif f.get(spec, "provider") is not None:
        f.error("spec.provider", f"provider may only be set with action CUSTOM, not {action}")
    if action in ("DENY", "AUDIT") and not raw_rules:
        f.warn("spec.rules", f"a {action} policy without rules matches nothing")
    for path, rule in f.objects(raw_rules, "spec.rules"):
        _check_rule(f, rule, path)
    return f


def _check_rule(f: Fields, rule: dict[str, Any], path: str) -> None:
    f.mapping(rule, path, known=("from", "to", "when"))
    for from_path, item in f.objects(rule.get("from"), f"{path}.from"):
        f.mapping(item, from_path, known=("source",))
        known = _STRING_SOURCE_FIELDS + _IP_FIELDS
        source = f.mapping(item.get("source"), f"{from_path}.source", required=True, known=known)
        if isinstance(item.get("source"), dict) and not any(source.values()):
            f.error(f"{from_path}.source", "must set at least one field")
        _check_source(f, source, f"{from_path}.source")
    for to_path, item in f.objects(rule.get("to"), f"{path}.to"):
        f.mapping(item, to_path, known=("operation",))
        operation = f.mapping(item.get("operation"), f"{to_path}.operation", required=True, known=_OPERATION_FIELDS)
        if isinstance(item.get("operation"), dict) and not any(operation.values()):
            f.error(f"{to_path}.operation", "must set at least one field")
        _check_operation(f, operation, f"{to_path}.operation")
    for when_path, condition in f.objects(rule.get("when"), f"{path}.when"):
        _check_condition(f, condition, when_path)


def _check_source(f: Fields, source: dict[str, Any], path: str) -> None:
    listed = {name: f.strings(f.get(source, name), f"{path}.{name}") for name in _STRING_SOURCE_FIELDS}
    for name in _IP_FIELDS:
        for item_path, text in f.strings(f.get(source, name), f"{path}.{name}"):
            if not is_ip_or_cidr(text):
                f.error(item_path, f"{text!r} is not an IP address or CIDR prefix")
    if f.get(source, "serviceAccounts") and (f.get(source, "principals") or f.get(source, "namespaces")):
        f.error(f"{path}.serviceAccounts", "cannot be set together with principals or namespaces")
    for name in ("serviceAccounts", "notServiceAccounts"):
        for item_path, text in listed[name]:
            if text.count("/") > 1 or "" in text.split("/"):
                f.error(item_path, f"{text!r} is not a service account: expected name or namespace/name")


def _check_operation(f: Fields, operation: dict[str, Any], path: str) -> None:
    for name in ("hosts", "notHosts", "methods", "notMethods"):
        f.strings(f.get(operation, name), f"{path}.{name}")
    for name in ("paths", "notPaths"):
        for item_path, text in f.strings(f.get(operation, name), f"{path}.{name}"):
            if (problem := admission_problem(text)) is not None:
                f.error(item_path, f"invalid or unsupported path {text[:64]!r}: {problem}")
    for name in ("ports", "notPorts"):
        for i, item in enumerate(f.sequence(f.get(operation, name), f"{path}.{name}")):
            item_path = f"{path}.{name}[{i}]"
            if not isinstance(item, str):
                f.error(item_path, f'ports are strings: expected a quoted port like "8080", got {item!r}')
            elif port_number(item) is None:
                f.error(item_path, f"{item!r} is not a port number (1-65535)")


def _check_condition(f: Fields, condition: dict[str, Any], path: str) -> None:
    f.mapping(condition, path, known=("key", "values", "notValues"))
    key = f.string(condition.get("key"), f"{path}.key", required=True)
    values = f.strings(f.get(condition, "values"), f"{path}.values")
    not_values = f.strings(f.get(condition, "notValues"), f"{path}.notValues")
    if key is None:
        return
    if not f.get(condition, "values") and not f.get(condition, "notValues"):
        f.error(path, f"at least one of values or notValues must be set for key {key!r}")
    known = key in _PLAIN_KEYS or _BRACKETED_KEY.fullmatch(key) or key.startswith("experimental.envoy.filters.")
    if not known:
        f.error(f"{path}.key", f"unknown attribute {key!r}")
    for item_path, text in values + not_values:
        if key in ("source.ip", "remote.ip", "destination.ip") and not is_ip_or_cidr(text):
            f.error(item_path, f"{text!r} is not an IP address or CIDR prefix")
        elif key == "destination.port" and port_number(text) is None:
            f.error(item_path, f"{text!r} is not a port number (1-65535)")
