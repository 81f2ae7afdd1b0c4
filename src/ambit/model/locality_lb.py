"""A DestinationRule's ``loadBalancer.localityLbSetting``: what it says, whether it is valid, and which endpoints it
leaves a proxy to pick among.

Theory of operation: pure. :class:`LocalityLbSetting` is the setting as read (translation and the xDS reader build
it); :func:`setting_problems` judges it as istiod's validation does (``ValidateLocalityLbSetting``), so the
control plane, its webhook and the waypoint refuse the same settings; :func:`by_locality` applies it to the
endpoints a proxy may pick, seen from the proxy's own workload, as istiod's endpoint builder prepares them for
Envoy (``ApplyLocalityLoadBalancer``) and Envoy's priority and locality-weighted balancing then use them.

Rules:

1. ``enabled: false``: locality plays no part; every candidate stays (and the Service's traffic distribution does
   not apply either: the rule's setting wins over it, as in istiod's ``GetEffectiveLbSetting``).
2. ``distribute``: the first entry whose ``from`` matches the proxy's locality decides (none: every candidate
   stays). A locality matches ``region[/zone[/subzone]]`` when each part given is ``*`` or equal; a part left out
   matches anything. Candidates in no ``to`` locality are dropped (istiod sends Envoy none of them). One locality
   of the candidates is drawn by weight: a ``to`` entry's weight is shared among the localities it matches in
   proportion to their candidates, rounded up (istiod's split of a wildcard's weight); its candidates are kept.
   Envoy also scales a locality's weight down when under 1/1.4 of its hosts are healthy; Ambit weighs only the
   candidates left (healthy ones), which shifts load the same way, without the 1.4 overprovisioning.
3. Otherwise, only when failing over is on (the effective policy has ``outlierDetection``: without it istiod
   applies no priorities and Envoy balances over every endpoint), candidates are ranked, lower first:
   a. ``failoverPriority`` labels, in order: the number of leading labels whose values the candidate shares with
      the proxy (``label=value`` compares the candidate with ``value`` instead of the proxy's own) gives rank
      ``len(labels) - shared``. When the first label is ``topology.istio.io/network``, a candidate on another
      network does not stop the run there and gets ``len(labels)`` more, behind every same-network candidate.
   b. ``failover`` (with no ``failoverPriority``, or after it as a second key: rank * 5 + this):
      0 same region, zone and subzone as the proxy; 1 same region and zone; 2 same region; 3 another region;
      4 another region that is not the ``to`` of the first ``failover`` entry whose ``from`` is the proxy's region
      (with no entry for the proxy's region, 3 for all).
   The candidates of the best rank present are kept: the next rank takes every request only when the better
   ones have no candidate left. (Envoy's priority levels spill part of the load early, in proportion to the
   unhealthy share of the better level, by its overprovisioning factor 1.4; Ambit moves it all at once, as for a
   Service's traffic distribution.)
4. Failover settings without ``outlierDetection`` change nothing: every candidate stays (rule 1's precedence over
   the traffic distribution still holds).
5. Labels Ambit's workloads answer for ``failoverPriority``: :data:`TOPOLOGY_LABELS` (network, region, zone,
   subzone, node, cluster: the ones istiod adds to every endpoint). A workload carries no other label at a proxy,
   so any other label compares as empty on both sides (translation notes it).
6. The candidates kept stay in the order given.
7. A rule with no setting, or no rule, gets the mesh config's ``localityLbSetting`` (:data:`MESH_DEFAULT`, Istio's
   default ``{enabled: true}``, unless the mesh config states another) after the Service's traffic distribution,
   which comes first (istiod's ``GetEffectiveLbSetting``: the rule's setting, then the Service's traffic
   distribution, then the mesh's; a rule's ``enabled: false`` stops there, a mesh's ``enabled: false`` leaves
   locality out). So with the default, a rule with ``outlierDetection`` fails over by region, zone and subzone
   (rule 3b); a mesh ``distribute`` applies to every Service without a setting of its own, and its failover to
   those whose rule has ``outlierDetection``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ambit.model.workload import Locality, Workload

__all__ = [
    "MAX_DISTRIBUTE",
    "MAX_FAILOVER",
    "MAX_FAILOVER_PRIORITY",
    "MAX_LOCALITY",
    "MAX_PRIORITY_LABEL",
    "MESH_DEFAULT",
    "TOPOLOGY_LABELS",
    "LocalityChoice",
    "LocalityDistribute",
    "LocalityFailover",
    "LocalityLbSetting",
    "by_locality",
    "locality_matches",
    "setting_problems",
]

MAX_DISTRIBUTE = 64
"""``distribute`` entries; each one's ``to`` is bounded by its weights (1..100 each, 100 in all)."""
MAX_FAILOVER = 64
MAX_FAILOVER_PRIORITY = 16
MAX_LOCALITY = 512
"""Characters of a locality (``region/zone/subzone``) or a failover region."""
MAX_PRIORITY_LABEL = 400
"""Characters of a ``failoverPriority`` entry: a label key (at most 317) and an optional ``=value`` (63)."""

