"""A pod's ``/etc/resolv.conf``, as the kubelet forms it from ``dnsPolicy`` and ``dnsConfig`` (pure).

The runtime writes the result to ``<pod dir>/resolv.conf`` and binds that file read-only at ``/etc/resolv.conf``
in each of the pod's containers (their own mount namespace): the machine's file is never written.

Rules:

1. Policy. ``dnsPolicy`` defaults to ``ClusterFirst``. ``ClusterFirst`` on a ``hostNetwork`` pod is ``Default``;
   ``ClusterFirstWithHostNet`` is ``ClusterFirst`` for any pod. A cluster policy with no cluster DNS server
   configured falls back to ``Default`` with a warning. Another value is a :class:`DnsConfigError`.
2. ``ClusterFirst``: the cluster DNS servers; the searches ``<ns>.svc.<domain> svc.<domain> <domain>`` followed by
   the node's own search domains; ``options ndots:5``.
3. ``Default``: the node's file (its ``nameserver``, ``search``/``domain`` and ``options`` lines) as it is.
4. ``None``: nothing but what ``dnsConfig`` says; ``dnsConfig`` is then required, with at least one nameserver.
5. ``dnsConfig`` is merged as the kubelet merges it: its nameservers and searches are appended (duplicates
   dropped, first kept), its options replace the options of the same name and the others are appended; an
   option with a value is ``name:value``.
6. Validation (the API server's rules for ``dnsConfig``, so that bad input gets a clear message here too): at most
   3 nameservers, each an IP address; at most 32 searches of at most 2048 characters in all, each a DNS name of
   at most 253 characters; every option has a name. A violation is a :class:`DnsConfigError` naming the field.
7. Limits on the merged result (the kubelet's): beyond 3 nameservers, 32 searches or 2048 characters of search
   line, the excess is omitted and a warning says what line was applied, in the kubelet's words.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.errors import AmbitError

MAX_NAMESERVERS = 3
MAX_SEARCHES = 32
MAX_SEARCH_CHARS = 2048
DEFAULT_NDOTS = "ndots:5"
POLICIES = ("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None")
_DNS_NAME = re.compile(r"(?=.{1,253}\.?\Z)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*\.?")


class DnsConfigError(AmbitError):
    """A pod's ``dnsPolicy`` or ``dnsConfig`` that no resolv.conf can be formed from (the pod's fault)."""


@dataclass(frozen=True, slots=True)
class ResolvConf:
    nameservers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()

    def render(self) -> str:
        lines = []
        if self.searches:
            lines.append("search " + " ".join(self.searches))
        lines += [f"nameserver {server}" for server in self.nameservers]
        if self.options:
            lines.append("options " + " ".join(self.options))
        return "".join(line + "\n" for line in lines)


@dataclass(frozen=True, slots=True)
class ClusterDns:
    """The node runtime's cluster DNS settings (the kubelet's ``clusterDNS`` and ``clusterDomain``)."""

    nameservers: tuple[str, ...]
    domain: str = "cluster.local"


@dataclass(frozen=True, slots=True)
class PodDns:
    resolv: ResolvConf
    warnings: tuple[str, ...] = ()


def parse_resolv_conf(text: str) -> ResolvConf:
    """Rule 3's input: ``nameserver``, ``search`` (or ``domain``) and ``options`` lines; the rest is skipped."""
    nameservers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split(";", 1)[0].split()
        if not words:
            continue
        if words[0] == "nameserver" and len(words) > 1:
            nameservers.append(words[1])
        elif words[0] in ("search", "domain"):
            searches = words[1:]  # the last search or domain line wins, as in glibc
        elif words[0] == "options":
            options.extend(words[1:])
    return ResolvConf(tuple(nameservers), tuple(searches), tuple(options))


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _validate(config: Mapping[str, Any]) -> tuple[list[str], list[str], list[tuple[str, str | None]]]:
    """Rule 6: the nameservers, searches and options of ``dnsConfig``, or :class:`DnsConfigError`."""
    nameservers = config.get("nameservers") or []
    searches = config.get("searches") or []
    options = config.get("options") or []
    if not isinstance(nameservers, list) or not isinstance(searches, list) or not isinstance(options, list):
        raise DnsConfigError("spec.dnsConfig: nameservers, searches and options must be lists")
    if len(nameservers) > MAX_NAMESERVERS:
        raise DnsConfigError(f"spec.dnsConfig.nameservers: must not have more than {MAX_NAMESERVERS} nameservers")
    for i, server in enumerate(nameservers):
        try:
            ipaddress.ip_address(server if isinstance(server, str) else "")
        except ValueError:
            raise DnsConfigError(f"spec.dnsConfig.nameservers[{i}]: {server!r} must be a valid IP address") from None
    if len(searches) > MAX_SEARCHES:
        raise DnsConfigError(f"spec.dnsConfig.searches: must not have more than {MAX_SEARCHES} search paths")
    for i, search in enumerate(searches):
        if not isinstance(search, str) or not _DNS_NAME.fullmatch(search):
            raise DnsConfigError(f"spec.dnsConfig.searches[{i}]: {search!r} must be a DNS name (lower case)")
    if len(" ".join(str(s) for s in searches)) > MAX_SEARCH_CHARS:
        raise DnsConfigError(f"spec.dnsConfig.searches: must not have more than {MAX_SEARCH_CHARS} characters")
    parsed: list[tuple[str, str | None]] = []
    for i, option in enumerate(options):
        name = option.get("name") if isinstance(option, dict) else None
        value = option.get("value") if isinstance(option, dict) else None
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise DnsConfigError(f"spec.dnsConfig.options[{i}].name: must be a word")
        if value is not None and (not isinstance(value, str) or any(c.isspace() for c in value)):
            raise DnsConfigError(f"spec.dnsConfig.options[{i}].value: must be a word")
        parsed.append((name, value))
    return [str(s) for s in nameservers], [str(s) for s in searches], parsed


