"""RBAC over the store: who may do what, as kube-apiserver's RBAC authorizer, impersonation filter, access reviews
and escalation checks decide. The evaluation itself is :mod:`ambit.apiserver.rbac_policy` (pure).

Theory of operation:

- Every request is authorized once, after authentication (and impersonation), before it reaches the verbs: the
  HTTP shell computes its attributes and calls :meth:`Authorizer.authorize`, which raises 403 in kube's format.
  Nodes (``system:node:<name>``) are asked of the Node authorizer first
  (:mod:`ambit.apiserver.node_authorizer`); what it does not allow goes to RBAC.
- A user's rules in a namespace are the rules of the ClusterRoles bound to it by ClusterRoleBindings, plus, for a
  namespaced request, those of the Roles and ClusterRoles bound by RoleBindings in that namespace. A binding whose
  role does not exist grants nothing. The index is rebuilt when the store's version has moved.
- Escalation prevention (on every write of a role or binding, whatever the verb): a Role or ClusterRole is stored
  only if the writer holds every rule in it or has ``escalate`` on it (an aggregationRule needs full authority);
  a binding only if the writer holds every rule of the referenced role or has ``bind`` on it.
- Aggregation: after any ClusterRole changes, every ClusterRole with an aggregationRule gets the union of the
  rules of the ClusterRoles its selectors match, until nothing changes (``edit`` aggregates into ``admin``).
- Impersonation needs ``impersonate`` on ``users`` (or ``serviceaccounts``), ``groups``, ``uids`` and
  ``userextras/<key>``; the impersonated user is then authorized for the request itself.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ambit.apiserver import errors, rbac_defaults
from ambit.apiserver.node_authorizer import NodeAuthorizer, node_of
from ambit.apiserver.rbac_policy import (
    MASTERS,
    RBAC_GROUP,
    SA_PREFIX,
    Attributes,
    Rule,
    forbidden_status_fields,
    reason,
    rules_allow,
    rules_from,
    service_account_groups,
    subject_applies,
    uncovered,
)
from ambit.apiserver.registry import ResourceType
from ambit.apiserver.requests import JsonObject, User
from ambit.apiserver.selectors import label_selector_from_spec
from ambit.apiserver.store import Store
from ambit.apiserver.strategies import Strategy

ROLES = (RBAC_GROUP, "roles")
CLUSTER_ROLES = (RBAC_GROUP, "clusterroles")
ROLE_BINDINGS = (RBAC_GROUP, "rolebindings")
CLUSTER_ROLE_BINDINGS = (RBAC_GROUP, "clusterrolebindings")
AUTHZ_GROUP = "authorization.k8s.io"
REVIEWS = frozenset(
    (AUTHZ_GROUP, plural)
    for plural in (
        "subjectaccessreviews",
        "selfsubjectaccessreviews",
        "localsubjectaccessreviews",
        "selfsubjectrulesreviews",
    )
)
FULL_AUTHORITY = (Rule(("*",), ("*",), ("*",)), Rule(("*",), non_resource_urls=("*",)))


def forbidden(a: Attributes, why: str = "") -> errors.ApiError:
    message, details = forbidden_status_fields(a, why or reason(a))
    return errors.ApiError(403, "Forbidden", message, details=details)


class Authorizer:
    """Reads roles and bindings from the store; one per server."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.nodes = NodeAuthorizer(store)
        self._indexed_at = -1
        self._cluster_bindings: list[Mapping[str, Any]] = []
        self._cluster_roles: dict[str, tuple[Rule, ...]] = {}

    # -- rules ----------------------------------------------------------------------------------------------
    def _refresh(self) -> None:
        rv = self.store.resource_version
        if rv == self._indexed_at:
            return
        self._cluster_bindings = [i.obj for i in self.store.items(CLUSTER_ROLE_BINDINGS)]
        self._cluster_roles = {
            i.obj["metadata"]["name"]: rules_from(i.obj.get("rules")) for i in self.store.items(CLUSTER_ROLES)
        }
        self._indexed_at = rv

    def rules_for(self, user: str, groups: tuple[str, ...], namespace: str) -> list[Rule]:
        return self.resolve(user, groups, namespace)[0]

    def resolve(self, user: str, groups: tuple[str, ...], namespace: str) -> tuple[list[Rule], list[str]]:
        """The rules that apply to ``user`` in ``namespace`` (cluster-wide ones too), and an error for each binding
        whose role does not exist (kube's rule resolver: a rules review with errors is incomplete)."""
        self._refresh()
        rules: list[Rule] = []
        missing: list[str] = []
        for binding in self._cluster_bindings:
            if _binds(binding, user, groups, "") and (binding.get("roleRef") or {}).get("kind") == "ClusterRole":
                name = str(binding["roleRef"].get("name"))
                if name in self._cluster_roles:
                    rules.extend(self._cluster_roles[name])
                else:
                    missing.append(f'clusterrole.rbac.authorization.k8s.io "{name}" not found')
        if namespace:
            for item in self.store.items(ROLE_BINDINGS, namespace):
                if not _binds(item.obj, user, groups, namespace):
                    continue
                ref = item.obj.get("roleRef") or {}
                name = str(ref.get("name"))
                if ref.get("kind") == "ClusterRole":
                    if name in self._cluster_roles:
                        rules.extend(self._cluster_roles[name])
                    else:
                        missing.append(f'clusterrole.rbac.authorization.k8s.io "{name}" not found')
                elif ref.get("kind") == "Role":
                    role = self.store.get(ROLES, namespace, name)
                    if role is not None:
                        rules.extend(rules_from(role.obj.get("rules")))
                    else:
                        missing.append(f'role.rbac.authorization.k8s.io "{name}" not found')
        return rules, missing

    def allows(self, a: Attributes) -> bool:
        """The Node authorizer, then RBAC (kube-apiserver's ``--authorization-mode=Node,RBAC``)."""
        if MASTERS in a.groups:
            return True
        node = node_of(a.user, a.groups)
        if node is not None and self.nodes.allows(node, a):
            return True
        return rules_allow(self.rules_for(a.user, a.groups, a.namespace), a)

    def authorize(self, a: Attributes) -> None:
        if not self.allows(a):
            raise forbidden(a)

    # -- impersonation --------------------------------------------------------------------------------------
    def impersonate(self, headers: Mapping[str, str], getall: Any, user: User) -> User:
        """The user a request acts as: ``user``, or whom its ``Impersonate-*`` headers name, if ``user`` may."""
        target = headers.get("Impersonate-User", "")
        groups = tuple(getall("Impersonate-Group", ()))
        uid = headers.get("Impersonate-Uid", "")
        extra: dict[str, list[str]] = {}
        for key in headers:
            if key.lower().startswith("impersonate-extra-"):
                extra.setdefault(key[len("impersonate-extra-") :].lower(), []).extend(getall(key, ()))
        if not target:
            if groups or uid or extra:
                raise errors.bad_request("requested impersonation without a user (Impersonate-User)")
            return user

        def check(a: Attributes) -> None:
            if not self.allows(a):
                raise forbidden(a)

        me, mine = user.username, user.groups
        if target.startswith(SA_PREFIX) and target.count(":") == 3:
            _, _, ns, name = target.split(":")
            check(Attributes(me, mine, "impersonate", True, "", "serviceaccounts", "", ns, name))
        else:
            check(Attributes(me, mine, "impersonate", True, "", "users", "", "", target))
        for group in groups:
            check(Attributes(me, mine, "impersonate", True, "", "groups", "", "", group))
        if uid:
            check(Attributes(me, mine, "impersonate", True, "authentication.k8s.io", "uids", "", "", uid))
        for key, values in extra.items():
            for value in values:
                check(Attributes(me, mine, "impersonate", True, "authentication.k8s.io", "userextras", key, "", value))
        all_groups = list(groups or service_account_groups(target))
        if target != "system:anonymous" and "system:authenticated" not in all_groups:
            all_groups.append("system:authenticated")
        return User(target, uid, tuple(all_groups), extra)

    # -- escalation -----------------------------------------------------------------------------------------
    def check_write(self, rtype: ResourceType, namespace: str, obj: JsonObject, user: User) -> None:
        """Refuse a role or binding that would grant ``user`` (or anyone) more than ``user`` holds."""
        key = rtype.key
        if key not in (ROLES, CLUSTER_ROLES, ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS) or MASTERS in user.groups:
            return
        name = str(obj["metadata"].get("name", ""))
        if key in (ROLES, CLUSTER_ROLES):
            if self.allows(
                Attributes(user.username, user.groups, "escalate", True, RBAC_GROUP, key[1], "", namespace, name)
            ):
                return
            wanted = rules_from(obj.get("rules"))
            if key == CLUSTER_ROLES and obj.get("aggregationRule"):
                wanted = FULL_AUTHORITY
        else:
            ref = obj.get("roleRef") or {}
            ref_kind, ref_name = ref.get("kind"), str(ref.get("name", ""))
            if ref_kind not in ("Role", "ClusterRole") or (key == CLUSTER_ROLE_BINDINGS and ref_kind != "ClusterRole"):
                raise errors.invalid(
                    rtype.kind, name, [("roleRef.kind", f"Unsupported value: {ref_kind!r}")], RBAC_GROUP
                )
            ref_plural = "roles" if ref_kind == "Role" else "clusterroles"
            bind = Attributes(user.username, user.groups, "bind", True, RBAC_GROUP, ref_plural, "", namespace, ref_name)
            if self.allows(bind):
                return
            if ref_kind == "Role":
                role = self.store.get(ROLES, namespace, ref_name)
            else:
                role = self.store.get(CLUSTER_ROLES, "", ref_name)
            if role is None:
                raise errors.not_found(ref_plural, ref_name, RBAC_GROUP)
            wanted = rules_from(role.obj.get("rules"))
        missing = uncovered(self.rules_for(user.username, user.groups, namespace), wanted)
        if missing:
            groups = " ".join(f'"{g}"' for g in user.groups)
            held = "\n".join(str(r) for r in missing)
            raise errors.ApiError(
                403,
                "Forbidden",
                f'{rtype.plural}.{RBAC_GROUP} "{name}" is forbidden: user "{user.username}" (groups=[{groups}]) '
                f"is attempting to grant RBAC permissions not currently held:\n{held}",
                details={"name": name, "group": RBAC_GROUP, "kind": rtype.plural},
            )

    # -- reviews --------------------------------------------------------------------------------------------
    def review(self, rtype: ResourceType, namespace: str, body: Any, user: User) -> JsonObject:
        """Answer a SubjectAccessReview, SelfSubjectAccessReview, LocalSubjectAccessReview or SelfSubjectRulesReview."""
        if not isinstance(body, dict) or not isinstance(body.get("spec", {}), dict):
            raise errors.bad_request(f"the {rtype.kind} must be an object with a spec")
        out = copy.deepcopy(body)
        out["apiVersion"], out["kind"] = f"{AUTHZ_GROUP}/v1", rtype.kind
        out.setdefault("metadata", {})
        spec = out.setdefault("spec", {})
        if rtype.plural == "selfsubjectrulesreviews":
            ns = str(spec.get("namespace") or "")
            rules, problems = self.resolve(user.username, user.groups, ns)
            if node_of(user.username, user.groups) is not None:
                problems.append("node authorizer does not support user rule resolution")
            if MASTERS in user.groups:
                rules = list(FULL_AUTHORITY) + rules
            out["status"] = {
                "resourceRules": [_rule_obj(r) for r in rules if not r.non_resource_urls],
                "nonResourceRules": [
                    {"verbs": list(r.verbs), "nonResourceURLs": list(r.non_resource_urls)}
                    for r in rules
                    if r.non_resource_urls
                ],
                "incomplete": bool(problems),
            }
            if problems:
                out["status"]["evaluationError"] = ", ".join(problems)
            return out
        if rtype.plural.startswith("self"):
            username, groups = user.username, user.groups
        else:
            username = str(spec.get("user") or "")
            groups = tuple(str(g) for g in spec.get("groups") or ())
            if not username and not groups:
                raise errors.invalid(
                    rtype.kind, "", [("spec.user", "at least one of user or group must be specified")], AUTHZ_GROUP
                )
        resource = spec.get("resourceAttributes")
        non_resource = spec.get("nonResourceAttributes")
        if isinstance(resource, dict):
            res_ns = str(resource.get("namespace") or "")
            if rtype.plural == "localsubjectaccessreviews" and res_ns != namespace:
                raise errors.invalid(
                    rtype.kind,
                    "",
                    [("spec.resourceAttributes.namespace", "must match metadata.namespace")],
                    AUTHZ_GROUP,
                )
            a = Attributes(
                username,
                groups,
                str(resource.get("verb") or ""),
                True,
                str(resource.get("group") or ""),
                str(resource.get("resource") or ""),
                str(resource.get("subresource") or ""),
                res_ns,
                str(resource.get("name") or ""),
            )
        elif isinstance(non_resource, dict):
            a = Attributes(
                username, groups, str(non_resource.get("verb") or ""), False, path=str(non_resource.get("path") or "")
            )
        else:
            raise errors.invalid(
                rtype.kind,
                "",
                [("spec", "exactly one of nonResourceAttributes or resourceAttributes must be specified")],
                AUTHZ_GROUP,
            )
        allowed = self.allows(a)
        out["status"] = {"allowed": allowed} if not allowed else {"allowed": True, "reason": "RBAC: allowed"}
        return out

    # -- bootstrap ------------------------------------------------------------------------------------------
    @staticmethod
    def bootstrap_objects(extra: list[JsonObject]) -> list[JsonObject]:
        """kube's default roles and bindings, then ``extra`` (the components' own, from ``deploy/rbac``)."""
        return rbac_defaults.cluster_roles() + rbac_defaults.cluster_role_bindings() + extra


