"""Pod volumes in a real lab, seen from inside runc containers: what a DaemonSet of the mesh will mount.

Every check runs inside the pod (``ambit lab exec``); the host side (the node's CNI directory, the emptyDir's
directory) is asserted from the test.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from tests.e2e.lab_driver import TEST_TIMEOUT, Lab, is_ready, pod_manifest, sleeper, wait_until

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/conftest.py lab: the shared mesh lab (these namespaces are not in the mesh)


# Prints one JSON object: each path's text, listing, or errno name.
LOOK = """
import errno, json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            out[path] = sorted(os.listdir(path))
        else:
            with open(path, errors="replace") as f:
                out[path] = f.read()
    except OSError as exc:
        out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""

WRITES = """
import errno, json, sys
out = {}
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("x")
        out[path] = "written"
    except OSError as exc:
        out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""

IN_CLUSTER = """
import asyncio, json, sys
from ambit.k8s import KubeClient, kinds
from ambit.k8s.errors import KubeApiStatusError

async def main():
    async with KubeClient.in_cluster() as client:
        try:
            await client.get(kinds.PODS, sys.argv[1])
            return {"status": 200, "namespace": client.namespace, "message": ""}
        except KubeApiStatusError as exc:  # RBAC may say no: authenticated all the same (not a 401)
            return {"status": exc.status_code, "namespace": client.namespace, "message": exc.message}

print(json.dumps(asyncio.run(main())))
"""


def run_in(lab: Lab, pod: str, namespace: str, script: str, *args: str) -> Any:
    return json.loads(lab.exec(pod, namespace, "python3", "-c", script, *args, timeout=30).strip().splitlines()[-1])


def claims(token: str) -> dict[str, Any]:
    body = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return decoded


def ready_pod(lab: Lab, name: str, namespace: str) -> Callable[[], dict[str, Any]]:
    def ready() -> dict[str, Any]:
        pod = lab.pod(name, namespace)
        return pod if is_ready(pod) else {}

    return ready


def volume_pod(node: str) -> dict[str, Any]:
    container = {
        **sleeper(),
        "volumeMounts": [
            {"name": "cfg", "mountPath": "/etc/app"},
            {"name": "istio-token", "mountPath": "/var/run/secrets/tokens"},
            {"name": "cni-bin", "mountPath": "/host/opt/cni/bin", "readOnly": True},
            {"name": "scratch", "mountPath": "/data"},
        ],
    }
    volumes = [
        {"name": "cfg", "configMap": {"name": "app"}},
        {
            "name": "istio-token",
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"audience": "istio-ca", "path": "istio-token", "expirationSeconds": 43200}}
                ]
            },
        },
        {"name": "cni-bin", "hostPath": {"path": "/opt/cni/bin", "type": "DirectoryOrCreate"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    return pod_manifest("vols", [container], volumes=volumes, node=node)


def test_a_pod_reads_its_volumes_cannot_write_the_read_only_ones_and_sees_config_map_updates(
    lab: Lab, namespace: str
) -> None:
    lab.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=privileged", "--overwrite")
    node = lab.topology.node(1).name
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"color": "blue"}}
    lab.apply(config_map, volume_pod(node), pod_manifest("other", [sleeper()], node=node), namespace=namespace)
    pods = {name: wait_until(f"pod {name} Ready", ready_pod(lab, name, namespace), 60) for name in ("vols", "other")}
    uid = pods["vols"]["metadata"]["uid"]

    token_path = "/var/run/secrets/tokens/istio-token"
    seen = run_in(lab, "vols", namespace, LOOK, "/etc/app/color", token_path, "/host/opt/cni/bin", "/data", "/bin/sh")
    assert seen["/etc/app/color"] == "blue"
    token = claims(seen[token_path])
    assert token["aud"] == ["istio-ca"]
    assert token["sub"] == f"system:serviceaccount:{namespace}:default"
    assert token["kubernetes.io"]["pod"]["uid"] == uid  # bound to the pod
    assert seen["/host/opt/cni/bin"] == sorted(p.name for p in lab.topology.cni_bin_dir(node).iterdir())
    assert seen["/host/opt/cni/bin"], "the node's CNI plugin directory should not be empty"
    assert seen["/data"] == []
    assert seen["/bin/sh"].startswith("\x7fELF")  # the rebuilt root still has the machine's programs

    written = run_in(
        lab, "vols", namespace, WRITES, "/etc/app/new", f"{token_path}-2", "/host/opt/cni/bin/evil", "/data/x"
    )
    assert written == {
        "/etc/app/new": "EROFS",
        f"{token_path}-2": "EROFS",
        "/host/opt/cni/bin/evil": "EROFS",
        "/data/x": "written",
    }
    empty_dir = lab.directory / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "scratch"
    assert (empty_dir / "x").read_text() == "x"
    assert not (lab.topology.cni_bin_dir(node) / "evil").exists()

    # Another pod reaches none of it: the lab's directory is masked, and it has no such mounts.
    theirs = [str(empty_dir / "x"), str(lab.directory / "pods" / uid / "volumes"), "/data", "/etc/app"]
    other = run_in(lab, "other", namespace, LOOK, *theirs)
    assert all(value == "ENOENT" for value in other.values()), other

    lab.kubectl("patch", "configmap", "app", "-n", namespace, "--type", "merge", "-p", '{"data":{"color":"green"}}')

    def updated() -> bool:
        return bool(run_in(lab, "vols", namespace, LOOK, "/etc/app/color")["/etc/app/color"] == "green")

    wait_until("the ConfigMap update in the volume", updated, timeout=60, interval=1.0)

    # Ambit's own client configures itself in-cluster from the mounted token and the environment.
    answer = run_in(lab, "vols", namespace, IN_CLUSTER, "vols")
    assert answer["namespace"] == namespace
    assert answer["status"] in (200, 403), answer
    if answer["status"] == 403:
        assert f"system:serviceaccount:{namespace}:default" in answer["message"]


def test_a_host_path_pod_is_refused_below_privileged_and_a_failed_type_check_is_reported(
    lab: Lab, namespace: str
) -> None:
    lab.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline", "--overwrite")
    container = {**sleeper(), "volumeMounts": [{"name": "h", "mountPath": "/host/etc"}]}
    pod = pod_manifest(
        "hosty", [container], volumes=[{"name": "h", "hostPath": {"path": "/etc/nothing", "type": "Directory"}}]
    )
    refused = lab.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod), check=False)
    assert refused.returncode != 0 and "hostPath volumes" in refused.stderr

    lab.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=privileged", "--overwrite")
    lab.apply(pod, namespace=namespace)

    def failed_mount() -> list[str]:
        return [
            str(e.get("message") or e.get("note"))
            for e in lab.events(namespace, "hosty")
            if e.get("reason") == "FailedMount"
        ]

    notes = wait_until("a FailedMount Event", failed_mount, timeout=60)
    assert (
        'MountVolume.SetUp failed for volume "h" : hostPath type check failed: /etc/nothing is not a directory' in notes
    )
    statuses = lab.pod("hosty", namespace)["status"].get("containerStatuses") or []
    assert statuses and statuses[0]["state"]["waiting"]["reason"] == "ContainerCreating"
