"""What every connection handler of the node proxy shares: state, certificates, pool, telemetry, local pods.

Theory of operation: one :class:`ProxyContext` per node proxy. Handlers (``outbound``, ``inbound``) are functions
of a context, the local pod that accepted the connection, and the accepted socket. A :class:`LocalPod` is a pod
this proxy serves: its ZDS identity (name, namespace, service account), its socket factory (sockets created
inside the pod's netns) and, once the workload state knows it, its workload. Handlers never create sockets in the
proxy's own netns for pod traffic: every upstream socket comes from the pod's factory.

The context also tracks live connections (for ``/config_dump`` and for draining): a handler registers a
:class:`LiveConnection` for the connection's lifetime with ``with ctx.register(...) as registration``. Leaving the
block unregisters it, unless the handler spliced the connection (:meth:`Registration.splice`): the handler then
returns at once and a :class:`ConnectionEnd` does the rest when the splice is over (finishes the accounting, closes
both streams, unregisters the connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ambit.identity.manager import CertificateManager
from ambit.model.identity import SpiffeId
from ambit.model.state import WorkloadState
from ambit.model.workload import IPAddress, Workload
from ambit.proxy.accounting import Accounting, BothSides, LabelsCache
from ambit.proxy.authorization import Authorizer, Guards
from ambit.proxy.drain import DrainSignal
from ambit.proxy.hostnames import HostnameResolver
from ambit.proxy.plans import NodeView
from ambit.proxy.pool import ConnectionPool
from ambit.proxy.relay import Splice, close_now, splice
from ambit.proxy.revocation import RevocationManager
from ambit.proxy.settings import ProxySettings
from ambit.proxy.sockets import SocketFactory
from ambit.proxy.streams import PushStream
from ambit.rbac import PolicyIndex
from ambit.telemetry.accesslog import AccessLog
from ambit.telemetry.metrics import ProxyMetrics
from ambit.zds.protocol import WorkloadInfo

WORKLOAD_WAIT = 5.0
"""How long a connection waits for the workload state to learn its pod (ztunnel's "lazy" start)."""

SYNC_POLL = 0.1
"""Seconds between looks at :attr:`ProxyContext.synced` while a connection waits for it."""
DEMAND_WAIT = 5.0
"""Seconds a connection waits for the control plane to answer an on-demand lookup (then it fails closed)."""

CLUSTER_ID = "Kubernetes"


@dataclass(slots=True)
class LocalPod:
    """A pod whose netns this proxy listens in.

    ``identity`` and ``workload_uid`` are derived from ``info`` once, here: every connection of the pod asks for
    them, several times (a :class:`SpiffeId` validates its parts when made).
    """

    uid: str
    info: WorkloadInfo
    sockets: SocketFactory
    trust_domain: str
    identity: SpiffeId = field(init=False)
    workload_uid: str = field(init=False)
    itself: bool = False
    """The node proxy's own pod (ztunnel's self-proxy listener, :mod:`ambit.inpod.self_inbound`): its own ports
    that serve others (:data:`~ambit.proxy.plans.SELF_SERVED_PORTS`) may be reached, and it dials them from its own
    address, not the client's."""

    def __post_init__(self) -> None:
        self.identity = SpiffeId(self.trust_domain, self.info.namespace, self.info.service_account or "default")
        self.workload_uid = workload_uid(self.info)


def workload_uid(info: WorkloadInfo) -> str:
    """The uid the workload API gives the pod (spec §4.1): ``<cluster>//Pod/<ns>/<name>``."""
    return f"{CLUSTER_ID}//Pod/{info.namespace}/{info.name}"


@dataclass(slots=True)
class LiveConnection:
    id: int
    direction: str
    src: str
    dst: str
    started: float
    pod: str
    bytes_up: int = 0
    bytes_down: int = 0

    def to_dump(self, now: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "direction": self.direction,
            "src": self.src,
            "dst": self.dst,
            "pod": self.pod,
            "ageSeconds": round(now - self.started, 3),
        }


@dataclass(slots=True)
class ProxyContext:
    settings: ProxySettings
    state: WorkloadState
    certs: CertificateManager
    pool: ConnectionPool
    metrics: ProxyMetrics
    access_log: AccessLog
    policies: PolicyIndex = field(default_factory=PolicyIndex)
    """The L4 policies the xDS client (or the local config) keeps (spec §7.3)."""
    pods: dict[str, LocalPod] = field(default_factory=dict)
    """Local pods by ZDS uid; change them with :meth:`add_pod` / :meth:`remove_pod` (they keep the index)."""
    _by_workload: dict[str, LocalPod] = field(default_factory=dict)
    connections: dict[int, LiveConnection] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _state_changed: asyncio.Event = field(default_factory=asyncio.Event)
    _fetches: set[asyncio.Task[bool]] = field(default_factory=set)
    """On-demand lookups of local pods' workloads in flight (kept referenced until done)."""
    state_generation: int = 0
    """How many times :meth:`state_changed` was called: a plan made at one generation is stale at a later one."""
    clock: Callable[[], float] = time.monotonic
    labels: LabelsCache = field(init=False)
    """Each connection's metric labels, by its ends (see :class:`~ambit.proxy.accounting.LabelsCache`)."""
    node: NodeView = field(init=False)
    """What the plans know of this proxy (:mod:`ambit.proxy.plans`)."""
    authorize: Authorizer = field(init=False)
    """The decision for an inbound connection: ``policies.check`` (tests may replace it)."""
    guards: Guards = field(default_factory=Guards)
    """Relayed inbound connections, re-checked when policies change."""
    revocation: RevocationManager | None = None
    """Checks HBONE peers against the CRL file and closes revoked connections; None: no CRL checks (no path)."""
    hostnames: HostnameResolver | None = None
    """Resolves hostname endpoints on demand (``resolution: DNS`` ServiceEntries); None: they are refused."""
    drain: DrainSignal = field(default_factory=DrainSignal)
    """Raised when the process starts its graceful drain: accepted HBONE connections say GOAWAY."""
    demand: Callable[[Sequence[str], float], Awaitable[bool]] | None = None
    """On-demand mode's lookup (the xDS client's :meth:`~ambit.xds.client.XdsClient.demand`: ask for names, wait
    for the answer, True once answered); None: the state holds every workload (wildcard)."""
    synced: Callable[[], bool] = lambda: True
    """Whether ``state`` holds a complete configuration (the control plane's first full view). Until then a
    connection waits as for its own workload: a destination the state does not know yet would be planned as
    plaintext passthrough, so planning early could send a meshed destination's traffic out in clear."""

    def __post_init__(self) -> None:
        self.labels = LabelsCache(self.metrics)
        self.node = NodeView(self.settings.network, self.settings.node, self._by_workload)
        self.authorize = self.policies.check

    def policies_changed(self) -> int:
        """Re-check every relayed inbound connection against the current policies; returns how many were closed."""
        if not len(self.guards):
            return 0
        return self.guards.recheck(self.state.find_workload, self.authorize)

    def add_pod(self, pod: LocalPod) -> None:
        """Serve ``pod`` from now on; on demand, its workload is asked for at once (its first connection, in or
        out, then finds it known)."""
        self.remove_pod(pod.uid)
        self.pods[pod.uid] = pod
        self._by_workload[pod.workload_uid] = pod
        if self.demand is not None and self.find_local_workload(pod) is None:
            task = asyncio.get_running_loop().create_task(self.fetch((pod.workload_uid,)))
            self._fetches.add(task)
            task.add_done_callback(self._fetches.discard)

    def remove_pod(self, uid: str) -> None:
        pod = self.pods.pop(uid, None)
        if pod is not None and self._by_workload.get(pod.workload_uid) is pod:
            del self._by_workload[pod.workload_uid]

    def state_changed(self) -> None:
        """Wake connections waiting for a workload (call after every change of ``state``)."""
        self.state_generation += 1
        self._state_changed.set()
        self._state_changed = asyncio.Event()

    async def wait_state_change(self, since: int, wait: float) -> bool:
        """True once the state changed after generation ``since`` (at once if it already has); False when ``wait``
        seconds pass first."""
        if self.state_generation != since:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._state_changed.wait(), wait)
        return self.state_generation != since

    def find_local_workload(self, pod: LocalPod) -> Workload | None:
        return self.state.find_workload(pod.workload_uid)

    async def fetch(self, names: Sequence[str], wait: float = DEMAND_WAIT) -> bool:
        """On demand (:mod:`ambit.proxy.on_demand`): ask for ``names`` and wait up to ``wait`` seconds for the
        answer; True when answered, or at once when there is nothing to ask or the state holds everything."""
        if self.demand is None or not names:
            return True
        return await self.demand(names, wait)

    async def wait_local_workload(self, pod: LocalPod, wait: float = WORKLOAD_WAIT) -> Workload | None:
        """The pod's workload, waiting up to ``wait`` seconds for the state to learn it and to be complete
        (:attr:`synced`); None (the connection is refused) when it does not happen in time. On demand, the
        workload is asked for by its uid first."""
        deadline = self.clock() + wait
        if self.demand is not None and self.find_local_workload(pod) is None:
            await self.fetch((pod.workload_uid,), wait)
        while (workload := self.find_local_workload(pod)) is None or not self.synced():
            remaining = deadline - self.clock()
            if remaining <= 0:
                return None
            # Completeness may turn true without a change of state (an empty first response): look again soon.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._state_changed.wait(), min(remaining, SYNC_POLL))
        return workload

    def find_workload_by_ip(self, ip: str | IPAddress) -> Workload | None:
        address = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
        return self.state.find_workload_by_address(self.settings.network, address)

    def find_local_pod(self, workload_uid: str) -> LocalPod | None:
        return self._by_workload.get(workload_uid)

    def register(self, direction: str, src: str, dst: str, pod: LocalPod) -> Registration:
        conn = LiveConnection(next(self._ids), direction, src, dst, self.clock(), pod.uid)
        self.connections[conn.id] = conn
        return Registration(self, conn)

    def unregister(self, conn: LiveConnection) -> None:
        self.connections.pop(conn.id, None)


