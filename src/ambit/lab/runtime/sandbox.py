"""Pod sandboxes as a node's runtime makes them: a network namespace per pod, attached by the node's CNI chain.

A sandbox is named after its pod (``topology.pod_netns(uid)``) and its CNI container id is the pod's uid, so a
runtime that restarts finds its sandboxes again by uid alone. The plugins run inside the node's namespace (the
CNI bridge and host-local's state are the node's), with their results cached under ``nodes/<node>/cni/cache``.

Invariants:

- :meth:`PodSandboxes.create` either returns an attached sandbox or leaves nothing behind: when CNI ADD fails the
  chain is torn down (DEL, as containerd does after a failed set-up, so an address already taken is released) and
  the namespace removed, then the :class:`~ambit.lab.network.plugins.CniInvocationError` propagates for the runtime to
  report.
- :meth:`PodSandboxes.destroy` is idempotent: DEL tolerates a missing namespace or attachment, and the namespace
  is removed even when DEL fails (the error is raised afterwards; a later destroy retries DEL with the cache).
- The namespace is noted in the lab's record before it is created (a crash leaves nothing the sweep misses).
- The namespace belongs to the host's user namespace, except for a pod with ``hostUsers: false``: its namespace
  belongs to the pod's own user namespace (:mod:`ambit.lab.runtime.pod_userns`), as containerd makes it, so that
  ``runc exec`` can join the pod. Such a pod's namespace also lets any user bind ports below 1024 and open ICMP
  echo sockets (:data:`USERNS_SYSCTLS`), as containerd sets for every pod.
- A pod's namespace gets a congestion control that does not pace where the machine's default does
  (:mod:`ambit.lab.network.congestion`: every link of a lab is on one machine).
- The pod's own ``securityContext.sysctls`` are set in its namespace when they are among the kubelet's safe,
  network-namespaced ones (:data:`SAFE_NET_SYSCTLS`, e.g. istiod's gateway template asks for
  ``net.ipv4.ip_unprivileged_port_start: "0"`` so that a gateway running as 1337 listens on port 80) with a
  value of digits and single spaces (:func:`pod_sysctls`); any other is left out, as it would be refused by a
  kubelet that does not allow unsafe sysctls.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambit.cni.errors import CniError
from ambit.commands import CommandRunner
from ambit.lab.cluster.record import Record
from ambit.lab.network import plugins
from ambit.lab.network.congestion import machine_congestion_sysctls
from ambit.lab.network.plugins import CniInvocationError, CniResult
from ambit.lab.network.topology import Topology
from ambit.lab.runtime.pod_userns import add_netns_in_user_namespace
from ambit.lab.runtime.userns import IdRange, hosts_users

NETNS_RUN_DIR = "/run/netns"  # where ``ip netns add`` mounts named namespaces
USERNS_SYSCTLS = ("net.ipv4.ip_unprivileged_port_start=0", "net.ipv4.ping_group_range=0 2147483647")
POD_IFNAME = "eth0"
SAFE_NET_SYSCTLS = frozenset(
    {
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
    }
)
"""The kubelet's safe sysctls that belong to the pod's network namespace."""
_SYSCTL_VALUE = re.compile(r"[0-9]{1,10}( [0-9]{1,10}){0,2}")


@dataclass(frozen=True, slots=True)
class Sandbox:
    netns: str
    netns_path: str
    ips: tuple[str, ...]
    result: CniResult


class PodSandboxes:
    """The pod sandboxes of one node."""

    def __init__(
        self,
        topology: Topology,
        node_name: str,
        record: Record,
        runner: CommandRunner,
        congestion: tuple[str, ...] | None = None,
    ) -> None:
        node = topology.node_named(node_name)
        if node is None:
            raise ValueError(f"no node {node_name!r} in lab {topology.lab_id}")
        self.topology = topology
        self.node = node
        self.record = record
        self.runner = runner
        self.congestion = machine_congestion_sysctls() if congestion is None else congestion
        """What every pod's namespace gets set first (:mod:`ambit.lab.network.congestion`; None: this machine's)."""

    @property
    def conf_dir(self) -> Path:
        return self.topology.cni_conf_dir(self.node.name)

    @property
    def bin_dirs(self) -> list[Path]:
        return [self.topology.cni_bin_dir(self.node.name)]

    @property
    def cache_dir(self) -> Path:
        return self.topology.node_dir(self.node.name) / "cni" / "cache"

    def netns_path(self, pod_uid: str) -> str:
        return f"{NETNS_RUN_DIR}/{self.topology.pod_netns(pod_uid)}"

    async def create(self, pod: Mapping[str, Any], user_ids: IdRange | None = None) -> Sandbox:
        """Make the pod's namespace and attach it (CNI ADD); raises :class:`CniInvocationError`, leaving nothing
        behind. With ``user_ids`` (a pod without host users) the namespace belongs to a new user namespace with
        those ids (:mod:`ambit.lab.runtime.pod_userns`)."""
        uid, name, namespace = _identity(pod)
        conflist = plugins.load_conflist(self.conf_dir)  # before creating anything: a bad config leaves nothing
        netns, path = self.topology.pod_netns(uid), self.netns_path(uid)
        if _exists(path):
            await self.destroy(uid)  # a stale sandbox of an earlier run: start clean
        self.record.note("netns", name=netns)
        args = _cni_args(uid, name, namespace)
        try:
            if user_ids is None:
                await self.runner.run_async(["ip", "netns", "add", netns])
            else:
                await add_netns_in_user_namespace(self.runner, netns, user_ids)
            wanted = [*self.congestion, *(() if hosts_users(pod) else USERNS_SYSCTLS), *pod_sysctls(pod)]
            if wanted:  # one process for all of them, none when there is nothing to set
                await self.runner.run_async(["ip", "netns", "exec", netns, "sysctl", "-q", "-w", *wanted])
            result = await plugins.add(conflist, uid, path, POD_IFNAME, args, *self._exec(), cache_dir=self.cache_dir)
        except BaseException:
            try:
                await plugins.delete(conflist, uid, path, POD_IFNAME, args, *self._exec(), cache_dir=self.cache_dir)
            except Exception:  # the ADD failure is the one to report
                pass
            finally:
                if _exists(path):
                    await self.runner.run_async(["ip", "netns", "delete", netns], check=False)
            raise
        return Sandbox(netns, path, result.pod_ips, result)

    async def destroy(self, pod_uid: str) -> None:
        """Detach (CNI DEL) and remove the pod's namespace; nothing to do is not an error."""
        netns, path = self.topology.pod_netns(pod_uid), self.netns_path(pod_uid)
        failure: CniInvocationError | None = None
        try:
            conflist = plugins.load_conflist(self.conf_dir)
            args = _cni_args(pod_uid, "", "")
            await plugins.delete(conflist, pod_uid, path, POD_IFNAME, args, *self._exec(), cache_dir=self.cache_dir)
        except CniInvocationError as exc:
            failure = exc
        if _exists(path):
            await self.runner.run_async(["ip", "netns", "delete", netns])
        if failure is not None:
            raise failure

    async def check(self, pod_uid: str) -> None:
        """CNI CHECK of the pod's attachment; raises :class:`CniInvocationError` when it is not as ADD left it."""
        path = self.netns_path(pod_uid)
        if not _exists(path):
            raise CniInvocationError(CniError(f"pod {pod_uid} has no sandbox (no {path})", code=3), command="CHECK")
        conflist = plugins.load_conflist(self.conf_dir)
        args = _cni_args(pod_uid, "", "")
        await plugins.check(conflist, pod_uid, path, POD_IFNAME, args, *self._exec(), cache_dir=self.cache_dir)

    def _exec(self) -> tuple[list[Path], CommandRunner, str]:
        return self.bin_dirs, self.runner, self.node.netns


