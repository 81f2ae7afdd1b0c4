"""deploy/ renders with kubectl's own kustomize, and what it renders is what a Kubernetes 1.32 API server accepts.

Every object of the base and of the lab overlay is validated against the Kubernetes 1.32 OpenAPI schemas with
``kubernetes-validate`` (strict: unknown fields are errors); custom resources (the samples below and those of
examples/) against the openAPIV3Schema of their CRD in deploy/crds, also strictly. The RBAC in deploy/ is checked
against the ``kubectl auth can-i --list`` golden files of tests/security: what the roles grant each component is
exactly what those files list, beyond kube's defaults. The image is named once, and the Containerfile builds it.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ambit.controlplane.webhook.registration import CONFIGURATION_NAME, webhook_configuration
from ambit.inpod.settings import parse_drain_deadline, parse_drain_max

pytestmark = pytest.mark.kubectl

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZATIONS = ("base", "overlays/lab")
K8S_VERSION = "1.32.0"
GOLDEN = ROOT / "tests" / "security" / "golden" / "can-i"


@cache
def rendered(kustomization: str) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl renders the kustomizations"
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / kustomization)], capture_output=True, text=True, check=True
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc is not None)


def of_kind(kind: str, kustomization: str = "base") -> list[dict[str, Any]]:
    return [doc for doc in rendered(kustomization) if doc["kind"] == kind]


def _id(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


# -- Kubernetes' own schemas --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kustomization", [*KUSTOMIZATIONS, "lab-dns"])
def test_every_object_validates_against_the_kubernetes_1_32_schemas(kustomization: str) -> None:
    failures = []
    for doc in rendered(kustomization):
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{_id(doc)}: {exc.message} at {'.'.join(map(str, exc.path))}")
    assert failures == []


def test_the_validator_rejects_a_misspelt_field_so_the_check_above_means_something() -> None:
    (deployment,) = of_kind("Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = bad["spec"]["template"]["spec"]["containers"][
        0
    ].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_base_holds_the_expected_objects() -> None:
    names = {_id(doc) for doc in rendered("base")}
    assert {
        "Namespace/istio-system",
        "ServiceAccount/istiod",
        "ServiceAccount/istio-cni",
        "ServiceAccount/ztunnel",
        "Deployment/istiod",
        "ConfigMap/istio",
        "Service/istiod",
        "PodDisruptionBudget/istiod",
        "ValidatingWebhookConfiguration/istio-validator-ambit",
        "DaemonSet/istio-cni-node",
        "DaemonSet/ztunnel",
    } <= names
    crds = {doc["metadata"]["name"] for doc in of_kind("CustomResourceDefinition")}
    assert "authorizationpolicies.security.istio.io" in crds and "httproutes.gateway.networking.k8s.io" in crds


def test_the_crds_of_the_base_are_the_files_the_api_server_installs() -> None:
    on_disk = [
        doc
        for path in sorted((DEPLOY / "crds").glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]
    rendered_crds = {doc["metadata"]["name"]: doc["spec"] for doc in of_kind("CustomResourceDefinition")}
    assert rendered_crds == {doc["metadata"]["name"]: doc["spec"] for doc in on_disk}


def test_system_namespace_admits_privileged_pods() -> None:
    (namespace,) = of_kind("Namespace")
    labels = namespace["metadata"]["labels"]
    assert {labels[f"pod-security.kubernetes.io/{mode}"] for mode in ("enforce", "audit", "warn")} == {"privileged"}


# -- the workloads' shape (spec §1) -------------------------------------------------------------------------------
def _pod(kind: str, name: str, kustomization: str = "base") -> dict[str, Any]:
    (doc,) = [d for d in of_kind(kind, kustomization) if d["metadata"]["name"] == name]
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def test_node_agent_runs_on_the_host_network_privileged_on_every_node() -> None:
    pod = _pod("DaemonSet", "istio-cni-node")
    assert pod["hostNetwork"] is True and pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"operator": "Exists", "effect": "NoExecute"} in pod["tolerations"]
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is True
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/var/run/netns"]["mountPropagation"] == "HostToContainer"
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {"/opt/cni/bin", "/etc/cni/net.d", "/var/run/netns", "/var/run/ztunnel", "/var/run/istio-cni"} <= host_paths
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8000}


def test_node_proxy_has_its_own_netns_three_capabilities_and_only_an_istio_ca_token() -> None:
    (daemonset,) = [d for d in of_kind("DaemonSet") if d["metadata"]["name"] == "ztunnel"]
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = daemonset["spec"]["template"]["spec"]
    assert not pod.get("hostNetwork") and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN", "NET_RAW"]}
    assert not context.get("privileged") and context["allowPrivilegeEscalation"] is False
    (token,) = [v for v in pod["volumes"] if v["name"] == "istio-token"]
    (source,) = token["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "istio-ca"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["istio-token"] + "/" + source["serviceAccountToken"]["path"] == "/var/run/secrets/tokens/istio-token"
    assert mounts["istiod-ca-cert"] == "/var/run/secrets/istio"
    env = {e["name"]: e for e in container["env"]}
    assert env["XDS_ADDRESS"]["value"] == env["CA_ADDRESS"]["value"] == "istiod.istio-system.svc:15012"
    assert env["INSTANCE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz/ready", "port": 15021}
    # scraped like Istio's ztunnel (and our waypoints): the stats port serves both paths
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/port": "15020",
        "prometheus.io/scrape": "true",
        "prometheus.io/path": "/stats/prometheus",
    }


def test_node_proxy_drains_25_s_without_a_successor_and_up_to_an_hour_after_a_hand_over_within_its_grace() -> None:
    """Without a successor the proxy drains as ztunnel's chart makes it (25 s, ztunnel's
    CONNECTION_TERMINATION_DEADLINE); after a hand-over up to DRAIN_MAX, which the grace period covers with 5 s to
    close what is left before the kubelet's SIGKILL (issue 21). TERMINATION_GRACE_PERIOD_SECONDS matches it."""
    (daemonset,) = [d for d in of_kind("DaemonSet") if d["metadata"]["name"] == "ztunnel"]
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TERMINATION_GRACE_PERIOD_SECONDS"] == str(pod["terminationGracePeriodSeconds"])
    deadline = parse_drain_deadline(None, env)
    assert deadline == 25.0
    assert parse_drain_max(None, env, deadline) == 3600.0 == pod["terminationGracePeriodSeconds"] - 5


