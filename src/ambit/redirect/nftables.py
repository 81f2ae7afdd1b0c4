"""In-pod and host-side redirection as nftables scripts (spec §2.2, §2.3; pure rendering, no I/O).

In-pod: three ``inet`` tables, ``istio-ambient-mangle``, ``istio-ambient-nat`` and ``istio-ambient-raw`` (raw only
with DNS capture), each with base chains ``prerouting``/``output`` that jump to regular chains
``istio-prerouting``/``istio-output``. The rules are those of the iptables variant (:mod:`ambit.redirect.iptables`,
spec §2.1), rule for rule and in the same order:

- mangle: the proxy's marked packets give their connection the connmark; on output the connmark is copied back to
  the packet mark, which the policy route (:mod:`ambit.redirect.routes`) sends to ``lo``. The output base chain is
  ``type route`` so that a changed mark re-routes the packet (iptables' mangle OUTPUT does the same);
- nat: inbound TCP to 15006 (not to localhost, not to 15008, not marked), outbound TCP to 15001, DNS to 15053;
  probes from the host's SNAT address, the proxy's connections and app-to-self traffic on ``lo`` are accepted;
- raw: the proxy's upstream DNS and its answers go to conntrack zone 1, apart from the app's DNS that was NATed.

The tables are ``inet``, but with ``ipv6`` off only IPv4 is redirected (as with iptables only): every rule that
matches no address carries ``meta nfproto ipv4``. With ``ipv6`` on, the IPv6 rules follow the IPv4 ones in each
chain; the two never match the same packet, so the order between them does not matter.

Idempotence: every script starts with ``add table`` + ``delete table`` for each of the three tables and then
declares the wanted ones whole, so one ``nft -f`` replaces what was there in a single transaction. Applying the
same script twice leaves the same ruleset; turning DNS capture off removes the raw table.

Host side: one ``inet istio-ambient-nat`` table in the node's namespace, with the sets ``istio-inpod-probes-v4``
and ``-v6`` (the enrolled pods' addresses) and a postrouting chain that SNATs TCP from a local socket (kubelet's
probes) to those addresses to the probe address. iptables matches ``--socket-exists``; nft has no such match, so we
match ``meta skuid``, which only matches packets that have a local socket: any owner by default, kubelet's uid
when given. Forwarded traffic has no socket and is not SNATed.

nft pitfalls (1.0.6): ``priority dstnat`` is refused for the ``output`` hook (written ``-100``); an empty set must
leave out ``elements``; ``ct mark set ct mark and ... or ...`` is how a masked connmark write is spelt.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from ambit.redirect.errors import RedirectSettingsError
from ambit.redirect.settings import HOST_PROBE_SNAT_IPV4, HOST_PROBE_SNAT_IPV6, InPodSettings

MANGLE_TABLE = "istio-ambient-mangle"
NAT_TABLE = "istio-ambient-nat"
RAW_TABLE = "istio-ambient-raw"
INPOD_TABLES = (MANGLE_TABLE, NAT_TABLE, RAW_TABLE)
HOST_TABLE = NAT_TABLE
PROBE_SET_V4 = "istio-inpod-probes-v4"
PROBE_SET_V6 = "istio-inpod-probes-v6"
FAMILY = "inet"


@dataclass(frozen=True, slots=True)
class _Family:
    """How one IP version is written in rules: ``ip``/``ip6``, its nfproto and its loopback address."""

    keyword: str
    nfproto: str
    loopback: str
    probe_ip: str


def _families(settings: InPodSettings) -> list[_Family]:
    out = [_Family("ip", "ipv4", "127.0.0.1", settings.host_probe_snat_ip)]
    if settings.ipv6:
        out.append(_Family("ip6", "ipv6", "::1", settings.host_probe_snat_ip_v6))
    return out


def _chain(name: str, rules: Iterable[str], base: str | None = None) -> list[str]:
    lines = [f"\tchain {name} {{"]
    if base is not None:
        lines.append(f"\t\t{base}; policy accept;")
    lines += [f"\t\t{rule}" for rule in rules]
    lines.append("\t}")
    return lines


def _table(name: str, chains: list[list[str]]) -> list[str]:
    lines = [f"table {FAMILY} {name} {{"]
    for chain in chains:
        lines += chain
    lines.append("}")
    return lines


def _replace_tables(names: Iterable[str]) -> list[str]:
    """``add`` then ``delete`` each table: the delete never fails, and the table is gone within the transaction."""
    lines: list[str] = []
    for name in names:
        lines += [f"add table {FAMILY} {name}", f"delete table {FAMILY} {name}"]
    return lines


def _base_chains(hook_types: dict[str, str]) -> list[list[str]]:
    return [
        _chain("prerouting", ["jump istio-prerouting"], hook_types["prerouting"]),
        _chain("output", ["jump istio-output"], hook_types["output"]),
    ]


def render_inpod_nft(settings: InPodSettings) -> str:
    """The nft script that installs (or replaces) a pod's redirection; apply with ``nft -f`` in the pod netns."""
    s = settings
    mark = f"meta mark & {s.mark_mask:#x}"
    not_proxy = f"{mark} != {s.proxy_mark:#x}"
    is_proxy = f"{mark} == {s.proxy_mark:#x}"
    families = _families(s)

    mangle_pre: list[str] = []
    mangle_out: list[str] = []
    nat_pre: list[str] = []
    nat_out: list[str] = []
    raw_pre: list[str] = []
    raw_out: list[str] = []
    keep = (~s.mark_mask) & 0xFFFFFFFF
    for f in families:
        proto = f"meta nfproto {f.nfproto}"
        not_lo = f"{f.keyword} daddr != {f.loopback}"
        mangle_pre.append(f"{proto} {is_proxy} ct mark set ct mark & {keep:#010x} | {s.connmark:#x}")
        mangle_out.append(f"{proto} ct mark & {s.mark_mask:#x} == {s.connmark:#x} meta mark set ct mark")

        for iface in s.reroute_interfaces:
            nat_pre.append(f'{proto} iifname "{iface}" meta l4proto tcp redirect to :{s.outbound_port}')
            nat_pre.append(f'{proto} iifname "{iface}" meta l4proto tcp return')
        if not s.inbound_bypass:
            nat_pre.append(f"{f.keyword} saddr {f.probe_ip} meta l4proto tcp accept")
        nat_out.append(f"{f.keyword} daddr {f.probe_ip} meta l4proto tcp accept")
        if not s.inbound_bypass:
            nat_pre.append(
                f"{not_lo} tcp dport != {s.inbound_hbone_port} {not_proxy} redirect to :{s.inbound_plaintext_port}"
            )
        if s.dns_capture:
            nat_out.append(f'{proto} oifname != "lo" udp dport 53 {not_proxy} redirect to :{s.dns_port}')
            nat_out.append(f"{not_lo} tcp dport 53 {not_proxy} redirect to :{s.dns_port}")
            raw_out.append(f"{proto} udp dport 53 {is_proxy} ct zone set 1")
            raw_pre.append(f"{proto} udp sport 53 {not_proxy} ct zone set 1")
        nat_out.append(f"{proto} meta l4proto tcp {mark} == {s.connmark:#x} accept")
        nat_out.append(f'{not_lo} oifname "lo" accept')
        nat_out.append(f"{not_lo} meta l4proto tcp {not_proxy} redirect to :{s.outbound_port}")

    lines = _replace_tables(INPOD_TABLES)
    lines += _table(
        MANGLE_TABLE,
        [
            *_base_chains(
                {
                    "prerouting": "type filter hook prerouting priority mangle",
                    "output": "type route hook output priority mangle",
                }
            ),
            _chain("istio-prerouting", mangle_pre),
            _chain("istio-output", mangle_out),
        ],
    )
    lines += _table(
        NAT_TABLE,
        [
            *_base_chains(
                {
                    "prerouting": "type nat hook prerouting priority dstnat",
                    "output": "type nat hook output priority -100",
                }
            ),
            _chain("istio-prerouting", nat_pre),
            _chain("istio-output", nat_out),
        ],
    )
    if s.dns_capture:
        lines += _table(
            RAW_TABLE,
            [
                *_base_chains(
                    {
                        "prerouting": "type filter hook prerouting priority raw",
                        "output": "type filter hook output priority raw",
                    }
                ),
                _chain("istio-prerouting", raw_pre),
                _chain("istio-output", raw_out),
            ],
        )
    return "\n".join(lines) + "\n"


