"""Finding a running pod's netns from /proc: the cgroup forms kube's drivers and the lab's runtime write, whole-uid
matching only, never the host's own namespace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.cni.procscan import cgroup_names_pod, find_pod_netns

UID = "0f3c2a5e-8b1d-4c7e-9a6f-2d4b8e1c3a5f"
OTHER = "0f3c2a5e-8b1d-4c7e-9a6f-2d4b8e1c3a50"


@pytest.mark.parametrize(
    "text",
    [
        f"0::/kubepods/besteffort/pod{UID}/0123abcd\n",
        "1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-1.scope\n",
        f"4:memory:/ab12cd/{UID.replace('-', '')}-app\n",
    ],
)
def test_the_cgroup_forms_of_kube_and_the_lab_name_the_pod(text: str) -> None:
    assert cgroup_names_pod(text, UID)


@pytest.mark.parametrize(
    "text",
    [
        f"0::/kubepods/besteffort/pod{OTHER}/x\n",
        f"0::/kubepods/besteffort/pod{UID}0/x\n",  # a longer hex run is another uid
        "0::/user.slice/session-1.scope\n",
        "",
    ],
)
def test_other_pods_and_host_processes_do_not(text: str) -> None:
    assert not cgroup_names_pod(text, UID)


def test_a_uid_that_is_not_a_uuid_never_matches() -> None:
    assert not cgroup_names_pod("0::/kubepods/pod/x\n", "")
    assert not cgroup_names_pod("0::/a/b\n", "a")


@given(st.text(), st.text())
def test_any_input_answers_without_raising(text: str, uid: str) -> None:
    cgroup_names_pod(text, uid)


def test_the_scan_finds_the_pods_process_and_never_the_hosts_namespace(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    host_ns = tmp_path / "host-net"
    pod_ns = tmp_path / "pod-net"
    host_ns.write_text("")
    pod_ns.write_text("")

    def process(pid: int, cgroup: str, netns: Path) -> None:
        (proc / str(pid) / "ns").mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(cgroup)
        os.link(netns, proc / str(pid) / "ns" / "net")  # the same inode, as /proc's ns links are

    process(1, "0::/init.scope\n", host_ns)
    process(40, f"0::/kubepods/pod{UID}/c\n", host_ns)  # a hostNetwork process of the pod: never the answer
    process(50, f"0::/kubepods/pod{UID}/c\n", pod_ns)
    process(60, f"0::/kubepods/pod{OTHER}/c\n", pod_ns)
    assert find_pod_netns(proc, UID) == str(proc / "50" / "ns" / "net")
    assert find_pod_netns(proc, "1e3c2a5e-8b1d-4c7e-9a6f-2d4b8e1c3a5f") is None
    assert find_pod_netns(tmp_path / "missing", UID) is None


def test_with_pid_1_hidden_the_agents_own_namespace_is_still_never_the_answer(tmp_path: Path) -> None:
    """A sandboxed machine may refuse access to pid 1's namespace (this CI machine does): the agent's own (it runs
    on the node's network) still rules the node out, and the pod is found."""
    proc = tmp_path / "proc"
    node_ns = tmp_path / "node-net"
    pod_ns = tmp_path / "pod-net"
    node_ns.write_text("")
    pod_ns.write_text("")
    for pid, netns in ((40, node_ns), (50, pod_ns)):
        (proc / str(pid) / "ns").mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::/ambit-ab12/{UID.replace('-', '')}-main\n")
        os.link(netns, proc / str(pid) / "ns" / "net")
    assert find_pod_netns(proc, UID, own_netns=node_ns) == str(proc / "50" / "ns" / "net")
    assert find_pod_netns(proc, UID, own_netns=tmp_path / "unreadable") is None, "no node namespace known: none"
