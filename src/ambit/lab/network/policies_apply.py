"""Applying the NetworkPolicy table of :mod:`ambit.lab.network.policies` inside a node, and keeping it current.

- :func:`apply_policy_rules` runs ``nft -f -`` (through ``ip netns exec NETNS`` unless netns is ``""``: a caller
  already inside the node) with the script on stdin. The script replaces the whole ``inet`` table in one
  transaction, so a failed apply leaves the previous rules in force; one table covers IPv4 and IPv6.
- :func:`remove_policy_rules` deletes the table (``add table`` + ``delete table``): idempotent, and a namespace
  that is already gone counts as removed.
- :class:`PolicyAgent` is what a node runtime embeds, next to the Service proxy: a
  :class:`~ambit.lab.network.nft_tables.TableKeeper` over three informers (NetworkPolicies, Pods, Namespaces),
  which re-renders after a short debounce, re-applies only when the script changed, retries a failed apply with
  back-off and logs reasons for objects left out once while they last (:mod:`ambit.lab.network.nft_tables`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.commands import CommandRunner
from ambit.k8s import KubeClient, kinds
from ambit.lab.network.nft_tables import (
    KeeperSettings,
    KeeperStats,
    NftRulesError,
    Rendering,
    TableKeeper,
    apply_script,
    removal_script,
    remove_tables,
)
from ambit.lab.network.policies import FAMILY, TABLE, RenderedPolicies, render_policy_rules
from ambit.lab.network.topology import NodeAddresses
from ambit.redirect.settings import HOST_PROBE_SNAT_IPV4, HOST_PROBE_SNAT_IPV6

log = logging.getLogger("ambit.lab.network.policies")


class PolicyRulesError(NftRulesError):
    """``nft`` refused the NetworkPolicy rules (or could not be run) in a node namespace."""

    what = "NetworkPolicy rules"


def node_sources(node: NodeAddresses) -> tuple[str, ...]:
    """The addresses that are the node itself (policies always allow them): its address, its bridge gateway and
    the ambient probe SNAT address, per family the node has."""
    sources = [node.address, node.pod_gateway, HOST_PROBE_SNAT_IPV4]
    if node.pod_cidr6:
        sources += [a for a in (node.address6, node.pod_gateway6) if a] + [HOST_PROBE_SNAT_IPV6]
    return tuple(sources)


async def apply_policy_rules(netns: str, script: str, runner: CommandRunner) -> None:
    """Replace the table in ``netns`` (``""``: this process's namespace). Raises :class:`PolicyRulesError`."""
    await apply_script(netns, script, runner, PolicyRulesError)


async def remove_policy_rules(netns: str, runner: CommandRunner) -> None:
    """Delete the table from ``netns``; nothing to do when it (or the namespace) is already gone."""
    await remove_tables(netns, PolicyAgent.removal, runner, PolicyRulesError)


@dataclass(frozen=True, slots=True)
class PolicyAgentSettings(KeeperSettings):
    """How a :class:`PolicyAgent` batches changes and retries: a keeper's, with a 100 ms debounce."""

    debounce: float = 0.1


PolicyAgentStats = KeeperStats


class PolicyAgent(TableKeeper):
    """Keeps the NetworkPolicy table of one node in step with the cluster's policies, pods and namespaces."""

    what = "network policies"
    error = PolicyRulesError
    removal = removal_script([(FAMILY, TABLE)])

    def __init__(
        self,
        client: KubeClient,
        *,
        netns: str,
        node_name: str,
        node_sources: tuple[str, ...],
        runner: CommandRunner | None = None,
        settings: KeeperSettings | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        render_policy_rules([], [], [], node_name=node_name, node_sources=node_sources)  # a bad setting raises now
        self.node_name = node_name
        self.node_sources = node_sources
        self.rendered: RenderedPolicies | None = None
        """The last rendered rules (applied or not)."""
        super().__init__(
            client,
            (kinds.NETWORK_POLICIES, kinds.PODS, kinds.NAMESPACES),
            netns=netns,
            runner=runner,
            settings=settings or PolicyAgentSettings(),
            sleep=sleep,
            log=log,
        )

    def render(self, caches: Sequence[list[dict[str, Any]]]) -> Rendering:
        """Rules are applied only once all three kinds are listed: earlier, a policy's peers would look absent."""
        policies, pods, namespaces = caches
        rendered = render_policy_rules(
            policies, pods, namespaces, node_name=self.node_name, node_sources=self.node_sources
        )
        self.rendered = rendered
        return Rendering(
            rendered.script, rendered.skipped, f"{rendered.policies} policies, {rendered.isolated} isolated pods"
        )
