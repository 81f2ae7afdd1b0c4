"""Applying the NetworkPolicy table of :mod:`ambit.lab.network.policies` inside a node, and keeping it current.

- :func:`apply_policy_rules` runs ``nft -f -`` (through ``ip netns exec NETNS`` unless netns is ``""``: a caller
  already inside the node) with the script on stdin. The script replaces the whole ``inet`` table in one
  transaction, so a failed apply leaves the previous rules in force; one table covers IPv4 and IPv6.
- :func:`remove_policy_rules` deletes the table (``add table`` + ``delete table``): idempotent, and a namespace
  that is already gone counts as removed.
- :class:`PolicyAgent` is what a node runtime embeds, next to the Service proxy: three informers (NetworkPolicies,
  Pods, Namespaces); any change marks the rules dirty, and one task re-renders after a short debounce and
  re-applies only when the script changed. A failed apply is logged and retried after a delay that doubles up to
  a cap; a success resets it. Reasons for objects left out are logged once while they last.

Commands go through a :class:`~ambit.commands.CommandRunner` (unit tests use a
:class:`~ambit.commands.RecordingRunner`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType

from ambit.commands import CommandRunner, SubprocessRunner
from ambit.errors import AmbitError
from ambit.k8s import Informer, InformerSettings, KubeClient, ResourceKind, kinds
from ambit.lab.network.policies import FAMILY, TABLE, RenderedPolicies, render_policy_rules
from ambit.lab.network.services_apply import run_nft
from ambit.lab.network.topology import NodeAddresses
from ambit.redirect.settings import HOST_PROBE_SNAT_IPV4, HOST_PROBE_SNAT_IPV6

log = logging.getLogger("ambit.lab.network.policies")

_REMOVE_SCRIPT = f"add table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n".encode()
_NO_NETNS = b"Cannot open network namespace"


class PolicyRulesError(AmbitError):
    """``nft`` refused the NetworkPolicy rules (or could not be run) in a node namespace."""

    def __init__(self, netns: str, action: str, returncode: int, stderr: bytes) -> None:
        self.netns = netns
        self.returncode = returncode
        self.stderr = stderr.decode(errors="replace").strip()
        super().__init__(f"{action} NetworkPolicy rules in {netns}: nft exited {returncode}: {self.stderr[-500:]}")


def node_sources(node: NodeAddresses) -> tuple[str, ...]:
    """The addresses that are the node itself (policies always allow them): its address, its bridge gateway and
    the ambient probe SNAT address, per family the node has."""
    sources = [node.address, node.pod_gateway, HOST_PROBE_SNAT_IPV4]
    if node.pod_cidr6:
        sources += [a for a in (node.address6, node.pod_gateway6) if a] + [HOST_PROBE_SNAT_IPV6]
    return tuple(sources)


async def apply_policy_rules(netns: str, script: str, runner: CommandRunner) -> None:
    """Replace the table in ``netns`` (``""``: this process's namespace). Raises :class:`PolicyRulesError`."""
    result = await run_nft(netns, script.encode(), runner)
    if result.returncode != 0:
        raise PolicyRulesError(netns or "this namespace", "applying", result.returncode, result.stderr)


async def remove_policy_rules(netns: str, runner: CommandRunner) -> None:
    """Delete the table from ``netns``; nothing to do when it (or the namespace) is already gone."""
    result = await run_nft(netns, _REMOVE_SCRIPT, runner)
    if result.returncode != 0 and not (netns and _NO_NETNS in result.stderr):
        raise PolicyRulesError(netns or "this namespace", "removing", result.returncode, result.stderr)


@dataclass(frozen=True, slots=True)
class PolicyAgentSettings:
    """How a :class:`PolicyAgent` batches changes and retries."""

    debounce: float = 0.1
    """Seconds to wait after a change for more changes before rendering once for all of them."""
    retry_initial: float = 0.5
    """Seconds before retrying a failed apply; doubles on each failure up to ``retry_max``."""
    retry_max: float = 10.0
    informer: InformerSettings | None = None
    """Settings of the three informers (their defaults when None)."""


@dataclass(slots=True)
class PolicyAgentStats:
    """Counters, for metrics and tests."""

    renders: int = 0
    applies: int = 0
    unchanged: int = 0
    """Renders that gave the script already applied (no ``nft`` run)."""
    failures: int = 0


class PolicyAgent:
    """Keeps the NetworkPolicy table of one node in step with the cluster's policies, pods and namespaces."""

    def __init__(
        self,
        client: KubeClient,
        *,
        netns: str,
        node_name: str,
        node_sources: tuple[str, ...],
        runner: CommandRunner | None = None,
        settings: PolicyAgentSettings | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        render_policy_rules([], [], [], node_name=node_name, node_sources=node_sources)  # a bad setting raises now
        self.netns = netns
        self.node_name = node_name
        self.node_sources = node_sources
        self.settings = settings or PolicyAgentSettings()
        self.stats = PolicyAgentStats()
        self.rendered: RenderedPolicies | None = None
        """The last rendered rules (applied or not)."""
        self._runner = runner or SubprocessRunner()
        self._sleep = sleep
        self._dirty = asyncio.Event()
        self._applied: str | None = None
        self._reported: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._where = netns or "this namespace"
        self._policies = self._informer(client, kinds.NETWORK_POLICIES)
        self._pods = self._informer(client, kinds.PODS)
        self._namespaces = self._informer(client, kinds.NAMESPACES)

    def _informer(self, client: KubeClient, kind: ResourceKind) -> Informer:
        changed = self._changed
        return Informer(
            client, kind, on_add=changed, on_update=changed, on_delete=changed, settings=self.settings.informer
        )

    def _changed(self, *objs: object) -> None:
        self._dirty.set()

    @property
    def _informers(self) -> tuple[Informer, ...]:
        return (self._policies, self._pods, self._namespaces)

    @property
    def applied_script(self) -> str | None:
        """The script in force in the namespace, as far as this agent knows."""
        return self._applied

    async def start(self) -> None:
        """Sync the informers, apply the first rules (raises :class:`PolicyRulesError`), then follow changes.

        Rules are applied only once all three kinds are listed: earlier, a policy's peers would look absent.
        """
        if self._task is not None:
            return
        for informer in self._informers:
            informer.start()
        try:
            for informer in self._informers:
                await informer.wait_synced()
            self._dirty.clear()
            await self.sync()
        except BaseException:
            for informer in self._informers:
                await informer.aclose()
            raise
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"policy agent in {self._where}")

    async def aclose(self) -> None:
        """Stop following changes and remove the table from the namespace."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for informer in self._informers:
            await informer.aclose()
        await remove_policy_rules(self.netns, self._runner)
        self._applied = None

    async def __aenter__(self) -> PolicyAgent:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def sync(self) -> bool:
        """Render from the informers' caches and apply if the script changed; True when ``nft`` ran."""
        rendered = render_policy_rules(
            self._policies.items(),
            self._pods.items(),
            self._namespaces.items(),
            node_name=self.node_name,
            node_sources=self.node_sources,
        )
        self.stats.renders += 1
        self.rendered = rendered
        self._report(rendered.skipped)
        if rendered.script == self._applied:
            self.stats.unchanged += 1
            return False
        try:
            await apply_policy_rules(self.netns, rendered.script, self._runner)
        except PolicyRulesError:
            self.stats.failures += 1
            raise
        self._applied = rendered.script
        self.stats.applies += 1
        log.info(
            "network policies in %s: %d policies, %d isolated pods", self._where, rendered.policies, rendered.isolated
        )
        return True

    def _report(self, skipped: list[str]) -> None:
        """Log each reason once while it lasts, not on every render."""
        current = set(skipped)
        for reason in sorted(current - self._reported):
            log.warning("network policies in %s: skipped %s", self._where, reason)
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
                if not isinstance(exc, PolicyRulesError):
                    log.exception("network policies in %s: sync failed", self._where)
                log.warning("%s; retrying in %.1fs", exc, delay)
                self._dirty.set()
                await self._sleep(delay)
                delay = min(delay * 2, self.settings.retry_max)
                continue
            delay = self.settings.retry_initial