def test_node_proxy_mounts_the_crl_config_map_optionally_where_crl_path_points() -> None:
    (daemonset,) = [d for d in of_kind("DaemonSet") if d["metadata"]["name"] == "ztunnel"]
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "istio-ca-crl"]
    assert volume["configMap"] == {"name": "istio-ca-crl", "optional": True}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert mounts["istio-ca-crl"] == "/var/run/secrets/istio/crl"  # Istio's chart, with peerCaCrl.enabled
    assert env["CRL_PATH"] == mounts["istio-ca-crl"] + "/ca-crl.pem"  # the map's key, as the control plane writes


def test_the_precreated_webhook_has_the_control_planes_rules_and_fails_open_until_it_has_a_ca_bundle() -> None:
    (config,) = of_kind("ValidatingWebhookConfiguration")
    assert config["metadata"]["name"] == CONFIGURATION_NAME
    (webhook,) = config["webhooks"]
    (ours,) = webhook_configuration("https://x", b"")["webhooks"]
    assert webhook["name"] == ours["name"] and webhook["rules"] == ours["rules"]
    assert "caBundle" not in webhook["clientConfig"] and webhook["failurePolicy"] == "Ignore"
    service = webhook["clientConfig"]["service"]
    (svc,) = of_kind("Service")
    assert (service["name"], service["namespace"]) == (svc["metadata"]["name"], svc["metadata"]["namespace"])
    assert service["port"] in {p["port"] for p in svc["spec"]["ports"]}


