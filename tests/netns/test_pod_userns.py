"""A pod's network namespace made inside its own user namespace (:mod:`ambit.lab.runtime.pod_userns`), for real.

Each test names its namespace with a random prefix and deletes it at the end, whatever happened.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambit.commands import SubprocessRunner
from ambit.lab.runtime.pod_userns import PodUsernsError, add_netns_in_user_namespace, fd_path, open_owner
from ambit.lab.runtime.userns import USERNS_LENGTH, IdRange

IDS = IdRange(37 * USERNS_LENGTH)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"ambit-t{uuid.uuid4().hex[:8]}-userns"
    yield name
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    assert not os.path.exists(f"/run/netns/{name}")


def holders() -> list[str]:
    """unshare/sleep holders this test might have left: this process's children only (a lab's node runtime beside
    the suite makes the same holders for its own pods)."""
    found = subprocess.run(
        ["pgrep", "-P", str(os.getpid()), "-af", "unshare --user --net -- sleep"],
        capture_output=True,
        text=True,
        check=False,
    )
    out = found.stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


async def test_the_network_namespace_belongs_to_a_user_namespace_with_the_pod_s_maps(netns: str) -> None:
    await add_netns_in_user_namespace(SubprocessRunner(), netns, IDS)
    check_entered(netns)


def check_entered(netns: str) -> None:
    path = f"/run/netns/{netns}"
    owner = open_owner(path)
    assert owner is not None, "the host's user namespace owns it"
    try:
        # Entering as runc exec does (user namespace first, then the network namespace) works, as root of the pod.
        probe = subprocess.run(
            ["nsenter", f"--user={fd_path(owner)}", f"--net={path}", "sh", "-c", "id -u; cat /proc/self/uid_map"],
            capture_output=True,
            text=True,
            pass_fds=(owner,),
            check=True,
        )
    finally:
        os.close(owner)
    uid, mapping = probe.stdout.split("\n", 1)
    assert uid == "0" and mapping.split() == ["0", str(IDS.first), str(IDS.length)]
    # Host root keeps its power over it: the CNI plugins and the node agent work there as before.
    up = subprocess.run(
        ["ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up"], capture_output=True, text=True, check=False
    )
    assert up.returncode == 0, up.stderr
    assert not holders()


def test_a_host_owned_network_namespace_has_no_pod_user_namespace(netns: str) -> None:
    subprocess.run(["ip", "netns", "add", netns], check=True)
    assert open_owner(f"/run/netns/{netns}") is None


async def test_maps_the_kernel_refuses_leave_no_namespace_and_no_holder(netns: str) -> None:
    beyond = IdRange(2**32 - USERNS_LENGTH // 2)  # runs past the 32-bit id space
    with pytest.raises(PodUsernsError, match="cannot write the pod's uid_map"):
        await add_netns_in_user_namespace(SubprocessRunner(), netns, beyond)
    assert not Path(f"/run/netns/{netns}").exists()  # noqa: ASYNC240 - a stat on tmpfs
    assert not holders()


async def test_cancelled_while_making_them_leaves_no_holder(netns: str) -> None:
    task = asyncio.create_task(add_netns_in_user_namespace(SubprocessRunner(), netns, IDS))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not holders()
