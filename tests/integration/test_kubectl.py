"""The real kubectl against ``ambit apiserver`` (a subprocess): every verb on every kind the server stores."""

from __future__ import annotations

import copy
import json
import subprocess
import time
from typing import Any

import pytest
import yaml
from tests.harness import ServerProcess, wait_for

pytestmark = pytest.mark.kubectl

NS = "kt"


def _meta(name: str, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"suite": "kubectl"}}
    if namespaced:
        meta["namespace"] = NS
    return meta


POD_SPEC = {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}]}
TEMPLATE = {"metadata": {"labels": {"app": "web"}}, "spec": POD_SPEC}

# (plural for kubectl, manifest, a spec-ish change for apply/replace: (path, value))
KINDS: list[tuple[str, dict[str, Any], tuple[str, Any]]] = [
    (
        "namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta("kt-extra", False)},
        ("metadata.annotations.note", "applied"),
    ),
    (
        "pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": _meta("web-0"), "spec": POD_SPEC},
        ("spec.activeDeadlineSeconds", 600),
    ),
    (
        "services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta("web"),
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        },
        ("spec.selector.tier", "front"),
    ),
    (
        "configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta("conf"), "data": {"a": "1"}},
        ("data.b", "2"),
    ),
    (
        "secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": _meta("creds"), "stringData": {"user": "ada"}},
        ("data.pass", "c2VjcmV0"),
    ),
    (
        "serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta("robot")},
        ("automountServiceAccountToken", False),
    ),
    (
        "nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": _meta("node-a", False), "spec": {"podCIDR": "198.18.1.0/24"}},
        ("spec.unschedulable", True),
    ),
    (
        "events",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": _meta("ev1"),
            "reason": "Tested",
            "message": "hello",
            "type": "Normal",
            "involvedObject": {"kind": "Pod", "namespace": NS, "name": "web-0"},
        },
        ("message", "hello again"),
    ),
    (
        "events.events.k8s.io",
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": _meta("ev2"),
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reason": "Tested",
            "note": "hi",
            "type": "Normal",
            "action": "Test",
            "reportingController": "ambit.io/test",
            "reportingInstance": "test-1",
            "regarding": {"kind": "Pod", "namespace": NS, "name": "web-0"},
        },
        ("note", "hi again"),
    ),
    (
        "endpoints",
        {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": _meta("web"),
            "subsets": [{"addresses": [{"ip": "198.18.1.5"}], "ports": [{"port": 8080}]}],
        },
        ("metadata.annotations.note", "applied"),
    ),
    (
        "endpointslices",
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": _meta("web-abc"),
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["198.18.1.5"]}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        },
        ("metadata.annotations.note", "applied"),
    ),
    (
        "leases",
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": _meta("leader"),
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
        },
        ("spec.holderIdentity", "b"),
    ),
    (
        "deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta("web"),
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": TEMPLATE},
        },
        ("spec.replicas", 3),
    ),
    (
        "replicasets",
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": _meta("web-rs"),
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": TEMPLATE},
        },
        ("spec.replicas", 2),
    ),
    (
        "daemonsets",
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": _meta("agent"),
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": TEMPLATE},
        },
        ("spec.minReadySeconds", 5),
    ),
    (
        "customresourcedefinitions",
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": _meta("widgets.example.com", False),
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    }
                ],
            },
        },
        ("spec.names.categories", ["all"]),
    ),
    (
        "authorizationpolicies.security.istio.io",
        {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": _meta("allow-web"),
            "spec": {
                "action": "ALLOW",
                "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/kt/sa/robot"]}}]}],
            },
        },
        ("spec.action", "DENY"),
    ),
    (
        "serviceentries.networking.istio.io",
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "ServiceEntry",
            "metadata": _meta("ext"),
            "spec": {
                "hosts": ["api.example.com"],
                "ports": [{"number": 443, "name": "https", "protocol": "TLS"}],
                "resolution": "DNS",
                "location": "MESH_EXTERNAL",
            },
        },
        ("spec.hosts", ["api.example.com", "www.example.com"]),
    ),
    (
        "gateways.gateway.networking.k8s.io",
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": _meta("waypoint"),
            "spec": {
                "gatewayClassName": "istio-waypoint",
                "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
            },
        },
        ("metadata.annotations.note", "applied"),
    ),
]


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return out


def _get(doc: dict[str, Any], path: str) -> Any:
    node: Any = doc
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


@pytest.fixture(scope="module")
def kube(server_process: ServerProcess) -> ServerProcess:
    server_process.kubectl("create", "namespace", NS) if False else None
    server_process.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    )
    return server_process


