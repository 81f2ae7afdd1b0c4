"""The node runtime with real runc (root): stopping, adopting after a restart, and cleaning up containers.

Pods here have no sandbox of their own (their containers share the test's network namespace, as ``hostNetwork``
pods share the node's); everything else is the lab's: runc under a state directory of the test's, cgroups under a
parent named with a per-run prefix, removed by the lab's sweep function at the end (and checked gone).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ambit.apiserver.server import ApiServer
from ambit.k8s import InformerSettings, KubeClient, KubeNotFoundError, kinds
from ambit.lab.cluster.node import interpreter_dirs
from ambit.lab.runtime.kubelet import NodeRuntime, NodeRuntimeSettings
from ambit.lab.runtime.oci_apply import RuncRuntime, RuncSettings, list_containers, remove_lab_containers
from ambit.lab.runtime.oci_spec import container_id
from ambit.lab.runtime.processes import find_process, process_start_ticks

NS = "default"
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclasses.dataclass(frozen=True)
class SharedSandbox:
    netns: str = ""
    netns_path: str = ""
    ips: tuple[str, ...] = ("127.0.0.1",)


class NoSandboxes:
    def __init__(self) -> None:
        self.destroyed: list[str] = []

    async def create(self, pod: dict[str, Any], user_ids: object = None) -> SharedSandbox:
        return SharedSandbox()

    async def destroy(self, pod_uid: str) -> None:
        self.destroyed.append(pod_uid)


class Notes:
    def __init__(self) -> None:
        self.notes: list[dict[str, Any]] = []

    def note(self, kind: str, **fields: Any) -> None:
        self.notes.append({"kind": kind, **fields})


POLITE = ["sh", "-c", 'trap "echo got SIGTERM; exit 0" TERM; echo up; while :; do sleep 0.2; done']


def pod_manifest(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "none", "command": command}
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": "node-1", "containers": [container], **spec},
    }


async def eventually(check: Callable[[], Awaitable[Any]], within: float = 20.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s; last value {value!r}")
        await asyncio.sleep(0.05)


async def running(kube: KubeClient, name: str) -> dict[str, Any] | None:
    try:
        pod = await kube.get(kinds.PODS, name, NS)
    except KubeNotFoundError:
        return None
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return pod if statuses and "running" in (statuses[0].get("state") or {}) else None


@pytest.fixture
def runc_settings(tmp_path: Path) -> Iterator[RuncSettings]:
    parent = f"/ambit-abt{secrets.token_hex(3)}"
    settings = RuncSettings(
        root=tmp_path / "runc",
        bundles=tmp_path / "containers",
        cgroup_parent=parent,
        masked=("/root",),
        revealed=tuple(str(d) for d in interpreter_dirs() if str(d).startswith("/root/")),
    )
    yield settings
    _, left = remove_lab_containers(settings.root, parent)
    assert left == []
    assert not list(CGROUP_ROOT.glob(f"*{parent}")), "the lab's cgroups are left behind"


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


@pytest.fixture
def node_settings(tmp_path: Path, apiserver: ApiServer) -> NodeRuntimeSettings:
    return NodeRuntimeSettings(
        node_name="node-1",
        node_ip="127.0.0.1",
        pod_cidr="198.18.1.0/24",
        pods_dir=tmp_path / "pods",
        api_host="127.0.0.1",
        api_port=int(apiserver.url.rsplit(":", 1)[1]),
        heartbeat_interval=0.3,
        restart_backoff_initial=0.2,
        restart_backoff_max=0.4,
        config_retry=0.2,
        minimum_grace_seconds=1.0,
        informer=InformerSettings(backoff_initial=0.05, backoff_max=0.2, watch_timeout=30),
    )


def make_runtime(kube: KubeClient, settings: NodeRuntimeSettings, runc: RuncSettings) -> NodeRuntime:
    return NodeRuntime(kube, settings, NoSandboxes(), Notes(), containers=RuncRuntime(runc))


async def test_deletion_signals_the_container_and_leaves_no_runc_state(
    kube: KubeClient, node_settings: NodeRuntimeSettings, runc_settings: RuncSettings
) -> None:
    runtime = make_runtime(kube, node_settings, runc_settings)
    await runtime.start()
    try:
        created = await kube.create(kinds.PODS, pod_manifest("polite", POLITE, terminationGracePeriodSeconds=5))
        uid = created["metadata"]["uid"]
        cid = container_id(uid, "main")
        await eventually(lambda: running(kube, "polite"))
        log = node_settings.pods_dir / uid / "main.log"
        await eventually(lambda: _has(log, "up"))
        assert list_containers(runc_settings.root) == [cid]

        await kube.delete(kinds.PODS, "polite", NS)
        await eventually(lambda: _gone(kube, "polite"))
        assert "got SIGTERM" in log.read_text()
        assert list_containers(runc_settings.root) == []
        assert not await asyncio.to_thread(lambda: list(CGROUP_ROOT.glob(f"*{runc_settings.cgroup_parent}/{cid}")))
    finally:
        await runtime.aclose(stop_pods=True)


async def test_a_restarted_runtime_adopts_its_running_container_and_cleans_up_a_deleted_pod_s(
    kube: KubeClient, node_settings: NodeRuntimeSettings, runc_settings: RuncSettings
) -> None:
    first = make_runtime(kube, node_settings, runc_settings)
    await first.start()
    await kube.create(kinds.PODS, pod_manifest("stays", POLITE))
    await kube.create(kinds.PODS, pod_manifest("goes", POLITE))
    stays = await eventually(lambda: running(kube, "stays"))
    await eventually(lambda: running(kube, "goes"))
    before = stays["status"]["containerStatuses"][0]["containerID"]

    async def runc_knows_both() -> bool:
        # The pod is Running once `runc run` is started; runc writes its state a moment later (under load, later).
        return len(list_containers(runc_settings.root)) == 2

    await eventually(runc_knows_both)
    await first.aclose()  # as if killed: the containers keep running under runc
    assert len(list_containers(runc_settings.root)) == 2
    await kube.delete(kinds.PODS, "goes", NS, grace_period_seconds=0)

    second = make_runtime(kube, node_settings, runc_settings)
    await second.start()
    try:

        async def only_stays_left() -> bool:
            return list_containers(runc_settings.root) == [container_id(stays["metadata"]["uid"], "main")]

        await eventually(only_stays_left)
        pod = await eventually(lambda: running(kube, "stays"))  # the new runtime reports it once it has adopted it
        status = pod["status"]["containerStatuses"][0]
        assert (status["containerID"], status["restartCount"]) == (before, 0)  # adopted, not started again
        pid = int(before.removeprefix("ambit://"))

        # The adopted container is still supervised: killing it from outside is seen and it is restarted.
        handle = find_process(pid, process_start_ticks(pid) or 0)
        assert handle is not None
        await second.containers.signal(handle, container_id(pod["metadata"]["uid"], "main"), signal.SIGKILL)

        async def restarted() -> bool:
            again = await running(kube, "stays")
            return again is not None and again["status"]["containerStatuses"][0]["restartCount"] == 1

        await eventually(restarted)
    finally:
        await second.aclose(stop_pods=True)
    assert list_containers(runc_settings.root) == []


async def _has(path: Path, text: str) -> bool:
    return await asyncio.to_thread(lambda: path.exists() and text in path.read_text())


async def _gone(kube: KubeClient, name: str) -> bool:
    try:
        await kube.get(kinds.PODS, name, NS)
    except KubeNotFoundError:
        return True
    return False


async def test_each_pod_sees_its_own_resolv_conf_and_the_machine_s_file_is_untouched(
    kube: KubeClient, node_settings: NodeRuntimeSettings, runc_settings: RuncSettings, tmp_path: Path
) -> None:
    machine = Path("/etc/resolv.conf")
    machine_before = await asyncio.to_thread(machine.read_bytes)
    node_file = tmp_path / "node-resolv.conf"
    node_file.write_text("nameserver 192.0.2.53\nsearch node.example\n")
    settings = dataclasses.replace(node_settings, node_resolv_conf=node_file)
    show = ["sh", "-c", "cat /etc/resolv.conf; echo x 2>/dev/null > /etc/resolv.conf || echo read-only; sleep 30"]
    config = {"nameservers": ["198.18.1.53"], "searches": ["lab.example"], "options": [{"name": "ndots", "value": "2"}]}
    runtime = make_runtime(kube, settings, runc_settings)
    await runtime.start()
    try:
        cluster = await kube.create(kinds.PODS, pod_manifest("cluster-first", show))
        custom = await kube.create(kinds.PODS, pod_manifest("custom", show, dnsPolicy="None", dnsConfig=config))
        default = await kube.create(kinds.PODS, pod_manifest("default", show, dnsPolicy="Default"))
        logs = [settings.pods_dir / p["metadata"]["uid"] / "main.log" for p in (cluster, custom, default)]
        for log in logs:
            await eventually(lambda log=log: _has(log, "read-only"))
        texts = [log.read_text() for log in logs]
        assert texts[0].startswith(
            "search default.svc.cluster.local svc.cluster.local cluster.local node.example\n"
            "nameserver 198.19.0.10\n"
            "options ndots:5\n"
        )
        assert texts[1].startswith("search lab.example\nnameserver 198.18.1.53\noptions ndots:2\n")
        assert texts[2].startswith("search node.example\nnameserver 192.0.2.53\n")
        assert await asyncio.to_thread(machine.read_bytes) == machine_before

        bad = {"nameservers": ["dns.example"]}
        await kube.create(kinds.PODS, pod_manifest("bad-dns", show, dnsPolicy="None", dnsConfig=bad))

        async def failed() -> list[str]:
            items, _ = await kube.list(kinds.EVENTS, NS)
            return [str(e.get("note")) for e in items if e.get("reason") == "Failed"]

        notes = await eventually(failed)
        assert any("spec.dnsConfig.nameservers[0]" in note for note in notes), notes
    finally:
        await runtime.aclose(stop_pods=True)


# -- seccomp: what a container can and cannot do (rule 12 of oci_spec) ------------------------------------------------
SYSCALLS = {
    "x86_64": {"keyctl": 250, "add_key": 248, "kexec_load": 246, "bpf": 321, "perf_event_open": 298,
               "userfaultfd": 323, "unshare": 272, "mount": 165, "clone3": 435, "open_by_handle_at": 304,
               "init_module": 175, "setns": 308},
    "aarch64": {"keyctl": 219, "add_key": 217, "kexec_load": 104, "bpf": 280, "perf_event_open": 241,
                "userfaultfd": 282, "unshare": 97, "mount": 40, "clone3": 435, "open_by_handle_at": 265,
                "init_module": 105, "setns": 268},
}  # fmt: skip

ATTACKS = """
import ctypes, errno, json, os, platform, socket, subprocess, sys, time
NR = json.loads(sys.argv[1])[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[name]), *[a if isinstance(a, bytes) else ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def in_child(name, *args):
    pid = os.fork()
    if pid == 0:
        os._exit(0 if call(name, *args) == "ok" else 1)
    return "ok" if os.waitpid(pid, 0)[1] == 0 else "refused"
def run(*argv):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    return "ok" if done.returncode == 0 else done.stderr.strip()[-120:] or f"exit {done.returncode}"
out = {
    "keyctl": call("keyctl", 0, -3, 0),
    "add_key": call("add_key", b"user", b"ambit", b"x", 1, -2),
    "kexec_load": call("kexec_load", 0, 0, 0, 0),
    "init_module": call("init_module", 0, 0, b""),
    "bpf": call("bpf", 0, 0, 0),
    "perf_event_open": call("perf_event_open", 0, 0, -1, -1, 0),
    "userfaultfd": call("userfaultfd", 1 | os.O_CLOEXEC),
    "open_by_handle_at": call("open_by_handle_at", -100, 0, 0),
    "clone3": call("clone3", 0, 0),
    "mount": call("mount", b"none", b"/tmp", b"tmpfs", 0, 0),
    "setns": call("setns", os.open("/proc/self/ns/net", os.O_RDONLY), 0x40000000),
    "unshare_user": in_child("unshare", 0x10000000),
    "unshare -Urn": run("unshare", "-Urn", "true"),
    "unshare -Urm mount": run("unshare", "-Urm", "mount", "-t", "tmpfs", "none", "/tmp"),
    "thread": run(sys.executable, "-c", "import threading; t = threading.Thread(target=print); t.start(); t.join()"),
}
try:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, 36, 0x539)  # SO_MARK, as the node proxy marks its sockets
    out["so_mark"] = "ok"
