"""Containers of a real lab are sandboxed by runc: what a pod can see and do from the inside.

Every check runs inside a lab pod (``ambit lab exec``, which is ``runc exec`` into the pod's container) as the
attacker would: its default service account, the pod's own processes. The host side of each check (that the secret
really is there, that the limit really is in the container's cgroup) is asserted from the test.

Issue 14's "from inside a lab pod as its default service account" is
:func:`test_a_pod_s_default_account_reads_no_secret_creates_no_pod_changes_no_webhook_and_gets_only_its_own_identity`
(the API and the mesh CA) with :func:`test_a_pod_cannot_read_the_lab_s_secrets_nor_write_to_the_host` (the
filesystem, the mesh CA's key included).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    http_echo_container,
    is_ready,
    pod_manifest,
    sleeper,
    wait_until,
)

from ambit.controlplane.webhook.registration import CONFIGURATION_NAME
from ambit.lab.runtime.oci_spec import SERVICE_ACCOUNT_DIR, container_id

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/conftest.py lab: the shared mesh lab (these namespaces are not in the mesh)

PY = sys.executable

# Each probe prints one JSON object: what the pod saw.
READS = """
import errno, json, sys
out = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            out[path] = "read" if f.read(64) else "empty"
    except OSError as exc:
        out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""

WRITES = """
import errno, json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write(os.environ.get("POD_NAME", "?"))
        out[path] = "written"
    except OSError as exc:
        out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""

PROCESSES = """
import json, os
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
init = open("/proc/1/cmdline", "rb").read().split(b"\\0")[0].decode()
print(json.dumps({"pids": pids, "init": init, "hostname": os.uname().nodename}))
"""

API_CALL = """
import json, os, ssl, sys, urllib.error, urllib.request
sa = sys.argv[1]
token = open(sa + "/token").read()
namespace = open(sa + "/namespace").read()
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
context = ssl.create_default_context(cafile=sa + "/ca.crt")
context.check_hostname = False  # the lab's API server certificate names its address, not a DNS name
url = f"https://{host}:{port}/api/v1/namespaces/{namespace}/pods/{os.environ['POD_NAME']}"
request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
try:
    with urllib.request.urlopen(request, context=context, timeout=10) as reply:
        status, body = reply.status, reply.read().decode()
except urllib.error.HTTPError as exc:
    status, body = exc.code, exc.read().decode()
print(json.dumps({"status": status, "body": body[:500], "token": token, "namespace": namespace}))
"""

HTTP_GET = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=10) as reply:
    print(reply.status)
"""

BIND = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", 80))
    print("bound")
except PermissionError:
    print("EACCES")
