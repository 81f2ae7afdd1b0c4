"""Simulated node proxies: M real delta ADS clients in one process, each as a node proxy of its node subscribes.

``python -m bench.scale.node_proxies`` reads one JSON line on stdin (the control plane's address, the mesh root,
the TLS name, and per client its node name, service-account token and, for an on-demand client, the names it looks
up), starts every client, then answers one JSON command per stdin line with one JSON line on stdout (see
:func:`_answer`).

Each client is what :class:`ambit.xds.client.XdsClient` is on the wire, without building a workload table: its own
:class:`~ambit.xds.grpc_channel.GrpcChannel` (the node proxy's own gRPC client on our HTTP/2 engine, not grpcio;
one TCP + TLS connection per client as separate nodes would have), the node proxy's keepalive,
``authorization: Bearer`` and ``clusterid`` metadata, and the node proxy's own
:class:`~ambit.xds.client_session.ClientSession` (wildcard Address and Authorization, ``initial_resource_versions``
on reconnect, ACK per response) with a decoder that keeps nothing but the name. On a broken stream it reconnects
with the node proxy's :class:`~ambit.xds.client.Backoff` (jittered, doubling). Wildcard clients keep what they hold
in the worker's shared maps (:mod:`bench.scale.shared_held`: one map per distinct content, not one per client), and
no client keeps a response, or what it carried, while it waits for the next one. A client given names to look up is
on demand (``XDS_ON_DEMAND``: it opens subscribed to nothing) and, once its opening is answered, asks for them in
one request (:meth:`~ambit.xds.client_session.ClientSession.demand`); a reconnect subscribes to them again in its
opening request, as the node proxy's session does.

What is counted, per client: every (re)connect and when its stream was in sync again (the first response of each
type after the connect and, on demand, every looked-up name answered) and how many resources those first responses
carried; responses and resources received; and
for the names being tracked (the pods the churn touches) the first arrival time (``time.monotonic()``, the same
clock in every process on Linux) as an upsert or a removal. Times are taken when a response is read, before the
client looks at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import any_pb2

from ambit.api import discovery_pb2 as dpb
from ambit.xds.client import MAX_RESPONSE_BYTES, Backoff, client_node
from ambit.xds.client_session import ClientSession
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.errors import GrpcCallError
from ambit.xds.grpc_channel import ChannelSettings, GrpcChannel
from ambit.xds.keepalive import DEFAULT_KEEPALIVE
from ambit.xds.session import AUTHORIZATION_TYPE_URL, METHOD, SERVICE_NAME
from bench.scale.shared_held import HeldPool, WildcardSession

PATH = f"/{SERVICE_NAME}/{METHOD}"
MAX_MESSAGE = MAX_RESPONSE_BYTES
"""What a simulated client accepts in one response: the node proxy's limit (``max_message`` in the config line
overrides it)."""
CONNECT_TIMEOUT = 10.0
"""Seconds a simulated node proxy waits for its channel to connect before it backs off and tries again."""


def _keep_name(name: str, body: any_pb2.Any) -> None:
    return None


@dataclass
class Sync:
    connected: float
    synced: float = 0.0
    resources: int = 0
    """Resources carried by the first response of each type after this connect (0: nothing resent)."""


def _encoded(request: dpb.DeltaDiscoveryRequest | bytes) -> bytes:
    """A request as sent: the shared session's openings come encoded already (:mod:`bench.scale.shared_held`)."""
    return request if isinstance(request, bytes) else request.SerializeToString()