except OSError as exc:
    out["so_mark"] = errno.errorcode.get(exc.errno, str(exc.errno))
print("RESULT " + json.dumps(out), flush=True)
time.sleep(60)
"""


BASE_PYTHON = os.path.realpath(sys.executable)
"""The interpreter behind the venv: a checkout under /tmp (CI's clean clone, its .venv) is hidden by a container's
private /tmp, while the base interpreter's directory is revealed (these scripts need only the standard library)."""


def attacker(name: str, **security: Any) -> dict[str, Any]:
    command = [BASE_PYTHON, "-c", ATTACKS, json.dumps(SYSCALLS)]
    manifest = pod_manifest(name, command, restartPolicy="Never")
    if security:
        manifest["spec"]["containers"][0]["securityContext"] = security
    return manifest


async def allow_privileged_pods(kube: KubeClient) -> None:
    """Pod Security Admission's ``privileged`` level for the test's namespace (baseline refuses Unconfined and
    SYS_ADMIN), as istio-system has it."""
    patch = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}
    await kube.patch(kinds.NAMESPACES, NS, patch)


async def _result(node_settings: NodeRuntimeSettings, uid: str) -> dict[str, str] | None:
    log = node_settings.pods_dir / uid / "main.log"

    def read() -> dict[str, str] | None:
        text = log.read_text() if log.exists() else ""
        for line in text.splitlines():
            if line.startswith("RESULT "):
                found: dict[str, str] = json.loads(line.removeprefix("RESULT "))
                return found
        return None

    return await asyncio.to_thread(read)


