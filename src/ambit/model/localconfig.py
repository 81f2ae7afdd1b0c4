"""The node proxy's local config file: workloads, services and policies in YAML, like ztunnel's local mode.

Theory of operation: :func:`parse_local_config` loads YAML (libyaml's safe loader when present,
:mod:`ambit.model.localconfig_yaml`, imported on first use: a node proxy fed by xDS never loads YAML), then walks the
document with a path in hand, so every complaint names the field that caused it (``workloads[2].workloadIps[0]:
not an IP address: 'x'``). :func:`render_local_config` writes every field out, defaults included, in the same
shape. The dict form in between (:func:`workload_to_dict`, :func:`service_to_dict`) is also what the admin
``/config_dump`` shows.

Rules:

1. Keys are camelCase; an unknown key, or a key given twice in one mapping, is an error.
2. A missing optional key (or an explicit ``null``) takes the model's default. ``uid``, ``name``, ``namespace``
   (workloads) and ``name``, ``namespace``, ``hostname`` (services) are required.
3. Strings are printable. Names that end up in a SPIFFE id (namespace, serviceAccount, trustDomain) use its
   charset; empty serviceAccount / trustDomain mean the defaults, as in proto3 (spec §12).
4. Port maps go servicePort → targetPort: service ports 1..65535, target ports 0..65535 (0 = named port). A port
   with an application protocol maps to ``{targetPort: N, appProtocol: HTTP11}`` instead of a bare number.
5. Workload uids and service keys (``namespace/hostname``) are unique within a file.
6. Nothing but :class:`LocalConfigError` escapes the parser; an empty document is an empty config.
7. ``parse_local_config(render_local_config(c)) == c`` for every config the parser can produce.
8. Policies (spec §4.3) are ``name``, ``namespace`` (required), ``scope``, ``action``, ``dryRun`` and ``rules`` →
   ``clauses`` → ``matches``; a match names only its populated fields. String matches are Istio's pattern form
   (``*``, ``*x``, ``x*``, ``x``) or, for a value that form cannot say (an exact ``a*``), a mapping with one of
   ``exact``, ``prefix``, ``suffix``, ``presence``. Service accounts are ``namespace/name``; IPs are CIDRs with
   host bits clear (a bare address is /32 or /128); ports are 1..65535. Policy keys are unique within a file.
9. A workload's or service's ``waypoint`` is ``{hostname: H, namespace: N}`` or ``{address: net/ip}``, plus
   ``hboneMtlsPort`` (default 15008); a service's ``ingressUseWaypoint`` is a boolean. These newer fields are
   written only when set (no waypoint, false), so files written before them render the same.
10. A workload's ``hostname`` (a DNS name, :func:`~ambit.model.dnsname.check_dns_name`, only without
    ``workloadIps``) and a service's ``visibility`` (``Public`` or ``Namespace``) are likewise written only when
    set (non-empty, not ``Public``).
11. A service's ``weightedWaypoints`` (written only when set) is a list of ``{destination: <waypoint>, weight:
    N}`` with ``weight`` 0..4294967295 (the wire's uint32).
12. A workload's ``capacity`` (0..4294967295, default 1) is written only when it is not 1, a service's
    ``loadBalancingMode`` (``Unspecified``, ``Strict``, ``Failover``, ``Passthrough``) only when it is not
    ``Unspecified``.
13. A workload's ``applicationTunnel`` (written only when set) is ``{protocol: NONE|PROXY, port: N}``, ``port``
    0..65535 (0, the default, keeps the client's port).
14. A service's ``routingPreferences`` (ztunnel's key and spellings, written only when set) is a list of
    ``Region``, ``Zone``, ``Subzone``, ``Node``, ``Cluster``, ``Network``, most significant first, at most
    :data:`~ambit.model.routing_preference.MAX_ROUTING_SCOPES` of them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ambit.model.dnsname import check_dns_name
from ambit.model.errors import AddressError, IdentityError, LocalConfigError
from ambit.model.identity import (
    DEFAULT_SERVICE_ACCOUNT,
    DEFAULT_TRUST_DOMAIN,
    check_path_segment,
    check_trust_domain,
)
from ambit.model.policy import (
    Action,
    Cidr,
    Clause,
    Match,
    Policy,
    Rule,
    Scope,
    ServiceAccountMatch,
    StringMatch,
    StringMatchKind,
)
from ambit.model.routing_preference import MAX_ROUTING_SCOPES
from ambit.model.workload import (
    HBONE_MTLS_PORT,
    ApplicationTunnel,
    AppProtocol,
    AppTunnelProtocol,
    GatewayAddress,
    HealthPolicy,
    HealthStatus,
    IPAddress,
    IPFamilies,
    LoadBalancingMode,
    Locality,
    NamespacedHostname,
    NetworkAddress,
    NetworkMode,
    PortMapping,
    RoutingScope,
    Service,
    TunnelProtocol,
    Visibility,
    WeightedWaypoint,
    Workload,
    parse_ip,
)

__all__ = ["LocalConfig", "LocalConfigError", "parse_local_config", "policy_to_dict", "render_local_config"]

T = TypeVar("T")

_PROTOCOLS = {"HBONE": TunnelProtocol.HBONE, "TCP": TunnelProtocol.NONE}
_PROTOCOL_NAMES = {value: key for key, value in _PROTOCOLS.items()}
_WORKLOAD_TYPES = ("deployment", "cronjob", "pod", "job")  # spec §4.1 WorkloadType, lower case as ztunnel writes it
_ROOT_KEYS = ("workloads", "services", "policies")
_WORKLOAD_KEYS = (
    "uid",
    "name",
    "namespace",
    "workloadIps",
    "protocol",
    "serviceAccount",
    "trustDomain",
    "node",
    "network",
    "canonicalName",
    "canonicalRevision",
    "workloadName",
    "workloadType",
    "clusterId",
    "status",
    "services",
    "authorizationPolicies",
    "networkMode",
    "locality",
    "waypoint",
    "hostname",
    "capacity",
    "applicationTunnel",
)
_APP_TUNNEL_KEYS = ("protocol", "port")
_SERVICE_KEYS = (
    "name",
    "namespace",
    "hostname",
    "vips",
    "ports",
    "subjectAltNames",
    "healthPolicy",
    "canonical",
    "ipFamilies",
    "waypoint",
    "ingressUseWaypoint",
    "visibility",
    "weightedWaypoints",
    "loadBalancingMode",
    "routingPreferences",
)
_WEIGHTED_KEYS = ("destination", "weight")
_WAYPOINT_KEYS = ("hostname", "namespace", "address", "hboneMtlsPort")
_LOCALITY_KEYS = ("region", "zone", "subzone")
_PORT_KEYS = ("targetPort", "appProtocol")
_POLICY_KEYS = ("name", "namespace", "scope", "action", "dryRun", "rules")
_STRING_MATCH_FIELDS = {
    "namespaces": "namespaces",
    "notNamespaces": "not_namespaces",
    "principals": "principals",
    "notPrincipals": "not_principals",
}
_ACCOUNT_FIELDS = {"serviceAccounts": "service_accounts", "notServiceAccounts": "not_service_accounts"}
_CIDR_FIELDS = {
    "sourceIps": "source_ips",
    "notSourceIps": "not_source_ips",
    "destinationIps": "destination_ips",
    "notDestinationIps": "not_destination_ips",
}
_PORT_FIELDS = {"destinationPorts": "destination_ports", "notDestinationPorts": "not_destination_ports"}
_MATCH_KEYS = (*_STRING_MATCH_FIELDS, *_ACCOUNT_FIELDS, *_CIDR_FIELDS, *_PORT_FIELDS)


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """What a local config file describes."""

    workloads: tuple[Workload, ...]
    services: tuple[Service, ...]
    policies: tuple[Policy, ...] = ()
    """L4 authorization policies (spec §4.3), ordered by key."""


# Reading: each helper takes the value and its path, and raises LocalConfigError naming that path.


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _mapping(value: object, path: str, allowed: tuple[str, ...] | None = None) -> Mapping[Any, Any]:
    if not isinstance(value, dict):
        raise LocalConfigError(f"{path}: expected a mapping, got {_describe(value)}")
    if allowed is not None:
        unknown = [key for key in value if key not in allowed]
        if unknown:
            names = ", ".join(repr(key) for key in unknown)
            raise LocalConfigError(f"{path}: unknown key(s) {names}; known keys: {', '.join(allowed)}")
    return value


def _list(value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise LocalConfigError(f"{path}: expected a list, got {_describe(value)}")
    return value


def _string(value: object, path: str, *, non_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise LocalConfigError(f"{path}: expected a string, got {_describe(value)}")
    if non_empty and not value:
        raise LocalConfigError(f"{path}: must not be empty")
    if not value.isprintable():
        raise LocalConfigError(f"{path}: has unprintable characters: {value!r}")
    return value


def _field(
    item: Mapping[Any, Any], key: str, path: str, read: Callable[[object, str], T], default: T | None = None
) -> T:
    """``read`` the value at ``key``; a missing or null key gives ``default``, or is an error when it is None."""
    value = item.get(key)
    if value is None:
        if default is None:
            raise LocalConfigError(f"{path}.{key}: required")
        return default
    return read(value, f"{path}.{key}")


def _name(value: object, path: str) -> str:
    return _string(value, path, non_empty=True)


def _optional_string(value: object, path: str) -> str:
    return _string(value, path)


def _identity_part(check: Callable[[str], None], *, non_empty: bool) -> Callable[[object, str], str]:
    def read(value: object, path: str) -> str:
        text = _string(value, path, non_empty=non_empty)
        if text:
            try:
                check(text)
            except IdentityError as exc:
                raise LocalConfigError(f"{path}: {exc}") from None
        return text

    return read


_namespace = _identity_part(lambda text: check_path_segment("namespace", text), non_empty=True)
_service_account = _identity_part(lambda text: check_path_segment("service account", text), non_empty=False)
_trust_domain = _identity_part(check_trust_domain, non_empty=False)


def _choice(choices: Mapping[str, T]) -> Callable[[object, str], T]:
    def read(value: object, path: str) -> T:
        if isinstance(value, str) and value in choices:
            return choices[value]
        raise LocalConfigError(f"{path}: expected one of {', '.join(choices)}, got {_describe(value)}")

    return read


def _port(value: object, path: str, *, lowest: int) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)  # JSON-style maps have string keys
    if not isinstance(value, int) or isinstance(value, bool) or not lowest <= value <= 65535:
        raise LocalConfigError(f"{path}: expected a port number {lowest}..65535, got {_describe(value)}")
    return value


def _ports(value: object, path: str) -> tuple[PortMapping, ...]:
    mappings = []
    for service_port, target in _mapping(value, path).items():
        port = _port(service_port, f"{path}[{service_port!r}]: service port", lowest=1)
        where = f"{path}[{port}]"
        if isinstance(target, dict):
            item = _mapping(target, where, _PORT_KEYS)
            mappings.append(
                PortMapping(
                    port,
                    _field(item, "targetPort", where, lambda v, p: _port(v, p, lowest=0)),
                    _field(item, "appProtocol", where, _choice({a.value: a for a in AppProtocol}), AppProtocol.UNKNOWN),
                )
            )
        else:
            mappings.append(PortMapping(port, _port(target, where, lowest=0)))
    if len({mapping.service_port for mapping in mappings}) != len(mappings):
        raise LocalConfigError(f"{path}: a service port is given twice")
    return tuple(mappings)


def _ips(value: object, path: str) -> tuple[IPAddress, ...]:
    ips = []
    for index, text in enumerate(_list(value, path)):
        try:
            ips.append(parse_ip(_string(text, f"{path}[{index}]")))
        except AddressError as exc:
            raise LocalConfigError(f"{path}[{index}]: {exc}") from None
    return tuple(ips)


def _vips(value: object, path: str) -> tuple[NetworkAddress, ...]:
    vips = []
    for index, text in enumerate(_list(value, path)):
        try:
            vips.append(NetworkAddress.parse(_string(text, f"{path}[{index}]")))
        except AddressError as exc:
            raise LocalConfigError(f"{path}[{index}]: {exc}") from None
    return tuple(vips)


def _workload_services(value: object, path: str) -> dict[str, tuple[PortMapping, ...]]:
    services = {}
    for key, ports in _mapping(value, path).items():
        key_text = _string(key, f"{path}: key")
        namespace, slash, hostname = key_text.partition("/")
        if not (namespace and slash and hostname):
            raise LocalConfigError(f"{path}: key {key_text!r} is not 'namespace/hostname'")
        services[key_text] = _ports(ports, f"{path}[{key_text}]")
    return services


def _policy_key(value: object, path: str) -> str:
    key = _name(value, path)
    _namespace, slash, name = key.partition("/")
    if not (slash and name):
        raise LocalConfigError(f"{path}: {key!r} is not a policy key 'namespace/name'")
    return key


def _locality(value: object, path: str) -> Locality:
    item = _mapping(value, path, _LOCALITY_KEYS)
    return Locality(**{key: _field(item, key, path, _optional_string, "") for key in _LOCALITY_KEYS})


def _waypoint(value: object, path: str) -> GatewayAddress:
    item = _mapping(value, path, _WAYPOINT_KEYS)
    port = _field(item, "hboneMtlsPort", path, lambda v, p: _port(v, p, lowest=1), HBONE_MTLS_PORT)
    if ("hostname" in item) == ("address" in item):
        raise LocalConfigError(f"{path}: give exactly one of 'hostname' (with 'namespace') and 'address'")
    if "address" in item:
        if "namespace" in item:
            raise LocalConfigError(f"{path}.namespace: only with 'hostname'")
        try:
            address = NetworkAddress.parse(_string(item["address"], f"{path}.address"))
        except AddressError as exc:
            raise LocalConfigError(f"{path}.address: {exc}") from None
        return GatewayAddress(address, port)
    hostname = _field(item, "hostname", path, _name)
    return GatewayAddress(NamespacedHostname(_field(item, "namespace", path, _namespace), hostname), port)


def _weighted_waypoints(value: object, path: str) -> tuple[WeightedWaypoint, ...]:
    out = []
    for index, entry in enumerate(_list(value, path)):
        where = f"{path}[{index}]"
        item = _mapping(entry, where, _WEIGHTED_KEYS)
        weight = _field(item, "weight", where, _weight)
        out.append(WeightedWaypoint(_field(item, "destination", where, _waypoint), weight))
    return tuple(out)


def _weight(value: object, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0xFFFFFFFF:
        raise LocalConfigError(f"{path}: expected an integer 0..4294967295, got {value!r}")
    return value


def _workload(value: object, path: str) -> Workload:
    item = _mapping(value, path, _WORKLOAD_KEYS)
    return Workload(
        uid=_field(item, "uid", path, _name),
        name=_field(item, "name", path, _name),
        namespace=_field(item, "namespace", path, _namespace),
        addresses=_field(item, "workloadIps", path, _ips, ()),
        network=_field(item, "network", path, _optional_string, ""),
        tunnel_protocol=_field(item, "protocol", path, _choice(_PROTOCOLS), TunnelProtocol.NONE),
        trust_domain=_field(item, "trustDomain", path, _trust_domain, DEFAULT_TRUST_DOMAIN),
        service_account=_field(item, "serviceAccount", path, _service_account, DEFAULT_SERVICE_ACCOUNT),
        node=_field(item, "node", path, _optional_string, ""),
        canonical_name=_field(item, "canonicalName", path, _optional_string, ""),
        canonical_revision=_field(item, "canonicalRevision", path, _optional_string, ""),
        workload_name=_field(item, "workloadName", path, _optional_string, ""),
        workload_type=_field(item, "workloadType", path, _choice({t: t for t in _WORKLOAD_TYPES}), "pod"),
        cluster_id=_field(item, "clusterId", path, _optional_string, "Kubernetes"),
        status=_field(item, "status", path, _choice({s.value: s for s in HealthStatus}), HealthStatus.HEALTHY),
        services=_field(item, "services", path, _workload_services, {}),
        authorization_policies=tuple(
            _policy_key(key, f"{path}.authorizationPolicies[{index}]")
            for index, key in enumerate(_list(item.get("authorizationPolicies"), f"{path}.authorizationPolicies"))
        ),
        network_mode=_field(
            item, "networkMode", path, _choice({m.value: m for m in NetworkMode}), NetworkMode.STANDARD
        ),
        locality=_field(item, "locality", path, _locality, Locality()),
        waypoint=_waypoint(item["waypoint"], f"{path}.waypoint") if item.get("waypoint") is not None else None,
        hostname=_workload_hostname(item, path),
        capacity=_field(item, "capacity", path, _weight, 1),
        application_tunnel=(
            _application_tunnel(item["applicationTunnel"], f"{path}.applicationTunnel")
            if item.get("applicationTunnel") is not None
            else None
        ),
    )


def _application_tunnel(value: object, path: str) -> ApplicationTunnel:
    """Rule 13."""
    item = _mapping(value, path, _APP_TUNNEL_KEYS)
    protocol = _field(item, "protocol", path, _choice({p.value: p for p in AppTunnelProtocol}), AppTunnelProtocol.NONE)
    port = item.get("port")
    return ApplicationTunnel(protocol, 0 if port is None else _port(port, f"{path}.port", lowest=0))


def _workload_hostname(item: Mapping[Any, Any], path: str) -> str:
    hostname = _field(item, "hostname", path, _optional_string, "")
    if hostname:
        if item.get("workloadIps"):
            raise LocalConfigError(f"{path}.hostname: give either 'workloadIps' or 'hostname', not both")
        problem = check_dns_name(hostname)
        if problem:
            raise LocalConfigError(f"{path}.hostname: {problem}")
    return hostname


def _service(value: object, path: str) -> Service:
    item = _mapping(value, path, _SERVICE_KEYS)
    policies = {policy.value: policy for policy in HealthPolicy}
    return Service(
        name=_field(item, "name", path, _name),
        namespace=_field(item, "namespace", path, _namespace),
        hostname=_field(item, "hostname", path, _name),
        vips=_field(item, "vips", path, _vips, ()),
        ports=_field(item, "ports", path, _ports, ()),
        subject_alt_names=tuple(
            _name(san, f"{path}.subjectAltNames[{index}]")
            for index, san in enumerate(_list(item.get("subjectAltNames"), f"{path}.subjectAltNames"))
        ),
        health_policy=_field(item, "healthPolicy", path, _choice(policies), HealthPolicy.ONLY_HEALTHY),
        canonical=_field(item, "canonical", path, _bool, False),
        ip_families=_field(item, "ipFamilies", path, _choice({f.value: f for f in IPFamilies}), IPFamilies.AUTOMATIC),
        waypoint=_waypoint(item["waypoint"], f"{path}.waypoint") if item.get("waypoint") is not None else None,
        ingress_use_waypoint=_field(item, "ingressUseWaypoint", path, _bool, False),
        visibility=_field(item, "visibility", path, _choice({v.value: v for v in Visibility}), Visibility.PUBLIC),
        weighted_waypoints=_field(item, "weightedWaypoints", path, _weighted_waypoints, ()),
        load_balancing_mode=_field(
            item,
            "loadBalancingMode",
            path,
            _choice({m.value: m for m in LoadBalancingMode}),
            LoadBalancingMode.UNSPECIFIED,
        ),
        routing_preference=_field(item, "routingPreferences", path, _routing_preference, ()),
    )


def _routing_preference(value: object, path: str) -> tuple[RoutingScope, ...]:
    """Rule 14."""
    items = _list(value, path)
    if len(items) > MAX_ROUTING_SCOPES:
        raise LocalConfigError(f"{path}: {len(items)} scopes, more than {MAX_ROUTING_SCOPES}")
    scope = _choice({s.value: s for s in RoutingScope})
    return tuple(scope(item, f"{path}[{index}]") for index, item in enumerate(items))


def _string_match(value: object, path: str) -> StringMatch:
    if isinstance(value, str):
        return StringMatch.of_pattern(_string(value, path))
    item = _mapping(value, path, tuple(kind.value for kind in StringMatchKind))
    if len(item) != 1:
        raise LocalConfigError(f"{path}: expected a pattern string or exactly one of exact, prefix, suffix, presence")
    [(key, inner)] = item.items()
    kind = StringMatchKind(key)
    if kind is StringMatchKind.PRESENCE:
        if inner not in (None, {}, True):
            raise LocalConfigError(f"{path}.presence: expected {{}} or true, got {_describe(inner)}")
        return StringMatch.presence()
    return StringMatch(kind, _string(inner, f"{path}.{key}"))


def _account(value: object, path: str) -> ServiceAccountMatch:
    text = _string(value, path)
    namespace, slash, account = text.partition("/")
    if not (namespace and slash and account):
        raise LocalConfigError(f"{path}: {text!r} is not 'namespace/serviceaccount'")
    return ServiceAccountMatch(namespace, account)


def _cidr(value: object, path: str) -> Cidr:
    text = _string(value, path)
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise LocalConfigError(f"{path}: not a CIDR with host bits clear: {exc}") from None


def _policy_port(value: object, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise LocalConfigError(f"{path}: expected a port number 1..65535, got {_describe(value)}")
    return value


def _each(item: Mapping[Any, Any], key: str, path: str, read: Callable[[object, str], T]) -> tuple[T, ...]:
    return tuple(read(v, f"{path}.{key}[{i}]") for i, v in enumerate(_list(item.get(key), f"{path}.{key}")))


def _match(value: object, path: str) -> Match:
    item = _mapping(value, path, _MATCH_KEYS)
    fields: dict[str, Any] = {}
    for key, name in _STRING_MATCH_FIELDS.items():
        fields[name] = _each(item, key, path, _string_match)
    for key, name in _ACCOUNT_FIELDS.items():
        fields[name] = _each(item, key, path, _account)
    for key, name in _CIDR_FIELDS.items():
        fields[name] = _each(item, key, path, _cidr)
    for key, name in _PORT_FIELDS.items():
        fields[name] = _each(item, key, path, _policy_port)
    return Match(**fields)


def _clause(value: object, path: str) -> Clause:
    return Clause(_each(_mapping(value, path, ("matches",)), "matches", path, _match))


def _rule(value: object, path: str) -> Rule:
    return Rule(_each(_mapping(value, path, ("clauses",)), "clauses", path, _clause))


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise LocalConfigError(f"{path}: expected true or false, got {_describe(value)}")
    return value


_NODE_SCOPES = (Scope.GLOBAL, Scope.NAMESPACE, Scope.WORKLOAD_SELECTOR)
_NODE_ACTIONS = (Action.ALLOW, Action.DENY)
"""What a node proxy's policy can be: AUDIT and the waypoint scopes exist only at L7 (ambit.model.policy)."""


