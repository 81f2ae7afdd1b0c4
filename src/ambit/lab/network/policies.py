"""Kubernetes NetworkPolicy with nftables: what a CNI's policy agent does inside one lab node (pure rendering).

Input: the cluster's NetworkPolicies (networking.k8s.io/v1), Pods and Namespaces as plain dicts (read by
:mod:`ambit.lab.network.policy_objects`), the node's name and the sources that are the node itself. Output: one
nftables script for the table ``inet ambit-lab-netpol`` (both IP families) that the node applies with ``nft -f``
(:mod:`ambit.lab.network.policies_apply`). Like the Service table, it starts with ``add table`` + ``delete table``
and declares the whole table again, so one ``nft -f`` replaces the previous rules in a single transaction.

Semantics (the API reference's, as kube-network-policies enforces them):

1. A pod is isolated for ingress (egress) when some policy of its namespace selects it and covers that direction
   (``policyTypes``). A pod isolated for neither direction is not in the table at all.
2. An isolated pod accepts (sends) only what at least one rule of at least one selecting policy allows: the union.
   A rule allows a packet when its peers and its ports both match; no peers means every peer, no ports every port
   and protocol.
3. Peers: ``podSelector`` alone chooses pods of the policy's namespace; ``namespaceSelector`` alone every pod of
   the chosen namespaces; both, the chosen pods of the chosen namespaces (namespaces by their labels); ``ipBlock``
   is its ``cidr`` minus its ``except`` blocks. Pods are matched by their addresses, on every node.
4. Ports: a number, a range (``endPort``), every port of a protocol (no ``port``), or a named port, resolved on the
   destination: for ingress on the selected pod, for egress on the peer pod (a named port never matches an
   ``ipBlock`` peer, nor a pod without that port).
5. Replies and related packets of an allowed connection pass (conntrack ``established,related``), and so does
   whatever comes from the node itself: its address, its bridge gateway and the ambient probe SNAT address
   (``169.254.7.127``), and a pod reaching itself through a Service (the Service table's hairpin mark: the packet
   will be SNATed to the gateway, so the pod sees its node). The node's own processes (kubelet probes) leave through
   ``output`` and never pass this table.
6. Only this node's pods are judged here, each direction once: ingress to a local pod, egress from a local pod, in
   the ``forward`` hook (bridged frames with br_netfilter, and routed packets from other nodes, both pass it). The
   hook runs after the Service table's DNAT, so the destination judged is the endpoint pod, not the ClusterIP.
7. Refused packets addressed to the pod itself are answered: a TCP reset, or ICMP administratively-prohibited for
   other protocols, so that a refused client fails at once. A refused connection that reached the pod through a
   Service (DNATed) is dropped, as most CNIs drop everything: the answer would come from the endpoint's address,
   which the kernel cannot translate back for a connection it never confirmed, and the client would ignore it.
8. ``hostNetwork`` pods are never policy targets nor pod peers; pods without an address yet, or finished, are left
   out (:mod:`ambit.lab.network.policy_objects`, rule 4).

How the table is laid out: ``forward`` accepts rule 5's packets, then sends a packet whose source is in
``egress-isolated4``/``6`` to the chain ``egress`` and one whose destination is in ``ingress-isolated4``/``6`` to
``ingress``. Each rule of each policy is one nft rule matching two sets: the policy's local pods (with the allowed
protocol and ports for ingress, as ``addr . proto . port`` intervals) and the peers (for egress, with the ports).
``egress`` returns on a match (ingress is judged next), ``ingress`` accepts; both end in ``refuse``. Policies are
numbered in (namespace, name) order: ``p<n>-in<i>-dst4`` is policy n's ingress rule i's destination set for IPv4.
Sets grow with pods and ports, rules with policies' rules: never one rule per pod pair.

Invariants: only validated tokens reach the script (addresses, port numbers, protocol keywords; names only in
``#`` comments, and only as DNS names), so no object can inject nft syntax. Interval sets never hold two
elements that overlap (nft refuses them, which would fail the whole transaction): a block nested in another keeps
only the ports the outer one does not allow.
Output is sorted, so the same objects give the same text. Malformed objects are left out with a reason, never
raised; a set that would pass :data:`MAX_SET_ELEMENTS` is left out with a reason too (its rule allows nothing).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ambit.lab.network.policy_objects import (
    IPAddress,
    IPNetwork,
    Malformed,
    Peer,
    Pod,
    Policy,
    Port,
    Rule,
    default_namespace_labels,
    describe,
    read_namespace_labels,
    read_pod,
    read_policy,
)
from ambit.lab.network.services import HAIRPIN_MARK

TABLE = "ambit-lab-netpol"
FAMILY = "inet"
MAX_SET_ELEMENTS = 65536
"""The most elements one set may hold; a rule whose sets would be larger is left out (it allows nothing)."""
_ALL_PORTS = (0, 65535)


@dataclass(frozen=True, slots=True)
class RenderedPolicies:
    """The script for one node, and what was left out of it."""

    script: str
    skipped: list[str]
    """One line per object or rule left out, with the reason."""
    policies: int
    """Policies that select at least one pod of this node."""
    isolated: int
    """Pods of this node isolated in at least one direction."""


@dataclass(frozen=True, slots=True)
class _Family:
    version: int
    keyword: str
    addr_type: str
    everything: IPNetwork


_FAMILIES = (
    _Family(4, "ip", "ipv4_addr", ipaddress.IPv4Network("0.0.0.0/0")),
    _Family(6, "ip6", "ipv6_addr", ipaddress.IPv6Network("::/0")),
)

_Box = tuple[IPNetwork, str, int, int]
"""An allowed destination: addresses, protocol, first and last port."""


@dataclass(slots=True)
class _Cluster:
    """What the renderer looks things up in."""

    pods: list[Pod]
    namespaces: dict[str, Mapping[str, str]]

    def namespace_labels(self, name: str) -> Mapping[str, str]:
        return self.namespaces.get(name) or default_namespace_labels(name)

    def select(self, policy: Policy) -> list[Pod]:
        """The pods a policy applies to (rule 1): its namespace's, matching, not host-network."""
        return [
            p
            for p in self.pods
            if p.namespace == policy.namespace and not p.host_network and policy.selector.matches(p.labels)
        ]

    def peer_pods(self, peer: Peer, namespace: str) -> list[Pod]:
        """Rule 3's pod peers."""
        out = []
        for pod in self.pods:
            if pod.host_network:
                continue
            if peer.namespaces is None:
                if pod.namespace != namespace:
                    continue
            elif not peer.namespaces.matches(self.namespace_labels(pod.namespace)):
                continue
            if peer.pods is None or peer.pods.matches(pod.labels):
                out.append(pod)
        return out


