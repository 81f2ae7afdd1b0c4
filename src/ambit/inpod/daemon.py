"""The node proxy as a process (``ambit nodeproxy``): ZDS client, in-pod listeners, data path, telemetry.

Theory of operation: the proxy's pieces are built once from :class:`NodeProxySettings` and wired here, and nowhere
else: the workload state (from the control plane over delta xDS, or a local config file), the certificate manager
(the control plane's CA with impersonation, or a local CA), the HBONE connection pool, metrics and access log, the
admin/metrics/readiness endpoints in the proxy's own netns, and the ZDS client whose pods get listeners served by
:mod:`ambit.proxy` (and a DNS proxy, :mod:`ambit.dns`). The admin POSTs need the token the proxy makes at start-up
and writes to :attr:`NodeProxy.admin_token_file` (0600): host-network pods reach the admin port too, and must not
stop or reconfigure the proxy.

Readiness (``/healthz/ready`` on 15021) waits for two tasks: ``state manager`` (the configuration was read) and
``workload proxy manager`` (ZDS snapshot received, no pod pending). With ``notify_fd`` the proxy also writes
``READY=1`` there once, when it first becomes ready: a supervisor starting a successor waits for that before it
stops the old proxy (the hand-over; the successor's listeners sit beside the old ones with SO_REUSEPORT, and the
node agent gives its pods to the newest proxy).

Stopping is a graceful drain (:mod:`ambit.inpod.drain` decides, :meth:`NodeProxy.run` carries it out): SIGTERM,
SIGINT or ``POST /quitquitquit`` closes every listener at once (the pods' and the endpoints': readiness fails,
connections go to a successor if there is one), says GOAWAY on inbound HBONE connections, refuses new pods from
the node agent (deletes still stop pods), and waits until the connections already accepted have ended, at most
``drain_max`` seconds if the node agent said a successor holds every pod (a hand-over), else ``drain_deadline``;
then whatever is left is closed, one log line per connection, and the process exits. A second signal cuts the wait
short. An essential task that ends (the ZDS client's, or housekeeping: :mod:`ambit.supervision` rule 4) stops
the proxy the same way, and :func:`run_node_proxy` then raises its :class:`TaskEndedError` so that the process exits
non-zero and is started again. A connection that never ends holds the drain for that bound at most; only the
node agent (over the ZDS socket, which only root on the node reaches) can choose the longer bound, and it cannot
extend it further.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ambit import native
from ambit.dns.resolvconf import ResolvConf
from ambit.dns.settings import DnsServerSettings, Upstream
from ambit.errors import AmbitError
from ambit.heap import HeapSettler
from ambit.identity.istiod import IstiodCaClient
from ambit.identity.localca import LocalCa
from ambit.identity.manager import CaClient, CertificateManager
from ambit.inpod.drain import (
    Command,
    ConnectionsCounted,
    Drain,
    DrainRequested,
    Exit,
    ExtendDrain,
    ForceClose,
    Phase,
    StopAccepting,
    SuccessorChanged,
)
from ambit.inpod.localstate import LocalConfigWatcher
from ambit.inpod.resolvers import read_resolv_conf, upstream_of
from ambit.inpod.self_inbound import SelfInbound
from ambit.inpod.settings import NodeProxySettings
from ambit.inpod.workers import FanOutPods, WorkerGroup
from ambit.inpod.workloads import DnsProxySettings, PodAdmission, PodListenerManager
from ambit.model.localconfig_policies import policy_to_dict
from ambit.model.policy import Policy
from ambit.model.state import WorkloadState
from ambit.proxy.admission import ListenerGate, NodeBudget, refusal_reporter
from ambit.proxy.context import ProxyContext
from ambit.proxy.hostnames import HostnameResolver, upstream_lookup
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.revocation import RevocationManager
from ambit.supervision import TaskEndedError, watch
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.endpoints import ProxyEndpoints, new_admin_token, write_admin_token
from ambit.telemetry.flows import FlowRing
from ambit.telemetry.metrics import ProxyMetrics
from ambit.telemetry.readiness import Readiness
from ambit.xds.client import XdsClient
from ambit.zds.client import PodHandler, ZdsClient

log = logging.getLogger("ambit.inpod.daemon")

STATE_TASK = "state manager"
PODS_TASK = "workload proxy manager"
HOUSEKEEPING_INTERVAL = 0.2
DRAIN_POLL = 0.05
"""Seconds between counts of the connections left while draining."""
DRAIN_TASK = "draining"
REAP_INTERVAL = 30.0
WORKERS_GRACE = 5.0
"""Seconds past the longest drain bound the node proxy waits for its workers to exit before it kills them."""
ADMIN_TOKEN_FILE = "admin-token"
"""The admin token's file name in the proxy's run directory (next to the ZDS socket) unless settings say where."""


class NodeProxyError(AmbitError):
    """The node proxy's settings cannot work (a missing file or address)."""


