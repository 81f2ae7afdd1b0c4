"""``kubectl debug node/N`` in the lab, as the runtime plans it (pure): the pod kubectl makes, its hostPath ``/``
at ``/host``, and what the container's mounts show there (:mod:`ambit.lab.runtime.node_view`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.lab.network.topology import HostPathLayout
from ambit.lab.runtime.node_view import NodeView, ViewBind, ViewLink, plan_node_view, view_mounts
from ambit.lab.runtime.oci_spec import BundlePaths, ProcessSpec, VolumeMount, container_config, container_id
from ambit.lab.runtime.volumes import VolumeSource, container_mounts, parse_volumes

LAYOUT = HostPathLayout(Path("/lab"), "node-1")
ROOT = "/lab/nodes/node-1/root"
MERGED_USR = {"/usr": None, "/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64"}
UID = "7a1f0000-0000-4000-8000-000000000001"


def debugger_pod(node: str = "node-1", *, it: bool = False) -> dict[str, Any]:
    """The pod ``kubectl debug node/node-1 --image=none [-it] -- chroot /host ls /etc/cni/net.d`` creates (1.32)."""
    container: dict[str, Any] = {
        "name": "debugger",
        "image": "none",
        "command": ["chroot", "/host", "ls", "/etc/cni/net.d"],
        "terminationMessagePolicy": "File",
        "volumeMounts": [{"mountPath": "/host", "name": "host-root"}],
    }
    if it:
        container |= {"stdin": True, "tty": True}
    return {
        "metadata": {"name": f"node-debugger-{node}-x7k2q", "namespace": "default", "uid": UID},
        "spec": {
            "nodeName": node,
            "hostIPC": True,
            "hostNetwork": True,
            "hostPID": True,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
            "volumes": [{"name": "host-root", "hostPath": {"path": "/", "type": ""}}],
        },
    }


def test_the_view_binds_the_nodes_cni_and_netns_dirs_and_the_machines_system_dirs() -> None:
    view = plan_node_view(LAYOUT, MERGED_USR)
    assert view.root == ROOT
    assert view.binds == (
        ViewBind("/etc/cni/net.d", "/lab/nodes/node-1/cni/net.d", False),
        ViewBind("/opt/cni/bin", "/lab/nodes/node-1/cni/bin", False),
        ViewBind("/var/run/netns", "/run/netns", False),
        ViewBind("/run/netns", "/run/netns", False),
        ViewBind("/usr", "/usr", True),
    )
    assert view.links == (
        ViewLink("/bin", "usr/bin"),
        ViewLink("/sbin", "usr/sbin"),
        ViewLink("/lib", "usr/lib"),
        ViewLink("/lib64", "usr/lib64"),
    )
    assert not any(b.machine_path.startswith(("/proc", "/sys", "/dev")) for b in view.binds)


def test_system_links_that_leave_the_tree_are_not_copied_and_real_directories_are_bound() -> None:
    view = plan_node_view(LAYOUT, {"/usr": None, "/bin": "/usr/bin", "/lib": "../../lib", "/sbin": None})
    assert view.links == ()
    assert [b.node_path for b in view.binds if b.read_only] == ["/usr", "/sbin"]


def test_kubectl_debug_node_pod_sees_the_nodes_root_at_host() -> None:
    pod = debugger_pod()
    assert [v.name for v in parse_volumes(pod)] == ["host-root"]
    sources = {"host-root": VolumeSource(ROOT, read_only=False)}
    plans = container_mounts(pod["spec"]["containers"][0], sources, privileged=False, expand=lambda t: t)
    view = plan_node_view(LAYOUT, MERGED_USR)
    mounts = view_mounts(tuple(p.mount for p in plans), view, masked=("/lab", "/root", "/run/netns", "/etc/shadow"))
    assert mounts == (
        VolumeMount(ROOT, "/host", False, "rprivate"),
        VolumeMount("/lab/nodes/node-1/cni/net.d", "/host/etc/cni/net.d", False, "rprivate"),
        VolumeMount("/lab/nodes/node-1/cni/bin", "/host/opt/cni/bin", False, "rprivate"),
        VolumeMount("/run/netns", "/host/var/run/netns", False, "rprivate"),
        VolumeMount("/run/netns", "/host/run/netns", False, "rprivate"),
        VolumeMount("/usr", "/host/usr", True, "rprivate", recursive_read_only=True),
    )
    paths = BundlePaths(
        container_id=container_id(UID, "debugger"),
        netns_path="",  # hostNetwork: the node's network namespace, the runtime's own
        service_account_dir=f"/lab/pods/{UID}/serviceaccount",
        cgroup_parent="/ambit-ab12cd",
        masked=("/lab", "/root", "/run/netns"),
        volume_mounts=mounts,
    )
    config = container_config(pod, pod["spec"]["containers"][0], ProcessSpec(("chroot", "/host", "ls"), {}), paths)
    shown = {m["destination"]: (m["source"], m["options"]) for m in config["mounts"] if m["destination"][:5] == "/host"}
    assert shown["/host"] == (ROOT, ["rbind", "rw", "rprivate"])
    assert shown["/host/etc/cni/net.d"] == ("/lab/nodes/node-1/cni/net.d", ["rbind", "rw", "rprivate"])
    assert shown["/host/usr"] == ("/usr", ["rbind", "rro", "rprivate"])
    order = [m["destination"] for m in config["mounts"]]
    assert order.index("/host") < order.index("/host/etc/cni/net.d")  # the tree first, then what it shows
    namespaces = {n["type"] for n in config["linux"]["namespaces"]}
    assert "pid" in namespaces and "ipc" in namespaces  # hostPID and hostIPC: the container's own (the lab's rule)


def test_a_volume_of_a_directory_of_the_tree_shows_the_binds_below_it() -> None:
    view = plan_node_view(LAYOUT, MERGED_USR)
    etc = VolumeMount(f"{ROOT}/etc", "/node-etc", True, "rslave")
    run = VolumeMount(f"{ROOT}/var/run", "/var/run/node", False, "rprivate")
    other = VolumeMount("/lab/pods/x/volumes/kubernetes.io~empty-dir/cache", "/cache")
    assert view_mounts((etc, run, other), view) == (
        etc,
        run,
        other,
        VolumeMount("/lab/nodes/node-1/cni/net.d", "/node-etc/cni/net.d", True, "rslave"),
        VolumeMount("/run/netns", "/var/run/node/netns", False, "rprivate"),
    )


def test_a_system_dir_holding_a_masked_path_is_left_out_and_no_view_changes_nothing() -> None:
    view = plan_node_view(LAYOUT, {"/usr": None})
    root = VolumeMount(ROOT, "/host")
    masked = ("/usr/local/lab-state",)
    assert all(m.destination != "/host/usr" for m in view_mounts((root,), view, masked))
    assert view_mounts((root,), None) == (root,)
    assert view_mounts((root,), NodeView(ROOT)) == (root,)


@given(st.lists(st.sampled_from(["etc", "cni", "var", "run", "opt", "usr", "netns", "x", ".."]), max_size=4))
def test_every_view_mount_lies_under_the_mount_that_shows_it(parts: list[str]) -> None:
    view = plan_node_view(LAYOUT, MERGED_USR)
    source = "/".join([ROOT, *parts])
    mount = VolumeMount(source, "/v")
    for extra in view_mounts((mount,), view)[1:]:
        assert extra.destination.startswith("/v/")
        assert ".." not in extra.destination.split("/") or ".." in parts


@pytest.mark.parametrize("node", ["node-1", "node-2"])
def test_a_nodes_view_names_only_its_own_cni_dirs(node: str) -> None:
    view = plan_node_view(HostPathLayout(Path("/lab"), node), {})
    assert {b.machine_path for b in view.binds} == {
        f"/lab/nodes/{node}/cni/net.d",
        f"/lab/nodes/{node}/cni/bin",
        "/run/netns",
    }