@dataclass
class SimulatedNodeProxy:
    node: str
    token: str
    tracked: set[str]
    demand: tuple[str, ...] = ()
    """Names this client looks up on demand (none: a wildcard client)."""
    pools: dict[str, HeldPool] | None = None
    """The worker's shared held maps, per type (a wildcard client keeps what it holds there)."""
    session: ClientSession | WildcardSession = field(init=False)
    syncs: list[Sync] = field(default_factory=list)
    responses: int = 0
    resources: int = 0
    arrivals: dict[str, float] = field(default_factory=dict)
    last_error: str = ""

    def __post_init__(self) -> None:
        decoders = {ADDRESS_TYPE_URL: _keep_name, AUTHORIZATION_TYPE_URL: _keep_name}
        node = client_node(self.node, "Kubernetes")
        if self.demand or self.pools is None:
            self.session = ClientSession(decoders, node=node, on_demand=bool(self.demand))
        else:
            self.session = WildcardSession(self.pools, node=node)

    @property
    def held(self) -> int:
        if isinstance(self.session, WildcardSession):
            return self.session.count(ADDRESS_TYPE_URL)
        return len(self.session.held(ADDRESS_TYPE_URL))

    async def run(self, target: str, root: bytes, server_name: str, max_message: int) -> None:
        backoff, attempt = Backoff(), 0
        while True:
            try:
                got = await self._stream(target, root, server_name, max_message)
            except asyncio.CancelledError:
                raise
            except GrpcCallError as exc:  # the refusal's grpc-retry-pushback-ms is read by the channel
                got = bool(self.syncs and self.syncs[-1].synced)
                self.last_error, pushback = str(exc), exc.pushback
            except Exception as exc:  # a broken stream in any other way: reconnect, as the node proxy does
                got, self.last_error, pushback = False, f"{type(exc).__name__}: {exc}", None
            attempt = 0 if got else attempt + 1
            # An overloaded control plane's retry hint wins over the back-off, as in the node proxy's client.
            await asyncio.sleep(pushback if pushback is not None else backoff.delay(attempt, random.random()))

    async def _stream(self, target: str, root: bytes, server_name: str, max_message: int) -> bool:
        settings = ChannelSettings(
            target,
            root,
            server_name=server_name,
            keepalive=DEFAULT_KEEPALIVE,
            max_receive_message=max_message,
            connect_timeout=CONNECT_TIMEOUT,
        )
        metadata = (("clusterid", "Kubernetes"), ("authorization", f"Bearer {self.token}"))
        sync = Sync(time.monotonic())
        self.syncs.append(sync)
        seen: set[str] = set()
        async with GrpcChannel(settings) as channel:
            # The stream's call dials first (TCP, TLS, the server's SETTINGS): a control plane that is down
            # (restarting) costs a refused connection, not an opening encoded and buffered per attempt.
            call = await channel.stream(PATH, metadata=metadata)
            for request in self.session.initial_requests():
                await call.write(_encoded(request))
            while True:
                message = await call.read()
                arrived = time.monotonic()
                if message is None:
                    self.last_error = "stream closed by the server"
                    return bool(sync.synced)
                response = dpb.DeltaDiscoveryResponse.FromString(message)
                message = None
                update = self.session.apply(response)
                response = None  # not kept while waiting for the next one (an 18 MiB answer, parsed)
                self.responses += 1
                count = len(update.upserts) + len(update.removals)
                self.resources += count
                lookup = None
                if update.type_url not in seen:
                    seen.add(update.type_url)
                    sync.resources += count
                    if len(seen) == 2 and self.demand:  # the opening is answered: look up (None once asked)
                        lookup = self.session.demand(ADDRESS_TYPE_URL, self.demand)
                if len(seen) == 2 and not sync.synced and not self.session.pending(ADDRESS_TYPE_URL):
                    sync.synced = arrived
                if self.tracked:
                    upserted = (u if isinstance(u, str) else u[0] for u in update.upserts)
                    for name in (*upserted, *update.removals):
                        if name in self.tracked and name not in self.arrivals:
                            self.arrivals[name] = arrived
                reply, update = update.reply, None
                await call.write(_encoded(reply))
                if lookup is not None:
                    await call.write(_encoded(lookup))


def _answer(command: dict[str, Any], proxies: list[SimulatedNodeProxy], tracked: set[str]) -> dict[str, Any]:
    """``track`` (add names; arrivals of them are recorded from now), ``status`` (counts, cheap enough to poll:
    ``arrived`` is how many (client, tracked name) arrivals there were), ``syncs`` (every
    client's connects and sync times), ``arrivals`` (per tracked name, every client's first arrival; a client that
    never saw it gives null)."""
    what = command.get("cmd")
    if what == "track":
        tracked.update(command["names"])
        return {"tracked": len(tracked)}
    if what == "status":
        current = [p.syncs[-1] for p in proxies if p.syncs]
        return {
            "clients": len(proxies),
            "synced": sum(1 for s in current if s.synced),
            "connects": sum(len(p.syncs) for p in proxies),
            "responses": sum(p.responses for p in proxies),
            "resources": sum(p.resources for p in proxies),
            "held_min": min((p.held for p in proxies), default=0),
            "held_max": max((p.held for p in proxies), default=0),
            "arrived": sum(len(p.arrivals) for p in proxies),
            "errors": sorted({p.last_error for p in proxies if p.last_error})[:3],
        }
    if what == "syncs":
        return {"syncs": [[[s.connected, s.synced, s.resources] for s in p.syncs] for p in proxies]}
    if what == "arrivals":
        names = command["names"]
        return {"arrivals": {n: [p.arrivals.get(n) for p in proxies] for n in names}}
    return {"error": f"unknown command {what!r}"}


async def main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    config = json.loads(await reader.readline())
    tracked: set[str] = set()
    pools = {ADDRESS_TYPE_URL: HeldPool(), AUTHORIZATION_TYPE_URL: HeldPool()}
    proxies = [
        SimulatedNodeProxy(c["node"], c["token"], tracked, tuple(c.get("demand") or ()), pools)
        for c in config["clients"]
    ]
    root = config["root_pem"].encode()
    max_message = int(config.get("max_message") or MAX_MESSAGE)
    tasks = [
        asyncio.create_task(p.run(config["target"], root, config["server_name"], max_message), name=f"proxy {p.node}")
        for p in proxies
    ]
    print(json.dumps({"started": len(tasks)}), flush=True)
    try:
        while line := await reader.readline():
            command = json.loads(line)
            if command.get("cmd") == "quit":
                break
            print(json.dumps(_answer(command, proxies, tracked)), flush=True)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main())