async def test_runtime_default_seccomp_refuses_what_an_escape_needs_and_unconfined_does_not(
    kube: KubeClient, node_settings: NodeRuntimeSettings, runc_settings: RuncSettings
) -> None:
    await allow_privileged_pods(kube)
    runtime = make_runtime(kube, node_settings, runc_settings)
    await runtime.start()
    try:
        pods = {
            "default": await kube.create(kinds.PODS, attacker("default")),  # unset: the lab's --seccomp-default
            "unconfined": await kube.create(kinds.PODS, attacker("unconfined", seccompProfile={"type": "Unconfined"})),
            "node-proxy": await kube.create(
                kinds.PODS,
                attacker(
                    "node-proxy",
                    seccompProfile={"type": "RuntimeDefault"},
                    capabilities={"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN", "NET_RAW"]},
                ),
            ),
        }
        seen = {
            name: await eventually(lambda p=p: _result(node_settings, p["metadata"]["uid"]), within=60)
            for name, p in pods.items()
        }
    finally:
        await runtime.aclose(stop_pods=True)

    default, unconfined, node_proxy = seen["default"], seen["unconfined"], seen["node-proxy"]
    for call in ("keyctl", "add_key", "kexec_load", "init_module", "bpf", "perf_event_open", "userfaultfd"):
        assert default[call] == "EPERM", (call, default)
    for call in ("open_by_handle_at", "mount", "setns"):
        assert default[call] == "EPERM", (call, default)
    assert default["clone3"] == "ENOSYS"  # libc falls back to clone, which may not make namespaces
    assert default["unshare_user"] == "refused"
    assert default["unshare -Urn"] != "ok" and "Operation not permitted" in default["unshare -Urn"], default
    assert default["unshare -Urm mount"] != "ok"
    assert default["thread"] == "ok"  # threads (clone without namespace flags) still work

    # The same container without a filter: the kernel alone lets an unprivileged process do these.
    assert unconfined["keyctl"] == "ok" and unconfined["add_key"] == "ok", unconfined
    assert unconfined["userfaultfd"] == "ok" and unconfined["unshare_user"] == "ok", unconfined
    assert unconfined["unshare -Urn"] == "ok" and unconfined["unshare -Urm mount"] == "ok", unconfined
    assert unconfined["clone3"] != "ENOSYS"

    # The node proxy's capabilities (Istio's ztunnel chart) keep what it needs under RuntimeDefault.
    assert node_proxy["setns"] == "ok" and node_proxy["so_mark"] == "ok", node_proxy
    assert node_proxy["keyctl"] == "EPERM" and node_proxy["kexec_load"] == "EPERM", node_proxy


