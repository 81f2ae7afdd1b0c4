"""Applying the Service rules of :mod:`ambit.lab.network.services` inside a node namespace, and keeping them current.

- :func:`apply_rules` runs ``ip netns exec NETNS nft -f -`` with the script on stdin (plain ``nft -f -`` for
  netns ``""``: a caller already inside the node). The script replaces the whole table in one transaction, so
  a failed apply leaves the previous rules in place.
- A dual-stack node (:class:`NodeIpv6` given) gets both tables, ``ip`` and ``ip6 ambit-lab-services``, from one
  script and one ``nft -f``.
- :func:`remove_rules` deletes the tables (both families) with ``add table`` + ``delete table`` in one
  ``nft -f``: idempotent, and a namespace that is already gone counts as removed.
- :class:`ServiceProxy` is what a node runtime embeds: a :class:`~ambit.lab.network.nft_tables.TableKeeper` over
  two informers (Services, EndpointSlices), which re-renders after a short debounce, re-applies only when the
  script changed and retries a failed apply with back-off (:mod:`ambit.lab.network.nft_tables`, which also runs
  ``nft`` with its timeout).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
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
from ambit.lab.network.services import FAMILY, FAMILY6, TABLE, RenderedRules, render_service_rules
from ambit.lab.network.topology import SERVICE_CIDR_V6, Topology

log = logging.getLogger("ambit.lab.network.services")


class ServiceRulesError(NftRulesError):
    """``nft`` refused the Service rules (or could not be run) in a node namespace."""

    what = "Service rules"


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


async def apply_rules(netns: str, script: str, runner: CommandRunner) -> None:
    """Replace the table in ``netns`` (``""``: this process's namespace) with ``script``.

    Raises :class:`ServiceRulesError`.
    """
    await apply_script(netns, script, runner, ServiceRulesError)


async def remove_rules(netns: str, runner: CommandRunner) -> None:
    """Delete the tables from ``netns``; nothing to do when they (or the namespace) are already gone."""
    await remove_tables(netns, ServiceProxy.removal, runner, ServiceRulesError)


ServiceProxySettings = KeeperSettings
"""How a :class:`ServiceProxy` batches changes and retries (its debounce: 50 ms)."""
ServiceProxyStats = KeeperStats


class ServiceProxy(TableKeeper):
    """Keeps the Service rules of one node namespace in step with the cluster's Services and EndpointSlices."""

    what = "service rules"
    error = ServiceRulesError
    removal = removal_script([(FAMILY, TABLE), (FAMILY6, TABLE)])

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
        settings: KeeperSettings | None = None,
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
        self.node_pod_cidr = node_pod_cidr
        self.node_gateway = node_gateway
        self.service_cidr = service_cidr
        self.load_balancer_cidr = load_balancer_cidr
        self.bridge_netfilter = bridge_netfilter
        self.rendered: RenderedRules | None = None
        """The last rendered rules (applied or not)."""
        super().__init__(
            client,
            (kinds.SERVICES, kinds.ENDPOINT_SLICES),
            netns=netns,
            runner=runner,
            settings=settings or KeeperSettings(),
            sleep=sleep,
            log=log,
        )

    def render(self, caches: Sequence[list[dict[str, Any]]]) -> Rendering:
        services, slices = caches
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
        self.rendered = rendered
        return Rendering(
            rendered.script, rendered.skipped, f"{rendered.services} services, {rendered.endpoints} endpoints"
        )


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