NETWORK_LABEL = "topology.istio.io/network"
_REGION_LABEL = "topology.kubernetes.io/region"
_ZONE_LABEL = "topology.kubernetes.io/zone"
_SUBZONE_LABEL = "topology.istio.io/subzone"
TOPOLOGY_LABELS: dict[str, Callable[[Workload], str]] = {
    NETWORK_LABEL: lambda w: w.network,
    _REGION_LABEL: lambda w: w.locality.region,
    _ZONE_LABEL: lambda w: w.locality.zone,
    _SUBZONE_LABEL: lambda w: w.locality.subzone,
    "kubernetes.io/hostname": lambda w: w.node,
    "topology.istio.io/cluster": lambda w: w.cluster_id,
}
"""The ``failoverPriority`` labels a workload answers (rule 5), and how."""
_LOCALITY_LABELS = (_REGION_LABEL, _ZONE_LABEL, _SUBZONE_LABEL)


@dataclass(frozen=True, slots=True)
class LocalityDistribute:
    """One ``distribute`` entry: proxies in ``source`` send ``to``'s share (percent) to each locality."""

    source: str
    to: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class LocalityFailover:
    """One ``failover`` entry: proxies in region ``source`` fail over to region ``to`` first."""

    source: str
    to: str


@dataclass(frozen=True, slots=True)
class LocalityLbSetting:
    """``LoadBalancerSettings.localityLbSetting``."""

    enabled: bool = True
    """``enabled: false`` turns locality off (rule 1); unset counts as true."""
    distribute: tuple[LocalityDistribute, ...] = ()
    failover: tuple[LocalityFailover, ...] = ()
    failover_priority: tuple[str, ...] = ()


MESH_DEFAULT = LocalityLbSetting()
"""Istio's default mesh config: ``localityLbSetting: {enabled: true}`` (rule 7)."""


@dataclass(frozen=True, slots=True)
class LocalityChoice:
    """A rule's setting as one pick applies it: the effective policy's setting, whether that policy has outlier
    detection (rule 3), and the draw for ``distribute`` (rule 2), called only when one is needed."""

    setting: LocalityLbSetting
    failing_over: bool
    random: Callable[[], float]
    mesh_default: bool = False
    """The rule has no setting: ``setting`` is the mesh config's, after the Service's traffic distribution
    (rule 7)."""


def _parts(locality: str) -> list[str]:
    return locality.split("/", 2)


def locality_matches(locality: Locality, pattern: str) -> bool:
    """Whether ``locality`` is in ``pattern`` (``region[/zone[/subzone]]``, a part ``*`` or left out matches any)."""
    parts = [*_parts(pattern), "", ""]
    region, zone, subzone = parts[0], parts[1], parts[2]
    return (
        region in ("*", locality.region) and zone in ("*", "", locality.zone) and subzone in ("*", "", locality.subzone)
    )


