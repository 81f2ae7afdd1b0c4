"""Checks of a ``networking.k8s.io/v1`` NetworkPolicy, as kube-apiserver words them (pure).

Theory of operation: like :mod:`ambit.apiserver.spec_validation`, :func:`validate_network_policy` takes the whole
object and returns its causes (``validation.SPEC_RULES`` names the kind); every field is read defensively, so one
request reports every problem and no input raises. It runs after defaulting (:mod:`ambit.apiserver.defaults`
fills in ``policyTypes`` and each port's ``protocol``), but never relies on it.

Rules kept (kube-apiserver's, for this kind):

1. ``spec.podSelector`` is a well-formed label selector (an empty one selects every pod of the namespace).
2. Each ``ingress[i]`` and ``egress[i]`` is an object whose ``ports`` and ``from`` / ``to`` are lists of objects.
3. A port: ``protocol`` TCP, UDP or SCTP; ``port`` a number 1-65535 or an IANA service name (a named container
   port); ``endPort`` only with a numeric ``port``, itself 1-65535 and not below ``port``.
4. A peer names at least one of ``podSelector``, ``namespaceSelector``, ``ipBlock`` ("must specify a peer"), and
   ``ipBlock`` comes alone; the selectors are well formed (rule 1).
5. ``ipBlock.cidr`` is required and a valid CIDR (host bits may be set, as kube parses it sloppily); each
   ``except`` is a valid CIDR and a strict subset of ``cidr`` (same family, inside it, a longer prefix).
6. ``policyTypes``: at most two, each ``Ingress`` or ``Egress``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from ambit.apiserver.names import Cause, at, forbidden, invalid, required, unsupported
from ambit.apiserver.shapes import as_object, is_int, object_items
from ambit.apiserver.spec_validation import PROTOCOLS, iana_service_name, validate_label_selector

POLICY_TYPES = ("Ingress", "Egress")
_PORT_RANGE = "must be between 1 and 65535, inclusive"
_CIDR_MESSAGE = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def validate_network_policy(obj: Mapping[str, Any]) -> list[Cause]:
    """Rules 1-6."""
    causes: list[Cause] = []
    spec = as_object(obj.get("spec"), "spec", causes)
    selector = spec.get("podSelector")
    if selector is not None:
        causes.extend(validate_label_selector(selector, "spec.podSelector"))
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        for rule_path, rule in object_items(spec.get(direction), at("spec", direction), causes):
            for port_path, port in object_items(rule.get("ports"), at(rule_path, "ports"), causes):
                causes.extend(_port(port, port_path))
            for peer_path, peer in object_items(rule.get(peers_key), at(rule_path, peers_key), causes):
                causes.extend(_peer(peer, peer_path))
    causes.extend(_policy_types(spec.get("policyTypes")))
    return causes


def _port(port: Mapping[str, Any], path: str) -> list[Cause]:
    """Rule 3."""
    causes: list[Cause] = []
    protocol = port.get("protocol")
    if protocol is not None and protocol not in PROTOCOLS:
        causes.append(unsupported(at(path, "protocol"), protocol, ("TCP", "UDP", "SCTP")))
    number, end = port.get("port"), port.get("endPort")
    if end is not None and not is_int(end):
        causes.append(invalid(at(path, "endPort"), end, "must be an integer"))
        end = None
    if number is None:
        if end is not None:
            causes.append(invalid(at(path, "endPort"), end, "may not be specified when `port` is not specified"))
    elif is_int(number):
        if not 1 <= number <= 65535:
            causes.append(invalid(at(path, "port"), number, _PORT_RANGE))
        if end is not None:
            if end < number:
                causes.append(invalid(at(path, "endPort"), number, "must be greater than or equal to `port`"))
            if not 1 <= end <= 65535:
                causes.append(invalid(at(path, "endPort"), end, _PORT_RANGE))
    elif isinstance(number, str):
        if end is not None:
            causes.append(invalid(at(path, "endPort"), end, "may not be specified when `port` is non-numeric"))
        causes.extend(invalid(at(path, "port"), number, m) for m in iana_service_name(number))
    else:
        causes.append(invalid(at(path, "port"), number, "must be an integer or a string"))
    return causes


def _peer(peer: Mapping[str, Any], path: str) -> list[Cause]:
    """Rule 4."""
    causes: list[Cause] = []
    given = 0
    for key in ("podSelector", "namespaceSelector"):
        if peer.get(key) is not None:
            given += 1
            causes.extend(validate_label_selector(peer.get(key), at(path, key)))
    block = peer.get("ipBlock")
    if block is not None:
        given += 1
        causes.extend(_ip_block(as_object(block, at(path, "ipBlock"), causes), at(path, "ipBlock")))
    if given == 0:
        causes.append(required(path, "must specify a peer"))
    elif given > 1 and block is not None:
        causes.append(forbidden(path, "may not specify both ipBlock and another peer"))
    return causes


def parse_cidr(text: Any) -> IPNetwork | None:
    """A CIDR as kube parses it (host bits allowed, masked off); None when it is not one. Shared with the
    renderer (:mod:`ambit.lab.network.policies`), which must read ``ipBlock`` exactly as it was validated."""
    if not isinstance(text, str) or "/" not in text or text != text.strip():
        return None
    address, _, prefix = text.partition("/")
    if not prefix.isdigit() or (len(prefix) > 1 and prefix.startswith("0")):
        return None
    try:
        return ipaddress.ip_network(f"{address}/{int(prefix)}", strict=False)
    except ValueError:
        return None


def _ip_block(block: Mapping[str, Any], path: str) -> list[Cause]:
    """Rule 5."""
    cidr_text = block.get("cidr")
    if cidr_text in (None, ""):
        return [required(at(path, "cidr"))]
    cidr = parse_cidr(cidr_text)
    if cidr is None:
        return [invalid(at(path, "cidr"), cidr_text, _CIDR_MESSAGE)]
    causes: list[Cause] = []
    excepts = block.get("except")
    if excepts is not None and not isinstance(excepts, list):
        return [invalid(at(path, "except"), excepts, "must be a list of strings")]
    for i, text in enumerate(excepts or ()):
        where = at(at(path, "except"), i)
        inner = parse_cidr(text)
        if inner is None:
            causes.append(invalid(where, text, _CIDR_MESSAGE))
        elif inner.version != cidr.version or not inner.subnet_of(cidr) or inner.prefixlen <= cidr.prefixlen:  # type: ignore[arg-type]
            causes.append(invalid(where, text, "must be a strict subset of `cidr`"))
    return causes


def _policy_types(types: Any) -> list[Cause]:
    """Rule 6."""
    if types is None:
        return []
    if not isinstance(types, list):
        return [invalid("spec.policyTypes", types, "must be a list of strings")]
    if len(types) > len(POLICY_TYPES):
        return [invalid("spec.policyTypes", types, "may not specify more than two policyTypes")]
    return [
        unsupported(at("spec.policyTypes", i), kind, POLICY_TYPES)
        for i, kind in enumerate(types)
        if kind not in POLICY_TYPES
    ]
