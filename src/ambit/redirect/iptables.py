"""In-pod and host-side redirection as ``iptables-restore --noflush`` input (spec §2.1, §2.3; pure, no I/O).

The in-pod rules, in tables mangle, nat and raw (raw only with DNS capture), live in our own chains
``ISTIO_PRERT`` and ``ISTIO_OUTPUT``, reached by one jump from each built-in ``PREROUTING``/``OUTPUT``. The
host side has ``ISTIO_POSTRT`` in nat, jumped to first from ``POSTROUTING``, and the ipset of enrolled pod IPs.

Idempotence under ``--noflush``, which never flushes the built-in chains:

- declaring a chain (``:ISTIO_PRERT - [0:0]``) creates it, or flushes it when it exists, so our chains are
  rewritten whole on every apply;
- a jump in a built-in chain would be appended again on every apply, so the renderers take the current state
  (``iptables-save`` output) and leave out jumps already there;
- whatever is present but no longer wanted (the raw table after DNS capture is turned off) is removed: its jumps
  deleted (``-D``, once per copy), its chains flushed and deleted (``-F``, ``-X``).

One ``iptables-restore`` commits all tables in one transaction (nf_tables backend), so there is no window with
half the rules. IPv6 gets the same rules from :func:`render_inpod_iptables` with ``family=6`` (for
``ip6tables-restore``): ``::1/128`` and the v6 probe address.

Pitfalls: ``iptables-nft`` leaves the built-in tables and chains (empty) behind after our removal, and
``iptables-save`` then still prints them; ``-D`` of a jump that is not there fails the whole restore, hence the
current state; the host's ``-m set`` rule fails to load unless the ipset exists (create it first,
:func:`render_host_ipset`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from ambit.redirect.errors import RedirectSettingsError
from ambit.redirect.settings import HOST_PROBE_SNAT_IPV4, InPodSettings

PRERT = "ISTIO_PRERT"
OUTPUT = "ISTIO_OUTPUT"
POSTRT = "ISTIO_POSTRT"
PROBE_IPSET_V4 = "istio-inpod-probes-v4"
PROBE_IPSET_V6 = "istio-inpod-probes-v6"

Family = Literal[4, 6]

# (built-in chain, our chain) per table.
_INPOD_JUMPS = (("PREROUTING", PRERT), ("OUTPUT", OUTPUT))
_HOST_JUMPS = (("POSTROUTING", POSTRT),)


@dataclass(slots=True)
class SavedState:
    """What ``iptables-save`` shows of our things: per table, our chains and the jumps to them."""

    chains: dict[str, set[str]] = field(default_factory=dict)
    jumps: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """(built-in chain, target) for every ``-A X -j ISTIO_*`` line, once per copy."""

    def has_anything(self) -> bool:
        return any(self.chains.values()) or any(self.jumps.values())


def parse_saved(text: str) -> SavedState:
    """Our chains and jumps in ``iptables-save`` output; everything else is ignored."""
    state = SavedState()
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":ISTIO_"):
            state.chains.setdefault(table, set()).add(line[1:].split()[0])
        elif line.startswith("-A "):
            words = line.split()
            if len(words) == 4 and words[2] == "-j" and words[3].startswith("ISTIO_"):
                state.jumps.setdefault(table, []).append((words[1], words[3]))
    return state


def _section(
    table: str,
    wanted: list[str] | None,
    jumps: Iterable[tuple[str, str]],
    current: SavedState,
    *,
    insert_first: bool = False,
) -> list[str]:
    """One ``*table`` block: declare our chains and add missing jumps, then ``wanted`` rules (None: remove ours)."""
    present_chains = current.chains.get(table, set())
    present_jumps = current.jumps.get(table, [])
    lines: list[str] = []
    if wanted is None:
        for builtin, target in present_jumps:
            lines.append(f"-D {builtin} -j {target}")
        for chain in sorted(present_chains):
            lines += [f"-F {chain}", f"-X {chain}"]
    else:
        ours = dict.fromkeys(target for _, target in jumps)
        lines += [f":{chain} - [0:0]" for chain in ours]
        for builtin, target in jumps:
            if (builtin, target) not in present_jumps:
                lines.append(f"-I {builtin} 1 -j {target}" if insert_first else f"-A {builtin} -j {target}")
        lines += wanted
    return [f"*{table}", *lines, "COMMIT"] if lines else []


def render_inpod_iptables(settings: InPodSettings, *, family: Family = 4, current: str = "") -> str:
    """The ``iptables-restore --noflush`` input that installs (or rewrites) a pod's rules.

    ``current`` is the pod netns's ``iptables-save`` output (empty for a fresh netns).
    """
    s = settings
    state = parse_saved(current)
    loopback = "127.0.0.1/32" if family == 4 else "::1/128"
    probe = s.host_probe_snat_ip if family == 4 else s.host_probe_snat_ip_v6
    mark, connmark = s.mark_match, s.connmark_match

    mangle = [
        f"-A {PRERT} -m mark --mark {mark} -j CONNMARK --set-xmark {connmark}",
        f"-A {OUTPUT} -m connmark --mark {connmark} -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff",
    ]
    nat: list[str] = []
    for iface in s.reroute_interfaces:
        nat += [
            f"-A {PRERT} -i {iface} -p tcp -j REDIRECT --to-ports {s.outbound_port}",
            f"-A {PRERT} -i {iface} -p tcp -j RETURN",
        ]
    if not s.inbound_bypass:
        nat.append(f"-A {PRERT} -s {probe} -p tcp -m tcp -j ACCEPT")
    nat.append(f"-A {OUTPUT} -d {probe} -p tcp -m tcp -j ACCEPT")
    if not s.inbound_bypass:
        nat.append(
            f"-A {PRERT} ! -d {loopback} -p tcp -m tcp ! --dport {s.inbound_hbone_port} -m mark ! --mark {mark} "
            f"-j REDIRECT --to-ports {s.inbound_plaintext_port}"
        )
    if s.dns_capture:
        nat += [
            f"-A {OUTPUT} ! -o lo -p udp -m mark ! --mark {mark} -m udp --dport 53 -j REDIRECT --to-ports {s.dns_port}",
            f"-A {OUTPUT} ! -d {loopback} -p tcp -m tcp --dport 53 -m mark ! --mark {mark} "
            f"-j REDIRECT --to-ports {s.dns_port}",
        ]
    nat += [
        f"-A {OUTPUT} -p tcp -m mark --mark {connmark} -j ACCEPT",
        f"-A {OUTPUT} ! -d {loopback} -o lo -j ACCEPT",
        f"-A {OUTPUT} ! -d {loopback} -p tcp -m mark ! --mark {mark} -j REDIRECT --to-ports {s.outbound_port}",
    ]
    raw = [
        f"-A {OUTPUT} -p udp -m mark --mark {mark} -m udp --dport 53 -j CT --zone 1",
        f"-A {PRERT} -p udp -m mark ! --mark {mark} -m udp --sport 53 -j CT --zone 1",
    ]
    lines = _section("mangle", mangle, _INPOD_JUMPS, state)
    lines += _section("nat", nat, _INPOD_JUMPS, state)
    if s.dns_capture:
        lines += _section("raw", raw, _INPOD_JUMPS, state)
    else:
        lines += _section("raw", None, (), state)
    return "\n".join(lines) + "\n"


def render_inpod_iptables_removal(current: str) -> str:
    """The restore input that deletes our jumps and chains present in ``current``; empty when there are none."""
    state = parse_saved(current)
    lines: list[str] = []
    for table in ("mangle", "nat", "raw"):
        lines += _section(table, None, (), state)
    return "\n".join(lines) + "\n" if lines else ""


def render_host_iptables(probe_snat_ip: str = HOST_PROBE_SNAT_IPV4, *, family: Family = 4, current: str = "") -> str:
    """The node-namespace restore input: SNAT TCP from local sockets to pods in the probe ipset (spec §2.3)."""
    ipset = PROBE_IPSET_V4 if family == 4 else PROBE_IPSET_V6
    _check_address(probe_snat_ip, family)
    rules = [
        f"-A {POSTRT} -m owner --socket-exists -p tcp -m set --match-set {ipset} dst "
        f"-j SNAT --to-source {probe_snat_ip}"
    ]
    lines = _section("nat", rules, _HOST_JUMPS, parse_saved(current), insert_first=True)
    return "\n".join(lines) + "\n"


def render_host_iptables_removal(current: str) -> str:
    lines = _section("nat", None, (), parse_saved(current))
    return "\n".join(lines) + "\n" if lines else ""


def render_host_ipset(pod_ips: Iterable[str], *, family: Family = 4) -> str:
    """``ipset restore`` input that makes the probe set hold exactly ``pod_ips`` of this family, atomically.

    The new members are loaded into a scratch set which is then swapped in, so probes never see a partial set.
    """
    name = PROBE_IPSET_V4 if family == 4 else PROBE_IPSET_V6
    scratch = f"{name}-tmp"
    inet = "inet" if family == 4 else "inet6"
    members = sorted(
        {a for a in (_parse_ip(t) for t in pod_ips) if a.version == family},
        key=int,
    )
    lines = [
        f"create {name} hash:ip family {inet} -exist",
        f"create {scratch} hash:ip family {inet} -exist",
        f"flush {scratch}",
        *(f"add {scratch} {a}" for a in members),
        f"swap {scratch} {name}",
        f"destroy {scratch}",
    ]
    return "\n".join(lines) + "\n"


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise RedirectSettingsError(f"pod IP {text!r} is not an IP address") from None


def _check_address(text: str, family: Family) -> None:
    try:
        ok = ipaddress.ip_address(text).version == family
    except ValueError:
        ok = False
    if not ok:
        raise RedirectSettingsError(f"probe SNAT address {text!r} is not an IPv{family} address")