def render_inpod_nft_removal() -> str:
    """The nft script that removes a pod's redirection tables; a no-op where there are none."""
    return "\n".join(_replace_tables(INPOD_TABLES)) + "\n"


def render_host_nft(
    probe_snat_ip: str = HOST_PROBE_SNAT_IPV4,
    pod_ips: Iterable[str] = (),
    *,
    probe_snat_ip_v6: str = HOST_PROBE_SNAT_IPV6,
    kubelet_uid: int | None = None,
) -> str:
    """The node-namespace script that SNATs local probes to enrolled pods (``pod_ips``) to the probe address.

    Re-rendered and re-applied whole whenever the set of enrolled pods changes (one transaction, no window).
    Raises :class:`RedirectSettingsError` for an address that is not one.
    """
    v4: set[ipaddress.IPv4Address] = set()
    v6: set[ipaddress.IPv6Address] = set()
    for text in pod_ips:
        try:
            addr = ipaddress.ip_address(text)
        except ValueError:
            raise RedirectSettingsError(f"pod IP {text!r} is not an IP address") from None
        if isinstance(addr, ipaddress.IPv4Address):
            v4.add(addr)
        else:
            v6.add(addr)
    snat4 = ipaddress.IPv4Address(_checked(probe_snat_ip, 4))
    snat6 = ipaddress.IPv6Address(_checked(probe_snat_ip_v6, 6))
    owner = "meta skuid 0-4294967295" if kubelet_uid is None else f"meta skuid {kubelet_uid}"

    lines = _replace_tables([HOST_TABLE])
    lines.append(f"table {FAMILY} {HOST_TABLE} {{")
    for name, kind, members in (
        (PROBE_SET_V4, "ipv4_addr", [str(a) for a in sorted(v4)]),
        (PROBE_SET_V6, "ipv6_addr", [str(a) for a in sorted(v6)]),
    ):
        lines += [f"\tset {name} {{", f"\t\ttype {kind}"]
        if members:  # an empty set must leave out "elements"
            lines.append(f"\t\telements = {{ {', '.join(members)} }}")
        lines.append("\t}")
    lines += _chain("postrouting", ["jump istio-postrouting"], "type nat hook postrouting priority srcnat")
    lines += _chain(
        "istio-postrouting",
        [
            f"{owner} ip daddr @{PROBE_SET_V4} meta l4proto tcp snat ip to {snat4}",
            f"{owner} ip6 daddr @{PROBE_SET_V6} meta l4proto tcp snat ip6 to {snat6}",
        ],
    )
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_host_nft_removal() -> str:
    return "\n".join(_replace_tables([HOST_TABLE])) + "\n"


def _checked(text: str, version: int) -> str:
    try:
        ok = ipaddress.ip_address(text).version == version
    except ValueError:
        ok = False
    if not ok:
        raise RedirectSettingsError(f"probe SNAT address {text!r} is not an IPv{version} address")
    return text
