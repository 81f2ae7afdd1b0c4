"""The node agent as a process: install the CNI plugin, serve ZDS to the node proxy, enrol the node's pods.

:func:`run_node_agent` writes the plugin's kubeconfig, chains the ``ambit-cni`` plugin into the node's CNI
configuration, starts the ZDS server (the :class:`~ambit.cni.enrolment.NodeProxyLink`), the enrolment manager and
the :class:`~ambit.cni.agent.NodeAgent`, and runs until SIGTERM or SIGINT. The ZDS socket is served only after
the agent has found the running pods again (so a node proxy's first snapshot is complete, also after a restart of
the agent), and the CNI plugin only after that. On a stop for an upgrade or a restart the plugin is left installed
(as istio-cni does: pods created while the agent restarts fail their ADD and are retried); it is removed when
``uninstall`` is asked for, or when the agent's DaemonSet is gone or being deleted (:mod:`ambit.cni.shutdown`).

While it runs, an :class:`~ambit.cni.installer.InstallWatcher` keeps the installation correct: when the plugin
binary is deleted or changed, or the node's conflist loses our entry (the primary CNI rewrote it, an admin edited
it), it is repaired within ``install_interval`` seconds. The watcher is stopped before the uninstall, so it cannot
put back what the uninstall removes.

When the agent's kubeconfig names a ``tokenFile`` (a rotated service-account token), the plugin's kubeconfig,
which holds a copy of the token, is rewritten within ``PLUGIN_TOKEN_INTERVAL`` seconds of each rotation (as
istio-cni rewrites its plugin kubeconfig when its token changes). A write that fails (a full disk, the run
directory gone for a while) is logged and tried again at the next look. That keeper is essential
(:mod:`ambit.supervision` rule 4): should it end by a defect, the agent stops as at a signal, but keeps the plugin
installed, and exits non-zero for the kubelet to start it again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ambit.cni import installer
from ambit.cni.addcheck import NetnsProbe
from ambit.cni.agent import NetnsResolver, NodeAgent, NodeAgentSettings
from ambit.cni.enrolment import EnrolmentManager, EnrolmentSettings
from ambit.cni.health import HealthEndpoints
from ambit.cni.plugin import PLUGIN_TYPE
from ambit.cni.shutdown import owner_state, plugin_stays
from ambit.commands import CommandRunner, SubprocessRunner
from ambit.k8s import EventRecorder, EventRecorderSettings, KubeClient
from ambit.k8s.connection import SERVICE_ACCOUNT_DIR
from ambit.supervision import TaskEndedError, watch
from ambit.zds import ZDS_SOCKET
from ambit.zds.server import ZdsServer

log = logging.getLogger("ambit.cni.daemon")

PLUGIN_EVENT_SOCKET = "pluginevent.sock"
PLUGIN_KUBECONFIG = "istio-cni-kubeconfig"
"""The plugin's kubeconfig in the run directory, named as istio-cni names it (upstream tests delete it by name)."""
WRAPPER = "ambit-cni-wrapper"
PLUGIN_TOKEN_INTERVAL = 30.0
PLUGIN_KUBECONFIG_CHECK = 1.0
"""Seconds between looks at whether the plugin's kubeconfig is still there (a stat)."""


@dataclass(frozen=True, slots=True)
class InCluster:
    """Where a pod finds its cluster: the environment and the service account's files."""

    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    service_account_dir: Path = SERVICE_ACCOUNT_DIR


def kubeconfig_parts(kubeconfig: Path | None, in_cluster: InCluster | None = None) -> tuple[str, bytes, str]:
    """The server URL, CA (PEM) and bearer token of ``kubeconfig``'s current context; None: the pod's own service
    account (in-cluster), re-read at each call so that a rotated token is seen."""
    from lightkube import KubeConfig

    if kubeconfig is None:
        where = in_cluster or InCluster()
        return in_cluster_parts(where.environ, where.service_account_dir)

    single = KubeConfig.from_file(kubeconfig).get()
    if single is None:
        raise ValueError(f"{kubeconfig}: no current context")
    cluster, user = single.cluster, single.user
    token = user.token if user is not None else None
    if user is not None and not token and user.token_file:
        token = Path(single.abs_file(user.token_file)).read_text().strip()  # a rotated file: read at each install
    if cluster is None or not token or not cluster.certificate_auth_data:
        raise ValueError(f"{kubeconfig}: needs a server, certificate-authority-data and a token (or tokenFile)")
    return cluster.server, base64.b64decode(cluster.certificate_auth_data), token


