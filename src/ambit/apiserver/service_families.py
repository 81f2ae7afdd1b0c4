"""A Service's IP families: ``spec.ipFamilyPolicy``, ``spec.ipFamilies`` and ``spec.clusterIPs`` (pure; no I/O).

kube-apiserver decides these in its Service REST storage (``initIPFamilyFields`` and the cluster-IP validation),
not in defaulting, because the answer depends on the cluster's Service ranges (``--service-cluster-ip-range``:
one range, or two of different families, the first the primary). :func:`plan_families` does the same for a
Service being created (``old`` None) or updated, and returns the policy and families to store, and the cluster
IPs the caller must keep or allocate (in family order). Rules, checked in this order:

1. ``ipFamilies`` holds at most two entries, each ``IPv4`` or ``IPv6``, no family twice; ``ipFamilyPolicy`` is
   ``SingleStack``, ``PreferDualStack`` or ``RequireDualStack``; ``clusterIPs`` holds at most two entries, each an
   IP address, except a headless Service's single ``None``; two cluster IPs are of two families; ``clusterIP``,
   when given with ``clusterIPs``, equals ``clusterIPs[0]``.
2. The policy, when not given: ``RequireDualStack`` when two families or two cluster IPs are given, or for a
   headless Service without a selector; otherwise ``SingleStack``. ``SingleStack`` with two families or two cluster
   IPs is invalid.
3. ``clusterIPs[i]`` is of family ``ipFamilies[i]`` wherever both are given.
4. The families, when not given: those of the cluster IPs given; else the family of ``clusterIPs[0]``; else the
   cluster's primary. A dual-stack policy on a dual-stack cluster then adds the cluster's other family.
5. ``RequireDualStack`` needs a dual-stack cluster (a headless Service without a selector excepted: it gets the
   cluster's families); a family the cluster has no range for is invalid (headless Services excepted).
6. On update: ``clusterIPs[0]`` (``clusterIP``) and ``ipFamilies[0]`` are immutable; an absent
   ``clusterIP``/``clusterIPs`` keeps the stored ones; ``SingleStack`` keeps only the first cluster IP and family
   (the downgrade); a dual-stack policy on a dual-stack cluster adds the secondary family, whose address the
   caller allocates (the upgrade); a stored secondary cluster IP cannot be changed to another.
7. An ``ExternalName`` Service has no families: the fields are dropped, as kube drops them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

IPV4, IPV6 = "IPv4", "IPv6"
FAMILIES = (IPV4, IPV6)
SINGLE, PREFER, REQUIRE = "SingleStack", "PreferDualStack", "RequireDualStack"
POLICIES = (SINGLE, PREFER, REQUIRE)
HEADLESS = "None"


class ServiceFamilyError(ValueError):
    """The Service's family fields are invalid; ``causes`` are (field path, message) pairs."""

    def __init__(self, causes: list[tuple[str, str]]) -> None:
        self.causes = causes
        super().__init__(", ".join(f"{field}: {msg}" for field, msg in causes))


@dataclass(frozen=True, slots=True)
class FamilyPlan:
    policy: str | None
    """None for an ExternalName Service (rule 7)."""
    families: tuple[str, ...]
    cluster_ips: tuple[str | None, ...]
    """One per family, in family order: the address to keep or check, or None to allocate; ``("None",)`` for a
    headless Service."""

    @property
    def headless(self) -> bool:
        return self.cluster_ips == (HEADLESS,)


def family_of(address: str) -> str:
    return IPV6 if ipaddress.ip_address(address).version == 6 else IPV4


def cluster_families(service_cidrs: Sequence[str]) -> tuple[str, ...]:
    """The families of the cluster's Service ranges, primary first; two ranges must be of two families."""
    families = tuple(family_of(str(ipaddress.ip_network(cidr).network_address)) for cidr in service_cidrs)
    if not 1 <= len(families) <= 2 or len(set(families)) != len(families):
        raise ValueError(f"the Service ranges must be one range, or two of different families: {service_cidrs}")
    return families


