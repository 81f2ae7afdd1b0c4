"""Pod Security Admission with the real kubectl against ``ambit apiserver``: the refusal in kube's words, the
``Warning:`` lines kubectl prints, and the attacks a pod's token might try to get a node-level pod.

Each test works in a namespace of its own (``psa-<test>``), so no test depends on another's objects.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import yaml
from tests.harness import ServerProcess
from tests.integration.apiserver_client import ApiClient, assert_status, ssl_context_from_kubeconfig

pytestmark = pytest.mark.kubectl

ENFORCE = "pod-security.kubernetes.io/enforce"
WARN = "pod-security.kubernetes.io/warn"


def pod(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "busybox", "command": ["sleep", "1"]}
    if spec.pop("privileged", False):
        container["securityContext"] = {"privileged": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container], **spec},
    }


@pytest.fixture
def ns(server_process: ServerProcess, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "psa-" + request.node.name.removeprefix("test_").replace("_", "-")[:40].strip("-")
    server_process.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        server_process.kubectl("delete", "namespace", name, "--wait=false", check=False)


def kubectl_fails(server: ServerProcess, *args: str, input: str | None = None) -> str:
    out = server.kubectl(*args, input=input, check=False)
    assert "Error from server" in out, out
    return out


def test_kubectl_shows_the_refusal_of_a_node_level_pod_in_kube_words(server_process: ServerProcess, ns: str) -> None:
    manifest = json.dumps(pod("x", ns, hostNetwork=True, privileged=True))
    out = kubectl_fails(server_process, "create", "-f", "-", input=manifest)
    assert (
        'Error from server (Forbidden): error when creating "STDIN": pods "x" is forbidden: violates PodSecurity '
        '"baseline:latest": host namespaces (hostNetwork=true), privileged (container "c" must not set '
        "securityContext.privileged=true)"
    ) in out
    assert "NotFound" in server_process.kubectl("get", "pod", "x", "-n", ns, check=False)


def test_kubectl_prints_the_warning_of_a_stricter_warn_level(server_process: ServerProcess, ns: str) -> None:
    server_process.kubectl("label", "namespace", ns, f"{WARN}=restricted")
    out = server_process.kubectl("create", "-f", "-", input=json.dumps(pod("plain", ns)), check=False)
    assert 'Warning: would violate PodSecurity "restricted:latest": allowPrivilegeEscalation != false' in out
    assert "pod/plain created" in out


def test_a_deployment_with_a_privileged_template_is_stored_with_a_warning(
    server_process: ServerProcess, ns: str
) -> None:
    template = pod("t", ns, privileged=True)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": template["spec"]},
        },
    }
    out = server_process.kubectl("apply", "-f", "-", input=yaml.safe_dump(deployment), check=False)
    assert (
        'Warning: would violate PodSecurity "baseline:latest": privileged (container "c" must not set '
        "securityContext.privileged=true)"
    ) in out
    assert "deployment.apps/d created" in out


def test_a_stricter_namespace_label_names_the_pods_that_would_violate_it(
    server_process: ServerProcess, ns: str
) -> None:
    server_process.kubectl("label", "namespace", ns, f"{ENFORCE}=privileged")
    server_process.kubectl("create", "-f", "-", input=json.dumps(pod("node-level", ns, hostPID=True)))
    out = server_process.kubectl(
        "label", "--dry-run=server", "--overwrite", "namespace", ns, f"{ENFORCE}=baseline", check=False
    )
    assert (
        f'Warning: existing pods in namespace "{ns}" violate the new PodSecurity enforce level "baseline:latest"' in out
    )
    assert "Warning: node-level: host namespaces" in out
    assert server_process.kubectl_json("get", "namespace", ns)["metadata"]["labels"][ENFORCE] == "privileged"


def test_an_invalid_level_label_is_refused(server_process: ServerProcess, ns: str) -> None:
    """kube refuses invalid PodSecurity labels on a namespace (422); one set before would read as restricted."""
    out = server_process.kubectl("label", "namespace", ns, f"{ENFORCE}=strict", check=False)
    assert out == (
        f'The Namespace "{ns}" is invalid: metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: '
        '"strict": must be one of privileged, baseline, restricted\n'
    )
    assert ENFORCE not in (server_process.kubectl_json("get", "namespace", ns)["metadata"].get("labels") or {})


# -- attacks with a pod's token ------------------------------------------------------------------------------
SAS = "/api/v1/namespaces/default/serviceaccounts"


@pytest.fixture
async def editor(server_process: ServerProcess) -> AsyncIterator[tuple[ApiClient, ApiClient, str]]:
    """(admin, a token of a service account allowed to ``edit`` in ``default``, that token)."""
    url = f"https://127.0.0.1:{server_process.port}"
    context = ssl_context_from_kubeconfig(server_process.kubeconfig)
    admin_token = (server_process.data_dir / "admin.token").read_text().strip()
    async with ApiClient(url, context, admin_token) as admin:
        assert (await admin.post(SAS, {"metadata": {"name": "psa-editor"}})).status in (201, 409)
        binding = {
            "metadata": {"name": "psa-editor-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": "psa-editor", "namespace": "default"}],
        }
        reply = await admin.post("/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", binding)
        assert reply.status in (201, 409), reply.body
        reply = await admin.post(f"{SAS}/psa-editor/token", {"spec": {}})
        assert reply.status == 201, reply.body
        token = str(reply.body["status"]["token"])
        async with ApiClient(url, context, token) as pod_client:
            yield admin, pod_client, token


@pytest.mark.parametrize(
    ("name", "spec", "violation"),
    [
        ("hostnet", {"hostNetwork": True}, "host namespaces (hostNetwork=true)"),
        ("priv", {"privileged": True}, 'privileged (container "c" must not set securityContext.privileged=true)'),
        (
            "hostroot",
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            'hostPath volumes (volume "root")',
        ),
    ],
)
async def test_a_pod_token_allowed_to_create_pods_cannot_create_a_node_level_pod(
    editor: tuple[ApiClient, ApiClient, str], name: str, spec: dict[str, Any], violation: str
) -> None:
    admin, attacker, _ = editor
    reply = await attacker.post("/api/v1/namespaces/default/pods", pod(f"psa-{name}", "default", **spec))
    status = assert_status(reply, 403, "Forbidden")
    assert status["message"] == (f'pods "psa-{name}" is forbidden: violates PodSecurity "baseline:latest": {violation}')
    assert (await admin.get(f"/api/v1/namespaces/default/pods/psa-{name}")).status == 404


async def test_a_pod_token_cannot_relabel_its_namespace_to_privileged(
    editor: tuple[ApiClient, ApiClient, str],
) -> None:
    admin, attacker, _ = editor
    patch = {"metadata": {"labels": {ENFORCE: "privileged"}}}
    reply = await attacker.patch("/api/v1/namespaces/default", patch)
    status = assert_status(reply, 403, "Forbidden")
    assert 'cannot patch resource "namespaces"' in status["message"]
    labels = (await admin.get("/api/v1/namespaces/default")).body["metadata"].get("labels") or {}
    assert ENFORCE not in labels


async def test_a_pod_token_cannot_create_a_pod_in_the_privileged_istio_system(
    server_process: ServerProcess, editor: tuple[ApiClient, ApiClient, str]
) -> None:
    admin, attacker, _ = editor
    labels = {m: "privileged" for m in (ENFORCE, WARN)}
    reply = await admin.post("/api/v1/namespaces", {"metadata": {"name": "istio-system", "labels": labels}})
    assert reply.status in (201, 409), reply.body
    reply = await attacker.post(
        "/api/v1/namespaces/istio-system/pods", pod("psa-escape", "istio-system", hostNetwork=True)
    )
    status = assert_status(reply, 403, "Forbidden")
    assert 'cannot create resource "pods" in API group "" in the namespace "istio-system"' in status["message"]


async def test_an_update_cannot_smuggle_a_privileged_container_into_an_admitted_pod(
    editor: tuple[ApiClient, ApiClient, str],
) -> None:
    admin, attacker, _ = editor
    assert (await attacker.post("/api/v1/namespaces/default/pods", pod("psa-later", "default"))).status == 201
    patch = {"spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]}}
    reply = await attacker.patch(
        "/api/v1/namespaces/default/pods/psa-later", patch, "application/strategic-merge-patch+json"
    )
    assert reply.status in (403, 422), reply.body  # PodSecurity, or the immutable pod spec before it
    stored = (await admin.get("/api/v1/namespaces/default/pods/psa-later")).body
    assert "securityContext" not in stored["spec"]["containers"][0]
    await admin.delete("/api/v1/namespaces/default/pods/psa-later")
