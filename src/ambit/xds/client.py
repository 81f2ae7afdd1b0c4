"""The node proxy's xDS client (spec §4.2, §5.2): a thin asyncio shell around :class:`ClientSession`.

Theory of operation: :meth:`XdsClient.run` loops forever: connect, stream, and on any failure wait a jittered,
exponentially growing back-off (reset once a response arrives) and connect again. Every connect re-reads the mesh
root (the control plane's server certificate is verified against it) and the bearer token from their files, so a
rotated root or a refreshed token is picked up without a restart, and sends ``authorization: Bearer <token>`` and
``clusterid`` metadata. A stream opens with :meth:`ClientSession.initial_requests` (what we hold, for a cheap
resync), then for each response: decode, apply upserts and removals to the :class:`WorkloadState`, call
``on_change`` once if anything changed, and write the ACK or NACK. The channel pings an idle connection every 30 s
and drops it when the ACK is 10 s late (:mod:`ambit.xds.keepalive`), so a control plane that went silent is
noticed within :attr:`KeepaliveSettings.detection_bound` (40 s) and the loop reconnects. A stream the server
refused with a retry hint (``grpc-retry-pushback-ms``: an overloaded control plane, :mod:`ambit.xds.admission`)
waits that long instead of the back-off. In on-demand mode :meth:`XdsClient.demand` writes lookups onto the live
stream between the loop's replies (one write lock) and waits for their answers (client session rule 6).

The channel comes from ``channel_factory``: by default :class:`~ambit.xds.grpc_channel.GrpcChannel`, our HTTP/2
engine (no grpcio in the node proxy); each connect makes a new one, so the root is re-read. Responses are bounded
by :data:`MAX_RESPONSE_BYTES` from their length prefix.

Invariants:

- The state is never cleared on disconnect: the node proxy keeps serving from its last view through a
  control-plane outage, and a reconnect's response brings only the differences (removals included).
- :attr:`XdsClient.synced` turns true after the first response of every opened type and stays true.
- Removed names are tried as a workload uid, then as a service key (their shapes cannot collide: a service key has
  exactly one ``/``, a uid at least three).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from ambit import ISTIO_VERSION, __version__
from ambit.api import discovery_pb2 as dpb
from ambit.hbone.grpc_calls import StatusCode
from ambit.model.policy import Policy
from ambit.model.state import WorkloadState
from ambit.model.workload import Service, Workload
from ambit.supervision import watch
from ambit.xds.authorization import decode_authorization
from ambit.xds.client_session import ClientSession, ClientUpdate, Decoder
from ambit.xds.convert import ADDRESS_TYPE_URL, decode_address
from ambit.xds.errors import GrpcCallError, XdsConfigFileError
from ambit.xds.grpc_channel import Channel, ChannelFactory, ChannelSettings, GrpcChannel, StreamCall
from ambit.xds.keepalive import DEFAULT_KEEPALIVE, KeepaliveSettings
from ambit.xds.session import AUTHORIZATION_TYPE_URL, METHOD, SERVICE_NAME

__all__ = ["MAX_RESPONSE_BYTES", "Backoff", "XdsClient"]

log = logging.getLogger("ambit.xds.client")

_PATH = f"/{SERVICE_NAME}/{METHOD}"
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
"""The largest response the client accepts. gRPC's default (4 MiB) is a wildcard snapshot of about 12,000
workloads: past that the first response never arrived and the client reconnected forever (issue 22). 100,000
workloads are about 34 MiB. The peer is the authenticated control plane, which can already tell us anything."""


class PolicySink(Protocol):
    """Where the client keeps the Authorization resources it receives (e.g. :class:`ambit.rbac.PolicyIndex`)."""

    def put(self, policy: Policy) -> object: ...

    def remove(self, key: str) -> object: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """Reconnect delays: ``initial`` doubling up to ``maximum``, each scaled by a random factor in [0.5, 1]."""

    initial: float = 0.1
    maximum: float = 15.0

    def delay(self, attempt: int, jitter: float) -> float:
        return min(self.maximum, self.initial * 2.0 ** min(attempt, 30)) * (0.5 + jitter / 2)


@dataclass(frozen=True, slots=True)
class Subscription:
    """One more type to follow, by resource name: each update's upserts and removals go to ``on_update``."""

    type_url: str
    names: tuple[str, ...]
    decoder: Decoder
    on_update: Callable[[ClientUpdate], None]