def in_cluster_parts(environ: Mapping[str, str], service_account_dir: Path) -> tuple[str, bytes, str]:
    """The API server, CA and token a pod reaches its cluster with, for the plugin's kubeconfig."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ValueError("not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    if ":" in host:
        host = f"[{host}]"
    ca_pem = (service_account_dir / "ca.crt").read_bytes()
    token = (service_account_dir / "token").read_text().strip()
    if not token:
        raise ValueError(f"the service-account token in {service_account_dir} is empty")
    return f"https://{host}:{port}", ca_pem, token


def plugin_entry(run_dir: Path, excluded_namespaces: Iterable[str]) -> dict[str, object]:
    return {
        "type": PLUGIN_TYPE,
        "name": PLUGIN_TYPE,
        "agent_socket": str(run_dir / PLUGIN_EVENT_SOCKET),
        "kubeconfig": str(run_dir / PLUGIN_KUBECONFIG),
        "exclude_namespaces": list(excluded_namespaces),
        "ambient_enabled": True,
    }


def _install(
    kubeconfig: Path | None,
    cni_conf_dir: Path,
    cni_bin_dir: Path,
    run_dir: Path,
    excluded: tuple[str, ...],
    in_cluster: InCluster | None = None,
    host_run_dir: Path | None = None,
) -> installer.InstallResult:
    """The plugin's kubeconfig and wrapper in ``run_dir``, and the plugin chained into the node's configuration."""
    run_dir.mkdir(parents=True, exist_ok=True)
    server, ca_pem, token = kubeconfig_parts(kubeconfig, in_cluster)
    installer.write_kubeconfig(run_dir / PLUGIN_KUBECONFIG, server, ca_pem, token)
    wrapper = run_dir / WRAPPER
    installer.write_atomic(wrapper, installer.render_wrapper(Path(sys.executable)).encode(), 0o755)
    return installer.install(cni_conf_dir, cni_bin_dir, plugin_entry(host_run_dir or run_dir, excluded), wrapper)


async def _keep_plugin_kubeconfig(
    kubeconfig: Path | None,
    run_dir: Path,
    in_cluster: InCluster | None = None,
    interval: float = PLUGIN_TOKEN_INTERVAL,
    check: float = PLUGIN_KUBECONFIG_CHECK,
) -> None:
    """Keep the plugin's kubeconfig: written again when the agent's token changes (a rotated token file, re-read
    every ``interval`` seconds) and at once when the file is gone (a node that lost it, as istio-cni's
    TestCNIRestartsWithMissingKubeConfig deletes it; looked at every ``check`` seconds), so that the plugin of the
    next pod reaches the API server."""
    path = run_dir / PLUGIN_KUBECONFIG
    loop = asyncio.get_running_loop()
    last, next_read = "", 0.0
    while True:
        missing = not path.exists()
        if missing or loop.time() >= next_read:
            next_read = loop.time() + interval
            try:
                server, ca_pem, token = kubeconfig_parts(kubeconfig, in_cluster)
            except (OSError, ValueError) as exc:
                log.warning("cannot re-read %s for the plugin's token: %s", kubeconfig, exc)
            else:
                if missing or (last and token != last):
                    try:
                        installer.write_kubeconfig(path, server, ca_pem, token)
                    except OSError as exc:  # a full disk, a run dir removed: tried again at the next check
                        log.warning("cannot write the plugin's kubeconfig %s: %s", path, exc)
                        next_read = 0.0
                        await asyncio.sleep(check)
                        continue
                    what = "was missing" if missing else "has the rotated token"
                    log.info("the plugin's kubeconfig %s: written again", what)
                last = token
        await asyncio.sleep(check)


async def _until_signalled(lost: asyncio.Future[TaskEndedError]) -> None:
    """Until SIGTERM or SIGINT; raise what ``lost`` holds if an essential task ends first."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lost.add_done_callback(lambda _: stop.set())
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    if lost.done():
        raise lost.result()