@pytest.mark.parametrize(("resource", "manifest", "change"), KINDS, ids=[k[0] for k in KINDS])
def test_every_verb_on_every_kind(
    kube: ServerProcess, resource: str, manifest: dict[str, Any], change: tuple[str, Any]
) -> None:
    name = manifest["metadata"]["name"]
    ns_args = ["-n", NS] if "namespace" in manifest["metadata"] else []
    ref = [resource, name, *ns_args]

    out = kube.kubectl("create", "-f", "-", input=json.dumps(manifest))
    assert "created" in out
    obj = kube.kubectl_json("get", *ref)
    assert obj["metadata"]["uid"] and obj["metadata"]["resourceVersion"]
    assert obj["metadata"]["labels"]["suite"] == "kubectl"

    # apply (client-side): first apply adopts the object, the second changes it.
    path, value = change
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    out = kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(_set(manifest, path, value)))
    assert "configured" in out, out
    obj = kube.kubectl_json("get", *ref)
    assert _get(obj, path) == value
    assert "kubectl.kubernetes.io/last-applied-configuration" in obj["metadata"]["annotations"]

    kube.kubectl("label", *ref, "tier=gold")
    kube.kubectl("annotate", *ref, "owner=team-a")
    obj = kube.kubectl_json("get", *ref)
    assert obj["metadata"]["labels"]["tier"] == "gold"
    assert obj["metadata"]["annotations"]["owner"] == "team-a"
    kube.kubectl("label", *ref, "tier-")
    assert "tier" not in kube.kubectl_json("get", *ref)["metadata"]["labels"]

    kube.kubectl("patch", *ref, "--type", "merge", "-p", json.dumps({"metadata": {"labels": {"patched": "merge"}}}))
    kube.kubectl(
        "patch",
        *ref,
        "--type",
        "json",
        "-p",
        json.dumps([{"op": "add", "path": "/metadata/labels/jsonpatch", "value": "yes"}]),
    )
    obj = kube.kubectl_json("get", *ref)
    assert obj["metadata"]["labels"]["patched"] == "merge"
    assert obj["metadata"]["labels"]["jsonpatch"] == "yes"
    if "." not in resource or (resource.endswith(("k8s.io",)) and "events" in resource):
        # strategic merge patch, kubectl's default type for built-in kinds
        kube.kubectl("patch", *ref, "-p", json.dumps({"metadata": {"labels": {"patched": "strategic"}}}))
        assert kube.kubectl_json("get", *ref)["metadata"]["labels"]["patched"] == "strategic"

    obj = kube.kubectl_json("get", *ref)
    obj["metadata"]["labels"]["replaced"] = "yes"
    out = kube.kubectl("replace", "-f", "-", input=json.dumps(obj))
    assert "replaced" in out
    assert kube.kubectl_json("get", *ref)["metadata"]["labels"]["replaced"] == "yes"
    stale = copy.deepcopy(obj)
    stale["metadata"]["labels"]["replaced"] = "twice"
    failed = kube.kubectl("replace", "-f", "-", input=json.dumps(stale), check=False)
    assert "the object has been modified" in failed

    # output formats
    table = kube.kubectl("get", resource, *ns_args)
    assert "NAME" in table.splitlines()[0].upper() or resource.startswith("events")  # events: LAST SEEN first
    assert name in table or resource.startswith("events")  # an event's name is a wide column, as in kubectl
    assert name in kube.kubectl("get", *ref, "-o", "wide")
    assert yaml.safe_load(kube.kubectl("get", *ref, "-o", "yaml"))["metadata"]["name"] == name
    assert kube.kubectl("get", *ref, "-o", "name").strip().endswith(f"/{name}")

    def names(*args: str) -> list[str]:
        return [n.rsplit("/", 1)[-1] for n in kube.kubectl("get", resource, *args, "-o", "name").split()]

    assert name in names("-l", "replaced=yes", *ns_args)
    assert name not in names("-l", "replaced=no", *ns_args)
    assert name in names("-l", "replaced in (yes,maybe),!absent", *ns_args)
    assert names("--field-selector", f"metadata.name={name}", *ns_args) == [name]
    if ns_args:
        assert name in names("-A")

    with _watching(kube, resource, *ns_args) as watch:
        kube.kubectl("label", *ref, "watched=yes")
        kube.kubectl("delete", *ref)
        watch.expect_lines(lambda lines: any(line.startswith("DELETED") for line in lines))
        assert any(line.startswith("MODIFIED") for line in watch.lines)

    gone = kube.kubectl("get", *ref, check=False)
    assert "NotFound" in gone or "not found" in gone