def render_policy_rules(
    policies: Iterable[object],
    pods: Iterable[object],
    namespaces: Iterable[object],
    *,
    node_name: str,
    node_sources: Iterable[str],
) -> RenderedPolicies:
    """Render the node's table. ``node_sources`` are the addresses that are the node itself (its address, its
    gateways, the probe SNAT addresses), of either family; they are the node's own settings, not input: a bad one
    is a ``ValueError``."""
    sources = sorted({ipaddress.ip_address(s) for s in node_sources}, key=lambda a: (a.version, int(a)))
    skipped: list[str] = []
    cluster = _Cluster(_read_pods(pods, skipped), _read_namespaces(namespaces, skipped))
    parsed: list[Policy] = []
    seen: set[tuple[str, str]] = set()
    for obj in policies:
        try:
            policy = read_policy(obj, skipped)
        except Malformed as exc:
            skipped.append(f"NetworkPolicy {describe(obj)}: {exc}")
            continue
        if (policy.namespace, policy.name) in seen:
            skipped.append(f"NetworkPolicy {policy.namespace}/{policy.name}: listed twice; the first one is used")
            continue
        seen.add((policy.namespace, policy.name))
        parsed.append(policy)
    parsed.sort(key=lambda p: (p.namespace, p.name))
    return _Renderer(cluster, node_name, sources, skipped).render(parsed)


def _read_pods(objs: Iterable[object], skipped: list[str]) -> list[Pod]:
    pods: list[Pod] = []
    for obj in objs:
        try:
            pods.append(read_pod(obj))
        except Malformed as exc:
            skipped.append(f"Pod {describe(obj)}: {exc}")
    pods.sort(key=lambda p: (p.namespace, p.name))
    owners: dict[IPAddress, str] = {}
    out = []
    for pod in pods:
        who = f"{pod.namespace}/{pod.name}"
        taken = [a for a in pod.addresses if a in owners]
        if pod.host_network:
            pass  # its addresses are its node's, shared with every host-network pod there
        elif taken:
            skipped.append(f"Pod {who}: {taken[0]} is also {owners[taken[0]]}'s; left out")
            continue
        else:
            owners.update((a, who) for a in pod.addresses)
        out.append(pod)
    return out