"""


def run_in(lab: Lab, pod: str, namespace: str, script: str, *args: str) -> Any:
    return json.loads(lab.exec(pod, namespace, "python3", "-c", script, *args, timeout=30).strip().splitlines()[-1])


def wait_ready(lab: Lab, namespace: str, *names: str) -> dict[str, dict[str, Any]]:
    def ready() -> dict[str, dict[str, Any]] | None:
        pods = {name: lab.pod(name, namespace) for name in names}
        return pods if all(is_ready(p) for p in pods.values()) else None

    found = wait_until(f"pods {names} Ready", ready, timeout=60)
    assert found is not None
    return found


def with_security(container: dict[str, Any], **security: Any) -> dict[str, Any]:
    return {**container, "securityContext": security}


def test_a_pod_cannot_read_the_lab_s_secrets_nor_write_to_the_host(lab: Lab, namespace: str) -> None:
    lab.apply(pod_manifest("intruder", [sleeper()]), pod_manifest("victim", [sleeper()]), namespace=namespace)
    pods = wait_ready(lab, namespace, "intruder", "victim")
    victim_uid = pods["victim"]["metadata"]["uid"]
    lab_dir = lab.directory.resolve()
    secrets = [
        lab_dir / "apiserver" / "pki" / "ca.key",
        lab_dir / "apiserver" / "pki" / "sa.key",
        lab_dir / "apiserver" / "state.db",
        lab_dir / "apiserver" / "admin.token",
        lab_dir / "kubeconfig",
        lab_dir / "pods" / victim_uid / "serviceaccount" / "token",
        *sorted(p for p in lab.topology.mesh_ca_dir.resolve().iterdir() if p.is_file()),  # the mesh CA's key too
    ]
    for path in secrets:
        assert path.exists(), f"{path} should exist on the host (the test is wrong otherwise)"
    seen = run_in(lab, "intruder", namespace, READS, *map(str, secrets), "/etc/shadow", "/run/netns", "/usr/bin/env")
    for path in map(str, secrets):
        assert seen[path] in ("ENOENT", "EACCES"), f"{path} readable from a pod: {seen[path]}"
    assert seen["/etc/shadow"] == "empty"  # a file mask is /dev/null
    assert seen["/run/netns"] == "ENOENT"  # no way into other namespaces
    assert seen["/usr/bin/env"] == "read"  # the host's programs are there, read-only

    # Without CAP_SYS_ADMIN the masks stay and the root stays read-only.
    for attempt in (f"umount {lab_dir}", "mount -o remount,rw /", f"mount --bind / {lab_dir}"):
        out = lab.exec("intruder", namespace, "sh", "-c", f"{attempt} 2>/dev/null; echo $?").strip()
        assert out != "0", f"{attempt!r} worked inside a pod"

    written = run_in(lab, "intruder", namespace, WRITES, "/ambit-escape", "/usr/ambit-escape", "/tmp/mine")
    assert written == {"/ambit-escape": "EROFS", "/usr/ambit-escape": "EROFS", "/tmp/mine": "written"}
    assert not Path("/ambit-escape").exists() and not Path("/tmp/mine").exists()  # /tmp is the pod's own
    assert run_in(lab, "victim", namespace, READS, "/tmp/mine") == {"/tmp/mine": "ENOENT"}


def test_a_pod_sees_only_its_own_processes_and_its_own_token(lab: Lab, namespace: str) -> None:
    lab.apply(pod_manifest("app", [sleeper()]), namespace=namespace)
    pod = wait_ready(lab, namespace, "app")["app"]
    seen = run_in(lab, "app", namespace, PROCESSES)
    assert seen["init"] == "sleep" and seen["hostname"] == "app"
    assert 1 in seen["pids"] and len(seen["pids"]) < 10, seen  # its own PID namespace: sleep, exec'd python3

    answer = run_in(lab, "app", namespace, API_CALL, SERVICE_ACCOUNT_DIR)
    host_token = lab.directory / "pods" / pod["metadata"]["uid"] / "serviceaccount" / "token"
    assert answer["token"] == host_token.read_text()  # the pod's own token, nobody else's
    assert answer["namespace"] == namespace
    # Authenticated as the pod's service account (RBAC may then say no: still not a 401).
    assert answer["status"] in (200, 403), answer
    if answer["status"] == 403:
        assert f"system:serviceaccount:{namespace}:default" in answer["body"]


def test_a_pod_keeps_its_network_and_reaches_another_pod_by_ip(lab: Lab, namespace: str) -> None:
    lab.apply(
        pod_manifest("server", [http_echo_container(8080)], node=lab.topology.node(2).name),
        pod_manifest("client", [sleeper()], node=lab.topology.node(1).name),
        namespace=namespace,
    )
    pods = wait_ready(lab, namespace, "server", "client")
    ip = pods["server"]["status"]["podIP"]
    out = lab.exec("client", namespace, "python3", "-c", HTTP_GET, f"http://{ip}:8080/", timeout=30)
    assert out.strip() == "200"


def test_security_context_sets_the_user_and_the_capabilities(lab: Lab, namespace: str) -> None:
    lab.apply(
        pod_manifest("user", [with_security(sleeper(), runAsUser=1234, runAsGroup=4321)]),
        pod_manifest("nobind", [with_security(sleeper(), capabilities={"drop": ["ALL"]})]),
        pod_manifest("bind", [with_security(sleeper(), capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]})]),
        namespace=namespace,
    )
    wait_ready(lab, namespace, "user", "nobind", "bind")
    assert lab.exec("user", namespace, "id", "-u").strip() == "1234"
    assert lab.exec("user", namespace, "id", "-g").strip() == "4321"
    # A non-root user can still read its own token (the projected volume's mode).
    assert run_in(lab, "user", namespace, READS, f"{SERVICE_ACCOUNT_DIR}/token") == {
        f"{SERVICE_ACCOUNT_DIR}/token": "read"
    }
    assert lab.exec("nobind", namespace, "python3", "-c", BIND).strip() == "EACCES"
    assert lab.exec("bind", namespace, "python3", "-c", BIND).strip() == "bound"


def test_read_only_root_filesystem_leaves_only_volumes_and_dev_shm_writable(lab: Lab, namespace: str) -> None:
    read_only = with_security(sleeper(), readOnlyRootFilesystem=True)
    with_tmp = {**read_only, "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}
    lab.apply(
        pod_manifest("sealed", [read_only]),
        pod_manifest("scratch", [with_tmp], volumes=[{"name": "tmp", "emptyDir": {}}]),
        namespace=namespace,
    )
    wait_ready(lab, namespace, "sealed", "scratch")
    paths = ("/tmp/mine", "/run/mine", "/root/mine", "/dev/shm/mine")
    assert run_in(lab, "sealed", namespace, WRITES, *paths) == {
        "/tmp/mine": "EROFS",
        "/run/mine": "EROFS",
        "/root/mine": "EROFS",
        "/dev/shm/mine": "written",  # as under containerd: the pod's shared memory is not its root filesystem
    }
    assert run_in(lab, "scratch", namespace, WRITES, "/tmp/mine", "/run/mine") == {
        "/tmp/mine": "written",  # a volume mounted there is the pod's to write
        "/run/mine": "EROFS",
    }
    token = f"{SERVICE_ACCOUNT_DIR}/token"  # mounted under the read-only /run all the same
    assert run_in(lab, "sealed", namespace, READS, token) == {token: "read"}
    # The mesh's and the lab's own pods ask for a read-only root too (deploy/: ztunnel, istiod, cluster DNS) and run.
    for system in ("istio-system", "kube-system"):
        for pod in lab.pods(system):
            assert is_ready(pod), f"{system}/{pod['metadata']['name']} is not Ready"


def test_run_as_non_root_without_a_user_is_a_config_error(lab: Lab, namespace: str) -> None:
    lab.apply(pod_manifest("rootless", [with_security(sleeper(), runAsNonRoot=True)]), namespace=namespace)

    def waiting() -> dict[str, Any] | None:
        statuses = (lab.pod("rootless", namespace).get("status") or {}).get("containerStatuses") or []
        state = (statuses[0].get("state") or {}).get("waiting") if statuses else None
        return state if state and state.get("reason") == "CreateContainerConfigError" else None

    state = wait_until("the container waiting with CreateContainerConfigError", waiting, timeout=30)
    assert state is not None
    assert state["message"].startswith("container has runAsNonRoot and image will run as root")


def test_limits_are_in_the_container_s_cgroup(lab: Lab, namespace: str) -> None:
    container = {**sleeper(), "resources": {"limits": {"memory": "64Mi", "cpu": "250m"}}}
    lab.apply(pod_manifest("limited", [container]), namespace=namespace)
    pod = wait_ready(lab, namespace, "limited")["limited"]
    cgroup = lab.topology.cgroup_parent.strip("/") + "/" + container_id(pod["metadata"]["uid"], "main")
    memory = Path("/sys/fs/cgroup/memory") / cgroup / "memory.limit_in_bytes"

    def limited() -> bool:
        try:
            return int(memory.read_text()) == 64 * 2**20
        except OSError:
            return False

    # The runtime reports the container running once `runc run` is under way; runc writes the limits while it
    # creates the container, so they may land a moment after the pod is Ready.
    wait_until("the memory limit in the container's cgroup", limited, timeout=10)
    cpu = Path("/sys/fs/cgroup/cpu") / cgroup
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == 25_000
    assert int((cpu / "cpu.cfs_period_us").read_text()) == 100_000
    assert int((Path("/sys/fs/cgroup/pids") / cgroup / "pids.max").read_text()) > 0


def test_a_container_runc_cannot_start_waits_with_runc_s_message(lab: Lab, namespace: str) -> None:
    # The root is read-only, so runc cannot make a missing working directory.
    container = {**sleeper(), "workingDir": "/ambit-no-such-directory"}
    lab.apply(pod_manifest("broken", [container]), namespace=namespace)

    def waiting() -> dict[str, Any] | None:
        statuses = (lab.pod("broken", namespace).get("status") or {}).get("containerStatuses") or []
        state = (statuses[0].get("state") or {}).get("waiting") if statuses else None
        reasons = ("CreateContainerError", "RunContainerError")
        return state if state and state.get("reason") in reasons else None

    state = wait_until("the container waiting with runc's error", waiting, timeout=30)
    assert state is not None
    assert "runc" in state["message"], state


API_ATTACKS = """
import json, os, ssl, sys, urllib.error, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(sa + "/token").read()
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
context = ssl.create_default_context(cafile=sa + "/ca.crt")
context.check_hostname = False  # the lab's API server certificate names its address, not a DNS name
def call(method, path, body=None, content_type="application/json"):
    headers = {"Authorization": "Bearer " + token}
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = content_type
    request = urllib.request.Request(f"https://{host}:{port}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as reply:
            return {"status": reply.status, "message": ""}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "message": json.loads(exc.read() or b"{}").get("message", "")}