def _policy(value: object, path: str) -> Policy:
    item = _mapping(value, path, _POLICY_KEYS)
    return Policy(
        name=_field(item, "name", path, _name),
        namespace=_field(item, "namespace", path, _name),
        scope=_field(item, "scope", path, _choice({s.name: s for s in _NODE_SCOPES}), Scope.GLOBAL),
        action=_field(item, "action", path, _choice({a.name: a for a in _NODE_ACTIONS}), Action.ALLOW),
        rules=_each(item, "rules", path, _rule),
        dry_run=_field(item, "dryRun", path, _bool, False),
    )


def parse_local_config(text: str) -> LocalConfig:
    """Read a local config file; any problem raises :class:`LocalConfigError` naming the field or line."""
    from ambit.model.localconfig_yaml import load_yaml  # YAML's modules only in processes that read such a file

    document = load_yaml(text)
    if document is None:
        return LocalConfig((), ())
    root = _mapping(document, "(top level)", _ROOT_KEYS)
    workloads = tuple(
        _workload(item, f"workloads[{index}]") for index, item in enumerate(_list(root.get("workloads"), "workloads"))
    )
    services = tuple(
        _service(item, f"services[{index}]") for index, item in enumerate(_list(root.get("services"), "services"))
    )
    policies = tuple(
        _policy(item, f"policies[{index}]") for index, item in enumerate(_list(root.get("policies"), "policies"))
    )
    _check_unique([w.uid for w in workloads], "workloads", ".uid", "uid")
    _check_unique([s.key for s in services], "services", "", "service namespace/hostname")
    _check_unique([p.key for p in policies], "policies", "", "policy namespace/name")
    return LocalConfig(workloads, services, policies)


