"""kubectl's imperative commands against ``ambit apiserver``: their typed clients send protobuf bodies.

``kubectl create configmap|secret|namespace|serviceaccount|token|deployment|service`` encode the object as
``application/vnd.kubernetes.protobuf``; the server answers JSON, which client-go decodes by the response's
Content-Type. Each test runs the real command and checks what was stored.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from tests.harness import ServerProcess

from ambit.tls.certs import issue_server_cert, new_ca

pytestmark = pytest.mark.kubectl

NS = "pb"


@pytest.fixture(scope="module")
def kube(server_process: ServerProcess) -> ServerProcess:
    server_process.kubectl("create", "namespace", NS)
    return server_process


def _claims(token: str) -> dict[str, Any]:
    payload = token.strip().split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def _data(obj: dict[str, Any]) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in obj["data"].items()}


def test_the_body_really_is_protobuf_and_the_json_answer_is_understood(kube: ServerProcess) -> None:
    out = kube.kubectl("create", "configmap", "wire", "-n", NS, "--from-literal=a=b", "-v=8", check=False)
    assert "Content-Type: application/vnd.kubernetes.protobuf" in out
    assert "configmap/wire created" in out
    assert kube.kubectl_json("get", "configmap", "wire", "-n", NS)["data"] == {"a": "b"}


def test_create_namespace(kube: ServerProcess) -> None:
    kube.kubectl("create", "namespace", "pb-extra")
    ns = kube.kubectl_json("get", "namespace", "pb-extra")
    assert ns["metadata"]["labels"]["kubernetes.io/metadata.name"] == "pb-extra"
    assert ns["status"] == {"phase": "Active"}


def test_create_configmap_from_literals_and_a_binary_file(kube: ServerProcess, tmp_path: Path) -> None:
    blob = bytes(range(256)) * 4
    (tmp_path / "blob.bin").write_bytes(blob)
    (tmp_path / "note.txt").write_text("héllo\n")
    kube.kubectl(
        "create", "configmap", "settings", "-n", NS, "--from-literal=mode=fast", "--from-literal=empty=",
        f"--from-file={tmp_path / 'blob.bin'}", f"--from-file={tmp_path / 'note.txt'}",
    )  # fmt: skip
    cm = kube.kubectl_json("get", "configmap", "settings", "-n", NS)
    assert cm["data"] == {"mode": "fast", "empty": "", "note.txt": "héllo\n"}
    assert base64.b64decode(cm["binaryData"]["blob.bin"]) == blob
    assert cm["metadata"]["namespace"] == NS and cm["metadata"]["uid"]


def test_server_side_dry_run_stores_nothing(kube: ServerProcess) -> None:
    out = kube.kubectl("create", "configmap", "dry", "-n", NS, "--from-literal=a=b", "--dry-run=server")
    assert "created (server dry run)" in out
    assert "NotFound" in kube.kubectl("get", "configmap", "dry", "-n", NS, check=False)


def test_create_secrets_generic_tls_and_docker_registry(kube: ServerProcess, tmp_path: Path) -> None:
    kube.kubectl("create", "secret", "generic", "creds", "-n", NS, "--from-literal=user=admin", "--from-literal=pw=s3")
    secret = kube.kubectl_json("get", "secret", "creds", "-n", NS)
    assert secret["type"] == "Opaque"
    assert _data(secret) == {"user": b"admin", "pw": b"s3"}

    ca = new_ca("pb-test-ca", now=time.time())
    pair = issue_server_cert(ca, common_name="web.example", dns_names=["web.example"], ip_addresses=[], now=time.time())
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    kube.kubectl(
        "create",
        "secret",
        "tls",
        "web-tls",
        "-n",
        NS,
        f"--cert={tmp_path / 'tls.crt'}",
        f"--key={tmp_path / 'tls.key'}",
    )
    tls = kube.kubectl_json("get", "secret", "web-tls", "-n", NS)
    assert tls["type"] == "kubernetes.io/tls"
    assert _data(tls) == {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem}

    kube.kubectl(
        "create", "secret", "docker-registry", "pull", "-n", NS,
        "--docker-server=registry.example", "--docker-username=u", "--docker-password=p",
    )  # fmt: skip
    pull = kube.kubectl_json("get", "secret", "pull", "-n", NS)
    assert pull["type"] == "kubernetes.io/dockerconfigjson"
    config = json.loads(_data(pull)[".dockerconfigjson"])
    assert config["auths"]["registry.example"]["username"] == "u"


def test_create_serviceaccount_and_tokens(kube: ServerProcess) -> None:
    kube.kubectl("create", "serviceaccount", "robot", "-n", NS)
    sa = kube.kubectl_json("get", "serviceaccount", "robot", "-n", NS)

    claims = _claims(kube.kubectl("create", "token", "robot", "-n", NS))
    assert claims["sub"] == f"system:serviceaccount:{NS}:robot"
    assert claims["kubernetes.io"]["serviceaccount"]["uid"] == sa["metadata"]["uid"]

    claims = _claims(kube.kubectl("create", "token", "robot", "-n", NS, "--audience=istio-ca", "--duration=2h"))
    assert claims["aud"] == ["istio-ca"]
    assert claims["exp"] - claims["iat"] == 7200

    runs_as_robot = '--overrides={"spec": {"serviceAccountName": "robot"}}'  # a token binds only to its own pods
    kube.kubectl(
        "run", "holder", "-n", NS, "--image=busybox:1.36", "--restart=Never", runs_as_robot, "--", "sleep", "3600"
    )
    pod = kube.kubectl_json("get", "pod", "holder", "-n", NS)
    claims = _claims(
        kube.kubectl("create", "token", "robot", "-n", NS, "--bound-object-kind=Pod", "--bound-object-name=holder")
    )
    assert claims["kubernetes.io"]["pod"] == {"name": "holder", "uid": pod["metadata"]["uid"]}


def test_create_deployment_then_expose_it(kube: ServerProcess) -> None:
    kube.kubectl("create", "deployment", "web", "-n", NS, "--image=nginx:1.27", "--replicas=2", "--port=80")
    deploy = kube.kubectl_json("get", "deployment", "web", "-n", NS)
    spec = deploy["spec"]
    assert spec["replicas"] == 2
    assert spec["selector"] == {"matchLabels": {"app": "web"}}
    assert spec["template"]["metadata"]["labels"] == {"app": "web"}
    [container] = spec["template"]["spec"]["containers"]
    assert container["name"] == "nginx" and container["image"] == "nginx:1.27"
    assert container["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert spec["strategy"]["type"] == "RollingUpdate"  # defaulted: the empty strategy was not sent as a value

    kube.kubectl("create", "deployment", "idle", "-n", NS, "--image=nginx:1.27", "--replicas=0")
    assert kube.kubectl_json("get", "deployment", "idle", "-n", NS)["spec"]["replicas"] == 0

    kube.kubectl("expose", "deployment", "web", "-n", NS, "--port=8080", "--target-port=80", "--name=web-svc")
    svc = kube.kubectl_json("get", "service", "web-svc", "-n", NS)
    assert svc["spec"]["selector"] == {"app": "web"}
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(8080, 80)]


@pytest.mark.parametrize(
    ("kind", "args", "expected_type"),
    [
        ("clusterip", ["--tcp=80:8080"], "ClusterIP"),
        ("nodeport", ["--tcp=80:8080"], "NodePort"),
        ("loadbalancer", ["--tcp=443:8443"], "LoadBalancer"),
        ("externalname", ["--external-name=db.example.com"], "ExternalName"),
    ],
)
def test_create_service(kube: ServerProcess, kind: str, args: list[str], expected_type: str) -> None:
    name = f"svc-{kind}"
    kube.kubectl("create", "service", kind, name, "-n", NS, *args)
    svc = kube.kubectl_json("get", "service", name, "-n", NS)
    spec = svc["spec"]
    assert spec["type"] == expected_type
    assert spec["selector"] == {"app": name}
    if expected_type == "ExternalName":
        assert spec["externalName"] == "db.example.com"
        assert "ports" not in spec
    else:
        [port] = spec["ports"]
        port_number, target = (443, 8443) if expected_type == "LoadBalancer" else (80, 8080)
        assert (port["port"], port["targetPort"], port["protocol"]) == (port_number, target, "TCP")


def test_run_a_pod(kube: ServerProcess) -> None:
    kube.kubectl(
        "run", "worker", "-n", NS, "--image=busybox:1.36", "--labels=app=worker", "--env=MODE=batch", "--port=9000",
        "--restart=Never", "--", "sleep", "60",
    )  # fmt: skip
    pod = kube.kubectl_json("get", "pod", "worker", "-n", NS)
    assert pod["metadata"]["labels"] == {"app": "worker"}
    [container] = pod["spec"]["containers"]
    assert container["env"] == [{"name": "MODE", "value": "batch"}]
    assert container["args"] == ["sleep", "60"]
    assert container["ports"][0]["containerPort"] == 9000