print(json.dumps({name: call(*args) for name, args in json.loads(sys.argv[1]).items()}))
"""

CA_ATTACKS = """
import asyncio, json, sys
from pathlib import Path
from ambit.identity.caclient import CaError
from ambit.identity.istiod import IstiodCaClient
from ambit.model.identity import SpiffeId
address, namespace, istio_token, root = sys.argv[1:5]
api_token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
own = SpiffeId("cluster.local", namespace, "default")
ztunnel = SpiffeId("cluster.local", "istio-system", "ztunnel")
neighbour = SpiffeId("cluster.local", namespace, "neighbour")
async def ask(token, identity, impersonate):
    client = IstiodCaClient(
        address, Path(root), Path(token), impersonate=impersonate, server_name="istiod.istio-system.svc"
    )
    try:
        return "granted " + str((await client.fetch_certificate(identity)).identity)
    except CaError as exc:
        return str(exc)
    finally:
        await client.aclose()
async def main():
    return {
        "own": await ask(istio_token, own, False),
        "csr-for-ztunnel": await ask(istio_token, ztunnel, False),
        "csr-for-neighbour": await ask(istio_token, neighbour, False),
        "impersonate-ztunnel": await ask(istio_token, ztunnel, True),
        "impersonate-neighbour": await ask(istio_token, neighbour, True),
        "own-with-the-api-token": await ask(api_token, own, False),
    }
