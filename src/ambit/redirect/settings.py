"""One pod's redirection settings, and the pod annotations that change them (spec §0, §1.2).

Settings are parsed once (:meth:`InPodSettings.for_pod`) and then only read: the renderers take them as they are.
Every value that reaches a rule script is validated here (interface names, addresses), so no annotation can inject
nft or iptables syntax.

Annotations (all optional, read by the node agent):

- ``ambient.istio.io/bypass-inbound-capture: "true"``: "ingress mode", only outbound is captured. The 15006
  redirect and the probe-accept rule are left out.
- ``ambient.istio.io/dns-capture: "true"|"false"``: overrides the node's DNS capture setting.
- ``istio.io/reroute-virtual-interfaces: "a,b"``: inbound TCP from these interfaces is treated as outbound
  (redirected to 15001).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ambit.redirect.errors import RedirectSettingsError

BYPASS_INBOUND_CAPTURE = "ambient.istio.io/bypass-inbound-capture"
DNS_CAPTURE = "ambient.istio.io/dns-capture"
REROUTE_VIRTUAL_INTERFACES = "istio.io/reroute-virtual-interfaces"

HOST_PROBE_SNAT_IPV4 = "169.254.7.127"
HOST_PROBE_SNAT_IPV6 = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"

# Linux interface names: at most 15 bytes, no "/", no whitespace. We also refuse quotes, ":" and the like so that a
# name can be written unquoted in iptables and double-quoted in nft.
_IFNAME = re.compile(r"[A-Za-z0-9_.+@-]{1,15}")
_BOOLS = {"true": True, "1": True, "t": True, "false": False, "0": False, "f": False}


@dataclass(frozen=True, slots=True)
class InPodSettings:
    """How traffic inside one pod's network namespace is sent to the node proxy."""

    dns_capture: bool = True
    """Redirect the pod's DNS (port 53, UDP and TCP, not to localhost) to the proxy's DNS port."""
    inbound_bypass: bool = False
    """Ingress mode: capture outbound only (no inbound 15006 redirect, no probe-accept rule)."""
    reroute_interfaces: tuple[str, ...] = ()
    """Interfaces whose inbound TCP is redirected to the outbound port, in annotation order."""
    host_probe_snat_ip: str = HOST_PROBE_SNAT_IPV4
    """Source address the host gives kubelet's probes (spec §2.3); accepted without redirection."""
    host_probe_snat_ip_v6: str = HOST_PROBE_SNAT_IPV6
    ipv6: bool = False
    """Also redirect IPv6 (rules for ``::1`` and the v6 probe address, a ``::/0`` local route)."""
    outbound_port: int = 15001
    inbound_plaintext_port: int = 15006
    inbound_hbone_port: int = 15008
    """Never redirected inbound: it lands on the proxy's own HBONE listener."""
    dns_port: int = 15053
    proxy_mark: int = 0x539
    """The mark the proxy sets on its own sockets (``SO_MARK`` 1337); marked traffic is never redirected."""
    connmark: int = 0x111
    """Connection mark for the proxy's connections; restored on replies so they route to ``lo`` (table 100)."""
    mark_mask: int = 0xFFF
    route_table: int = 100
    rule_priority: int = 32764

    def __post_init__(self) -> None:
        for name in self.reroute_interfaces:
            if not _IFNAME.fullmatch(name):
                raise RedirectSettingsError(
                    f"{REROUTE_VIRTUAL_INTERFACES}: {name!r} is not an interface name "
                    "(1-15 characters of letters, digits, '_', '.', '+', '@', '-')"
                )
        for field_name, version in (("host_probe_snat_ip", 4), ("host_probe_snat_ip_v6", 6)):
            value = getattr(self, field_name)
            try:
                ok = ipaddress.ip_address(value).version == version
            except ValueError:
                ok = False
            if not ok:
                raise RedirectSettingsError(f"{field_name}: {value!r} is not an IPv{version} address")
        for field_name in ("outbound_port", "inbound_plaintext_port", "inbound_hbone_port", "dns_port"):
            if not 0 < getattr(self, field_name) < 65536:
                raise RedirectSettingsError(f"{field_name}: {getattr(self, field_name)!r} is not a port number")

    @classmethod
    def for_pod(cls, annotations: Mapping[str, str], *, dns_capture: bool = True, ipv6: bool = False) -> InPodSettings:
        """The settings for a pod with these annotations, on a node whose global DNS capture is ``dns_capture``.

        Raises :class:`RedirectSettingsError` (one line, naming the annotation) for a value that cannot be used.
        """
        bypass = _parse_bool(annotations, BYPASS_INBOUND_CAPTURE, default=False)
        dns = _parse_bool(annotations, DNS_CAPTURE, default=dns_capture)
        raw = annotations.get(REROUTE_VIRTUAL_INTERFACES, "")
        interfaces = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
        return cls(dns_capture=dns, inbound_bypass=bypass, reroute_interfaces=interfaces, ipv6=ipv6)

    @property
    def mark_match(self) -> str:
        """``0x539/0xfff``: the proxy mark under its mask, as iptables writes it."""
        return f"{self.proxy_mark:#x}/{self.mark_mask:#x}"

    @property
    def connmark_match(self) -> str:
        return f"{self.connmark:#x}/{self.mark_mask:#x}"


def _parse_bool(annotations: Mapping[str, str], key: str, *, default: bool) -> bool:
    value = annotations.get(key)
    if value is None:
        return default
    try:
        return _BOOLS[value.strip().lower()]
    except KeyError:
        raise RedirectSettingsError(f'{key}: {value!r} is not "true" or "false"') from None
