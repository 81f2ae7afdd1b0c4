"""Applying the Service rules of :mod:`ambit.lab.network.services` inside a node namespace, and keeping them current.

- :func:`apply_rules` runs ``ip netns exec NETNS nft -f -`` with the script on stdin (plain ``nft -f -`` for
  netns ``""``: a caller already inside the node). The script replaces the whole table in one transaction, so
  a failed apply leaves the previous rules in place.
- A dual-stack node (:class:`NodeIpv6` given) gets both tables, ``ip`` and ``ip6 ambit-lab-services``, from one
  script and one ``nft -f``.
- :func:`remove_rules` deletes the tables (both families) with ``add table`` + ``delete table`` in one
  ``nft -f``: idempotent, and a namespace that is already gone counts as removed.
- :class:`ServiceProxy` is what a node runtime embeds: two informers (Services, EndpointSlices); any change marks
  the rules dirty, and one task re-renders after a short debounce and re-applies only when the script changed.
  A failed apply is logged and retried after a delay that doubles up to a cap; a success resets it.

Commands go through a :class:`~ambit.commands.CommandRunner` (the seam unit tests replace with a
:class:`~ambit.commands.RecordingRunner`); :class:`~ambit.commands.SubprocessRunner` is the real one. An
``nft`` that does not finish within :data:`NFT_TIMEOUT` seconds is killed and counts as exit code 124.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ambit.commands import CommandResult, CommandRunner, SubprocessRunner
from ambit.errors import AmbitError
from ambit.k8s import Informer, InformerSettings, KubeClient, ResourceKind, kinds
from ambit.lab.network.services import FAMILY, FAMILY6, TABLE, RenderedRules, render_service_rules
from ambit.lab.network.topology import SERVICE_CIDR_V6, Topology

log = logging.getLogger("ambit.lab.network.services")

_REMOVE_SCRIPT = "".join(f"add table {f} {TABLE}\ndelete table {f} {TABLE}\n" for f in (FAMILY, FAMILY6)).encode()
_NO_NETNS = b"Cannot open network namespace"
NFT_TIMEOUT = 10.0
"""Seconds an ``nft`` run may take before it is killed (exit code 124)."""


class ServiceRulesError(AmbitError):
    """``nft`` refused the Service rules (or could not be run) in a node namespace."""

    def __init__(self, netns: str, action: str, returncode: int, stderr: bytes) -> None:
        self.netns = netns
        self.returncode = returncode
        self.stderr = stderr.decode(errors="replace").strip()
        super().__init__(f"{action} Service rules in {netns}: nft exited {returncode}: {self.stderr[-500:]}")


BRIDGE_NF_CALL_IPTABLES = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
BRIDGE_NF_CALL_IP6TABLES = Path("/proc/sys/net/bridge/bridge-nf-call-ip6tables")


@dataclass(frozen=True, slots=True)
class NodeIpv6:
    """A dual-stack node's IPv6 side: its IPv6 pod range, its ``cni0`` IPv6 address, the IPv6 Service range and
    whether bridged IPv6 frames pass netfilter (``bridge-nf-call-ip6tables``)."""

    pod_cidr: str
    gateway: str
    service_cidr: str | None = None
    bridge_netfilter: bool = False


def node_ipv6(topology: Topology, node_name: str) -> NodeIpv6 | None:
    """The IPv6 side of a node of a dual-stack lab, read in the node's namespace (this process's); None otherwise."""
    node = topology.node_named(node_name)
    if node is None or not node.pod_cidr6:
        return None
    bridged = bridge_netfilter_enabled(BRIDGE_NF_CALL_IP6TABLES)
    return NodeIpv6(node.pod_cidr6, node.pod_gateway6, SERVICE_CIDR_V6, bridged)


def bridge_netfilter_enabled(setting: Path = BRIDGE_NF_CALL_IPTABLES) -> bool:
    """Whether this process's network namespace hands bridged IPv4 frames to netfilter (br_netfilter loaded and
    ``bridge-nf-call-iptables`` on): then a Service reply crossing the node's bridge is un-DNATed there (see
    :mod:`ambit.lab.network.services`, rule 3). Unreadable or absent (no br_netfilter) counts as off."""
    try:
        return setting.read_text().strip() == "1"
    except OSError:
        return False


def _nft(netns: str) -> list[str]:
    """``nft -f -`` in the named namespace, or in our own for ``""`` (a node runtime started inside its node)."""
    return ["ip", "netns", "exec", netns, "nft", "-f", "-"] if netns else ["nft", "-f", "-"]


async def run_nft(netns: str, script: bytes, runner: CommandRunner) -> CommandResult:
    """``nft -f -`` with ``script`` on stdin; one that outlasts :data:`NFT_TIMEOUT` is killed, reported as exit 124."""
    argv = _nft(netns)
    try:
        async with asyncio.timeout(NFT_TIMEOUT):
            return await runner.run_async(argv, stdin=script, check=False)
    except TimeoutError:
        return CommandResult(tuple(argv), 124, b"", f"timed out after {NFT_TIMEOUT} s".encode())


async def apply_rules(netns: str, script: str, runner: CommandRunner) -> None:
    """Replace the table in ``netns`` (``""``: this process's namespace) with ``script``.

    Raises :class:`ServiceRulesError`.
    """
    result = await run_nft(netns, script.encode(), runner)
    if result.returncode != 0:
        raise ServiceRulesError(netns or "this namespace", "applying", result.returncode, result.stderr)


async def remove_rules(netns: str, runner: CommandRunner) -> None:
    """Delete the table from ``netns``; nothing to do when it (or the namespace) is already gone."""
    result = await run_nft(netns, _REMOVE_SCRIPT, runner)
    if result.returncode != 0 and not (netns and _NO_NETNS in result.stderr):
        raise ServiceRulesError(netns or "this namespace", "removing", result.returncode, result.stderr)


@dataclass(frozen=True, slots=True)
class ServiceProxySettings:
    """How a :class:`ServiceProxy` batches changes and retries."""

    debounce: float = 0.05
    """Seconds to wait after a change for more changes before rendering once for all of them."""
    retry_initial: float = 0.5
    """Seconds before retrying a failed apply; doubles on each failure up to ``retry_max``."""
    retry_max: float = 10.0
    informer: InformerSettings | None = None
    """Settings of the two informers (their defaults when None)."""


@dataclass(slots=True)
class ServiceProxyStats:
    """Counters, for metrics and tests."""

    renders: int = 0
    applies: int = 0
    unchanged: int = 0
    """Renders that gave the script already applied (no ``nft`` run)."""
    failures: int = 0


class ServiceProxy:
    """Keeps the Service rules of one node namespace in step with the cluster's Services and EndpointSlices."""

    def __init__(
        self,
        client: KubeClient,
        *,
        netns: str,
        node_pod_cidr: str,
        node_gateway: str,
        service_cidr: str | None = None,
        load_balancer_cidr: str | None = None,
        bridge_netfilter: bool = False,
        ipv6: NodeIpv6 | None = None,
        runner: CommandRunner | None = None,
        settings: ServiceProxySettings | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        # a bad node setting is a ValueError now, not in the task later
        render_service_rules(
            [],
            [],
            node_pod_cidr=node_pod_cidr,
            node_gateway=node_gateway,
            service_cidr=service_cidr,
            load_balancer_cidr=load_balancer_cidr,
            bridge_netfilter=bridge_netfilter,
        )
        if ipv6 is not None:
            _render_v6([], [], ipv6)
        self.ipv6 = ipv6
        self.netns = netns
        self.node_pod_cidr = node_pod_cidr
        self.node_gateway = node_gateway
        self.service_cidr = service_cidr
        self.load_balancer_cidr = load_balancer_cidr
        self.bridge_netfilter = bridge_netfilter
        self.settings = settings or ServiceProxySettings()
        self.stats = ServiceProxyStats()
        self.rendered: RenderedRules | None = None
        """The last rendered rules (applied or not)."""
        self._runner = runner or SubprocessRunner()
        self._sleep = sleep
        self._dirty = asyncio.Event()
        self._applied: str | None = None
        self._reported: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._where = netns or "this namespace"
        self._services = self._informer(client, kinds.SERVICES)
        self._slices = self._informer(client, kinds.ENDPOINT_SLICES)

    def _informer(self, client: KubeClient, kind: ResourceKind) -> Informer:
        changed = self._changed
        return Informer(
            client, kind, on_add=changed, on_update=changed, on_delete=changed, settings=self.settings.informer
        )

    def _changed(self, *objs: object) -> None:
        self._dirty.set()

    @property
    def applied_script(self) -> str | None:
        """The script in force in the namespace, as far as this proxy knows."""
        return self._applied

    async def start(self) -> None:
        """Sync both informers, apply the first rules (raises :class:`ServiceRulesError`), then follow changes.

        Rules are applied only once both kinds are listed: earlier, every Service would look endpoint-less.
        """
        if self._task is not None:
            return
        self._services.start()
        self._slices.start()
        try:
            await self._services.wait_synced()
            await self._slices.wait_synced()
            self._dirty.clear()
            await self.sync()
        except BaseException:
            await self._services.aclose()
            await self._slices.aclose()
            raise
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"service proxy in {self._where}")

    async def aclose(self) -> None:
        """Stop following changes and remove the table from the namespace."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._services.aclose()
        await self._slices.aclose()
        await remove_rules(self.netns, self._runner)
        self._applied = None

    async def __aenter__(self) -> ServiceProxy:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def sync(self) -> bool:
        """Render from the informers' caches and apply if the script changed; True when ``nft`` ran."""
        services, slices = self._services.items(), self._slices.items()
        rendered = render_service_rules(
            services,
            slices,
            node_pod_cidr=self.node_pod_cidr,
            node_gateway=self.node_gateway,
            service_cidr=self.service_cidr,
            load_balancer_cidr=self.load_balancer_cidr,
            bridge_netfilter=self.bridge_netfilter,
        )
        if self.ipv6 is not None:
            rendered = _both(rendered, _render_v6(services, slices, self.ipv6))
        self.stats.renders += 1
        self.rendered = rendered
        self._report(rendered.skipped)
        if rendered.script == self._applied:
            self.stats.unchanged += 1
            return False
        try:
            await apply_rules(self.netns, rendered.script, self._runner)
        except ServiceRulesError:
            self.stats.failures += 1
            raise
        self._applied = rendered.script
        self.stats.applies += 1
        log.info("service rules in %s: %d services, %d endpoints", self._where, rendered.services, rendered.endpoints)
        return True

    def _report(self, skipped: list[str]) -> None:
        """Log each reason once while it lasts, not on every render."""
        current = set(skipped)
        for reason in sorted(current - self._reported):
            log.warning("service rules in %s: skipped %s", self._where, reason)
        self._reported = current

    async def _run(self) -> None:
        delay = self.settings.retry_initial
        while True:
            await self._dirty.wait()
            await self._sleep(self.settings.debounce)
            self._dirty.clear()
            try:
                await self.sync()
            except Exception as exc:  # one bad pass must not end the task: log it and retry
                if not isinstance(exc, ServiceRulesError):
                    log.exception("service rules in %s: sync failed", self._where)
                log.warning("%s; retrying in %.1fs", exc, delay)
                self._dirty.set()
                await self._sleep(delay)
                delay = min(delay * 2, self.settings.retry_max)
                continue
            delay = self.settings.retry_initial


def _render_v6(services: Iterable[object], slices: Iterable[object], ipv6: NodeIpv6) -> RenderedRules:
    return render_service_rules(
        services,
        slices,
        family=6,
        node_pod_cidr=ipv6.pod_cidr,
        node_gateway=ipv6.gateway,
        service_cidr=ipv6.service_cidr,
        bridge_netfilter=ipv6.bridge_netfilter,
    )


def _both(v4: RenderedRules, v6: RenderedRules) -> RenderedRules:
    """One script for both tables; a reason both renders gave (a malformed object) is listed once."""
    skipped = [*v4.skipped, *(reason for reason in v6.skipped if reason not in v4.skipped)]
    return RenderedRules(v4.script + v6.script, skipped, v4.services + v6.services, v4.endpoints + v6.endpoints)