print(json.dumps(asyncio.run(main())))
"""

WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def _webhook(lab: Lab, name: str) -> dict[str, Any] | None:
    found = [w for w in lab.items("validatingwebhookconfigurations") if w["metadata"]["name"] == name]
    return found[0] if found else None


def test_a_pod_s_default_account_reads_no_secret_creates_no_pod_changes_no_webhook_and_gets_only_its_own_identity(
    lab: Lab, namespace: str
) -> None:
    """The attacker runs in a pod, as its namespace's default service account, with what a pod may have: its API
    token, and (as Istio's sidecar injection gives one) a projected token for the CA (audience ``istio-ca``) with
    the mesh root. Everything else is refused, each with the right answer: 403 with kube's message from the API
    server, UNAUTHENTICATED or INVALID_ARGUMENT from the CA; and what it tried to change is unchanged."""
    hook = CONFIGURATION_NAME
    webhook = wait_until("the control plane's webhook configuration", lambda: _webhook(lab, hook), timeout=60)
    lab.kubectl("create", "serviceaccount", "neighbour", "-n", namespace)
    manifest = pod_manifest("intruder", [sleeper()])
    manifest["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "istio-token", "mountPath": "/var/run/secrets/tokens"},
        {"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio"},
    ]
    manifest["spec"]["volumes"] = [
        {
            "name": "istio-token",
            "projected": {"sources": [{"serviceAccountToken": {"audience": "istio-ca", "path": "istio-token"}}]},
        },
        {"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}},
    ]
    lab.apply(manifest, namespace=namespace)
    wait_ready(lab, namespace, "intruder")
    user = f"system:serviceaccount:{namespace}:default"

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "spawned"}, "spec": {"containers": [sleeper()]}}
    fail_open = [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]
    attacks = {
        "get-the-mesh-ca-secret": ["GET", "/api/v1/namespaces/istio-system/secrets/istio-ca-secret"],
        "list-own-secrets": ["GET", f"/api/v1/namespaces/{namespace}/secrets"],
        "create-a-pod": ["POST", f"/api/v1/namespaces/{namespace}/pods", pod],
        "create-a-pod-in-istio-system": ["POST", "/api/v1/namespaces/istio-system/pods", pod],
        "patch-the-webhook": ["PATCH", f"{WEBHOOKS}/{hook}", fail_open, "application/json-patch+json"],
        "delete-the-webhook": ["DELETE", f"{WEBHOOKS}/{hook}"],
        "mint-a-ztunnel-token": ["POST", "/api/v1/namespaces/istio-system/serviceaccounts/ztunnel/token", {}],
    }
    seen = run_in(lab, "intruder", namespace, API_ATTACKS, json.dumps(attacks))
    expected = {
        "get-the-mesh-ca-secret": f'secrets "istio-ca-secret" is forbidden: User "{user}" cannot get resource '
        '"secrets" in API group "" in the namespace "istio-system"',
        "list-own-secrets": f'secrets is forbidden: User "{user}" cannot list resource "secrets" in API group "" '
        f'in the namespace "{namespace}"',
        "create-a-pod": f'pods is forbidden: User "{user}" cannot create resource "pods" in API group "" in the '
        f'namespace "{namespace}"',
        "create-a-pod-in-istio-system": f'pods is forbidden: User "{user}" cannot create resource "pods" in API '
        'group "" in the namespace "istio-system"',
        "patch-the-webhook": f'validatingwebhookconfigurations.admissionregistration.k8s.io "{hook}" is forbidden: '
        f'User "{user}" cannot patch resource "validatingwebhookconfigurations" in API group '
        '"admissionregistration.k8s.io" at the cluster scope',
        "delete-the-webhook": f'validatingwebhookconfigurations.admissionregistration.k8s.io "{hook}" is forbidden: '
        f'User "{user}" cannot delete resource "validatingwebhookconfigurations" in API group '
        '"admissionregistration.k8s.io" at the cluster scope',
        "mint-a-ztunnel-token": f'serviceaccounts "ztunnel" is forbidden: User "{user}" cannot create resource '
        '"serviceaccounts/token" in API group "" in the namespace "istio-system"',
    }
    assert seen == {name: {"status": 403, "message": message} for name, message in expected.items()}
    assert lab.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout.split() == ["pod/intruder"]
    assert not lab.items("pods", "-n", "istio-system", "--field-selector", "metadata.name=spawned")
    assert lab.get("validatingwebhookconfiguration", hook)["webhooks"] == webhook["webhooks"]

    address = lab.control_plane_address()
    args = (address, namespace, "/var/run/secrets/tokens/istio-token", "/var/run/secrets/istio/root-cert.pem")
    out = lab.exec("intruder", namespace, PY, "-c", CA_ATTACKS, *args, timeout=60)
    answers = json.loads(out.strip().splitlines()[-1])
    own = f"spiffe://cluster.local/ns/{namespace}/sa/default"
    assert answers.pop("own") == f"granted {own}", "the pod could not get its own identity"
    for case, code in {
        "csr-for-ztunnel": "INVALID_ARGUMENT",  # its own token, a CSR naming someone else: the CSR is never trusted
        "csr-for-neighbour": "INVALID_ARGUMENT",
        "impersonate-ztunnel": "UNAUTHENTICATED",  # only a node proxy may ask for others, on its own node
        "impersonate-neighbour": "UNAUTHENTICATED",
        "own-with-the-api-token": "UNAUTHENTICATED",  # the API token's audience is not istio-ca
    }.items():
        assert f": {code}: " in answers[case] and "refused" in answers[case], (case, answers[case])


KEYRING = """
import ctypes, errno, platform
number = {"x86_64": 250, "aarch64": 219}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
result = libc.syscall(ctypes.c_long(number), ctypes.c_long(0), ctypes.c_long(-3), ctypes.c_long(0))
print("ok" if result >= 0 else errno.errorcode[ctypes.get_errno()])
"""


def test_a_pod_runs_under_runtime_default_seccomp_and_the_mesh_still_works(lab: Lab, namespace: str) -> None:
    lab.apply(pod_manifest("confined", [sleeper()]), namespace=namespace)
    wait_ready(lab, namespace, "confined")
    status = lab.exec("confined", namespace, "sh", "-c", "grep Seccomp: /proc/self/status")
    assert status.split() == ["Seccomp:", "2"]  # a filter, though the pod asked for none (--seccomp-default)
    assert lab.exec("confined", namespace, "python3", "-c", KEYRING).strip() == "EPERM"
    out = lab.exec("confined", namespace, "sh", "-c", "unshare -Urn true 2>&1; echo exit=$?").strip()
    assert "Operation not permitted" in out and out.endswith("exit=1"), out
    # The mesh's own pods (ztunnel with SYS_ADMIN for setns, under RuntimeDefault; istio-cni privileged) are Ready.
    for pod in lab.pods("istio-system"):
        assert is_ready(pod), pod["metadata"]["name"]


IDENTITY = """
import errno, json, os, socket, time
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
def bind_80():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 80))
out = {
    "uid": os.getuid(),
    "uid_map": open("/proc/self/uid_map").read().split(),
    "bind_80": attempt(bind_80),
    "env_owner": os.stat("/usr/bin/env").st_uid,
    "read_env": attempt(lambda: open("/usr/bin/env", "rb").read(1)),
    "token": attempt(lambda: open("/var/run/secrets/kubernetes.io/serviceaccount/token").read()),
}
print("RESULT " + json.dumps(out), flush=True)
time.sleep(3600)
"""


def test_a_pod_without_host_users_is_root_inside_and_an_unprivileged_id_on_the_host(lab: Lab, namespace: str) -> None:
    # The pod reports from its own log what its main process sees; an exec readiness probe and `lab exec` show
    # that runc can join it (its network namespace belongs to its user namespace).
    main = {"name": "main", "image": "none", "command": ["python3", "-c", IDENTITY]}
    main["readinessProbe"] = {"exec": {"command": ["cat", "/proc/self/uid_map"]}, "periodSeconds": 1}
    manifest = pod_manifest("userns", [main])
    manifest["spec"]["hostUsers"] = False
    lab.apply(manifest, namespace=namespace)
    pod = wait_ready(lab, namespace, "userns")["userns"]
    pod_dir = lab.directory / "pods" / pod["metadata"]["uid"]

    def reported() -> dict[str, Any] | None:
        text = (pod_dir / "main.log").read_text() if (pod_dir / "main.log").exists() else ""
        lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
        return json.loads(lines[0].removeprefix("RESULT ")) if lines else None

    seen = wait_until("the pod's report", reported, timeout=60)
    assert seen is not None
    inside, first, length = seen["uid_map"]
    assert seen["uid"] == 0 and (inside, length) == ("0", "65536") and int(first) >= 65536, seen
    saved = json.loads((pod_dir / "userns.json").read_text())
    assert saved["uidMappings"] == [{"hostId": int(first), "containerId": 0, "length": 65536}]
    # Root of its own namespace, in a pod network namespace it owns: a low port binds.
    assert seen["bind_80"] == "ok", seen
    assert seen["env_owner"] == 65534 and seen["read_env"] == "ok" and seen["token"] == "ok", seen
    # An exec joins the same user namespace as the main process, as root of it.
    out = lab.exec(
        "userns", namespace, "sh", "-c", "id -u; cat /proc/self/uid_map; readlink /proc/self/ns/user /proc/1/ns/user"
    )
    uid, mapping, own_ns, main_ns = out.strip().split("\n")
    assert uid == "0" and mapping.split() == ["0", first, "65536"] and own_ns == main_ns, out


def test_pods_without_host_users_are_enrolled_in_the_mesh_and_talk_over_hbone(lab: Lab, namespace: str) -> None:
    """Istio ambient with user-namespaced pods: the node agent and the node proxy work inside network namespaces
    that the pods' user namespaces own."""
    lab.kubectl("label", "namespace", namespace, "istio.io/dataplane-mode=ambient")
    server = pod_manifest("server", [http_echo_container()], node="node-2", hostUsers=False)
    client = pod_manifest("client", [sleeper()], node="node-1", hostUsers=False)
    lab.apply(server, client, namespace=namespace)
    pods = lab.wait_pods_ready(namespace, "", 2, timeout=90)
    enrolled = {
        p["metadata"]["name"]: p["metadata"].get("annotations", {}).get("ambient.istio.io/redirection") for p in pods
    }
    assert enrolled == {"server": "enabled", "client": "enabled"}
    server_ip = lab.pod("server", namespace)["status"]["podIP"]
    code = f"import urllib.request;print(urllib.request.urlopen('http://{server_ip}:8080/',timeout=5).read().decode())"

    def reply() -> dict[str, Any] | None:
        try:
            return dict(json.loads(lab.exec("client", namespace, "python3", "-c", code)))
        except (subprocess.SubprocessError, AssertionError, ValueError):
            return None

    answer = wait_until("a request from one user-namespaced pod to another", reply, timeout=30)
    assert answer is not None and answer["pod"] == "server"
    (proxy,) = [p for p in lab.pods("istio-system", "app=ztunnel") if p["spec"]["nodeName"] == "node-2"]
    log = lab.directory / "pods" / proxy["metadata"]["uid"] / "istio-proxy.log"
    identity = f"spiffe://cluster.local/ns/{namespace}/sa/default"
    wait_until(
        "node-2's node proxy logs the inbound HBONE connection with the client's identity",
        lambda: f"src.identity={identity}" in log.read_text(errors="replace"),
        timeout=10,
    )