def _check_unique(keys: list[str], path: str, field: str, what: str) -> None:
    first: dict[str, int] = {}
    for index, key in enumerate(keys):
        if key in first:
            raise LocalConfigError(f"{path}[{index}]{field}: duplicate {what} {key!r} (first at {path}[{first[key]}])")
        first[key] = index


# Writing.


def _port_map(ports: tuple[PortMapping, ...]) -> dict[int, int | dict[str, Any]]:
    mapped: dict[int, int | dict[str, Any]] = {
        mapping.service_port: (
            mapping.target_port
            if mapping.app_protocol is AppProtocol.UNKNOWN
            else {"targetPort": mapping.target_port, "appProtocol": mapping.app_protocol.value}
        )
        for mapping in ports
    }
    if len(mapped) != len(ports):
        raise LocalConfigError(f"cannot render ports {ports!r}: a service port is given twice")
    return mapped


def waypoint_to_dict(waypoint: GatewayAddress) -> dict[str, Any]:
    """The file form of a waypoint's address (rule 9)."""
    destination = waypoint.destination
    if isinstance(destination, NamespacedHostname):
        where: dict[str, Any] = {"hostname": destination.hostname, "namespace": destination.namespace}
    else:
        where = {"address": str(destination)}
    return {**where, "hboneMtlsPort": waypoint.hbone_mtls_port}


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """The file form of one workload, every field included but an unset waypoint (port maps have int keys)."""
    out: dict[str, Any] = {
        "uid": workload.uid,
        "name": workload.name,
        "namespace": workload.namespace,
        "workloadIps": [str(ip) for ip in workload.addresses],
        "protocol": _PROTOCOL_NAMES[workload.tunnel_protocol],
        "serviceAccount": workload.service_account,
        "trustDomain": workload.trust_domain,
        "node": workload.node,
        "network": workload.network,
        "canonicalName": workload.canonical_name,
        "canonicalRevision": workload.canonical_revision,
        "workloadName": workload.workload_name,
        "workloadType": workload.workload_type,
        "clusterId": workload.cluster_id,
        "status": workload.status.value,
        "services": {key: _port_map(ports) for key, ports in workload.services.items()},
        "authorizationPolicies": list(workload.authorization_policies),
        "networkMode": workload.network_mode.value,
        "locality": {
            "region": workload.locality.region,
            "zone": workload.locality.zone,
            "subzone": workload.locality.subzone,
        },
    }
    if workload.waypoint is not None:
        out["waypoint"] = waypoint_to_dict(workload.waypoint)
    if workload.hostname:
        out["hostname"] = workload.hostname
    if workload.capacity != 1:
        out["capacity"] = workload.capacity
    if workload.application_tunnel is not None:
        tunnel = workload.application_tunnel
        out["applicationTunnel"] = {"protocol": tunnel.protocol.value, "port": tunnel.port}
    return out