def _read_namespaces(objs: Iterable[object], skipped: list[str]) -> dict[str, Mapping[str, str]]:
    found: dict[str, Mapping[str, str]] = {}
    for obj in objs:
        try:
            name, labels = read_namespace_labels(obj)
        except Malformed as exc:
            skipped.append(f"Namespace {describe(obj, namespaced=False)}: {exc}")
            continue
        found[name] = labels
    return found


class _Renderer:
    """One render: collects sets and rules per family, then writes the script."""

    def __init__(self, cluster: _Cluster, node: str, sources: list[IPAddress], skipped: list[str]) -> None:
        self.cluster = cluster
        self.node = node
        self.sources = sources
        self.skipped = skipped
        self.sets: list[tuple[str, str, bool, list[str]]] = []  # (name, type, interval, elements)
        self.comments: list[str] = []
        self.ingress_rules: list[str] = []
        self.egress_rules: list[str] = []
        self.isolated: dict[str, set[IPAddress]] = {"ingress": set(), "egress": set()}

    def render(self, policies: list[Policy]) -> RenderedPolicies:
        applied = 0
        isolated_pods: set[tuple[str, str]] = set()
        for n, policy in enumerate(policies):
            local = [p for p in self.cluster.select(policy) if p.node == self.node and p.addresses]
            if not local:
                continue
            applied += 1
            isolated_pods.update((p.namespace, p.name) for p in local)
            self.comments.append(f"# p{n}: {policy.namespace}/{policy.name}")
            if policy.ingress is not None:
                self.isolated["ingress"].update(a for p in local for a in p.addresses)
                for rule in policy.ingress:
                    self._ingress(f"p{n}-in{rule.index}", policy, rule, local)
            if policy.egress is not None:
                self.isolated["egress"].update(a for p in local for a in p.addresses)
                for rule in policy.egress:
                    self._egress(f"p{n}-eg{rule.index}", policy, rule, local)
        return RenderedPolicies(self._script(), self.skipped, applied, len(isolated_pods))

    # -- one rule ------------------------------------------------------------------------------------------------

    def _ingress(self, base: str, policy: Policy, rule: Rule, local: list[Pod]) -> None:
        for fam in _FAMILIES:
            targets = [p for p in local if any(a.version == fam.version for a in p.addresses)]
            peers = self._peer_blocks(rule.peers, policy.namespace, fam)
            if not targets or (peers is not None and not peers):
                continue
            source = ""
            if peers is not None:
                if not self._set(f"{base}-src{fam.version}", fam.addr_type, [str(n) for n in _collapse(peers)]):
                    continue
                source = f" {fam.keyword} saddr @{base}-src{fam.version}"
            if rule.ports is None:
                dst = _collapse(_host(a) for p in targets for a in p.addresses if a.version == fam.version)
                match = f"{fam.keyword} daddr @{base}-dst{fam.version}"
                dst_set = self._set(f"{base}-dst{fam.version}", fam.addr_type, [str(n) for n in dst])
            else:
                boxes = [
                    (_host(a), protocol, first, last)
                    for p in targets
                    for a in p.addresses
                    if a.version == fam.version
                    for protocol, first, last in _resolve(rule.ports, p)
                ]
                if not boxes:
                    continue
                match = f"{fam.keyword} daddr . meta l4proto . th dport @{base}-dst{fam.version}"
                dst_set = self._set(f"{base}-dst{fam.version}", _box_type(fam), _box_elements(boxes))
            if dst_set:
                self.ingress_rules.append(f"{match}{source} accept")

    def _egress(self, base: str, policy: Policy, rule: Rule, local: list[Pod]) -> None:
        for fam in _FAMILIES:
            sources = _collapse(_host(a) for p in local for a in p.addresses if a.version == fam.version)
            if not sources:
                continue
            src = f"{base.rsplit('-', 1)[0]}-eg-src{fam.version}"  # one per policy: its local pods
            match = f"{fam.keyword} saddr @{src}"
            if rule.peers is None and rule.ports is None:
                pass  # every destination
            elif rule.ports is None:
                peers = self._peer_blocks(rule.peers, policy.namespace, fam) or []
                if not self._set(f"{base}-dst{fam.version}", fam.addr_type, [str(n) for n in _collapse(peers)]):
                    continue
                match += f" {fam.keyword} daddr @{base}-dst{fam.version}"
            else:
                boxes = self._egress_boxes(rule, rule.ports, policy.namespace, fam)
                if not self._set(f"{base}-dst{fam.version}", _box_type(fam), _box_elements(boxes)):
                    continue
                match += f" {fam.keyword} daddr . meta l4proto . th dport @{base}-dst{fam.version}"
            if self._set(src, fam.addr_type, [str(n) for n in sources]):
                self.egress_rules.append(f"{match} return")

    def _egress_boxes(self, rule: Rule, ports: tuple[Port, ...], namespace: str, fam: _Family) -> list[_Box]:
        """Rule 4 for egress: numeric ports on every peer block, named ports on the peer pods that have them."""
        numeric = [p for p in ports if p.name is None]
        named = [p for p in ports if p.name is not None]
        blocks: list[IPNetwork] = []
        pods: list[Pod] = []
        if rule.peers is None:
            blocks = [fam.everything]
            pods = [p for p in self.cluster.pods if not p.host_network] if named else []
        else:
            for peer in rule.peers:
                if peer.block is not None:
                    blocks += _block_parts(peer, fam)
                else:
                    found = self.cluster.peer_pods(peer, namespace)
                    pods += found
                    blocks += [_host(a) for p in found for a in p.addresses if a.version == fam.version]
        boxes = [(b, protocol, first, last) for b in blocks for protocol, first, last in _resolve(numeric, None)]
        for pod in pods:
            for address in pod.addresses:
                if address.version == fam.version:
                    boxes += [(_host(address), protocol, first, last) for protocol, first, last in _resolve(named, pod)]
        return boxes

    def _peer_blocks(self, peers: tuple[Peer, ...] | None, namespace: str, fam: _Family) -> list[IPNetwork] | None:
        """The addresses of rule 3's peers in one family; None when the rule names none (every peer)."""
        if peers is None:
            return None
        blocks: list[IPNetwork] = []
        for peer in peers:
            if peer.block is not None:
                blocks += _block_parts(peer, fam)
            else:
                pods = self.cluster.peer_pods(peer, namespace)
                blocks += [_host(a) for p in pods for a in p.addresses if a.version == fam.version]
        return blocks

    def _set(self, name: str, type_: str, elements: list[str]) -> bool:
        """Declare a set; False (and a reason) when it would hold nothing or too much."""
        if not elements:
            return False
        if len(elements) > MAX_SET_ELEMENTS:
            self.skipped.append(f"set {name}: {len(elements)} elements, more than {MAX_SET_ELEMENTS}; rule left out")
            return False
        if not any(s[0] == name for s in self.sets):
            self.sets.append((name, type_, True, elements))
        return True

    # -- the script ----------------------------------------------------------------------------------------------

    def _script(self) -> str:
        lines = [
            f"# NetworkPolicies of the lab for the pods of {self.node} (generated by ambit.lab.network.policies).",
            *self.comments,
            f"add table {FAMILY} {TABLE}",
            f"delete table {FAMILY} {TABLE}",
            f"table {FAMILY} {TABLE} {{",
        ]
        forward = [
            "ct state established,related accept",
            f"meta mark & {HAIRPIN_MARK:#x} == {HAIRPIN_MARK:#x} accept",
        ]
        for fam in _FAMILIES:
            node = [str(a) for a in self.sources if a.version == fam.version]
            lines += _collection(f"set node-sources{fam.version}", fam.addr_type, False, node)
            if node:
                forward.append(f"{fam.keyword} saddr @node-sources{fam.version} accept")
        for direction, field in (("egress", "saddr"), ("ingress", "daddr")):
            for fam in _FAMILIES:
                pods = sorted(str(a) for a in self.isolated[direction] if a.version == fam.version)
                lines += _collection(f"set {direction}-isolated{fam.version}", fam.addr_type, False, pods)
                forward.append(f"{fam.keyword} {field} @{direction}-isolated{fam.version} jump {direction}")
        for name, type_, interval, elements in self.sets:
            lines += _collection(f"set {name}", type_, interval, elements)
        lines += _chain("forward", "type filter hook forward priority filter; policy accept;", forward)
        lines += _chain("egress", None, [*self.egress_rules, "goto refuse"])
        lines += _chain("ingress", None, [*self.ingress_rules, "goto refuse"])
        refuse = [
            "ct status dnat drop",
            "meta l4proto tcp reject with tcp reset",
            "reject with icmpx type admin-prohibited",
        ]
        lines += _chain("refuse", None, refuse)
        lines[-1:] = ["}"]
        return "\n".join(lines) + "\n"