def _required(path: Path | None, what: str) -> Path:
    if path is None:
        raise NodeProxyError(f"the node proxy needs {what} to talk to the control plane")
    return path


def dns_settings(settings: NodeProxySettings) -> DnsProxySettings | None:
    """Each pod's DNS proxy, or None when it is off: explicit upstreams, else the pod's own resolv.conf with the
    proxy's own as the fallback (read once, here)."""
    if not settings.dns_proxy:
        return None
    server = DnsServerSettings(domain=settings.cluster_domain)
    if settings.dns_nameservers:
        return DnsProxySettings(server, Upstream(settings.dns_nameservers), explicit=True)
    own = read_resolv_conf(settings.resolv_conf) or ResolvConf()
    return DnsProxySettings(server, upstream_of(own))


def hostname_resolver(
    settings: NodeProxySettings, clock: Callable[[], float], observe: Callable[[bool], None] | None = None
) -> HostnameResolver:
    """Resolves hostname endpoints from the node proxy's own resolvers (explicit upstreams, else its resolv.conf,
    read once here), as ztunnel resolves them with its own."""
    nameservers = settings.dns_nameservers or (read_resolv_conf(settings.resolv_conf) or ResolvConf()).nameservers
    return HostnameResolver(upstream_lookup(nameservers), clock=clock, observe=observe)