def _merge_options(existing: Iterable[str], extra: list[tuple[str, str | None]]) -> tuple[str, ...]:
    merged: dict[str, str | None] = {}
    for option in existing:
        name, _, text = option.partition(":")
        merged[name] = text or None
    for name, value in extra:
        merged[name] = value
    return tuple(name if value is None else f"{name}:{value}" for name, value in merged.items())


def _limits(resolv: ResolvConf) -> PodDns:
    """Rule 7."""
    warnings: list[str] = []
    nameservers = resolv.nameservers
    if len(nameservers) > MAX_NAMESERVERS:
        nameservers = nameservers[:MAX_NAMESERVERS]
        warnings.append(
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line "
            f"is: {' '.join(nameservers)}"
        )
    searches = list(resolv.searches[:MAX_SEARCHES])
    while len(" ".join(searches)) > MAX_SEARCH_CHARS:
        searches.pop()
    if len(searches) < len(resolv.searches):
        warnings.append(
            "Search Line limits were exceeded, some search paths have been omitted, the applied search line "
            f"is: {' '.join(searches)}"
        )
    return PodDns(ResolvConf(nameservers, tuple(searches), resolv.options), tuple(warnings))


def pod_dns(pod: Mapping[str, Any], cluster: ClusterDns, node: ResolvConf) -> PodDns:
    """Rules 1 to 7 for ``pod``; :class:`DnsConfigError` for a policy or ``dnsConfig`` that cannot be used."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    namespace = str(meta.get("namespace") or "default")
    policy = spec.get("dnsPolicy") or "ClusterFirst"
    if policy not in POLICIES:
        raise DnsConfigError(f"spec.dnsPolicy: {policy!r} is not one of {', '.join(POLICIES)}")
    config = spec.get("dnsConfig")
    if config is not None and not isinstance(config, dict):
        raise DnsConfigError("spec.dnsConfig: must be an object")
    warnings: list[str] = []
    if policy == "ClusterFirst" and spec.get("hostNetwork"):
        policy = "Default"
    if policy in ("ClusterFirst", "ClusterFirstWithHostNet") and not cluster.nameservers:
        warnings.append(f"pod {namespace}/{meta.get('name')}: no cluster DNS server is configured: using Default")
        policy = "Default"
    if policy == "None":
        if config is None:
            raise DnsConfigError("spec.dnsConfig: required when dnsPolicy is None")
        if not config.get("nameservers"):
            raise DnsConfigError("spec.dnsConfig.nameservers: at least one is required when dnsPolicy is None")
        base = ResolvConf()
    elif policy == "Default":
        base = node
    else:
        domain = cluster.domain
        base = ResolvConf(
            cluster.nameservers,
            _unique((f"{namespace}.svc.{domain}", f"svc.{domain}", domain, *node.searches)),
            (DEFAULT_NDOTS,),
        )
    if config is not None:
        nameservers, searches, options = _validate(config)
        base = ResolvConf(
            _unique((*base.nameservers, *nameservers)),
            _unique((*base.searches, *searches)),
            _merge_options(base.options, options),
        )
    limited = _limits(base)
    return PodDns(limited.resolv, (*warnings, *limited.warnings))