def service_to_dict(service: Service) -> dict[str, Any]:
    """The file form of one service (port maps have int keys); waypoint fields only when set (rule 9)."""
    out: dict[str, Any] = {
        "name": service.name,
        "namespace": service.namespace,
        "hostname": service.hostname,
        "vips": [str(vip) for vip in service.vips],
        "ports": _port_map(service.ports),
        "subjectAltNames": list(service.subject_alt_names),
        "healthPolicy": service.health_policy.value,
        "canonical": service.canonical,
        "ipFamilies": service.ip_families.value,
    }
    if service.waypoint is not None:
        out["waypoint"] = waypoint_to_dict(service.waypoint)
    if service.ingress_use_waypoint:
        out["ingressUseWaypoint"] = True
    if service.visibility is not Visibility.PUBLIC:
        out["visibility"] = service.visibility.value
    if service.weighted_waypoints:
        out["weightedWaypoints"] = [
            {"destination": waypoint_to_dict(w.destination), "weight": w.weight} for w in service.weighted_waypoints
        ]
    if service.load_balancing_mode is not LoadBalancingMode.UNSPECIFIED:
        out["loadBalancingMode"] = service.load_balancing_mode.value
    if service.routing_preference:
        out["routingPreferences"] = [scope.value for scope in service.routing_preference]
    return out