def _locality_problem(localities: Sequence[str]) -> str:
    """istiod's ``validateLocalities``: wildcards only at the end, no empty part, no locality covering an earlier one
    (order matters as it does there: ``*`` after others is allowed, nothing after ``*``)."""
    seen: dict[str, dict[str, set[str]]] = {}
    for locality in localities:
        stars = locality.count("*")
        if stars > 1 or (stars == 1 and not locality.endswith("*")):
            return f"locality {locality!r}: at most one '*', at the end"
        if "*" in seen:
            return f"locality {locality!r} overlaps an earlier one"
        parts = _parts(locality)
        if any(not part for part in parts):
            return f"locality {locality!r} has an empty region, zone or subzone"
        region = parts[0]
        zones = seen.get(region)
        if len(parts) == 1:
            if zones is not None:
                return f"locality {locality!r} overlaps an earlier one"
            seen[region] = {"*": {"*"}}
            continue
        zone = parts[1]
        if zones is None:
            seen[region] = zones = {}
        elif "*" in zones:
            return f"locality {locality!r} overlaps an earlier one"
        subzones = zones.get(zone)
        if len(parts) == 2:
            if subzones is not None:
                return f"locality {locality!r} overlaps an earlier one"
            zones[zone] = {"*"}
        elif subzones is None:
            zones[zone] = {parts[2]}
        elif "*" in subzones or parts[2] in subzones:
            return f"locality {locality!r} overlaps an earlier one"
        else:
            subzones.add(parts[2])
    return ""


def setting_problems(setting: LocalityLbSetting) -> list[tuple[str, str]]:
    """(field, problem) pairs for what istiod's validation refuses, and Ambit's bounds; empty when valid. Fields
    are named as in the manifest (``distribute[0].to``)."""
    problems: list[tuple[str, str]] = []
    if len(setting.distribute) > MAX_DISTRIBUTE:
        problems.append(("distribute", f"more than {MAX_DISTRIBUTE} entries"))
    if len(setting.failover) > MAX_FAILOVER:
        problems.append(("failover", f"more than {MAX_FAILOVER} entries"))
    if len(setting.failover_priority) > MAX_FAILOVER_PRIORITY:
        problems.append(("failoverPriority", f"more than {MAX_FAILOVER_PRIORITY} labels"))
    if problems:
        return problems
    if setting.distribute and setting.failover:
        return [("distribute", "distribute and failover cannot both be set")]
    if setting.failover:
        for index, label in enumerate(setting.failover_priority):
            if label in _LOCALITY_LABELS:
                problems.append((f"failoverPriority[{index}]", f"{label} cannot be used with failover"))
    for index, entry in enumerate(setting.distribute):
        at = f"distribute[{index}]"
        if any(weight < 1 or weight > 100 for _, weight in entry.to):
            problems.append((f"{at}.to", "each weight must be 1..100"))
        elif sum(weight for _, weight in entry.to) != 100:
            problems.append((f"{at}.to", f"weights add up to {sum(w for _, w in entry.to)}, not 100"))
        elif problem := _locality_problem([name for name, _ in entry.to]):
            problems.append((f"{at}.to", problem))
        if len(entry.source) > MAX_LOCALITY or any(len(name) > MAX_LOCALITY for name, _ in entry.to):
            problems.append((at, f"a locality is longer than {MAX_LOCALITY} characters"))
    if problem := _locality_problem([entry.source for entry in setting.distribute]):
        problems.append(("distribute", problem))
    for index, failover in enumerate(setting.failover):
        at = f"failover[{index}]"
        if failover.source == failover.to:
            problems.append((at, "from and to must be different regions"))
        if "/" in failover.source + failover.to:
            problems.append((at, "from and to are regions (no '/')"))
        if "*" in failover.source + failover.to:
            problems.append((at, "a region cannot hold '*'"))
        if not failover.source or not failover.to or max(len(failover.source), len(failover.to)) > MAX_LOCALITY:
            problems.append((at, f"from and to are 1..{MAX_LOCALITY} characters"))
    for index, label in enumerate(setting.failover_priority):
        if not label or len(label) > MAX_PRIORITY_LABEL or not label.isprintable():
            problems.append((f"failoverPriority[{index}]", f"not a label (1..{MAX_PRIORITY_LABEL} characters)"))
    return problems