def _binds(binding: Mapping[str, Any], user: str, groups: tuple[str, ...], namespace: str) -> bool:
    subjects = binding.get("subjects") or ()
    return isinstance(subjects, list) and any(
        isinstance(s, Mapping) and subject_applies(s, user, groups, namespace) for s in subjects
    )


def _rule_obj(rule: Rule) -> JsonObject:
    out: JsonObject = {"verbs": list(rule.verbs), "apiGroups": list(rule.api_groups), "resources": list(rule.resources)}
    if rule.resource_names:
        out["resourceNames"] = list(rule.resource_names)
    return out


class ClusterRoleStrategy(Strategy):
    """ClusterRoles: after any change, aggregated roles take the union of the roles their selectors match."""

    def after_commit(self, etype: str, rtype: ResourceType, obj: JsonObject) -> None:
        self.aggregate(rtype)

    def after_remove(self, obj: JsonObject) -> None:
        rtype = self.context.registry.find(*CLUSTER_ROLES)
        assert rtype is not None
        self.aggregate(rtype)

    def aggregate(self, rtype: ResourceType) -> None:
        store = self.context.store
        for _ in range(8):  # chains (view → edit → admin) settle in a few rounds
            changed = False
            roles = [i.obj for i in store.items(CLUSTER_ROLES)]
            for role in roles:
                rule = role.get("aggregationRule")
                if not isinstance(rule, dict):
                    continue
                selectors = [
                    label_selector_from_spec(s) for s in rule.get("clusterRoleSelectors") or () if isinstance(s, dict)
                ]
                union: list[Any] = []
                name = role["metadata"]["name"]
                for other in roles:
                    if other["metadata"]["name"] == name:
                        continue
                    labels = other["metadata"].get("labels") or {}
                    if any(sel.matches(labels) for sel in selectors):
                        for r in other.get("rules") or ():
                            if r not in union:
                                union.append(r)
                if role.get("rules") != union:
                    new = copy.deepcopy(role)
                    new["rules"] = union
                    self.context.hub.publish(store.put("MODIFIED", CLUSTER_ROLES, "", name, new))
                    changed = True
            if not changed:
                return


class BindingStrategy(Strategy):
    """RoleBindings and ClusterRoleBindings: the role a binding refers to cannot change (delete and recreate)."""

    def prepare_for_update(self, rtype: ResourceType, old: JsonObject, new: JsonObject) -> None:
        if new.get("roleRef") != old.get("roleRef"):
            name = str(old["metadata"].get("name", ""))
            raise errors.invalid(rtype.kind, name, [("roleRef", "cannot change roleRef")], RBAC_GROUP)