def _string_match_form(match: StringMatch) -> str | dict[str, Any]:
    pattern = str(match)
    if StringMatch.of_pattern(pattern) == match:
        return pattern
    return {match.kind.value: {} if match.kind is StringMatchKind.PRESENCE else match.value}


def match_to_dict(match: Match) -> dict[str, Any]:
    """The file form of one match: only its populated fields (rule 8)."""
    out: dict[str, Any] = {}
    for key, name in _STRING_MATCH_FIELDS.items():
        if values := getattr(match, name):
            out[key] = [_string_match_form(v) for v in values]
    for key, name in _ACCOUNT_FIELDS.items():
        if values := getattr(match, name):
            out[key] = [str(v) for v in values]
    for key, name in _CIDR_FIELDS.items():
        if values := getattr(match, name):
            out[key] = [str(v) for v in values]
    for key, name in _PORT_FIELDS.items():
        if values := getattr(match, name):
            out[key] = list(values)
    return out


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The file form of one policy (also what ``/config_dump`` can show)."""
    return {
        "name": policy.name,
        "namespace": policy.namespace,
        "scope": policy.scope.name,
        "action": policy.action.name,
        "dryRun": policy.dry_run,
        "rules": [
            {"clauses": [{"matches": [match_to_dict(m) for m in clause.matches]} for clause in rule.clauses]}
            for rule in policy.rules
        ],
    }


def render_local_config(config: LocalConfig) -> str:
    """YAML that :func:`parse_local_config` reads back as an equal config."""
    document: dict[str, Any] = {
        "workloads": [workload_to_dict(workload) for workload in config.workloads],
        "services": [service_to_dict(service) for service in config.services],
    }
    if config.policies:
        document["policies"] = [policy_to_dict(policy) for policy in config.policies]
    from ambit.model.localconfig_yaml import dump_yaml

    return dump_yaml(document)
