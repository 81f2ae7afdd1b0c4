"""Reading NetworkPolicies, Pods and Namespaces for the policy renderer (pure; :mod:`ambit.lab.network.policies`).

Objects arrive as plain dicts from informers, so any shape is possible. Each ``read_*`` function returns a frozen
model or raises :class:`Malformed` with a one-line reason; only the renderer catches it, and it never leaves the
package. What reaches the models is validated: addresses are :mod:`ipaddress` objects, ports are integers,
protocols are one of ``tcp``, ``udp``, ``sctp``, names are DNS labels or subdomains. Label selectors stay as
:class:`~ambit.model.labels.LabelSelector` (matched in Python, never written into a script).

Rules of reading (kube's meaning of each field, and what a malformed field costs):

1. A policy needs a readable ``metadata`` (namespace a DNS label, name a DNS subdomain), ``spec.podSelector`` and
   ``spec.policyTypes`` (absent or empty: Ingress, plus Egress when egress rules are given, as kube defaults
   them); without these it is left out entirely (nobody can say whom it isolates).
2. A readable policy isolates its pods even when one of its rules is malformed: that rule alone is left out with
   its reason, so a bad rule allows less, never more.
3. A rule's ``ports`` and ``from``/``to`` absent or empty mean "all"; a port without ``port`` means every port of
   its protocol (TCP when absent); ``endPort`` makes a range. A peer is ``ipBlock`` (``cidr`` minus ``except``, in
   kube's sloppy CIDR syntax), or ``podSelector`` and/or ``namespaceSelector``.
4. A pod gives its addresses (``status.podIPs``, else ``status.podIP``) only while it may hold them: a pod of
   phase Succeeded or Failed, or without an address yet, has none. ``hostNetwork`` pods are marked: their address
   is their node's, so they are neither policy targets nor pod peers (kube leaves them undefined; traffic from a
   node is allowed anyway and an ``ipBlock`` still covers their address).
5. A pod's named ports are its containers' ``ports[].name`` with protocol and number (init containers left out).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.apiserver.network_policy_validation import parse_cidr
from ambit.model.labels import LabelSelector, selector_from_spec

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_PORT_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


class Malformed(Exception):
    """The object (or part) being read is unusable; the message is the reason."""


@dataclass(frozen=True, slots=True)
class Port:
    """One entry of a rule's ``ports``: ``number`` None means every port; ``name`` is a named port instead."""

    protocol: str
    number: int | None = None
    end: int | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Peer:
    """One entry of ``from``/``to``: an address block, or pods chosen by selectors."""

    block: IPNetwork | None = None
    excepts: tuple[IPNetwork, ...] = ()
    pods: LabelSelector | None = None
    namespaces: LabelSelector | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """An ingress or egress rule; ``peers`` None and ``ports`` None mean all (rule 3)."""

    index: int
    ports: tuple[Port, ...] | None
    peers: tuple[Peer, ...] | None


@dataclass(frozen=True, slots=True)
class Policy:
    namespace: str
    name: str
    selector: LabelSelector
    ingress: tuple[Rule, ...] | None
    """None when the policy does not cover ingress; empty when it covers it and allows nothing."""
    egress: tuple[Rule, ...] | None


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    labels: Mapping[str, str]
    node: str
    addresses: tuple[IPAddress, ...]
    host_network: bool
    named_ports: tuple[tuple[str, str, int], ...]
    """(name, protocol, number) of each named container port."""

    def find_port(self, name: str, protocol: str) -> int | None:
        for port_name, port_protocol, number in self.named_ports:
            if port_name == name and port_protocol == protocol:
                return number
        return None


# -- policies ----------------------------------------------------------------------------------------------------


def read_policy(obj: object, skipped: list[str]) -> Policy:
    """Rules 1-3; a malformed rule is reported in ``skipped`` and left out."""
    meta = _mapping(obj, "metadata")
    namespace, name = _label(meta, "namespace"), _subdomain(meta, "name")
    spec = _mapping(obj, "spec")
    selector = selector_from_spec(spec.get("podSelector") if spec.get("podSelector") is not None else {})
    if selector is None:
        raise Malformed("spec.podSelector is not a label selector")
    types = spec.get("policyTypes")
    if types in (None, []):
        types = ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]
    if not isinstance(types, list) or any(t not in ("Ingress", "Egress") for t in types):
        raise Malformed(f"spec.policyTypes {_show(types)} is not a list of Ingress and Egress")
    who = f"NetworkPolicy {namespace}/{name}"
    ingress = _rules(spec, "ingress", "from", who, skipped) if "Ingress" in types else None
    egress = _rules(spec, "egress", "to", who, skipped) if "Egress" in types else None
    return Policy(namespace, name, selector, ingress, egress)


