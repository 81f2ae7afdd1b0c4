"""The bootstrap ClusterRoles and ClusterRoleBindings kube-apiserver creates, with their real names and rules (a
subset: the kinds this server serves and the ones kubectl users expect).

``admin``, ``edit`` and ``view`` are aggregated, as in kube: their rules are the union of the ClusterRoles carrying
``rbac.authorization.k8s.io/aggregate-to-<name>: "true"``; ``system:aggregate-to-*`` hold the built-in part, and
``edit`` aggregates into ``admin``, ``view`` into ``edit``. Pure data; the authorizer installs it at start.
"""

from __future__ import annotations

from typing import Any

READ = ["get", "list", "watch"]
WRITE = ["create", "delete", "deletecollection", "patch", "update"]
READ_WRITE = READ + WRITE
AGG = "rbac.authorization.k8s.io/aggregate-to-"
DEFAULTS_LABEL = {"kubernetes.io/bootstrapping": "rbac-defaults"}
DISCOVERY_URLS = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz"]
DISCOVERY_URLS += ["/version", "/version/"]
PUBLIC_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]


def _rule(verbs: list[str], groups: list[str], resources: list[str]) -> dict[str, Any]:
    return {"verbs": verbs, "apiGroups": groups, "resources": resources}


def _role(name: str, rules: list[dict[str, Any]], labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {**DEFAULTS_LABEL, **(labels or {})},
        "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
    }
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": meta,
        "rules": rules,
        **extra,
    }


def _aggregated(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    selector = {"matchLabels": {AGG + name: "true"}}
    return _role(name, [], labels, aggregationRule={"clusterRoleSelectors": [selector]})


def _binding(name: str, role: str, groups: list[str], users: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": name,
            "labels": dict(DEFAULTS_LABEL),
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in groups]
        + [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u} for u in users],
    }


