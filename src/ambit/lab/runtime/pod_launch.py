"""How a pod's container is made ready to start: the ``prepare`` hook of a pod worker's containers.

Theory of operation. A container supervisor (:mod:`ambit.lab.runtime.containers_apply`) asks its pod worker
(:mod:`ambit.lab.runtime.pod_worker`) to prepare each start; the worker hands that to its :class:`ContainerLauncher`,
which turns the container's spec and the pod's state into a :class:`~ambit.lab.runtime.containers_apply.LaunchSpec`:

- the environment: the variables every container gets (the API server's address, the pod's names and address, the
  token file once rule 2 wrote one), then the container's own ``env``/``envFrom`` with ``$(VAR)`` expansion in
  command and args;
- for a container runtime without sandboxing: a command line run in the pod's network namespace, and nothing more
  (``hostUsers: false`` needs a sandboxing runtime);
- for a sandboxing runtime (runc): the mounts its ``volumeMounts`` name (rule 2b), the pod's resolv.conf (rule 2c of
  the worker: formed by :mod:`ambit.lab.runtime.pod_dns`, written to ``<pods_dir>/<uid>/resolv.conf`` and bound
  read-only at ``/etc/resolv.conf`` unless a volume is mounted there), the seccomp profile, the pod's user
  namespace (``hostUsers: false``: held open by fd for runc to join by path; its emptyDirs are chowned to its root)
  and the OCI configuration (:mod:`ambit.lab.runtime.oci_spec`).

A spec that cannot be used raises :class:`~ambit.lab.runtime.containers_apply.ContainerConfigError`, retried when
the cause may pass (a seccomp profile file not there yet, no free user-namespace range, a volume not ready).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ambit.lab.runtime.containers_apply import ContainerConfigError, LaunchSpec
from ambit.lab.runtime.node_view import view_mounts
from ambit.lab.runtime.oci_apply import read_seccomp_profile
from ambit.lab.runtime.oci_spec import (
    SERVICE_ACCOUNT_DIR,
    ProcessSpec,
    SecurityContextError,
    VolumeMount,
    container_config,
    container_id,
    security_view,
)
from ambit.lab.runtime.pod_dns import ClusterDns, DnsConfigError, PodDns, parse_resolv_conf, pod_dns
from ambit.lab.runtime.pod_env import config_refs, container_env, expand, fetch_configs
from ambit.lab.runtime.pod_userns import fd_path, open_owner
from ambit.lab.runtime.probes import ProbeTarget
from ambit.lab.runtime.processes import container_argv
from ambit.lab.runtime.seccomp import LOCALHOST, SeccompFieldError, SeccompProfileError, seccomp_choice
from ambit.lab.runtime.userns import IdRange, UsernsError, hosts_users
from ambit.lab.runtime.volumes import EmptyDirVolume, VolumeError, container_mounts
from ambit.lab.runtime.volumes_apply import mount_point_dirs, resolve_mounts

if TYPE_CHECKING:
    from ambit.lab.runtime.pod_worker import PodWorker

RESOLV_CONF = "/etc/resolv.conf"


class ContainerLauncher:
    """Prepares the starts of one pod's containers; holds the pod's user namespace open while containers need it."""

    def __init__(self, worker: PodWorker) -> None:
        self.worker = worker
        self._userns_fd: int | None = None
        """The pod's user namespace (owning its network namespace), held open for runc to join by path."""

    async def prepare(self, container: Mapping[str, Any]) -> LaunchSpec:
        name = str(container.get("name"))
        command = container.get("command")
        if not command:
            raise ContainerConfigError(
                f'container "{name}" has no command: the lab runs commands from this machine\'s filesystem, '
                f"not images (image {container.get('image')!r} is not run)",
                retry=False,
            )
        s = self.worker.runtime.settings
        configs = await fetch_configs(self.worker.runtime.client, self.worker.namespace, config_refs(container))
        env = container_env(self.worker.pod, container, self._base_env(), configs, self.worker.pod_ips, s.node_ip)
        command_line = [expand(str(part), env) for part in command]
        args = [expand(str(part), env) for part in container.get("args") or ()]
        working_dir = str(container.get("workingDir") or "")
        netns = self.worker.sandbox.netns if self.worker.sandbox is not None else ""
        self.worker.directory.mkdir(parents=True, exist_ok=True)
        log_path = self.worker.directory / f"{name}.log"
        containers = self.worker.runtime.containers
        cid = container_id(self.worker.uid, name)
        if not containers.sandboxed:
            if not hosts_users(self.worker.pod):
                raise ContainerConfigError("hostUsers: false needs a sandboxing container runtime (runc)", retry=False)
            argv = container_argv(netns, command_line, args, working_dir)
            target = ProbeTarget(self.worker.pod_ips[0] if self.worker.pod_ips else "", netns, env)
            return LaunchSpec(tuple(argv), env, log_path, target, self.worker.grace(), cid)
        netns_path = self.worker.sandbox.netns_path if self.worker.sandbox is not None else ""
        try:
            privileged = security_view(self.worker.pod, container).privileged
            plans = container_mounts(
                container, self.worker.volumes.sources, privileged=privileged, expand=lambda text: expand(text, env)
            )
            paths = containers.bundle_paths(cid, netns_path, self.worker.token.service_account_dir)
            mounts = view_mounts(resolve_mounts(plans), self.worker.volumes.node_view, paths.masked)
            if all(m.destination != RESOLV_CONF for m in mounts):  # a volume there is the pod's own choice
                mounts = (*mounts, self._write_resolv_conf())
            rebuilt = mount_point_dirs([m.destination for m in mounts])
            user_namespace = self._user_namespace()
            profile = seccomp_choice(self.worker.pod, container, privileged=privileged)
            localhost = read_seccomp_profile(s.seccomp_dir, profile.localhost) if profile.type == LOCALHOST else None
            paths = dataclasses.replace(
                paths,
                volume_mounts=mounts,
                mount_point_dirs=rebuilt,
                seccomp_localhost=localhost,
                user_namespace=user_namespace,
                user_namespace_path=self._user_namespace_path() if user_namespace is not None else "",
            )
            config = container_config(
                self.worker.pod, container, ProcessSpec((*command_line, *args), env, working_dir), paths
            )
        except SeccompProfileError as exc:  # the file may yet appear: the runtime's error, tried again
            raise ContainerConfigError(str(exc), retry=True, reason=exc.reason) from None
        except UsernsError as exc:  # a pod may yet free a range
            raise ContainerConfigError(str(exc), retry=True) from None
        except (SecurityContextError, SeccompFieldError, VolumeError, DnsConfigError) as exc:
            retry = isinstance(exc, VolumeError) and exc.retry
            raise ContainerConfigError(str(exc), retry=retry) from None
        target = ProbeTarget(
            self.worker.pod_ips[0] if self.worker.pod_ips else "", "", env, containers.exec_prefix(cid)
        )
        return LaunchSpec((*command_line, *args), env, log_path, target, self.worker.grace(), cid, config)

    def _user_namespace(self) -> IdRange | None:
        """The pod's ids when it has a user namespace; its emptyDirs then belong to its root (host ids keep their
        owners without idmapped mounts, and an emptyDir is the pod's to write)."""
        if hosts_users(self.worker.pod):
            return None
        ids = self.worker.runtime.user_namespace(self.worker.uid)
        for volume in self.worker.volumes.volumes:
            source = self.worker.volumes.sources.get(volume.name)
            if isinstance(volume, EmptyDirVolume) and source is not None:
                info = os.stat(source.path)
                if (info.st_uid, info.st_gid) != (ids.first, ids.first):
                    os.chown(source.path, ids.first, ids.first)
        return ids

    def _write_resolv_conf(self) -> VolumeMount:
        """The worker's rule 2c: the pod's resolv.conf, written atomically, as a read-only ``/etc/resolv.conf``."""
        s = self.worker.runtime.settings
        try:
            node = parse_resolv_conf(s.node_resolv_conf.read_text(errors="replace"))
        except OSError:
            node = parse_resolv_conf("")
        formed: PodDns = pod_dns(self.worker.pod, ClusterDns(s.cluster_dns, s.cluster_domain), node)
        for warning in formed.warnings:
            self.worker.event("Warning", "DNSConfigForming", warning)
        path = self.worker.directory / "resolv.conf"
        tmp = self.worker.directory / ".resolv.conf.tmp"
        tmp.write_text(formed.resolv.render())
        tmp.chmod(0o644)
        tmp.replace(path)
        return VolumeMount(str(path), RESOLV_CONF, read_only=True)

    def _base_env(self) -> dict[str, str]:
        s = self.worker.runtime.settings
        account = str((self.worker.pod.get("spec") or {}).get("serviceAccountName") or "default")
        env = {
            "PATH": s.container_path,
            "HOSTNAME": self.worker.name,
            "KUBERNETES_SERVICE_HOST": s.api_host,
            "KUBERNETES_SERVICE_PORT": str(s.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(s.api_port),
            "KUBERNETES_PORT": f"tcp://{s.api_host}:{s.api_port}",
            "POD_NAME": self.worker.name,
            "POD_NAMESPACE": self.worker.namespace,
            "POD_IP": self.worker.pod_ips[0] if self.worker.pod_ips else "",
            "NODE_NAME": s.node_name,
            "SERVICE_ACCOUNT": account,
        }
        if s.container_pythonpath:
            env["PYTHONPATH"] = s.container_pythonpath
        if self.worker.token.written:
            sandboxed = self.worker.runtime.containers.sandboxed
            env["AMBIT_TOKEN_FILE"] = f"{SERVICE_ACCOUNT_DIR}/token" if sandboxed else str(self.worker.token.token_path)
        return env

    def _user_namespace_path(self) -> str:
        """The pod's user namespace, for runc to join; empty when the host's owns its network namespace."""
        if self._userns_fd is None:
            netns_path = self.worker.sandbox.netns_path if self.worker.sandbox is not None else ""
            if not netns_path:
                return ""
            try:
                self._userns_fd = open_owner(netns_path)
            except OSError as exc:
                raise ContainerConfigError(
                    f"cannot open the pod's user namespace: {exc.strerror}", retry=True
                ) from None
            if self._userns_fd is None:
                return ""
        return fd_path(self._userns_fd)

    def close_user_namespace(self) -> None:
        fd, self._userns_fd = self._userns_fd, None
        if fd is not None:
            os.close(fd)