class NodeProxy:
    """Everything one node proxy runs; ``start`` then ``aclose``."""

    def __init__(self, settings: NodeProxySettings) -> None:
        from ambit import __version__

        self.settings = settings
        self.stopped = asyncio.Event()
        """Set once a stop (drain) was asked for."""
        self.drain = Drain(settings.drain_deadline, settings.drain_max)
        self._stop_requests: list[str] = []
        self._drain_by_word = False
        """The drain running was started by the node proxy's word (:meth:`request_drain`: we are its worker)."""
        self._asked_directly = False
        """A signal, ``/quitquitquit`` or a failure asked for the stop (:meth:`request_stop`)."""
        self.state = WorkloadState()
        self.ca = self._ca_client(settings)
        self.certs = CertificateManager(self.ca)
        self.metrics = ProxyMetrics(build_version=__version__)
        self.readiness = Readiness()
        self.heap = HeapSettler()
        self.readiness.add_pending(STATE_TASK)
        self.readiness.add_pending(PODS_TASK)
        self.flows = FlowRing(settings.flow_log_size) if settings.flow_log_size else None
        self.context = ProxyContext(
            settings=settings.proxy,
            state=self.state,
            certs=self.certs,
            pool=ConnectionPool(max_streams=settings.pool_max_streams, idle_timeout=settings.pool_idle_timeout),
            metrics=self.metrics,
            access_log=AccessLog(json=settings.log_json, flows=self.flows),
        )
        if settings.crl_path is not None:
            self.context.revocation = RevocationManager(
                settings.crl_path, self.metrics, anchors=self._trust_anchors, interval=settings.crl_poll_interval
            )
        self.context.hostnames = hostname_resolver(
            settings, self.context.clock, lambda miss: self.metrics.on_demand_dns(miss=miss)
        )
        bounds = settings.connection_bounds
        self.budget = NodeBudget(
            bounds.node_max_connections,
            bounds.node_max_pending,
            refusal_reporter(self.metrics.connection_refused, self.context.clock, log),
            bounds.node_max_connections_per_peer,
        )
        """Every listener's connections and handshakes in progress, in total (:mod:`ambit.proxy.admission`)."""
        self.pods = PodListenerManager(
            self.context,
            dns_settings(settings),
            PodAdmission(self.budget, bounds.hbone, bounds.plaintext),
            ipv6=settings.ipv6,
        )
        self.self_inbound = (
            SelfInbound(
                self.context,
                settings.own_pod,
                settings.own_address,
                gate=ListenerGate("self_hbone", bounds.hbone, self.budget, handshake=True),
            )
            if settings.own_pod is not None and settings.own_address is not None and not settings.worker
            else None
        )
        self.pods.on_change = self._pods_changed
        self.workers = (
            WorkerGroup(settings, self.metrics, self.context.clock)
            if settings.workers > 1 and not settings.worker
            else None
        )
        """The other processes serving these pods (:mod:`ambit.inpod.workers`), or None."""
        handler: PodHandler = self.pods if self.workers is None else FanOutPods(self.pods, self.workers)
        self.zds = ZdsClient(settings.zds_socket, handler, on_successor=self._successor_changed)
        self.watcher = (
            LocalConfigWatcher(settings.config_file, self.state, self._state_changed, self._local_policies)
            if settings.config_file
            else None
        )
        self.xds = (
            XdsClient(
                settings.xds_address,
                self.state,
                self._state_changed,
                root_cert_file=_required(settings.root_cert_file, "a root certificate file"),
                token_file=settings.token_file,
                cluster_id=settings.cluster_id,
                node_id=settings.node,
                server_name=settings.xds_server_name,
                policies=self.context.policies,
                on_policy_change=self._policies_changed,
                on_demand=settings.xds_on_demand,
            )
            if settings.xds_address
            else None
        )
        if self.xds is not None and settings.xds_on_demand:
            self.context.demand = self.xds.demand
        self.context.synced = self._state_complete
        self.admin_token = new_admin_token()
        self.admin_token_file = settings.admin_token_file or settings.zds_socket.parent / ADMIN_TOKEN_FILE
        self.endpoints = (
            None
            if settings.worker
            else ProxyEndpoints(
                admin_token=self.admin_token,
                metrics=self.metrics,
                readiness=self.readiness,
                config_dump=self.config_dump,
                quit=lambda: self.request_stop("/quitquitquit"),
                admin_address=("127.0.0.1", settings.admin_port),
                stats_address=("0.0.0.0", settings.stats_port),
                readiness_address=("0.0.0.0", settings.readiness_port),
                flows=self.flows,
                reuse_port=True,
                ipv6=settings.ipv6,
            )
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.failure: TaskEndedError | None = None
        """Why an essential task ended (the process then stops and exits non-zero), or None."""
        self._notify_fd = settings.notify_fd

    @staticmethod
    def _ca_client(settings: NodeProxySettings) -> CaClient:
        if settings.ca_address:
            return IstiodCaClient(
                settings.ca_address,
                _required(settings.root_cert_file, "a root certificate file"),
                _required(settings.token_file, "a token file"),
                cluster_id=settings.cluster_id,
                ttl_seconds=settings.secret_ttl,
                server_name=settings.xds_server_name,
            )
        if settings.local_ca_dir is not None:
            return LocalCa(settings.local_ca_dir, trust_domain=settings.trust_domain)
        raise NodeProxyError(
            "the node proxy needs a CA: the control plane's (--ca-address) or a local one (--local-ca)"
        )

    def _trust_anchors(self) -> list[bytes]:
        """The mesh roots we know now (for the CRL's diagnostics; verdicts use each peer's verified chain)."""
        anchors = []
        if self.settings.root_cert_file is not None:
            anchors.append(self.settings.root_cert_file.read_bytes())
        if isinstance(self.ca, LocalCa):
            anchors.append(self.ca.roots_pem)
        return anchors

    def _state_complete(self) -> bool:
        """Whether the workload state holds a full configuration: the local file read, or the control plane's
        first full view received (connections wait for it, :attr:`ProxyContext.synced`)."""
        if self.watcher is not None:
            return self.watcher.loaded
        return self.xds is None or self.xds.synced

    def _state_changed(self) -> None:
        self.context.state_changed()
        self._track()
        self.heap.changed()

    def _policies_changed(self) -> None:
        self.heap.changed()
        closed = self.context.policies_changed()
        if closed:
            log.info("policy change: closed %d connection(s) no longer allowed", closed)

    def _local_policies(self, policies: tuple[Policy, ...]) -> None:
        self.context.policies.replace_all(policies)
        self._policies_changed()

    def _pods_changed(self) -> None:
        self._track()
        self.metrics.set_proxy_counts(active=len(self.context.pods), pending=0)

    def _track(self) -> None:
        identities = {pod.identity for pod in self.context.pods.values()}
        identities |= self.state.find_identities_on_node(self.settings.node)
        self.certs.track(identities)

    def config_dump(self) -> dict[str, Any]:
        now = self.context.clock()
        return {
            "config": {
                "node": self.settings.node,
                "trustDomain": self.settings.trust_domain,
                "network": self.settings.network,
                "configFile": str(self.settings.config_file or ""),
                "xdsAddress": self.settings.xds_address or "",
                "caAddress": self.settings.ca_address or "",
                "xdsSynced": bool(self.xds and self.xds.synced),
                "tlsTransport": self.settings.tls_transport,
                "tlsRecords": native.selection().describe() if self.settings.tls_transport == "socket" else "loop",
                "workers": self.workers.to_dump() if self.workers is not None else [],
            },
            **self.state.to_dump(),
            "policies": [policy_to_dict(policy) for policy in self.context.policies.all()],
            "pods": [
                {"uid": uid, "name": pod.info.name, "namespace": pod.info.namespace, "identity": str(pod.identity)}
                for uid, pod in sorted(self.context.pods.items())
            ],
            "certificates": self.certs.snapshot(),
            "pool": self.context.pool.stats(),
            "connections": [conn.to_dump(now) for conn in self.context.connections.values()],
            "crl": self.context.revocation.to_dump() if self.context.revocation is not None else {"path": ""},
        }

    async def start(self) -> None:
        if self.endpoints is not None:
            write_admin_token(self.admin_token_file, self.admin_token)
        if self.context.revocation is not None:
            self.context.revocation.poll()  # before any listener: the first connections are checked too
            self._tasks.append(watch(asyncio.create_task(self.context.revocation.run(), name="CRL file watcher")))
        if self.endpoints is not None:
            await self.endpoints.start()
        if self.watcher is not None:
            self.watcher.poll()
            self._tasks.append(watch(asyncio.create_task(self.watcher.run(), name="local config watcher")))
        elif self.xds is not None:
            await self.xds.start()
        else:
            self.readiness.done(STATE_TASK)
        if self.workers is not None:
            await self.workers.start()
        await self.zds.start()
        for task in self.zds.tasks:  # without its node agent the proxy takes no pod: essential
            watch(task, on_failure=self._essential_lost)
        if self.self_inbound is not None:
            try:
                await self.self_inbound.start()
            except OSError as exc:  # the rest of the proxy works without it
                log.error("self-proxy listener on %s:15008 not opened: %s", self.settings.own_address, exc)
                self.self_inbound = None
        housekeeping = asyncio.create_task(self._housekeeping(), name="node proxy housekeeping")
        self._tasks.append(watch(housekeeping, on_failure=self._essential_lost))
        role = "node proxy worker" if self.settings.worker else "node proxy"
        log.info("%s for %s is running (ZDS %s)", role, self.settings.node, self.settings.zds_socket)

    async def _housekeeping(self) -> None:
        since_reap = 0.0
        while True:
            if (self.watcher is not None and self.watcher.loaded) or (self.xds is not None and self.xds.synced):
                self.readiness.done(STATE_TASK)
            if self.zds.ready:
                self.readiness.done(PODS_TASK)
            if self.readiness.ready:
                self._notify_ready()
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            since_reap += HOUSEKEEPING_INTERVAL
            if since_reap >= REAP_INTERVAL:
                since_reap = 0.0
                self.context.pool.reap_idle()

    def _notify_ready(self) -> None:
        fd, self._notify_fd = self._notify_fd, None
        if fd is None:
            return
        try:
            os.write(fd, b"READY=1\n")
        except OSError as exc:  # whoever gave us the fd went away: nobody to tell
            log.warning("cannot write readiness to fd %d: %s", fd, exc)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _successor_changed(self, ready: bool) -> None:
        """The node agent's word on a successor (ZDS): the drain's bound follows it (:mod:`ambit.inpod.drain`)."""
        if self.workers is not None:
            self.workers.successor_changed(ready)
        commands = self.drain.handle(SuccessorChanged(self.context.clock(), ready))
        for command in commands:
            if isinstance(command, ExtendDrain):
                log.info(
                    "draining: a successor holds every pod; connections may run %g s more",
                    max(command.deadline - self.context.clock(), 0.0),
                )

    def _essential_lost(self, error: TaskEndedError) -> None:
        """An essential task ended (:mod:`ambit.supervision` rule 4): stop, and exit non-zero afterwards."""
        if self.failure is None:
            self.failure = error
            self.request_stop(str(error))

    def request_stop(self, reason: str) -> None:
        """Ask for the graceful drain (a second ask cuts it short); from a signal handler or the admin port.

        A worker's first such ask after its node proxy's word started the drain is the same drain, not a second
        ask: a signal to the process group reaches the node proxy and its worker together, and the node proxy's word
        may be read first. It goes on; a further ask cuts it short."""
        first_direct, self._asked_directly = not self._asked_directly, True
        if first_direct and self._drain_by_word:
            log.info("stop requested (%s): already draining on the node proxy's word", reason)
            return
        self._ask(reason)

    def _ask(self, reason: str) -> None:
        log.info("stop requested (%s)", reason)
        self._stop_requests.append(reason)
        self.stopped.set()

    def request_drain(self, reason: str) -> None:
        """A drain, unless one runs or was asked for: never the second ask that cuts a drain short (a worker's word
        from its node proxy, which may come before or after the same SIGTERM reached the worker itself)."""
        if self.drain.phase is Phase.SERVING and not self._stop_requests:
            self._drain_by_word = True
            self._ask(reason)

    def cut_short(self, reason: str) -> None:
        """The drain cut short at once: asked for twice, counting the asks already made."""
        if self.drain.over:
            return
        asks = 2 if self.drain.phase is Phase.SERVING else 1
        for _ in range(asks - len(self._stop_requests)):
            self._ask(reason)

    def live_connections(self) -> int:
        """Connections the pods still serve (being set up, relayed, or inbound HBONE connections)."""
        return sum(len(pod.connections) for pod in self.pods.pods.values())

    async def run(self) -> None:
        """Serve until a stop is asked for, then drain (see the module docstring); returns when the drain is over.
        The caller closes the proxy (:meth:`aclose`) afterwards."""
        clock = self.context.clock
        while not self.drain.over:
            if self._stop_requests:
                reason = self._stop_requests.pop(0)
                await self._carry_out(self.drain.handle(DrainRequested(clock(), reason)))
                continue
            if self.drain.draining:
                await self._carry_out(self.drain.handle(ConnectionsCounted(clock(), self.live_connections())))
                if self.drain.over:
                    break
            self.stopped.clear()
            if self._stop_requests:
                continue
            wait = DRAIN_POLL if self.drain.draining else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), wait)
        self.stopped.set()

    async def _carry_out(self, commands: list[Command]) -> None:
        for command in commands:
            match command:
                case StopAccepting(handover=handover):
                    await self._stop_accepting(handover)
                case ExtendDrain():
                    pass  # only a successor's news extends a drain: _successor_changed
                case ForceClose(live=live, reason=reason):
                    log.warning("drain: %s; closing %s connection(s) left", reason, live if live >= 0 else "the")
                    if self.workers is not None:
                        self.workers.cut()
                    now = self.context.clock()
                    for conn in list(self.context.connections.values()):
                        log.info(
                            "drain: closing %s %s -> %s (pod %s) after %.0f s",
                            conn.direction,
                            conn.src,
                            conn.dst,
                            conn.pod,
                            now - conn.started,
                        )
                    for pod in self.pods.pods.values():
                        for each in list(pod.connections):
                            each.cancel()
                case Exit(reason=reason):
                    log.info("drain over: %s", reason)
                case _:
                    raise NodeProxyError(f"unknown drain command {command!r}")

    async def _stop_accepting(self, handover: bool) -> None:
        self.readiness.add_pending(DRAIN_TASK)
        live = self.live_connections()
        log.info(
            "draining: closing every listener; %d connection(s) may run up to %g s (%s)",
            live,
            self.drain.bound,
            "a successor holds every pod: drain-max" if handover else "no successor: drain deadline",
        )
        for failure in self.context.drain.start():
            log.error("drain: a connection failed to hear the drain", exc_info=failure)
        if self.workers is not None:
            self.workers.stop()  # each drains its own connections, under the same bounds
        await self.pods.stop_accepting()
        if self.self_inbound is not None:
            await self.self_inbound.stop_accepting()
        if self.endpoints is not None:
            await self.endpoints.aclose()

    async def aclose(self) -> None:
        self.heap.close()
        if self._notify_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._notify_fd)
            self._notify_fd = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # an error was logged at once (supervision)
        if self.workers is not None:  # they drain as we did: wait for them within the longest bound
            await self.workers.aclose(self.settings.drain_max + WORKERS_GRACE)
        await self.zds.aclose()
        if self.xds is not None:
            await self.xds.aclose()
        await self.pods.aclose()
        if self.self_inbound is not None:
            await self.self_inbound.aclose()
        await self.context.pool.aclose()
        await self.certs.aclose()
        if isinstance(self.ca, IstiodCaClient):
            await self.ca.aclose()
        if self.endpoints is not None:
            await self.endpoints.aclose()
        self.context.access_log.flush()  # the last connections' lines


async def run_node_proxy(settings: NodeProxySettings) -> None:
    """Run until SIGTERM, SIGINT or ``/quitquitquit``, then drain (see the module docstring)."""
    proxy = NodeProxy(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, proxy.request_stop, sig.name)
    await proxy.start()
    try:
        await proxy.run()
    finally:
        await proxy.aclose()
    if proxy.failure is not None:
        raise proxy.failure  # non-zero: the kubelet starts the node proxy again