async def test_a_localhost_profile_is_applied_and_a_bad_one_keeps_the_container_waiting(
    kube: KubeClient, node_settings: NodeRuntimeSettings, runc_settings: RuncSettings
) -> None:
    seccomp_dir = node_settings.seccomp_dir
    (seccomp_dir / "profiles").mkdir(parents=True)
    permissive = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["keyctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": 95},  # EOPNOTSUPP: this profile's own answer
    ]}  # fmt: skip
    (seccomp_dir / "profiles" / "no-keys.json").write_text(json.dumps(permissive))
    (seccomp_dir / "profiles" / "broken.json").write_text('{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": 7}')
    runtime = make_runtime(kube, node_settings, runc_settings)
    await runtime.start()
    try:
        local = {"type": "Localhost", "localhostProfile": "profiles/no-keys.json"}
        applied = await kube.create(kinds.PODS, attacker("local", seccompProfile=local))
        broken = {"type": "Localhost", "localhostProfile": "profiles/broken.json"}
        await kube.create(kinds.PODS, attacker("broken", seccompProfile=broken))
        missing = {"type": "Localhost", "localhostProfile": "profiles/absent.json"}
        await kube.create(kinds.PODS, attacker("missing", seccompProfile=missing))
        seen = await eventually(lambda: _result(node_settings, applied["metadata"]["uid"]), within=60)
        assert seen["keyctl"] in ("ENOTSUP", "EOPNOTSUPP") and seen["add_key"] == "ok", seen

        async def waiting(name: str) -> dict[str, Any] | None:
            pod = await kube.get(kinds.PODS, name, NS)
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            state = (statuses[0].get("state") or {}).get("waiting") if statuses else None
            return state if state and state.get("reason") == "CreateContainerError" else None

        state = await eventually(lambda: waiting("broken"))
        assert state["message"].startswith("cannot load seccomp profile 'profiles/broken.json': syscalls must be")
        state = await eventually(lambda: waiting("missing"))
        assert "profiles/absent.json" in state["message"] and "no such file" in state["message"], state
    finally:
        await runtime.aclose(stop_pods=True)