def plan_families(spec: Mapping[str, Any], cluster: Sequence[str], old: Mapping[str, Any] | None = None) -> FamilyPlan:
    """Rules 1 to 7 for ``spec`` (with ``old``, the stored spec, on update); :class:`ServiceFamilyError` if invalid."""
    if spec.get("type") == "ExternalName":
        return FamilyPlan(None, (), ())
    causes: list[tuple[str, str]] = []
    raw_policy = spec.get("ipFamilyPolicy")
    families = _families(spec.get("ipFamilies"), causes)
    ips = _cluster_ips(spec, causes)
    if raw_policy is not None and raw_policy not in POLICIES:
        causes.append(("spec.ipFamilyPolicy", f"Unsupported value: {_show(raw_policy)}: supported values: "
                       + ", ".join(f'"{p}"' for p in POLICIES)))  # fmt: skip
    if causes:
        raise ServiceFamilyError(causes)
    if old is not None:
        return _plan_update(spec, raw_policy, families, ips, tuple(cluster), old)
    return _plan_create(spec, raw_policy, families, ips, tuple(cluster))


def _plan_create(
    spec: Mapping[str, Any], raw_policy: Any, families: list[str], ips: list[str], cluster: tuple[str, ...]
) -> FamilyPlan:
    headless = ips == [HEADLESS]
    selectorless = headless and not spec.get("selector")
    policy = str(raw_policy) if raw_policy is not None else None
    if policy is None:  # rule 2
        policy = REQUIRE if len(families) == 2 or len(ips) == 2 or selectorless else SINGLE
    if policy == SINGLE and (len(families) > 1 or len(ips) > 1):
        raise ServiceFamilyError(
            [
                (
                    "spec.ipFamilyPolicy",
                    "must be RequireDualStack or PreferDualStack when multiple IP families are specified",
                )
            ]
        )
    addresses = [] if headless else ips
    _check_order(families, addresses)  # rule 3
    if not families:  # rule 4
        families = [family_of(ip) for ip in addresses] or [cluster[0]]
    dual = len(cluster) == 2
    if policy != SINGLE and len(families) == 1 and (dual or selectorless):
        families += [f for f in cluster if f not in families]
    if policy == REQUIRE and len(families) < 2 and not selectorless:  # rule 5
        raise ServiceFamilyError([("spec.ipFamilyPolicy", "this cluster is not configured for dual-stack services")])
    if not headless:
        for i, family in enumerate(families):
            if family not in cluster:
                raise ServiceFamilyError([(f"spec.ipFamilies[{i}]", f"{family} is not configured on this cluster")])
    if headless:
        return FamilyPlan(policy, tuple(families), (HEADLESS,))
    wanted: list[str | None] = [*addresses, *([None] * (len(families) - len(addresses)))]
    return FamilyPlan(policy, tuple(families), tuple(wanted))


