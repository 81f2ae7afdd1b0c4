"""The Node object a node runtime registers and the status its heartbeats report, computed without I/O.

Theory of operation. :func:`node_manifest` is the Node as created (labels with ``kubernetes.io/hostname`` and
``kubernetes.io/os``, ``podCIDR``, the taints to register with, :mod:`ambit.lab.runtime.node_taints`);
:func:`node_status` is what each heartbeat patches: the addresses, the pressure conditions (always false) and
``Ready`` (true since ``ready_since``, heartbeat ``now``), capacity, and ``nodeInfo`` from the machine
(:class:`HostInfo`, read once). The heartbeat loop and the node's Lease are
:class:`ambit.lab.runtime.kubelet.NodeRuntime`'s.
"""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambit.lab.runtime.containers import rfc3339

if TYPE_CHECKING:
    from ambit.lab.runtime.kubelet import NodeRuntimeSettings

KUBELET_VERSION = "v1.32.0-ambit"
RUNTIME_VERSION = "ambit://0.1.0"


@dataclass(frozen=True, slots=True)
class HostInfo:
    machine_id: str
    boot_id: str
    kernel: str
    os_image: str
    architecture: str
    cpus: int
    memory_kib: int

    @classmethod
    def read(cls) -> HostInfo:
        def first(path: str) -> str:
            with contextlib.suppress(OSError):
                return Path(path).read_text().strip()
            return ""

        os_image = "Linux"
        for line in first("/etc/os-release").splitlines():
            if line.startswith("PRETTY_NAME="):
                os_image = line.split("=", 1)[1].strip('"')
        memory = 0
        for line in first("/proc/meminfo").splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1])
        machine = platform.machine()
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
        return cls(
            first("/etc/machine-id"),
            first("/proc/sys/kernel/random/boot_id"),
            platform.release(),
            os_image,
            arch,
            os.cpu_count() or 1,
            memory,
        )


def node_manifest(settings: NodeRuntimeSettings) -> dict[str, Any]:
    labels = {**settings.labels, "kubernetes.io/hostname": settings.node_name, "kubernetes.io/os": "linux"}
    cidrs = [settings.pod_cidr, *([settings.pod_cidr6] if settings.pod_cidr6 else [])]
    spec: dict[str, Any] = {"podCIDR": settings.pod_cidr, "podCIDRs": cidrs}
    if settings.register_with_taints:
        spec["taints"] = [t.to_api() for t in settings.register_with_taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": settings.node_name, "labels": labels},
        "spec": spec,
    }


def node_status(settings: NodeRuntimeSettings, host: HostInfo, ready_since: float, now: float) -> dict[str, Any]:
    def condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": "True" if ok else "False",
            "lastHeartbeatTime": rfc3339(now),
            "lastTransitionTime": rfc3339(ready_since),
            "reason": reason,
            "message": message,
        }

    resources = {"cpu": str(host.cpus), "memory": f"{host.memory_kib}Ki", "pods": "110"}
    return {
        "addresses": [
            {"type": "InternalIP", "address": settings.node_ip},
            *([{"type": "InternalIP", "address": settings.node_ip6}] if settings.node_ip6 else []),
            {"type": "Hostname", "address": settings.node_name},
        ],
        "conditions": [
            condition("MemoryPressure", False, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", False, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", False, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", True, "KubeletReady", "kubelet is posting ready status"),
        ],
        "capacity": resources,
        "allocatable": resources,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": host.machine_id,
            "systemUUID": host.machine_id,
            "bootID": host.boot_id,
            "kernelVersion": host.kernel,
            "osImage": host.os_image,
            "containerRuntimeVersion": RUNTIME_VERSION,
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": host.architecture,
        },
    }