async def run_node_agent(
    kubeconfig: Path | None,
    node: str,
    *,
    cni_conf_dir: Path,
    cni_bin_dir: Path,
    run_dir: Path,
    netns_for: NetnsResolver,
    excluded_namespaces: Iterable[str] = ("kube-system",),
    uninstall: bool = False,
    runner: CommandRunner | None = None,
    install_interval: float = 0.5,
    netns_probe: NetnsProbe | None = None,
    zds_socket: Path | None = None,
    ready_address: tuple[str, int] | None = None,
    in_cluster: InCluster | None = None,
    host_run_dir: Path | None = None,
    owner: tuple[str, str] | None = None,
) -> None:
    """Run one node's agent until SIGTERM or SIGINT, or until cancelled (see the module's docstring).

    ``kubeconfig`` None: in-cluster (the pod's service account). ``host_run_dir``: where the node (which runs the
    plugin) sees ``run_dir``, when that differs from where this process sees it. ``zds_socket`` defaults to
    ``run_dir``'s;
    ``ready_address``, when given, serves ``/healthz`` and ``/readyz`` there (istio-cni's :8000), ready once the
    agent serves ZDS and the plugin.

    ``owner`` (namespace, name) is the agent's DaemonSet, when it runs as one: at the stop signal it decides whether
    the plugin stays (an upgrade) or goes (the mesh is being removed), by :mod:`ambit.cni.shutdown`'s rules.

    ``runner`` runs the rule commands (``nft``, ``ip``; default: real subprocesses, in this process's namespace);
    ``netns_probe`` answers the ``/cmdadd`` checks' questions about netns paths (default: the kernel's ``stat``).
    """
    excluded = tuple(excluded_namespaces)
    result = _install(kubeconfig, cni_conf_dir, cni_bin_dir, run_dir, excluded, in_cluster, host_run_dir)
    log.info("ambit-cni installed in %s (%s)", result.config, "changed" if result.changed else "unchanged")
    watcher = installer.InstallWatcher(
        cni_conf_dir,
        cni_bin_dir,
        plugin_entry(host_run_dir or run_dir, excluded),
        run_dir / WRAPPER,
        interval=install_interval,
    )
    zds_path = zds_socket or run_dir / ZDS_SOCKET
    zds_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # root's: only root may speak ZDS
    zds = ZdsServer(zds_path)  # serving only once the running pods are in its snapshot
    health = HealthEndpoints(ready_address) if ready_address is not None else None
    if health is not None:
        await health.start()
    if kubeconfig is None:
        where = in_cluster or InCluster()
        client_factory = KubeClient.in_cluster(where.service_account_dir, environ=where.environ)
    else:
        client_factory = KubeClient.from_kubeconfig(kubeconfig)
    try:
        async with watcher, client_factory as client:
            recorder = EventRecorder(
                client, EventRecorderSettings(reporting_controller="ambit.dev/node-agent", reporting_instance=node)
            )
            recorder.start()
            lost: asyncio.Future[TaskEndedError] = asyncio.get_running_loop().create_future()

            def essential_lost(error: TaskEndedError) -> None:
                if not lost.done():
                    lost.set_result(error)

            token_keeper = watch(
                asyncio.create_task(_keep_plugin_kubeconfig(kubeconfig, run_dir, in_cluster), name="plugin kubeconfig"),
                on_failure=essential_lost,
            )
            try:
                manager = EnrolmentManager(
                    client, recorder, runner or SubprocessRunner(), zds, EnrolmentSettings(node_name=node)
                )
                settings = NodeAgentSettings(
                    node_name=node,
                    socket_path=str(run_dir / PLUGIN_EVENT_SOCKET),
                    excluded_namespaces=frozenset(excluded),
                )
                agent = NodeAgent(client, manager, settings, netns_for, netns_probe=netns_probe)
                await agent.start(before_serving=zds.start)
                if health is not None:
                    health.ready = True
                log.info("node agent %s is running", node)
                try:
                    await _until_signalled(lost)
                    if owner is not None:
                        state = await owner_state(client, *owner)
                        remove = not plugin_stays(state)
                        log.info(
                            "stopping: DaemonSet %s/%s %s, the plugin %s",
                            *owner,
                            state.value,
                            "is removed" if remove else "stays",
                        )
                        uninstall = uninstall or remove
                finally:
                    await agent.aclose()
            finally:
                token_keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await token_keeper
                await recorder.aclose()
    finally:
        if health is not None:
            await health.aclose()
        await zds.aclose()
        if uninstall:
            with contextlib.suppress(OSError):
                installer.uninstall(cni_conf_dir, cni_bin_dir)