def test_lab_overlay_changes_only_the_pull_policy_the_control_plane_address_dry_run_and_the_cert_lifetime() -> None:
    for kind, name in (("Deployment", "istiod"), ("DaemonSet", "istio-cni-node"), ("DaemonSet", "ztunnel")):
        base, lab = _pod(kind, name), _pod(kind, name, "overlays/lab")
        (b,), (c,) = base["containers"], lab["containers"]
        assert c["imagePullPolicy"] == "Never" and c["command"] == b["command"] == ["ambit"]
        added = ["--enable-dry-run"] if name == "istiod" else []  # the lab's control plane sends dry-run policies
        assert c["args"] == b["args"] + added and c["volumeMounts"] == b["volumeMounts"]
        changed = {e["name"] for e in c["env"]} ^ {e["name"] for e in b["env"]}
        # Lab certificates live 2 minutes (Istio's ambient suite: 5), so a rotated CA reaches ztunnel within a minute.
        expected = {"SECRET_TTL"} if name == "ztunnel" else set()
        assert changed == expected, f"{name}: the overlay adds or drops variables {changed ^ expected}"
    (proxy,) = _pod("DaemonSet", "ztunnel", "overlays/lab")["containers"]
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    (service,) = [s for s in of_kind("Service", "overlays/lab") if s["metadata"]["name"] == "istiod"]
    address = f"{service['spec']['clusterIP']}:15012"
    assert env["CA_ADDRESS"] == env["XDS_ADDRESS"] == address
    assert env["SECRET_TTL"] == "2m"
    # The overlay patches variables by position: a variable inserted before them would be overwritten silently.
    assert env["HBONE_TLS_TRANSPORT"] == "socket"
    assert env["AMBIT_NATIVE_DATA"] == "1"  # step 2 of docs/native-data-path.md, measured on the lab in session 35


def test_no_container_names_an_environment_variable_twice() -> None:
    # Kubernetes keeps the last of two equal names: a positional patch gone wrong shows up as a duplicate.
    for kustomization in KUSTOMIZATIONS:
        for kind in ("Deployment", "DaemonSet"):
            for doc in of_kind(kind, kustomization):
                for c in doc["spec"]["template"]["spec"]["containers"]:
                    names = [e["name"] for e in c.get("env", [])]
                    assert len(names) == len(set(names)), f"{_id(doc)}: {sorted(names)}"


# -- the image: one name, one Containerfile ----------------------------------------------------------------------
def _kustomize_image() -> str:
    (image,) = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())["images"]
    return f"{image['newName']}:{image['newTag']}"


def test_every_container_uses_the_one_image_of_the_kustomization() -> None:
    for kustomization in KUSTOMIZATIONS:
        for kind in ("Deployment", "DaemonSet"):
            for doc in of_kind(kind, kustomization):
                for c in doc["spec"]["template"]["spec"]["containers"]:
                    assert c["image"] == _kustomize_image(), _id(doc)
    for path in DEPLOY.rglob("*.yaml"):
        named = set(re.findall(r"^\s*image:\s*(\S+)", path.read_text(), re.M))
        assert named <= {"ambit"}, f"{path} names an image; only the kustomization's images: may"


def test_component_pods_carry_istios_name_and_version_labels() -> None:
    """As Istio's charts: ``app.kubernetes.io/name`` and ``app.kubernetes.io/version`` (the Istio version Ambit
    states), which the mesh reads as the pods' canonical service and revision (their metrics' ``*_canonical_*``)."""
    from ambit import ISTIO_VERSION

    names = {}
    for kind in ("Deployment", "DaemonSet"):
        for doc in of_kind(kind, "base"):
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert labels["app.kubernetes.io/version"] == ISTIO_VERSION, _id(doc)
            names[doc["metadata"]["name"]] = labels["app.kubernetes.io/name"]
    assert names == {"istiod": "istiod", "istio-cni-node": "istio-cni", "ztunnel": "ztunnel"}


