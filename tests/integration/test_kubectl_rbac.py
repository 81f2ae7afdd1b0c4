"""The real kubectl against ``ambit apiserver``: RBAC objects through get/apply/delete, and ``kubectl auth can-i``
(SelfSubjectAccessReview, SelfSubjectRulesReview, impersonation with ``--as``) for users and the components."""

from __future__ import annotations

import json

import pytest
from tests.harness import ServerProcess

pytestmark = pytest.mark.kubectl

SA = "system:serviceaccount:apps:default"
ROLE_AND_BINDING = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "pod-reader", "namespace": "apps"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "pod-reader", "namespace": "apps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "apps"}],
    },
]


@pytest.fixture(scope="module")
def kube(server_process: ServerProcess) -> ServerProcess:
    for ns in ("apps", "istio-system"):
        server_process.kubectl("create", "namespace", ns)
    for name in ("istiod", "ztunnel", "istio-cni"):
        server_process.kubectl("create", "serviceaccount", name, "-n", "istio-system")
    return server_process


def can_i(kube: ServerProcess, *args: str) -> str:
    """kubectl's answer (its first line; a warning about cluster-scoped resources may follow, as with kube)."""
    return kube.kubectl("auth", "can-i", *args, check=False).strip().splitlines()[0]


def test_admin_can_do_anything(kube: ServerProcess) -> None:
    assert can_i(kube, "get", "secrets", "-n", "istio-system") == "yes"
    assert can_i(kube, "delete", "namespaces") == "yes"
    assert can_i(kube, "get", "/healthz") == "yes"
    listed = kube.kubectl("auth", "can-i", "--list")
    assert "*.*" in listed and "[*]" in listed


def test_default_service_account_cannot(kube: ServerProcess) -> None:
    as_sa = f"--as={SA}"
    for args in (("create", "pods"), ("get", "secrets", "-n", "istio-system"), ("delete", "namespaces")):
        assert can_i(kube, *args, as_sa).startswith("no"), args
    assert can_i(kube, "create", "selfsubjectaccessreviews", as_sa) == "yes"
    assert can_i(kube, "get", "/apis", as_sa) == "yes"


def test_rbac_objects_through_kubectl_apply_get_delete(kube: ServerProcess) -> None:
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": ROLE_AND_BINDING}))
    names = kube.kubectl("get", "roles,rolebindings", "-n", "apps", "-o", "name").split()
    assert names == ["role.rbac.authorization.k8s.io/pod-reader", "rolebinding.rbac.authorization.k8s.io/pod-reader"]
    assert "cluster-admin" in kube.kubectl("get", "clusterroles", "-o", "name")
    as_sa = f"--as={SA}"
    assert can_i(kube, "list", "pods", "-n", "apps", as_sa) == "yes"
    assert can_i(kube, "get", "pods", "--subresource=log", "-n", "apps", as_sa) == "yes"
    assert can_i(kube, "list", "pods", "-n", "default", as_sa).startswith("no")
    assert can_i(kube, "delete", "pods", "-n", "apps", as_sa).startswith("no")
    kube.kubectl("delete", "rolebinding", "pod-reader", "-n", "apps")
    assert can_i(kube, "list", "pods", "-n", "apps", as_sa).startswith("no")
    kube.kubectl("delete", "role", "pod-reader", "-n", "apps")


@pytest.mark.parametrize("account", ["istiod", "ztunnel", "istio-cni"])
def test_can_i_list_for_each_component(kube: ServerProcess, account: str) -> None:
    out = kube.kubectl("auth", "can-i", "--list", f"--as=system:serviceaccount:istio-system:{account}")
    resources = {line.split()[0] for line in out.strip().splitlines()[1:]}
    granted = {r for r in resources if not r.startswith("[")}
    basic = {"selfsubjectaccessreviews.authorization.k8s.io", "selfsubjectrulesreviews.authorization.k8s.io"}
    if account == "ztunnel":
        assert granted == basic, out
    elif account == "istio-cni":
        assert granted == basic | {"pods", "pods/status", "namespaces", "events", "events.events.k8s.io"}, out
    else:
        assert {"pods", "services", "endpointslices.discovery.k8s.io", "tokenreviews.authentication.k8s.io"} <= granted
        [secrets] = [line for line in out.splitlines() if line.split()[0] == "secrets"]
        assert secrets.split()[-3:] == ["[get", "list", "watch]"], out  # read only: gateway certificates
        return
    assert "secrets" not in resources
