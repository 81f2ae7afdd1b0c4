"""``/cmdadd`` netns checks against the real kernel: a real pod sandbox namespace, the host's, another pod's."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator

import pytest

from ambit.cni.addcheck import AddEventRefusedError, KernelNetnsProbe, check_add_event, resolved_dirs

POD = {"metadata": {"namespace": "apps", "name": "web"}, "spec": {"nodeName": "node-1"}}


@pytest.fixture
def two_sandboxes() -> Iterator[tuple[str, str]]:
    names = [f"ambit-ac-{secrets.token_hex(3)}" for _ in range(2)]
    for name in names:
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield f"/run/netns/{names[0]}", f"/var/run/netns/{names[1]}"
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], check=False)


def check(path: str, sandbox: str) -> None:
    probe = KernelNetnsProbe()
    check_add_event(
        POD,
        path,
        node_name="node-1",
        netns_dirs=resolved_dirs(("/run/netns", "/var/run/netns")),
        facts=probe.inspect(path),
        forbidden=probe.forbidden(),
        sandbox=probe.inspect(sandbox),
    )


def test_a_pods_real_sandbox_namespace_is_accepted_by_either_directory_name(two_sandboxes: tuple[str, str]) -> None:
    mine, other = two_sandboxes
    check(mine, mine)
    check(other, other.replace("/var/run/", "/run/"))


@pytest.mark.parametrize("path", ["/proc/1/ns/net", "/proc/self/ns/net", "/etc/hostname"])
def test_the_hosts_namespace_and_plain_files_are_refused(two_sandboxes: tuple[str, str], path: str) -> None:
    with pytest.raises(AddEventRefusedError):
        check(path, two_sandboxes[0])


def test_another_pods_real_sandbox_is_refused(two_sandboxes: tuple[str, str]) -> None:
    mine, other = two_sandboxes
    with pytest.raises(AddEventRefusedError, match="not this pod's sandbox"):
        check(other, mine)