def _containerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined, comments dropped."""
    lines: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "Containerfile").read_text().splitlines():
        if not pending and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        pending += raw.rstrip().removesuffix("\\") + " " if raw.rstrip().endswith("\\") else raw
        if not raw.rstrip().endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            lines.append((word, rest.strip()))
            pending = ""
    assert not pending, "a continuation line ends the file"
    return lines


def test_containerfile_parses_and_builds_the_image_the_kustomization_names() -> None:
    instructions = _containerfile()
    known = {"FROM", "RUN", "COPY", "WORKDIR", "LABEL", "USER", "ENTRYPOINT", "CMD", "ENV", "ARG"}
    assert {word for word, _ in instructions} <= known
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert froms and all(f.split()[0] == "docker.io/library/debian:12-slim" for f in froms)
    (entrypoint,) = [rest for word, rest in instructions if word == "ENTRYPOINT"]
    assert entrypoint == '["ambit"]'
    labels = " ".join(rest for word, rest in instructions if word == "LABEL")
    assert f'io.ambit.image="{_kustomize_image()}"' in labels
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f'org.opencontainers.image.version="{version}"' in labels
    assert _kustomize_image().endswith(f":{version}")
    run = " ".join(rest for word, rest in instructions if word == "RUN")
    assert "nftables" in run and "iproute2" in run and "/usr/local/bin/ambit" in run


# -- custom resources against their CRD's schema ------------------------------------------------------------------
def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused where the CRD does not preserve them (kubectl's strict validation)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and "additionalProperties" not in schema and not preserve:
        out["additionalProperties"] = False
    return out


def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    group, _, version = api_version.rpartition("/")
    for crd in of_kind("CustomResourceDefinition"):
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
            for v in crd["spec"]["versions"]:
                if v["name"] == version:
                    schema = _strict(v["schema"]["openAPIV3Schema"])
                    schema["properties"]["apiVersion"] = {"type": "string"}
                    schema["properties"]["kind"] = {"type": "string"}
                    schema["properties"]["metadata"] = {"type": "object"}
                    return jsonschema.Draft4Validator(schema)
    raise AssertionError(f"no CRD serves {api_version} {kind}")


SAMPLES: list[dict[str, Any]] = [
    {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "allow-frontend", "namespace": "prod"},
        "spec": {
            "selector": {"matchLabels": {"app": "backend"}},
            "action": "ALLOW",
            "rules": [
                {
                    "from": [{"source": {"principals": ["cluster.local/ns/prod/sa/frontend"]}}],
                    "to": [{"operation": {"ports": ["8080"]}}],
                }
            ],
        },
    },
    {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": "istio-system"},
        "spec": {"mtls": {"mode": "STRICT"}},
    },
    {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "external", "namespace": "prod"},
        "spec": {
            "hosts": ["api.example.com"],
            "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
            "resolution": "DNS",
        },
    },
    {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "prod"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    },
]
EXAMPLES = [
    doc
    for path in sorted((ROOT / "examples").rglob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    if doc is not None and any(g in doc["apiVersion"] for g in ("istio.io/", "gateway.networking.k8s.io/"))
]


@pytest.mark.parametrize("doc", SAMPLES + EXAMPLES, ids=[_id(d) for d in SAMPLES + EXAMPLES])
def test_custom_resources_validate_against_their_crds_own_schema(doc: dict[str, Any]) -> None:
    errors = [e.message for e in crd_validator(doc["apiVersion"], doc["kind"]).iter_errors(doc)]
    assert errors == []


@pytest.mark.parametrize(
    ("path", "value"),
    [(("spec", "action"), "MAYBE"), (("spec", "rules"), {"from": []}), (("spek",), {})],
    ids=["bad-enum", "rules-not-a-list", "unknown-top-level-field"],
)
def test_a_bad_authorization_policy_is_refused_by_its_crd_schema(path: tuple[Any, ...], value: Any) -> None:
    doc = copy.deepcopy(SAMPLES[0])
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert list(crd_validator(doc["apiVersion"], doc["kind"]).iter_errors(doc))


# -- RBAC: exactly the golden can-i lists -------------------------------------------------------------------------
_DEFAULT_ROWS = {"selfsubjectaccessreviews.authorization.k8s.io", "selfsubjectrulesreviews.authorization.k8s.io"}
"""Rows every authenticated user gets from kube's default roles (system:basic-user), not from deploy/."""