_VIEW = [
    _rule(
        READ,
        [""],
        [
            "pods",
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "serviceaccounts",
            "services",
            "services/status",
            "endpoints",
            "persistentvolumeclaims",
            "persistentvolumeclaims/status",
            "configmaps",
        ],
    ),
    _rule(
        READ,
        [""],
        [
            "limitranges",
            "resourcequotas",
            "bindings",
            "events",
            "pods/status",
            "resourcequotas/status",
            "namespaces/status",
            "replicationcontrollers/status",
            "pods/log",
        ],
    ),
    _rule(READ, [""], ["namespaces"]),
    _rule(READ, ["discovery.k8s.io"], ["endpointslices"]),
    _rule(
        READ,
        ["apps"],
        [
            "controllerrevisions",
            "statefulsets",
            "statefulsets/scale",
            "statefulsets/status",
            "daemonsets",
            "daemonsets/status",
            "deployments",
            "deployments/scale",
            "deployments/status",
            "replicasets",
            "replicasets/scale",
            "replicasets/status",
        ],
    ),
    _rule(READ, ["events.k8s.io"], ["events"]),
    _rule(READ, ["batch"], ["cronjobs", "cronjobs/status", "jobs", "jobs/status"]),
    _rule(READ, ["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"]),
    _rule(READ, ["autoscaling"], ["horizontalpodautoscalers", "horizontalpodautoscalers/status"]),
    _rule(READ, ["networking.k8s.io"], ["ingresses", "ingresses/status", "networkpolicies"]),
]
_EDIT = [
    _rule(["impersonate"], [""], ["serviceaccounts"]),
    _rule(WRITE, [""], ["pods", "pods/attach", "pods/proxy", "pods/exec", "pods/portforward"]),
    _rule(["create"], [""], ["pods/eviction"]),
    _rule(
        WRITE,
        [""],
        [
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "serviceaccounts",
            "services",
            "services/proxy",
            "persistentvolumeclaims",
            "configmaps",
            "secrets",
            "events",
        ],
    ),
    _rule(["create"], [""], ["serviceaccounts/token"]),
    _rule(
        WRITE,
        ["apps"],
        [
            "statefulsets",
            "statefulsets/scale",
            "daemonsets",
            "deployments",
            "deployments/scale",
            "deployments/rollback",
            "replicasets",
            "replicasets/scale",
        ],
    ),
    _rule(WRITE, ["batch"], ["cronjobs", "jobs"]),
    _rule(READ, [""], ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"]),
    _rule(WRITE, ["discovery.k8s.io"], ["endpointslices"]),
    _rule(WRITE, ["policy"], ["poddisruptionbudgets"]),
    _rule(WRITE, ["autoscaling"], ["horizontalpodautoscalers"]),
    _rule(WRITE, ["networking.k8s.io"], ["ingresses", "networkpolicies"]),
]
_ADMIN = [
    _rule(["create"], ["authorization.k8s.io"], ["localsubjectaccessreviews"]),
    _rule(READ_WRITE, ["rbac.authorization.k8s.io"], ["roles", "rolebindings"]),
]


CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
KUBE_PROXY_USER = "system:kube-proxy"

# What the lab's controller process does (scheduler included: the lab runs it in the same process, so this role
# also binds pods to nodes), and no more: kube's role of this name reads every resource; this one reads what the
# controllers watch and never Secrets.
_CONTROLLER_MANAGER = [
    _rule(READ, [""], ["pods", "nodes", "services", "endpoints", "namespaces", "events"]),
    _rule(READ, ["apps"], ["deployments", "replicasets", "daemonsets", "statefulsets", "controllerrevisions"]),
    _rule(READ, ["discovery.k8s.io"], ["endpointslices"]),
    _rule(READ, ["policy"], ["poddisruptionbudgets"]),
    _rule(READ, ["scheduling.k8s.io"], ["priorityclasses"]),
    # The Job, CronJob and TTL-after-finished controllers: Jobs made, replaced and deleted, both statuses
    # written, and the job-tracking finalizer taken off pods (a pod patch, granted above).
    _rule([*READ, "create", "delete", "patch", "update"], ["batch"], ["jobs", "cronjobs"]),
    _rule(["patch", "update"], ["batch"], ["jobs/status", "cronjobs/status"]),
    _rule(["create", "delete", "patch", "update"], [""], ["pods", "endpoints"]),
    _rule(["patch", "update"], [""], ["pods/status"]),
    # The lab's load balancer writes LoadBalancer Services' addresses (kube's service controller does).
    _rule(["patch", "update"], [""], ["services/status"]),
    _rule(["create"], [""], ["pods/binding", "pods/eviction"]),
    _rule(["create", "delete", "patch", "update"], ["apps"], ["replicasets", "controllerrevisions"]),
    _rule(["patch", "update"], ["apps"], ["deployments", "daemonsets"]),
    _rule(
        ["patch", "update"],
        ["apps"],
        ["deployments/status", "replicasets/status", "daemonsets/status", "statefulsets/status"],
    ),
    _rule(["create", "delete", "patch", "update"], ["discovery.k8s.io"], ["endpointslices"]),
    _rule(["patch", "update"], ["policy"], ["poddisruptionbudgets/status"]),
    _rule(["create", "patch", "update"], ["", "events.k8s.io"], ["events"]),
    # kube's persistent-volume-binder, pvc-protection and pv-protection controllers (the lab's local-path
    # provisioner runs in the same process and needs no more than the binder).
    _rule(["create", "delete", "get", "list", "update", "patch", "watch"], [""], ["persistentvolumes"]),
    _rule(["update", "patch"], [""], ["persistentvolumes/status", "persistentvolumeclaims/status"]),
    _rule(["create", "delete", "get", "list", "update", "patch", "watch"], [""], ["persistentvolumeclaims"]),
    _rule(READ, ["storage.k8s.io"], ["storageclasses"]),
]
# kube's system:persistent-volume-provisioner: what an external provisioner (rancher's local-path provisioner's
# service account, on kind) needs; bound to nobody by default.
_VOLUME_PROVISIONER = [
    _rule(["create", "delete", "get", "list", "watch"], [""], ["persistentvolumes"]),
    _rule(["get", "list", "update", "watch"], [""], ["persistentvolumeclaims"]),
    _rule(["list", "watch"], ["storage.k8s.io"], ["storageclasses"]),
    _rule(["create", "patch", "update", "watch"], [""], ["events"]),
]
# kube's system:node-proxier: what a service proxy reads to program Service rules.
_NODE_PROXIER = [
    _rule(["list", "watch"], [""], ["services", "endpoints"]),
    _rule(READ, [""], ["nodes"]),
    _rule(["list", "watch"], ["discovery.k8s.io"], ["endpointslices"]),
    _rule(["create", "patch", "update"], ["", "events.k8s.io"], ["events"]),
]

NODES_GROUP = "system:nodes"
NODE_NETWORK_POLICIES = "system:node-network-policies"
# What a lab node reads to enforce NetworkPolicies for its pods (ambit.lab.network.policies_apply), as
# kube-network-policies' ClusterRole: policies, and the pods and namespaces their selectors choose from.
_NODE_NETWORK_POLICIES = [
    _rule(["list", "watch"], [""], ["pods", "namespaces"]),
    _rule(["list", "watch"], ["networking.k8s.io"], ["networkpolicies"]),
]


def cluster_roles() -> list[dict[str, Any]]:
    """The bootstrap ClusterRoles (fresh objects on every call)."""
    return [
        _role(
            "cluster-admin",
            [_rule(["*"], ["*"], ["*"]), {"verbs": ["*"], "nonResourceURLs": ["*"]}],
        ),
        _aggregated("admin"),
        _aggregated("edit", {AGG + "admin": "true"}),
        _aggregated("view", {AGG + "edit": "true"}),
        _role("system:aggregate-to-admin", _ADMIN, {AGG + "admin": "true"}),
        _role("system:aggregate-to-edit", _EDIT, {AGG + "admin": "true", AGG + "edit": "true"}),
        _role("system:aggregate-to-view", _VIEW, {AGG + "admin": "true", AGG + "edit": "true", AGG + "view": "true"}),
        _role("system:discovery", [{"verbs": ["get"], "nonResourceURLs": DISCOVERY_URLS}]),
        _role(
            "system:basic-user",
            [
                _rule(["create"], ["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]),
            ],
        ),
        _role("system:public-info-viewer", [{"verbs": ["get"], "nonResourceURLs": PUBLIC_URLS}]),
        _role("system:kube-controller-manager", _CONTROLLER_MANAGER),
        _role("system:node-proxier", _NODE_PROXIER),
        _role(NODE_NETWORK_POLICIES, _NODE_NETWORK_POLICIES),
        _role("system:persistent-volume-provisioner", _VOLUME_PROVISIONER),
    ]


def cluster_role_bindings() -> list[dict[str, Any]]:
    return [
        _binding("cluster-admin", "cluster-admin", ["system:masters"]),
        _binding("system:discovery", "system:discovery", ["system:authenticated"]),
        _binding("system:basic-user", "system:basic-user", ["system:authenticated"]),
        _binding(
            "system:public-info-viewer", "system:public-info-viewer", ["system:authenticated", "system:unauthenticated"]
        ),
        _binding("system:kube-controller-manager", "system:kube-controller-manager", [], (CONTROLLER_MANAGER_USER,)),
        _binding("system:node-proxier", "system:node-proxier", [], (KUBE_PROXY_USER,)),
        _binding(NODE_NETWORK_POLICIES, NODE_NETWORK_POLICIES, [NODES_GROUP]),
    ]