def _plan_update(
    spec: Mapping[str, Any],
    raw_policy: Any,
    families: list[str],
    ips: list[str],
    cluster: tuple[str, ...],
    old: Mapping[str, Any],
) -> FamilyPlan:
    old_ips = [str(ip) for ip in old.get("clusterIPs") or ([old["clusterIP"]] if old.get("clusterIP") else [])]
    old_families = [str(f) for f in old.get("ipFamilies") or ()]
    if not ips:
        ips = list(old_ips)
    if not families:
        families = list(old_families)[: max(1, len(ips))] if ips != [HEADLESS] else list(old_families)
    policy = str(raw_policy) if raw_policy is not None else str(old.get("ipFamilyPolicy") or SINGLE)
    if old_ips and ips[:1] != old_ips[:1]:
        raise ServiceFamilyError([("spec.clusterIP", "field is immutable")])
    if old_families and families[:1] != old_families[:1]:
        raise ServiceFamilyError([("spec.ipFamilies[0]", "may not change once set")])
    if len(ips) == 2 and len(old_ips) == 2 and ips[1] != old_ips[1]:
        raise ServiceFamilyError([("spec.clusterIPs[1]", "may not change once set")])
    headless = ips == [HEADLESS]
    if policy == SINGLE:  # the downgrade: the stored (or sent) secondary is dropped, as kube's allocator does
        families, ips = families[:1], ips[:1]
    addresses = [] if headless else ips
    _check_order(families, addresses)
    if not families:
        families = [family_of(ip) for ip in addresses] or [cluster[0]]
    if policy != SINGLE and len(families) == 1 and len(cluster) == 2:  # the upgrade
        families += [f for f in cluster if f not in families]
    if policy == REQUIRE and len(families) < 2 and not (headless and not spec.get("selector")):
        raise ServiceFamilyError([("spec.ipFamilyPolicy", "this cluster is not configured for dual-stack services")])
    if headless:
        return FamilyPlan(policy, tuple(families), (HEADLESS,))
    for i, family in enumerate(families[len(old_ips) :], start=len(old_ips)):
        if family not in cluster:
            raise ServiceFamilyError([(f"spec.ipFamilies[{i}]", f"{family} is not configured on this cluster")])
    wanted: list[str | None] = [*addresses, *([None] * (len(families) - len(addresses)))]
    return FamilyPlan(policy, tuple(families), tuple(wanted))


def _families(value: Any, causes: list[tuple[str, str]]) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        causes.append(("spec.ipFamilies", f"{_show(value)} is not a list"))
        return []
    if len(value) > 2:
        causes.append(("spec.ipFamilies", "may specify no more than one IP for each IP family"))
    out: list[str] = []
    for i, family in enumerate(value):
        if family not in FAMILIES:
            causes.append(
                (f"spec.ipFamilies[{i}]", f'Unsupported value: {_show(family)}: supported values: "IPv4", "IPv6"')
            )
        elif family in out:
            causes.append((f"spec.ipFamilies[{i}]", f"Duplicate value: {_show(family)}"))
        else:
            out.append(str(family))
    return out


def _cluster_ips(spec: Mapping[str, Any], causes: list[tuple[str, str]]) -> list[str]:
    single, many = spec.get("clusterIP"), spec.get("clusterIPs")
    if single is not None and single != "" and not isinstance(single, str):
        causes.append(("spec.clusterIP", f"{_show(single)} is not a string"))
        return []
    if many is None or many == []:
        if not single:
            return []
        many = [single]
    if not isinstance(many, list) or not all(isinstance(ip, str) for ip in many):
        causes.append(("spec.clusterIPs", f"{_show(many)} is not a list of strings"))
        return []
    if single and many[0] != single:
        causes.append(("spec.clusterIPs[0]", "must be the same as spec.clusterIP"))
    if len(many) > 2:
        causes.append(("spec.clusterIPs", "may only hold up to 2 values"))
        return []
    if HEADLESS in many and many != [HEADLESS]:
        causes.append(("spec.clusterIPs", "must not contain other values when 'None' is specified"))
        return []
    if many == [HEADLESS]:
        return [HEADLESS]
    for i, ip in enumerate(many):
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            causes.append(
                (f"spec.clusterIPs[{i}]", f"must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff): {_show(ip)}")
            )
            return []
    if len(many) == 2 and family_of(many[0]) == family_of(many[1]):
        causes.append(("spec.clusterIPs[1]", "may specify no more than one IP for each IP family"))
    return list(many)


def _check_order(families: list[str], addresses: list[str]) -> None:
    for i, (family, ip) in enumerate(zip(families, addresses, strict=False)):
        if family_of(ip) != family:
            raise ServiceFamilyError(
                [(f"spec.clusterIPs[{i}]", f"expected an {family} value as indicated by `ipFamilies[{i}]`")]
            )


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