def _distribute(entry: LocalityDistribute, candidates: Sequence[Workload], draw: float) -> list[Workload]:
    """Rule 2 once the entry is chosen: one locality drawn by weight (``draw`` in [0, 1)), its candidates."""
    members: dict[Locality, list[Workload]] = {}
    share: dict[Locality, int] = {}
    for name, weight in entry.to:
        matched = [w for w in candidates if locality_matches(w.locality, name) and w.locality not in members]
        for workload in matched:
            members.setdefault(workload.locality, []).append(workload)
        for locality in dict.fromkeys(w.locality for w in matched):  # in the candidates' order: a stable draw
            # istiod: weight * this locality's endpoints / all the entry matched, rounded up.
            share[locality] = -(-weight * len(members[locality]) // len(matched))
    total = sum(share.values())
    if not total:
        return []
    point = draw * total
    for locality, weight in share.items():
        if point < weight:
            return members[locality]
        point -= weight
    return members[next(reversed(share))]


def _unlabelled(_: Workload) -> str:
    """A label no workload carries here (rule 5)."""
    return ""


def _priority_rank(labels: tuple[str, ...], near: Workload, endpoint: Workload) -> int:
    """Rule 3a."""
    network_first = bool(labels) and labels[0].partition("=")[0] == NETWORK_LABEL
    rank = adjust = 0
    for index, entry in enumerate(labels):
        name, has_value, value = entry.partition("=")
        read = TOPOLOGY_LABELS.get(name, _unlabelled)
        wanted = value if has_value else read(near)
        if read(endpoint) != wanted:
            if index == 0 and network_first:
                adjust = len(labels)
                continue
            rank = len(labels) - index
            break
    return rank + adjust


def _failover_rank(failover: tuple[LocalityFailover, ...], near: Locality, endpoint: Locality) -> int:
    """Rule 3b."""
    if near.region == endpoint.region:
        if near.zone == endpoint.zone:
            return 0 if near.subzone == endpoint.subzone else 1
        return 2
    entry = next((f for f in failover if f.source == near.region), None)
    return 4 if entry is not None and endpoint.region != entry.to else 3


def by_locality(
    setting: LocalityLbSetting,
    near: Workload,
    candidates: Sequence[Workload],
    *,
    failing_over: bool,
    draw: float = 0.0,
) -> list[Workload]:
    """The candidates a proxy whose own workload is ``near`` may pick among (rules 1-6); ``failing_over``: the
    effective policy has outlier detection; ``draw`` in [0, 1) picks ``distribute``'s locality."""
    if not setting.enabled or not candidates:
        return list(candidates)
    if setting.distribute:
        entry = next((d for d in setting.distribute if locality_matches(near.locality, d.source)), None)
        return list(candidates) if entry is None else _distribute(entry, candidates, draw)
    if not failing_over:
        return list(candidates)

    def rank(endpoint: Workload) -> int:
        if not setting.failover_priority:
            return _failover_rank(setting.failover, near.locality, endpoint.locality)
        ranked = _priority_rank(setting.failover_priority, near, endpoint)
        if setting.failover:
            ranked = ranked * 5 + _failover_rank(setting.failover, near.locality, endpoint.locality)
        return ranked

    ranks = [rank(endpoint) for endpoint in candidates]
    best = min(ranks)
    return [endpoint for endpoint, ranked in zip(candidates, ranks, strict=True) if ranked == best]