def _rules(spec: dict[str, Any], direction: str, peers_key: str, who: str, skipped: list[str]) -> tuple[Rule, ...]:
    raw_rules = spec.get(direction)
    if raw_rules is None:
        return ()
    if not isinstance(raw_rules, list):
        skipped.append(f"{who}: spec.{direction} {_show(raw_rules)} is not a list; it allows nothing")
        return ()
    rules = []
    for i, raw in enumerate(raw_rules):
        try:
            if not isinstance(raw, dict):
                raise Malformed(f"{_show(raw)} is not an object")
            ports = _optional_list(raw, "ports", _port)
            peers = _optional_list(raw, peers_key, _peer)
        except Malformed as exc:
            skipped.append(f"{who}: spec.{direction}[{i}]: {exc}; the rule allows nothing")
            continue
        rules.append(Rule(i, ports, peers))
    return tuple(rules)


def _optional_list(raw: dict[str, Any], field: str, read: Any) -> Any:
    items = raw.get(field)
    if items is None or items == []:
        return None
    if not isinstance(items, list):
        raise Malformed(f"{field} {_show(items)} is not a list")
    out = []
    for i, item in enumerate(items):
        try:
            out.append(read(item))
        except Malformed as exc:
            raise Malformed(f"{field}[{i}]: {exc}") from None
    return tuple(out)


def _port(raw: object) -> Port:
    if not isinstance(raw, dict):
        raise Malformed(f"{_show(raw)} is not an object")
    protocol_text = raw.get("protocol") or "TCP"
    protocol = PROTOCOLS.get(protocol_text) if isinstance(protocol_text, str) else None
    if protocol is None:
        raise Malformed(f"protocol {_show(protocol_text)} is not TCP, UDP or SCTP")
    number, end = raw.get("port"), raw.get("endPort")
    if number is None:
        if end is not None:
            raise Malformed("endPort without port")
        return Port(protocol)
    if isinstance(number, str):
        if end is not None:
            raise Malformed("endPort with a named port")
        if len(number) > 15 or not _PORT_NAME.fullmatch(number) or not re.search("[a-z]", number):
            raise Malformed(f"port {_show(number)} is not a port name")
        return Port(protocol, name=number)
    first = _port_number(number, "port")
    last = _port_number(end, "endPort") if end is not None else None
    if last is not None and last < first:
        raise Malformed(f"endPort {last} is below port {first}")
    return Port(protocol, first, last)


def _peer(raw: object) -> Peer:
    if not isinstance(raw, dict):
        raise Malformed(f"{_show(raw)} is not an object")
    block = raw.get("ipBlock")
    pods, namespaces = raw.get("podSelector"), raw.get("namespaceSelector")
    if block is not None:
        if pods is not None or namespaces is not None:
            raise Malformed("ipBlock with another peer")
        return _ip_block(block)
    if pods is None and namespaces is None:
        raise Malformed("names no peer")
    pod_selector = selector_from_spec(pods) if pods is not None else None
    namespace_selector = selector_from_spec(namespaces) if namespaces is not None else None
    if (pods is not None and pod_selector is None) or (namespaces is not None and namespace_selector is None):
        raise Malformed("a selector is not a label selector")
    return Peer(pods=pod_selector, namespaces=namespace_selector)


def _ip_block(raw: object) -> Peer:
    if not isinstance(raw, dict):
        raise Malformed(f"ipBlock {_show(raw)} is not an object")
    cidr = parse_cidr(raw.get("cidr"))
    if cidr is None:
        raise Malformed(f"ipBlock.cidr {_show(raw.get('cidr'))} is not a CIDR")
    excepts = raw.get("except") or []
    if not isinstance(excepts, list):
        raise Malformed(f"ipBlock.except {_show(excepts)} is not a list")
    inner = []
    for text in excepts:
        network = parse_cidr(text)
        if network is None or network.version != cidr.version or not _strictly_inside(network, cidr):
            raise Malformed(f"ipBlock.except {_show(text)} is not a CIDR strictly inside {cidr}")
        inner.append(network)
    return Peer(block=cidr, excepts=tuple(inner))


def _strictly_inside(inner: IPNetwork, outer: IPNetwork) -> bool:
    return inner.prefixlen > outer.prefixlen and int(inner.network_address) & int(outer.netmask) == int(
        outer.network_address
    )


# -- pods and namespaces -----------------------------------------------------------------------------------------


