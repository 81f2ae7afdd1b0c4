"""A pod's user namespace that owns its network namespace (``hostUsers: false``), as containerd makes it.

Theory of operation. The kubelet's sandbox of a pod without host users is a network namespace made *inside* the
pod's user namespace, so root of the pod holds the capabilities its container keeps over its own network (binding
low ports, raw sockets), and ``runc exec`` can join the pod: it enters the user namespace first and then the network
namespace, which it may only do when that user namespace owns it (runc 1.1 fails with "failed to setns into net
namespace" on a network namespace of the host's user namespace).

Rules:

1. :func:`add_netns_in_user_namespace` runs a holder, ``unshare --user --net -- sleep``, which makes both
   namespaces in one call (the user namespace first, so it owns the network namespace); once the holder is in them
   the runtime writes the pod's uid and gid maps (one block, :class:`~ambit.lab.runtime.userns.IdRange`) and mounts
   the network namespace at ``/run/netns/<name>`` with ``ip netns attach``. The holder is then killed: the mount
   keeps the network namespace alive, and the network namespace keeps its user namespace. Anything that fails
   kills the holder, and a mount already made is the caller's to remove (``ip netns delete``), as for ``ip netns
   add``. Host root keeps every capability over both (it is in an ancestor user namespace), so CNI plugins, the
   node agent and the node proxy enter the pod's network namespace as before.
2. :func:`open_owner` opens the user namespace that owns a mounted network namespace (``NS_GET_USERNS``): a
   container of the pod joins that one by path (``/proc/<runtime pid>/fd/<fd>``, kept open by the pod's worker)
   rather than making a namespace of its own. A network namespace the host's user namespace owns (a sandbox made
   before this rule) answers None: its containers make their own user namespace with the same maps, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time

from ambit.commands import CommandRunner
from ambit.errors import AmbitError
from ambit.lab.runtime.userns import IdRange

NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1), linux/nsfs.h
HOLDER_START_TIMEOUT = 10.0
_POLL = 0.005


class PodUsernsError(AmbitError):
    """The pod's user and network namespaces could not be made."""


async def add_netns_in_user_namespace(runner: CommandRunner, netns: str, ids: IdRange) -> None:
    """Rule 1: ``/run/netns/<netns>``, owned by a new user namespace with ``ids`` as its uid and gid maps."""
    holder = await asyncio.create_subprocess_exec(
        "unshare",
        "--user",
        "--net",
        "--",
        "sleep",
        "600",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await _wait_until_unshared(holder)
        _write_maps(holder.pid, ids)
        await runner.run_async(["ip", "netns", "attach", netns, str(holder.pid)])
    finally:
        with contextlib.suppress(ProcessLookupError):
            holder.kill()
        await holder.wait()


def _write_maps(pid: int, ids: IdRange) -> None:
    mapping = f"0 {ids.first} {ids.length}\n".encode()
    for name in ("uid_map", "gid_map"):  # a write to /proc: no need to leave the event loop
        try:
            fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, mapping)
            finally:
                os.close(fd)
        except OSError as exc:
            raise PodUsernsError(
                f"cannot write the pod's {name} ({mapping.decode().strip()}): {exc.strerror}"
            ) from None


async def _wait_until_unshared(holder: asyncio.subprocess.Process) -> None:
    own = os.stat("/proc/self/ns/net").st_ino
    deadline = time.monotonic() + HOLDER_START_TIMEOUT
    while time.monotonic() < deadline:
        if holder.returncode is not None:
            break
        with contextlib.suppress(OSError):  # not yet exec'd, or gone
            if os.stat(f"/proc/{holder.pid}/ns/net").st_ino != own:
                return
        await asyncio.sleep(_POLL)
    detail = b""
    if holder.returncode is not None and holder.stderr is not None:
        detail = await holder.stderr.read(512)
    reason = detail.decode(errors="replace").strip() or "it did not enter new namespaces in time"
    raise PodUsernsError(f"cannot make the pod's user and network namespaces: unshare: {reason}")


def open_owner(netns_path: str) -> int | None:
    """Rule 2: a file descriptor of the user namespace owning ``netns_path``, or None when the host's owns it."""
    fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        owner = fcntl.ioctl(fd, NS_GET_USERNS)
    finally:
        os.close(fd)
    if os.fstat(owner).st_ino == os.stat("/proc/self/ns/user").st_ino:
        os.close(owner)
        return None
    return owner


def fd_path(fd: int) -> str:
    """The path by which another process (runc) opens this process's ``fd``."""
    return f"/proc/{os.getpid()}/fd/{fd}"
