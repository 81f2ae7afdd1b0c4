"""Pure RBAC evaluation, as kube-apiserver's RBAC authorizer decides: rules, subjects, request attributes.

Rules (kube's ``RuleAllows`` and ``Covers``):

Rule 1. A resource request is allowed by a rule when the rule's verbs hold the verb or ``*``, its apiGroups hold
        the group or ``*``, its resources hold ``*``, the resource (``pods``), ``resource/subresource``
        (``pods/status``) or ``*/subresource``; and its resourceNames are empty or hold the request's name.
Rule 2. A non-resource request (``/healthz``, ``/api``) is allowed by a rule whose verbs hold the verb (the
        lower-cased HTTP method) or ``*`` and whose nonResourceURLs hold the path, ``*``, or ``prefix*`` with the
        path starting with ``prefix``.
Rule 3. A request is allowed when any rule allows it; there is no deny. ``system:masters`` is always allowed.
Rule 4. A subject applies to a user: ``User`` by name, ``Group`` by membership, ``ServiceAccount`` by the user
        name ``system:serviceaccount:<ns>:<name>``, its namespace defaulting to the binding's.
Rule 5. Owner rules cover a rule when every atomic piece of it (one verb, one group, one resource, one name, or
        one verb and one URL) is covered by one owner rule (``*``, exact, ``*/subresource`` for resources,
        ``prefix*`` for URLs; owner resourceNames empty or holding the name). Escalation prevention uses it.
Rule 6. Request attributes come from the path alone, as kube's RequestInfo: ``/api/v1`` and ``/apis/<g>/<v>``
        followed by ``[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]`` is a resource request; for
        ``namespaces/<name>`` the namespace is the name. Verb: GET is get (with a name), list or watch
        (``?watch``, ``/watch/`` prefix); POST create; PUT update; PATCH patch; DELETE delete or
        deletecollection (no name); a list or watch with ``fieldSelector=metadata.name=<n>`` names ``<n>``.
        Anything else is a non-resource request with the lower-cased method.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MASTERS = "system:masters"
SA_PREFIX = "system:serviceaccount:"
RBAC_GROUP = "rbac.authorization.k8s.io"
NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@dataclass(frozen=True, slots=True)
class Rule:
    """One PolicyRule; tuples keep it hashable and comparable."""

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> Rule:
        def strings(key: str) -> tuple[str, ...]:
            value = obj.get(key) or ()
            return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()

        return cls(
            strings("verbs"),
            strings("apiGroups"),
            strings("resources"),
            strings("resourceNames"),
            strings("nonResourceURLs"),
        )

    def to_obj(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verbs": list(self.verbs)}
        if self.non_resource_urls:
            out["nonResourceURLs"] = list(self.non_resource_urls)
        else:
            out["apiGroups"] = list(self.api_groups)
            out["resources"] = list(self.resources)
        if self.resource_names:
            out["resourceNames"] = list(self.resource_names)
        return out

    def __str__(self) -> str:
        """kube's compact form, used in escalation messages."""
        parts = []
        if self.api_groups:
            parts.append("APIGroups:[" + " ".join(f'"{g}"' for g in self.api_groups) + "]")
        if self.resources:
            parts.append("Resources:[" + " ".join(f'"{r}"' for r in self.resources) + "]")
        if self.resource_names:
            parts.append("ResourceNames:[" + " ".join(f'"{n}"' for n in self.resource_names) + "]")
        if self.non_resource_urls:
            parts.append("NonResourceURLs:[" + " ".join(f'"{u}"' for u in self.non_resource_urls) + "]")
        parts.append("Verbs:[" + " ".join(f'"{v}"' for v in self.verbs) + "]")
        return "{" + ", ".join(parts) + "}"


def rules_from(objs: Any) -> tuple[Rule, ...]:
    """The rules of a role's ``rules`` list (anything not an object is skipped)."""
    if not isinstance(objs, list):
        return ()
    return tuple(Rule.from_obj(o) for o in objs if isinstance(o, Mapping))


@dataclass(frozen=True, slots=True)
class Attributes:
    """What a request asks, as kube's authorizer.Attributes."""

    user: str
    groups: tuple[str, ...]
    verb: str
    resource_request: bool = True
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""


# -- Rules 1-3 ------------------------------------------------------------------------------------------------
def _has(items: Sequence[str], wanted: str) -> bool:
    return "*" in items or wanted in items