# -- addresses and ports -----------------------------------------------------------------------------------------


def _host(address: IPAddress) -> IPNetwork:
    return ipaddress.ip_network(address)


def _block_parts(peer: Peer, fam: _Family) -> list[IPNetwork]:
    """An ipBlock's ``cidr`` minus its ``except`` blocks, as disjoint networks of one family (rule 3)."""
    if peer.block is None or peer.block.version != fam.version:
        return []
    parts: list[IPNetwork] = [peer.block]
    for hole in peer.excepts:
        next_parts: list[IPNetwork] = []
        for part in parts:
            if _inside(hole, part):
                next_parts += part.address_exclude(hole)  # type: ignore[arg-type]
            elif not _inside(part, hole):
                next_parts.append(part)
        parts = next_parts
    return parts


def _inside(inner: IPNetwork, outer: IPNetwork) -> bool:
    return inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]


def _collapse(networks: Iterable[IPNetwork]) -> list[IPNetwork]:
    by_family: dict[int, list[IPNetwork]] = {}
    for network in networks:
        by_family.setdefault(network.version, []).append(network)
    return [n for v in sorted(by_family) for n in ipaddress.collapse_addresses(by_family[v])]  # type: ignore[type-var]


def _resolve(ports: Iterable[Port], pod: Pod | None) -> list[tuple[str, int, int]]:
    """(protocol, first, last) of each port, named ports looked up on ``pod`` (none without one)."""
    out = []
    for port in ports:
        if port.name is not None:
            number = pod.find_port(port.name, port.protocol) if pod is not None else None
            if number is not None:
                out.append((port.protocol, number, number))
        elif port.number is None:
            out.append((port.protocol, *_ALL_PORTS))
        else:
            out.append((port.protocol, port.number, port.end if port.end is not None else port.number))
    return out