class _Watch:
    """Lines of a running ``kubectl get -w``, read from the raw pipe (no buffering between select and read)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._partial = b""

    def expect_lines(self, predicate: Any, timeout: float = 10.0) -> None:
        import os
        import select

        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while not predicate(self.lines):
            left = deadline - time.monotonic()
            assert left > 0, f"watch output so far: {self.lines}"
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data = self._partial + chunk
            *complete, self._partial = data.split(b"\n")
            self.lines.extend(line.decode() for line in complete)
        assert predicate(self.lines), self.lines


class _watching:
    def __init__(self, kube: ServerProcess, *args: str) -> None:
        import os

        env = dict(os.environ, KUBECONFIG=str(kube.kubeconfig), KUBECACHEDIR=str(kube.data_dir / "kubecache"))
        self.proc = subprocess.Popen(
            ["kubectl", "get", *args, "-w", "--output-watch-events"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.watch = _Watch(self.proc)

    def __enter__(self) -> _Watch:
        self.watch.expect_lines(lambda lines: len(lines) >= 1)  # the header and current state arrived
        return self.watch

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=5)


def test_field_selector_on_node_name(kube: ServerProcess) -> None:
    for i, node in enumerate(["node-1", "node-1", "node-2"]):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"bound-{i}", "namespace": NS},
            "spec": {**POD_SPEC, "nodeName": node},
        }
        kube.kubectl("create", "-f", "-", input=json.dumps(pod))
    names = kube.kubectl("get", "pods", "-n", NS, "--field-selector", "spec.nodeName=node-1", "-o", "name").split()
    assert sorted(names) == ["pod/bound-0", "pod/bound-1"]
    names = kube.kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName!=node-1", "-o", "name").split()
    assert "pod/bound-2" in names and "pod/bound-0" not in names
    bad = kube.kubectl("get", "pods", "--field-selector", "spec.color=blue", check=False)
    assert "field label not supported" in bad
    # A pod bound to a node is deleted gracefully: the node's kubelet would finish the deletion.
    kube.kubectl("delete", "pod", "bound-2", "-n", NS, "--wait=false")
    pod = kube.kubectl_json("get", "pod", "bound-2", "-n", NS)
    assert pod["metadata"]["deletionTimestamp"]
    kube.kubectl(
        "delete",
        "pods",
        "-n",
        NS,
        "-l",
        "!nothing",
        "--field-selector",
        "spec.nodeName!=",
        "--grace-period=0",
        "--force",
    )
    assert "bound-" not in kube.kubectl("get", "pods", "-n", NS, "-o", "name")


def test_custom_resource_of_a_new_crd(kube: ServerProcess) -> None:
    crd = KINDS[[k[0] for k in KINDS].index("customresourcedefinitions")][1]
    crd = _set(crd, "metadata.name", "gadgets.example.com")
    crd["spec"]["names"] = {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "shortNames": ["gd"]}
    kube.kubectl("apply", "-f", "-", input=json.dumps(crd))
    gadget = {
        "apiVersion": "example.com/v1",
        "kind": "Gadget",
        "metadata": {"name": "g1", "namespace": NS},
        "spec": {"size": 3},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(gadget))
    assert kube.kubectl_json("get", "gd", "g1", "-n", NS)["spec"]["size"] == 3
    kube.kubectl("patch", "gadget", "g1", "-n", NS, "--type", "merge", "-p", '{"spec":{"size":4}}')
    assert kube.kubectl_json("get", "gadgets", "g1", "-n", NS)["spec"]["size"] == 4
    kube.kubectl("delete", "crd", "gadgets.example.com")
    wait_for(lambda: "gadgets" not in kube.kubectl("api-resources", "--cached=false"))


def test_namespace_delete_removes_its_contents(kube: ServerProcess) -> None:
    kube.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}})
    )
    kube.kubectl(
        "apply",
        "-n",
        "doomed",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}),
    )
    kube.kubectl("delete", "namespace", "doomed", "--timeout=20s")
    assert "NotFound" in kube.kubectl("get", "namespace", "doomed", check=False)
    assert "c" not in kube.kubectl("get", "configmaps", "-A", "-o", "name").split()


def test_watch_resumes_across_a_server_restart(kube: ServerProcess) -> None:
    """A watcher that saw resourceVersion N before the restart gets everything after N from the new process."""
    kube.kubectl(
        "apply",
        "-n",
        NS,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "before"}}),
    )
    listed = json.loads(kube.kubectl("get", "--raw", f"/api/v1/namespaces/{NS}/configmaps"))
    last_seen = listed["metadata"]["resourceVersion"]
    assert int(last_seen) > 0
    kube.stop()
    kube.start()
    kube.kubectl(
        "apply",
        "-n",
        NS,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after"}}),
    )
    raw = kube.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{NS}/configmaps?watch=1&resourceVersion={last_seen}&timeoutSeconds=1"
    )
    events = [json.loads(line) for line in raw.splitlines() if line.strip()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "after")]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > int(last_seen)
    # And kubectl's own watch works against the restarted server.
    with _watching(kube, "configmaps", "-n", NS) as watch:
        kube.kubectl("label", "configmap", "after", "-n", NS, "seen=yes")
        watch.expect_lines(lambda lines: sum("after" in line for line in lines) >= 2)


def test_kubectl_scale_uses_the_scale_subresource(kube: ServerProcess) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "scaled", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "scaled"}},
            "template": {"metadata": {"labels": {"app": "scaled"}}, "spec": POD_SPEC},
        },
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(deployment))
    assert "scaled" in kube.kubectl("scale", "deployment", "scaled", "-n", NS, "--replicas=5")
    assert kube.kubectl_json("get", "deployment", "scaled", "-n", NS)["spec"]["replicas"] == 5
    scale = json.loads(kube.kubectl("get", "--raw", f"/apis/apps/v1/namespaces/{NS}/deployments/scaled/scale"))
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 5
    assert scale["status"]["selector"] == "app=scaled"
    failed = kube.kubectl(
        "scale", "deployment", "scaled", "-n", NS, "--replicas=2", "--current-replicas=3", check=False
    )
    assert "expected" in failed.lower() or "precondition" in failed.lower() or "error" in failed.lower()
    assert kube.kubectl_json("get", "deployment", "scaled", "-n", NS)["spec"]["replicas"] == 5


def test_apply_of_a_list_document(kube: ServerProcess) -> None:
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"listed-{i}", "namespace": NS}}
            for i in range(2)
        ],
    }
    out = kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(listed))
    assert "configmap/listed-0 created" in out and "configmap/listed-1 created" in out


STORED_ONLY = [
    {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": "add-header", "namespace": NS},
        "spec": {
            "targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "waypoint"}],
            "configPatches": [{"applyTo": "HTTP_FILTER", "patch": {"operation": "INSERT_FIRST", "value": {}}}],
        },
    },
    {
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "ProxyConfig",
        "metadata": {"name": "sandwich", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "gw"}}, "concurrency": 1},
    },
    {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Sidecar",
        "metadata": {"name": "default", "namespace": NS},
        "spec": {"egress": [{"hosts": ["./*"]}]},
    },
    {
        "apiVersion": "networking.istio.io/v1",
        "kind": "WorkloadGroup",
        "metadata": {"name": "vms", "namespace": NS},
        "spec": {"metadata": {"labels": {"app": "vm"}}, "template": {"serviceAccount": "vm"}},
    },
    {
        "apiVersion": "extensions.istio.io/v1alpha1",
        "kind": "WasmPlugin",
        "metadata": {"name": "header", "namespace": NS},
        "spec": {"url": "oci://example.com/filter:v1", "phase": "STATS"},
    },
    {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "BackendTLSPolicy",
        "metadata": {"name": "tls", "namespace": NS},
        "spec": {
            "targetRefs": [
                {"group": "networking.istio.io", "kind": "ServiceEntry", "name": "ext", "sectionName": "https"}
            ],
            "validation": {
                "hostname": "server.default.svc",
                "caCertificateRefs": [{"kind": "ConfigMap", "name": "ca", "group": ""}],
            },
        },
    },
]


@pytest.mark.parametrize("manifest", STORED_ONLY, ids=[m["kind"] for m in STORED_ONLY])
def test_istio_kinds_that_are_only_stored_apply_and_read_back(kube: ServerProcess, manifest: dict[str, Any]) -> None:
    """Manifests of upstream's ambient tests carry these kinds: they must apply ("no matches for kind" fails the
    whole apply), even though nothing acts on them."""
    out = kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    assert "created" in out, out
    kind = manifest["kind"].lower()
    obj = kube.kubectl_json("get", kind, manifest["metadata"]["name"], "-n", NS)
    assert obj["apiVersion"] == manifest["apiVersion"] and obj["spec"] == manifest["spec"]
    kube.kubectl("delete", kind, manifest["metadata"]["name"], "-n", NS)