def read_pod(obj: object) -> Pod:
    """Rules 4 and 5."""
    meta = _mapping(obj, "metadata")
    namespace, name = _label(meta, "namespace"), _subdomain(meta, "name")
    labels = _labels(meta)
    spec = _mapping(obj, "spec")
    assert isinstance(obj, dict)  # _mapping checked it
    raw_status = obj.get("status")
    status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
    node = spec.get("nodeName") or ""
    if not isinstance(node, str):
        raise Malformed(f"spec.nodeName {_show(node)} is not a string")
    host_network = spec.get("hostNetwork") is True
    phase = status.get("phase")
    addresses: tuple[IPAddress, ...] = ()
    if phase not in ("Succeeded", "Failed"):
        addresses = _pod_addresses(status)
    return Pod(namespace, name, labels, node, addresses, host_network, _named_ports(spec))


def _pod_addresses(status: dict[str, Any]) -> tuple[IPAddress, ...]:
    texts: list[object] = []
    pod_ips = status.get("podIPs")
    if isinstance(pod_ips, list) and pod_ips:
        texts = [item.get("ip") if isinstance(item, dict) else item for item in pod_ips]
    elif status.get("podIP"):
        texts = [status.get("podIP")]
    out: list[IPAddress] = []
    for text in texts:
        try:
            address = ipaddress.ip_address(text) if isinstance(text, str) else None
        except ValueError:
            address = None
        if address is None:
            raise Malformed(f"status.podIPs holds {_show(text)}, not an IP address")
        if address not in out:
            out.append(address)
    return tuple(out)


def _named_ports(spec: dict[str, Any]) -> tuple[tuple[str, str, int], ...]:
    found: list[tuple[str, str, int]] = []
    containers = spec.get("containers")
    for container in containers if isinstance(containers, list) else ():
        ports = container.get("ports") if isinstance(container, dict) else None
        for port in ports if isinstance(ports, list) else ():
            if not isinstance(port, dict) or not isinstance(port.get("name"), str):
                continue
            protocol = PROTOCOLS.get(port.get("protocol") or "TCP", "")
            number = port.get("containerPort")
            if protocol and isinstance(number, int) and not isinstance(number, bool) and 1 <= number <= 65535:
                found.append((port["name"], protocol, number))
    return tuple(found)


def read_namespace_labels(obj: object) -> tuple[str, Mapping[str, str]]:
    """A Namespace's name and labels (with ``kubernetes.io/metadata.name``, which the API server always sets)."""
    meta = _mapping(obj, "metadata")
    name = _label(meta, "name")
    return name, {**_labels(meta), NAMESPACE_NAME_LABEL: name}


def default_namespace_labels(name: str) -> Mapping[str, str]:
    """The labels of a namespace not (yet) listed: only the one the API server always sets."""
    return {NAMESPACE_NAME_LABEL: name}


# -- field checks ------------------------------------------------------------------------------------------------


def _mapping(obj: object, field: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise Malformed(f"{_show(obj)} is not an object")
    value = obj.get(field)
    if not isinstance(value, dict):
        raise Malformed(f"{field} is {_show(value)}, not an object")
    return value


def _label(meta: dict[str, Any], field: str) -> str:
    value = meta.get(field)
    if not isinstance(value, str) or not _LABEL.fullmatch(value):
        raise Malformed(f"metadata.{field} {_show(value)} is not a DNS label")
    return value


def _subdomain(meta: dict[str, Any], field: str) -> str:
    value = meta.get(field)
    if not isinstance(value, str) or len(value) > 253 or not _SUBDOMAIN.fullmatch(value):
        raise Malformed(f"metadata.{field} {_show(value)} is not a DNS subdomain")
    return value


def _labels(meta: dict[str, Any]) -> dict[str, str]:
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise Malformed(f"metadata.labels {_show(labels)} is not a map of strings")
    return labels


def _port_number(value: object, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise Malformed(f"{field} {_show(value)} is not a port number")
    return value


def describe(obj: object, *, namespaced: bool = True) -> str:
    """``namespace/name`` (or ``name``) of an object for a reason, whatever it holds."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "(no metadata)"
    name = _show_name(meta.get("name"))
    return f"{_show_name(meta.get('namespace'))}/{name}" if namespaced else name


def _show_name(value: object) -> str:
    return value if isinstance(value, str) and _SUBDOMAIN.fullmatch(value) and len(value) <= 253 else _show(value)


def _show(value: object) -> str:
    """An untrusted value in a reason: a short repr (one line, whatever it holds)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