def _resource_matches(rule: Rule, resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in rule.resources:
        if r in ("*", combined):
            return True
        if subresource and r == "*/" + subresource:
            return True
    return False


def _url_matches(patterns: Sequence[str], path: str) -> bool:
    for p in patterns:
        if p in ("*", path):
            return True
        if p.endswith("*") and path.startswith(p[:-1]):
            return True
    return False


def rule_allows(rule: Rule, a: Attributes) -> bool:
    if not _has(rule.verbs, a.verb):
        return False
    if not a.resource_request:
        return _url_matches(rule.non_resource_urls, a.path)
    if not _has(rule.api_groups, a.api_group) or not _resource_matches(rule, a.resource, a.subresource):
        return False
    return not rule.resource_names or a.name in rule.resource_names


def rules_allow(rules: Iterable[Rule], a: Attributes) -> bool:
    if MASTERS in a.groups:
        return True
    return any(rule_allows(r, a) for r in rules)


# -- Rule 4 ---------------------------------------------------------------------------------------------------
def subject_applies(subject: Mapping[str, Any], user: str, groups: Sequence[str], binding_namespace: str) -> bool:
    kind = subject.get("kind")
    name = subject.get("name")
    if kind == "User":
        return bool(name == user)
    if kind == "Group":
        return name in groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and user == f"{SA_PREFIX}{namespace}:{name}"
    return False


def service_account_groups(username: str) -> tuple[str, ...]:
    """The groups kube gives a service account's user name (empty for other users)."""
    if not username.startswith(SA_PREFIX):
        return ()
    namespace = username[len(SA_PREFIX) :].split(":", 1)[0]
    return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")


# -- Rule 5 ---------------------------------------------------------------------------------------------------
def _atoms(rule: Rule) -> Iterable[Rule]:
    if rule.non_resource_urls:
        for verb in rule.verbs:
            for url in rule.non_resource_urls:
                yield Rule((verb,), non_resource_urls=(url,))
        return
    names: tuple[str | None, ...] = rule.resource_names or (None,)
    for group in rule.api_groups:
        for resource in rule.resources:
            for verb in rule.verbs:
                for name in names:
                    yield Rule((verb,), (group,), (resource,), () if name is None else (name,))


def _owner_covers(owner: Rule, atom: Rule) -> bool:
    if not _has(owner.verbs, atom.verbs[0]):
        return False
    if atom.non_resource_urls:
        return _url_matches(owner.non_resource_urls, atom.non_resource_urls[0])
    if not _has(owner.api_groups, atom.api_groups[0]):
        return False
    resource = atom.resources[0]
    if not _has(owner.resources, resource) and (
        "/" not in resource or "*/" + resource.split("/", 1)[1] not in owner.resources
    ):
        return False
    if not owner.resource_names:
        return True
    return bool(atom.resource_names) and atom.resource_names[0] in owner.resource_names


def uncovered(owner: Sequence[Rule], wanted: Iterable[Rule]) -> list[Rule]:
    """The atomic pieces of ``wanted`` that no owner rule covers (empty: covered)."""
    return [atom for rule in wanted for atom in _atoms(rule) if not any(_owner_covers(o, atom) for o in owner)]


# -- Rule 6 ---------------------------------------------------------------------------------------------------
UPGRADED_SUBRESOURCES = frozenset({"exec", "attach", "portforward"})
"""Pod subresources whose GET is a WebSocket upgrade, authorized with verb ``create``."""


def request_attributes(
    user: str, groups: tuple[str, ...], method: str, path: str, watch_param: bool, field_selector: str = ""
) -> Attributes:
    parts = [p for p in path.split("/") if p]
    method = method.upper()
    plain = Attributes(user, groups, method.lower(), resource_request=False, path=path)
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return plain
    watch = watch_param
    if rest[0] == "watch":
        watch, rest = True, rest[1:]
        if not rest:
            return plain
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if method in ("GET", "HEAD"):
        verb = "watch" if watch else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
    if verb == "get" and group == "" and resource == "pods" and subresource in UPGRADED_SUBRESOURCES:
        verb = "create"  # kube 1.32 authorizes a WebSocket GET on these as the POST it replaces
    if verb in ("list", "watch") and not name:
        name = _exact_name(field_selector)
    return Attributes(user, groups, verb, True, group, resource, subresource, namespace, name, path)


def _exact_name(field_selector: str) -> str:
    """The name a field selector requires exactly (``metadata.name=x``), as kube takes it for a list or watch."""
    for term in field_selector.split(","):
        for op in ("==", "="):
            key, sep, value = term.partition(op)
            if sep and key.strip() == "metadata.name" and not key.endswith("!"):
                return value.strip()
    return ""


# -- kube's messages ------------------------------------------------------------------------------------------
def reason(a: Attributes) -> str:
    """kube's ``forbiddenMessage``: what the user cannot do."""
    if not a.resource_request:
        return f'User "{a.user}" cannot {a.verb} path "{a.path}"'
    resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    where = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
    return f'User "{a.user}" cannot {a.verb} resource "{resource}" in API group "{a.api_group}" {where}'


def forbidden_status_fields(a: Attributes, why: str) -> tuple[str, dict[str, str]]:
    """kube's ``NewForbidden`` message and details for a refused request ``a`` (``why`` is the reason text)."""
    if not a.resource_request or not a.resource:
        return f"forbidden: {why}", {}
    qualified = f"{a.resource}.{a.api_group}" if a.api_group else a.resource
    details: dict[str, str] = {}
    if a.name:
        details["name"] = a.name
    if a.api_group:
        details["group"] = a.api_group
    details["kind"] = a.resource
    if a.name:
        return f'{qualified} "{a.name}" is forbidden: {why}', details
    return f"{qualified} is forbidden: {why}", details