def _box_type(fam: _Family) -> str:
    return f"{fam.addr_type} . inet_proto . inet_service"


def _box_elements(boxes: Iterable[_Box]) -> list[str]:
    """Disjoint ``addr . proto . ports`` elements covering exactly the union of ``boxes``.

    CIDR blocks either nest or are apart. Each block keeps only the ports that no block holding it already
    allows (a pod inside an ``ipBlock`` adds just its extra ports), so two elements whose addresses overlap never
    share a port: nft accepts them, as it would not accept overlapping elements.
    """
    by_protocol: dict[str, dict[IPNetwork, list[tuple[int, int]]]] = {}
    for network, protocol, first, last in boxes:
        by_protocol.setdefault(protocol, {}).setdefault(network, []).append((first, last))
    elements: list[tuple[int, int, int, str, int, str]] = []
    for protocol, blocks in by_protocol.items():
        wide = [n for n in blocks if n.num_addresses > 1]  # only these can hold another block
        for network, ranges in blocks.items():
            outer = [r for o in wide if o != network and _inside(network, o) for r in blocks[o]]
            for first, last in _subtract(_merge(ranges), _merge(outer)):
                text = str(first) if first == last else f"{first}-{last}"
                key = (network.version, int(network.network_address), network.prefixlen, protocol, first)
                elements.append((*key, f"{network} . {protocol} . {text}"))
    return [e[-1] for e in sorted(elements)]


def _subtract(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of disjoint sorted ``ranges`` outside disjoint sorted ``holes``."""
    out = []
    for first, last in ranges:
        start = first
        for hole_first, hole_last in holes:
            if hole_last < start or hole_first > last:
                continue
            if hole_first > start:
                out.append((start, hole_first - 1))
            start = hole_last + 1
            if start > last:
                break
        if start <= last:
            out.append((start, last))
    return out


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _collection(head: str, type_: str, interval: bool, elements: list[str]) -> list[str]:
    lines = [f"\t{head} {{", f"\t\ttype {type_}"]
    if interval:
        lines.append("\t\tflags interval")
    if elements:  # nft refuses "elements = { }"
        lines += ["\t\telements = {", *(f"\t\t\t{e}," for e in elements), "\t\t}"]
    return [*lines, "\t}", ""]


def _chain(name: str, base: str | None, rules: list[str]) -> list[str]:
    head = [f"\t\t{base}"] if base else []
    return [f"\tchain {name} {{", *head, *(f"\t\t{rule}" for rule in rules), "\t}", ""]