def pod_sysctls(pod: Mapping[str, Any]) -> list[str]:
    """The ``name=value`` arguments of the pod's ``securityContext.sysctls`` that are set in its namespace (see the
    module docstring); the rest are left out."""
    spec = pod.get("spec")
    context = spec.get("securityContext") if isinstance(spec, Mapping) else None
    items = context.get("sysctls") if isinstance(context, Mapping) else None
    out: list[str] = []
    for item in items if isinstance(items, list) else ():
        name = item.get("name") if isinstance(item, Mapping) else None
        value = item.get("value") if isinstance(item, Mapping) else None
        if name in SAFE_NET_SYSCTLS and isinstance(value, str) and _SYSCTL_VALUE.fullmatch(value):
            out.append(f"{name}={value}")
    return out


def _exists(path: str) -> bool:
    return os.path.exists(path)  # a stat in /run (tmpfs): no need to leave the event loop


def _identity(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("uid"), str) or not meta["uid"]:
        raise ValueError("a pod needs metadata.uid")
    return meta["uid"], str(meta.get("name", "")), str(meta.get("namespace", "default"))


def _cni_args(uid: str, name: str, namespace: str) -> dict[str, str]:
    # What the kubelet passes (the pod's uid doubles as the sandbox's "infra container" id here).
    args = {"K8S_POD_NAMESPACE": namespace, "K8S_POD_NAME": name, "K8S_POD_INFRA_CONTAINER_ID": uid}
    args["K8S_POD_UID"] = uid
    return {key: value for key, value in args.items() if value}