class Registration:
    """A connection registered while its handler sets it up: unregistered when the ``with`` block ends, unless
    :meth:`splice` handed it to a relay (whose :class:`ConnectionEnd` unregisters it when the relay is over)."""

    __slots__ = ("conn", "ctx", "spliced")

    def __init__(self, ctx: ProxyContext, conn: LiveConnection) -> None:
        self.ctx, self.conn, self.spliced = ctx, conn, False

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.spliced:
            self.ctx.unregister(self.conn)

    def splice(self, downstream: PushStream, upstream: PushStream, accounting: Accounting | BothSides) -> Splice:
        """Relay the connection from now on; it stays registered until the relay is over."""
        self.spliced = True
        return splice(downstream, upstream, ConnectionEnd(self.ctx, self.conn, accounting), counter=accounting)


class ConnectionEnd:
    """A spliced connection's ``on_done``: the connection's end, once its relay is over.

    It finishes the accounting (one, or :class:`~ambit.proxy.accounting.BothSides` on the same-node path) with the
    relay's error, closes both streams and unregisters ``conn`` (None when another connection's registration
    covers it: an HBONE tunnel is part of its HBONE connection). Slotted and callable, so a held connection keeps
    one small object for this.
    """

    __slots__ = ("accounting", "conn", "ctx")

    def __init__(self, ctx: ProxyContext, conn: LiveConnection | None, accounting: Accounting | BothSides) -> None:
        self.ctx, self.conn, self.accounting = ctx, conn, accounting

    def __call__(self, over: Splice) -> None:
        try:
            self.accounting.finish(over.result.error)
        finally:
            close_now(over.downstream, over.upstream)
            self.ctx.guards.discard(over)
            if self.conn is not None:
                self.ctx.unregister(self.conn)