def client_node(node_id: str, cluster_id: str) -> dpb.Node:
    """The ``Node`` a proxy of ours states on its stream: its id and cluster, the Istio release whose APIs it
    implements as Istio proxies state theirs (``ISTIO_VERSION`` metadata: what EnvoyFilter ``proxyVersion``
    matches and ``ambit proxy-status`` shows; see :mod:`ambit`), and Ambit's own build as Envoy states its
    (``build_version``)."""
    metadata = struct_pb2.Struct()
    metadata.update({"ISTIO_VERSION": ISTIO_VERSION})
    return dpb.Node(id=node_id, cluster=cluster_id, metadata=metadata, build_version=f"ambit/{__version__}")


class XdsClient:
    """Streams the workload API from the control plane into a :class:`WorkloadState`."""

    def __init__(
        self,
        target: str,
        state: WorkloadState,
        on_change: Callable[[], None],
        *,
        root_cert_file: Path,
        token_file: Path | None,
        cluster_id: str,
        node_id: str = "",
        server_name: str | None = "istiod.istio-system.svc",
        backoff: Backoff = Backoff(),
        authorization: bool = True,
        policies: PolicySink | None = None,
        on_policy_change: Callable[[], None] | None = None,
        rng: Callable[[], float] = random.random,
        keepalive: KeepaliveSettings = DEFAULT_KEEPALIVE,
        subscriptions: Sequence[Subscription] = (),
        channel_factory: ChannelFactory = GrpcChannel,
        on_demand: bool = False,
    ) -> None:
        self.target = target
        self._channel_factory = channel_factory
        self._subscriptions = {sub.type_url: sub for sub in subscriptions}
        self._keepalive = keepalive
        self._state, self._on_change = state, on_change
        self._policies, self._on_policy_change = policies, on_policy_change
        self._root_cert_file, self._token_file = root_cert_file, token_file
        self._cluster_id, self._server_name = cluster_id, server_name
        self._backoff, self._rng = backoff, rng
        decoders: dict[str, Decoder] = {ADDRESS_TYPE_URL: decode_address}
        if authorization:
            decoders[AUTHORIZATION_TYPE_URL] = decode_authorization
        decoders.update({sub.type_url: sub.decoder for sub in subscriptions})
        named = {sub.type_url: sub.names for sub in subscriptions}
        self.session = ClientSession(decoders, node=client_node(node_id, cluster_id), named=named, on_demand=on_demand)
        self._call: StreamCall | None = None
        """The live stream while connected: on-demand requests are written to it between the loop's replies."""
        self._write_lock = asyncio.Lock()
        self._answers = asyncio.Event()
        """Set (and replaced) whenever a response answered demanded names or a stream (re)opened."""
        self.connected = False
        self.connects = 0
        self.nacks = 0
        self.last_error = ""
        self._got_response = False
        self._task: asyncio.Task[None] | None = None

    @property
    def synced(self) -> bool:
        """A full view was received at least once (for readiness)."""
        return self.session.synced

    async def start(self) -> None:
        self._task = watch(asyncio.create_task(self.run(), name=f"xds client {self.target}"))

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def run(self) -> None:
        attempt = 0
        while True:
            pushback: float | None = None
            try:
                got_response = await self._connect_once()
            except asyncio.CancelledError:
                raise
            except GrpcCallError as exc:
                got_response = exc.code != StatusCode.UNAUTHENTICATED and self._got_response
                self.last_error, pushback = str(exc), exc.pushback
            except XdsConfigFileError as exc:
                got_response, self.last_error = False, str(exc)
            except Exception as exc:  # a broken stream in any other way: reconnect, never die
                got_response, self.last_error = self._got_response, f"{type(exc).__name__}: {exc}"
            finally:
                self.connected = False
            attempt = 0 if got_response else attempt + 1
            delay = self._backoff.delay(attempt, self._rng())
            if pushback is not None:  # the server's retry hint (overload): it knows better than our back-off
                delay = pushback
            log.warning("xds %s: disconnected (%s); retrying in %.2fs", self.target, self.last_error, delay)
            await asyncio.sleep(delay)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        metadata = [("clusterid", self._cluster_id)]
        if self._token_file is not None:
            try:
                token = self._token_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise XdsConfigFileError(f"cannot read the xDS token {self._token_file}: {exc}") from None
            metadata.append(("authorization", f"Bearer {token}"))
        return tuple(metadata)

    def _channel(self) -> Channel:
        try:
            root = self._root_cert_file.read_bytes()
        except OSError as exc:
            raise XdsConfigFileError(f"cannot read the mesh root {self._root_cert_file}: {exc}") from None
        settings = ChannelSettings(
            self.target,
            root,
            server_name=self._server_name or None,
            keepalive=self._keepalive,
            max_receive_message=MAX_RESPONSE_BYTES,
        )
        return self._channel_factory(settings)

    async def _connect_once(self) -> bool:
        """One stream, until it fails; True when at least one response arrived (the back-off resets)."""
        self._got_response = False
        metadata = self._metadata()
        self.connects += 1
        channel = self._channel()
        try:
            call = await channel.stream(_PATH, metadata=metadata)
            async with self._write_lock:
                for request in self.session.initial_requests():
                    await call.write(request.SerializeToString())
                self._call = call
            for type_url in self.session.resyncing:
                log.info(
                    "xds %s: %s opened without its resource versions (too many to send): full resync",
                    self.target,
                    type_url,
                )
            self.connected = True
            while True:
                message = await call.read()
                if message is None:
                    self.last_error = "stream closed by the server"
                    return self._got_response
                try:
                    response = dpb.DeltaDiscoveryResponse.FromString(message)
                except DecodeError as exc:
                    call.cancel()
                    raise GrpcCallError(StatusCode.INTERNAL, f"an undecodable response: {exc}") from None
                self._got_response = True
                update = self.session.apply(response)
                self._apply(update)
                if update.answered:
                    self._wake_demands()
                async with self._write_lock:
                    await call.write(update.reply.SerializeToString())
        finally:
            self._call = None
            await channel.aclose()

    def _wake_demands(self) -> None:
        self._answers.set()
        self._answers = asyncio.Event()

    async def demand(self, names: Sequence[str], wait: float) -> bool:
        """Ask the control plane for Address resources by name or ``network/IP`` alias (on-demand mode), and wait
        up to ``wait`` seconds for the answer; True once every name is answered (found or known absent), False on
        timeout or when this client is not on demand. Never raises for a broken stream: a name asked while
        disconnected goes out with the next opening request."""
        if not self.session.on_demand:
            return False
        request = self.session.demand(ADDRESS_TYPE_URL, names)
        if request is not None and self._call is not None:
            call = self._call
            try:
                async with self._write_lock:
                    await call.write(request.SerializeToString())
            except Exception as exc:  # the stream broke: the reconnect subscribes again (client session rule 6)
                log.info("xds %s: on-demand request not written: %s", self.target, exc)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        wanted = set(names)
        while wanted & self.session.pending(ADDRESS_TYPE_URL):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answers.wait(), remaining)
        return True

    def _apply(self, update: ClientUpdate) -> None:
        if update.nacked:
            self.nacks += 1
            log.warning("xds %s: NACK %s: %s", self.target, update.reply.response_nonce, "; ".join(update.errors))
        if (subscription := self._subscriptions.get(update.type_url)) is not None:
            subscription.on_update(update)
            return
        if update.type_url == AUTHORIZATION_TYPE_URL:
            self._apply_policies(update)
        if update.type_url != ADDRESS_TYPE_URL:
            return
        policy_lists_changed = False
        for _name, value in update.upserts:
            if isinstance(value, Workload):
                old = self._state.find_workload(value.uid)
                policy_lists_changed |= old is not None and old.authorization_policies != value.authorization_policies
                self._state.upsert_workload(value)
            elif isinstance(value, Service):
                self._state.upsert_service(value)
        for name in update.removals:
            self._state.remove_workload(name) or self._state.remove_service(name)
        if update.upserts or update.removals:
            self._on_change()
        if policy_lists_changed and self._on_policy_change is not None:
            self._on_policy_change()

    def _apply_policies(self, update: ClientUpdate) -> None:
        if self._policies is None:
            return
        for _name, value in update.upserts:
            if isinstance(value, Policy):
                self._policies.put(value)
        for name in update.removals:
            self._policies.remove(name)
        if (update.upserts or update.removals) and self._on_policy_change is not None:
            self._on_policy_change()