def _golden_grants(account: str) -> dict[tuple[str, tuple[str, ...]], set[str]]:
    grants: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    lines = (GOLDEN / f"{account}.txt").read_text().splitlines()[1:]
    for line in lines:
        if not line[:1].strip():
            continue  # a non-resource URL row: kube's discovery defaults
        match = re.fullmatch(r"(\S+)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*", line)
        assert match, line
        resource, _, names, verbs = match.groups()
        if resource in _DEFAULT_ROWS:
            continue
        key = (resource, tuple(names.split()))
        grants.setdefault(key, set()).update(verbs.split())
    return grants


def _rendered_grants(account: str) -> dict[tuple[str, tuple[str, ...]], set[str]]:
    subject = {"kind": "ServiceAccount", "name": account, "namespace": "istio-system"}
    roles = {("ClusterRole", r["metadata"]["name"]): r for r in of_kind("ClusterRole")}
    roles |= {("Role", r["metadata"]["name"]): r for r in of_kind("Role")}
    grants: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for binding in of_kind("ClusterRoleBinding") + of_kind("RoleBinding"):
        if subject not in binding["subjects"]:
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    base, slash, sub = resource.partition("/")
                    name = f"{base}.{group}{slash}{sub}" if group else resource  # kubectl's "pods.g/status"
                    key = (name, tuple(rule.get("resourceNames", [])))
                    grants.setdefault(key, set()).update(rule["verbs"])
    return grants


@pytest.mark.parametrize("account", ["istiod", "istio-cni", "ztunnel"])
def test_rbac_in_deploy_grants_each_component_exactly_its_golden_can_i_list(account: str) -> None:
    assert _rendered_grants(account) == _golden_grants(account)


def test_only_the_control_plane_reads_secrets_and_no_role_grants_wildcard_verbs() -> None:
    """istiod reads Secrets for ingress certificates, as Istio's does (read only); no other component role does."""
    for role in of_kind("ClusterRole") + of_kind("Role"):
        name = role["metadata"]["name"]
        for rule in role["rules"]:
            assert "*" not in rule["verbs"], name
            if "secrets" in rule.get("resources", []):
                assert name.startswith("istiod-") and set(rule["verbs"]) <= {"get", "list", "watch"}, name


def _istiod_pods(replicas: int, ready: int) -> tuple[list[dict[str, Any]], Any]:
    """``replicas`` istiod pods of one ReplicaSet of the base's Deployment, ``ready`` of them Ready, and the lookup
    the disruption controller resolves their scale with."""
    (deployment,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == "istiod"]
    deployment = {**deployment, "metadata": {**deployment["metadata"], "uid": "d-1"}}
    deployment["spec"] = {**deployment["spec"], "replicas": replicas}
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "istiod", "uid": "d-1", "controller": True}
    rs = {"metadata": {"name": "istiod-1", "namespace": "istio-system", "uid": "rs-1", "ownerReferences": [owner]}}
    rs_ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "istiod-1", "uid": "rs-1", "controller": True}
    pods = [
        {
            "metadata": {
                "name": f"istiod-{i}",
                "namespace": "istio-system",
                "labels": {"app": "istiod", "istio": "pilot"},
                "ownerReferences": [rs_ref],
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True" if i < ready else "False"}],
            },
        }
        for i in range(replicas)
    ]
    objects = {("Deployment", "istiod"): deployment, ("ReplicaSet", "istiod-1"): rs}
    return pods, lambda kind, namespace, name: objects.get((kind, name))


@pytest.mark.parametrize(("replicas", "ready", "allowed"), [(1, 1, 1), (2, 2, 1), (2, 1, 0), (3, 3, 1)])
def test_istiods_budget_never_blocks_a_drain_of_a_single_replica_and_keeps_all_but_one_of_several(
    replicas: int, ready: int, allowed: int
) -> None:
    """Istio's chart leaves the budget out at one replica (kubernetes#93476); the base's maxUnavailable 1 gives the
    same drains: one replica may be evicted, and of several all but one stay up."""
    from ambit.lab.controllers.budgets import compute

    (budget,) = [b for b in of_kind("PodDisruptionBudget") if b["metadata"]["name"] == "istiod"]
    pods, find = _istiod_pods(replicas, ready)
    assert compute(budget, pods, find, now=0.0).allowed == allowed