# -- user namespaces (hostUsers: false, rule 13 of oci_spec) -----------------------------------------------------------
IDENTITY = """
import errno, json, os, sys, time
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
def write(path):
    with open(path, "a") as f:
        f.write("pod was here\\n")
out = {
    "uid": os.getuid(), "gid": os.getgid(),
    "uid_map": open("/proc/self/uid_map").read().split(),
    "gid_map": open("/proc/self/gid_map").read().split(),
    "host_file_owner": os.stat("/etc/hostname").st_uid,
    "read_host_file": attempt(lambda: open("/etc/hostname").read()),
    "write_host_owned": attempt(lambda: write("/data/owned.txt")),
    "create_in_host_dir": attempt(lambda: write("/data/new.txt")),
    "write_empty_dir": attempt(lambda: write("/scratch/mine.txt")),
    "empty_dir_owner": os.stat("/scratch").st_uid,
    "token": attempt(lambda: open("/var/run/secrets/kubernetes.io/serviceaccount/token").read()),
}
print("RESULT " + json.dumps(out), flush=True)
time.sleep(60)
"""


def identity_pod(name: str, **spec: Any) -> dict[str, Any]:
    manifest = pod_manifest(name, [BASE_PYTHON, "-c", IDENTITY], restartPolicy="Never", **spec)
    manifest["spec"]["volumes"] = [
        {"name": "data", "hostPath": {"path": f"/data/{name}", "type": "Directory"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    manifest["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "data", "mountPath": "/data"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    return manifest


async def test_a_pod_without_host_users_is_root_inside_and_an_unprivileged_id_on_the_host(
    kube: KubeClient, node_settings: NodeRuntimeSettings, runc_settings: RuncSettings
) -> None:
    await allow_privileged_pods(kube)  # hostPath, to show a host-owned file
    node_root = node_settings.host_path_layout.root
    for name in ("userns-a", "userns-b", "host-users"):
        (node_root / "data" / name).mkdir(parents=True)
        (node_root / "data" / name / "owned.txt").write_text("root's\n")
        (node_root / "data" / name / "owned.txt").chmod(0o644)
    runtime = make_runtime(kube, node_settings, runc_settings)
    await runtime.start()
    try:
        pods = {
            "userns-a": await kube.create(kinds.PODS, identity_pod("userns-a", hostUsers=False)),
            "userns-b": await kube.create(kinds.PODS, identity_pod("userns-b", hostUsers=False)),
            "host-users": await kube.create(kinds.PODS, identity_pod("host-users")),
        }
        seen = {
            name: await eventually(lambda p=p: _result(node_settings, p["metadata"]["uid"]), within=60)
            for name, p in pods.items()
        }
        saved = {
            name: json.loads((node_settings.pods_dir / p["metadata"]["uid"] / "userns.json").read_text())
            for name, p in pods.items()
            if name != "host-users"
        }
        written = {  # before the pods' volumes go with them
            name: [f.stat().st_uid for f in (node_settings.pods_dir / p["metadata"]["uid"]).rglob("mine.txt")]
            for name, p in pods.items()
        }
    finally:
        await runtime.aclose(stop_pods=True)

    firsts = []
    for name in ("userns-a", "userns-b"):
        inside = seen[name]
        first = int(inside["uid_map"][1])
        firsts.append(first)
        assert (inside["uid"], inside["gid"]) == (0, 0)  # root in the container...
        assert inside["uid_map"] == ["0", str(first), "65536"] and inside["gid_map"] == inside["uid_map"]
        assert first >= 65536 and first % 65536 == 0  # ...an unprivileged block of ids on the host
        assert saved[name]["uidMappings"] == [{"hostId": first, "containerId": 0, "length": 65536}]
        assert inside["host_file_owner"] == 65534 and inside["read_host_file"] == "ok"  # root's files: nobody's
        assert inside["write_host_owned"] == "EACCES" and inside["create_in_host_dir"] == "EACCES", inside
        assert inside["write_empty_dir"] == "ok" and inside["empty_dir_owner"] == 0, inside
        assert inside["token"] == "ok"
        assert written[name] == [first]  # what it writes is the block's on the host
        assert (node_root / "data" / name / "owned.txt").read_text() == "root's\n"
    assert firsts[0] != firsts[1]  # the pods' ranges do not overlap

    host = seen["host-users"]
    assert host["uid_map"] == ["0", "0", "4294967295"] and host["host_file_owner"] == 0
    assert host["write_host_owned"] == "ok"  # the control: root of the host's user namespace may


async def test_host_users_false_refuses_ids_outside_the_namespace_and_ranges_are_freed_and_restored(
    kube: KubeClient, node_settings: NodeRuntimeSettings, runc_settings: RuncSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ambit.lab.runtime")  # a slow delete (seen once under CI's load) tells why
    runtime = make_runtime(kube, node_settings, runc_settings)
    await runtime.start()
    try:
        outside = pod_manifest("outside", ["sleep", "30"], hostUsers=False)
        outside["spec"]["securityContext"] = {"runAsUser": 70000}
        await kube.create(kinds.PODS, outside)

        async def refused() -> dict[str, Any] | None:
            pod = await kube.get(kinds.PODS, "outside", NS)
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            state = (statuses[0].get("state") or {}).get("waiting") if statuses else None
            return state if state and state.get("reason") == "CreateContainerConfigError" else None

        state = await eventually(refused)
        assert "hostUsers is false: id 70000 is outside the pod's user namespace" in state["message"], state
        created = await kube.create(kinds.PODS, pod_manifest("kept", POLITE, hostUsers=False))
        await eventually(lambda: running(kube, "kept"))
        uid = created["metadata"]["uid"]
        ids = runtime.userns.find(uid)
        assert ids is not None
    finally:
        await runtime.aclose()  # the container keeps running, as after a kubelet crash
    second = make_runtime(kube, node_settings, runc_settings)
    await second.start()
    try:
        await eventually(lambda: running(kube, "kept"))
        second._load_user_namespaces()
        assert second.userns.find(uid) == ids  # taken back from the pod's directory, not given to another pod
        await kube.delete(kinds.PODS, "kept", NS)
        # Beyond the pod's 30 s grace period: under CI's load the delete once took over 20 s (cause not found yet;
        # unloaded it takes well under a second), and a stop that has to fall back to SIGKILL still ends in time.
        await eventually(lambda: _gone(kube, "kept"), within=45.0)
        assert second.userns.find(uid) is None
        assert not (node_settings.pods_dir / uid / "userns.json").exists()
    finally:
        await second.aclose(stop_pods=True)
