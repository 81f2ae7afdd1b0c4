"""The node proxy's local config file: workloads, services and policies in YAML, like ztunnel's local mode.

Theory of operation: :func:`parse_local_config` loads YAML (libyaml's safe loader when present,
:mod:`ambit.model.localconfig_yaml`, imported on first use: a node proxy fed by xDS never loads YAML), then walks the
document with a path in hand, so every complaint names the field that caused it (``workloads[2].workloadIps[0]:
not an IP address: 'x'``). :func:`render_local_config` writes every field out, defaults included, in the same
shape. The dict form in between (:mod:`ambit.model.localconfig_forms`; policies:
:mod:`ambit.model.localconfig_policies`) is also what the admin ``/config_dump`` shows. The readers of single values
are :mod:`ambit.model.localconfig_fields`.

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.model.dnsname import check_dns_name
from ambit.model.errors import AddressError, LocalConfigError
from ambit.model.identity import DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN
from ambit.model.localconfig_fields import (
    choice,
    read_bool,
    read_field,
    read_list,
    read_mapping,
    read_name,
    read_namespace,
    read_optional_string,
    read_port,
    read_service_account,
    read_string,
    read_trust_domain,
)
from ambit.model.localconfig_forms import TUNNEL_PROTOCOLS, service_to_dict, workload_to_dict
from ambit.model.localconfig_policies import policy_to_dict, read_policy
from ambit.model.policy import Policy
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

__all__ = ["LocalConfig", "LocalConfigError", "parse_local_config", "render_local_config"]

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


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """What a local config file describes."""

    workloads: tuple[Workload, ...]
    services: tuple[Service, ...]
    policies: tuple[Policy, ...] = ()
    """L4 authorization policies (spec §4.3), ordered by key."""


# Reading: each helper takes the value and its path, and raises LocalConfigError naming that path.


def _ports(value: object, path: str) -> tuple[PortMapping, ...]:
    mappings = []
    for service_port, target in read_mapping(value, path).items():
        port = read_port(service_port, f"{path}[{service_port!r}]: service port", lowest=1)
        where = f"{path}[{port}]"
        if isinstance(target, dict):
            item = read_mapping(target, where, _PORT_KEYS)
            mappings.append(
                PortMapping(
                    port,
                    read_field(item, "targetPort", where, lambda v, p: read_port(v, p, lowest=0)),
                    read_field(
                        item, "appProtocol", where, choice({a.value: a for a in AppProtocol}), AppProtocol.UNKNOWN
                    ),
                )
            )
        else:
            mappings.append(PortMapping(port, read_port(target, where, lowest=0)))
    if len({mapping.service_port for mapping in mappings}) != len(mappings):
        raise LocalConfigError(f"{path}: a service port is given twice")
    return tuple(mappings)


def _ips(value: object, path: str) -> tuple[IPAddress, ...]:
    ips = []
    for index, text in enumerate(read_list(value, path)):
        try:
            ips.append(parse_ip(read_string(text, f"{path}[{index}]")))
        except AddressError as exc:
            raise LocalConfigError(f"{path}[{index}]: {exc}") from None
    return tuple(ips)


def _vips(value: object, path: str) -> tuple[NetworkAddress, ...]:
    vips = []
    for index, text in enumerate(read_list(value, path)):
        try:
            vips.append(NetworkAddress.parse(read_string(text, f"{path}[{index}]")))
        except AddressError as exc:
            raise LocalConfigError(f"{path}[{index}]: {exc}") from None
    return tuple(vips)


def _workload_services(value: object, path: str) -> dict[str, tuple[PortMapping, ...]]:
    services = {}
    for key, ports in read_mapping(value, path).items():
        key_text = read_string(key, f"{path}: key")
        namespace, slash, hostname = key_text.partition("/")
        if not (namespace and slash and hostname):
            raise LocalConfigError(f"{path}: key {key_text!r} is not 'namespace/hostname'")
        services[key_text] = _ports(ports, f"{path}[{key_text}]")
    return services


def _policy_key(value: object, path: str) -> str:
    key = read_name(value, path)
    _, slash, name = key.partition("/")
    if not (slash and name):
        raise LocalConfigError(f"{path}: {key!r} is not a policy key 'namespace/name'")
    return key


def _locality(value: object, path: str) -> Locality:
    item = read_mapping(value, path, _LOCALITY_KEYS)
    return Locality(**{key: read_field(item, key, path, read_optional_string, "") for key in _LOCALITY_KEYS})


def _waypoint(value: object, path: str) -> GatewayAddress:
    item = read_mapping(value, path, _WAYPOINT_KEYS)
    port = read_field(item, "hboneMtlsPort", path, lambda v, p: read_port(v, p, lowest=1), HBONE_MTLS_PORT)
    if ("hostname" in item) == ("address" in item):
        raise LocalConfigError(f"{path}: give exactly one of 'hostname' (with 'namespace') and 'address'")
    if "address" in item:
        if "namespace" in item:
            raise LocalConfigError(f"{path}.namespace: only with 'hostname'")
        try:
            address = NetworkAddress.parse(read_string(item["address"], f"{path}.address"))
        except AddressError as exc:
            raise LocalConfigError(f"{path}.address: {exc}") from None
        return GatewayAddress(address, port)
    hostname = read_field(item, "hostname", path, read_name)
    return GatewayAddress(NamespacedHostname(read_field(item, "namespace", path, read_namespace), hostname), port)


def _weighted_waypoints(value: object, path: str) -> tuple[WeightedWaypoint, ...]:
    out = []
    for index, entry in enumerate(read_list(value, path)):
        where = f"{path}[{index}]"
        item = read_mapping(entry, where, _WEIGHTED_KEYS)
        weight = read_field(item, "weight", where, _weight)
        out.append(WeightedWaypoint(read_field(item, "destination", where, _waypoint), weight))
    return tuple(out)


def _weight(value: object, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0xFFFFFFFF:
        raise LocalConfigError(f"{path}: expected an integer 0..4294967295, got {value!r}")
    return value


def _workload(value: object, path: str) -> Workload:
    item = read_mapping(value, path, _WORKLOAD_KEYS)
    return Workload(
        uid=read_field(item, "uid", path, read_name),
        name=read_field(item, "name", path, read_name),
        namespace=read_field(item, "namespace", path, read_namespace),
        addresses=read_field(item, "workloadIps", path, _ips, ()),
        network=read_field(item, "network", path, read_optional_string, ""),
        tunnel_protocol=read_field(item, "protocol", path, choice(TUNNEL_PROTOCOLS), TunnelProtocol.NONE),
        trust_domain=read_field(item, "trustDomain", path, read_trust_domain, DEFAULT_TRUST_DOMAIN),
        service_account=read_field(item, "serviceAccount", path, read_service_account, DEFAULT_SERVICE_ACCOUNT),
        node=read_field(item, "node", path, read_optional_string, ""),
        canonical_name=read_field(item, "canonicalName", path, read_optional_string, ""),
        canonical_revision=read_field(item, "canonicalRevision", path, read_optional_string, ""),
        workload_name=read_field(item, "workloadName", path, read_optional_string, ""),
        workload_type=read_field(item, "workloadType", path, choice({t: t for t in _WORKLOAD_TYPES}), "pod"),
        cluster_id=read_field(item, "clusterId", path, read_optional_string, "Kubernetes"),
        status=read_field(item, "status", path, choice({s.value: s for s in HealthStatus}), HealthStatus.HEALTHY),
        services=read_field(item, "services", path, _workload_services, {}),
        authorization_policies=tuple(
            _policy_key(key, f"{path}.authorizationPolicies[{index}]")
            for index, key in enumerate(read_list(item.get("authorizationPolicies"), f"{path}.authorizationPolicies"))
        ),
        network_mode=read_field(
            item, "networkMode", path, choice({m.value: m for m in NetworkMode}), NetworkMode.STANDARD
        ),
        locality=read_field(item, "locality", path, _locality, Locality()),
        waypoint=_waypoint(item["waypoint"], f"{path}.waypoint") if item.get("waypoint") is not None else None,
        hostname=_workload_hostname(item, path),
        capacity=read_field(item, "capacity", path, _weight, 1),
        application_tunnel=(
            _application_tunnel(item["applicationTunnel"], f"{path}.applicationTunnel")
            if item.get("applicationTunnel") is not None
            else None
        ),
    )


def _application_tunnel(value: object, path: str) -> ApplicationTunnel:
    """Rule 13."""
    item = read_mapping(value, path, _APP_TUNNEL_KEYS)
    protocol = read_field(
        item, "protocol", path, choice({p.value: p for p in AppTunnelProtocol}), AppTunnelProtocol.NONE
    )
    port = item.get("port")
    return ApplicationTunnel(protocol, 0 if port is None else read_port(port, f"{path}.port", lowest=0))


def _workload_hostname(item: Mapping[Any, Any], path: str) -> str:
    hostname = read_field(item, "hostname", path, read_optional_string, "")
    if hostname:
        if item.get("workloadIps"):
            raise LocalConfigError(f"{path}.hostname: give either 'workloadIps' or 'hostname', not both")
        problem = check_dns_name(hostname)
        if problem:
            raise LocalConfigError(f"{path}.hostname: {problem}")
    return hostname


def _service(value: object, path: str) -> Service:
    item = read_mapping(value, path, _SERVICE_KEYS)
    policies = {policy.value: policy for policy in HealthPolicy}
    return Service(
        name=read_field(item, "name", path, read_name),
        namespace=read_field(item, "namespace", path, read_namespace),
        hostname=read_field(item, "hostname", path, read_name),
        vips=read_field(item, "vips", path, _vips, ()),
        ports=read_field(item, "ports", path, _ports, ()),
        subject_alt_names=tuple(
            read_name(san, f"{path}.subjectAltNames[{index}]")
            for index, san in enumerate(read_list(item.get("subjectAltNames"), f"{path}.subjectAltNames"))
        ),
        health_policy=read_field(item, "healthPolicy", path, choice(policies), HealthPolicy.ONLY_HEALTHY),
        canonical=read_field(item, "canonical", path, read_bool, False),
        ip_families=read_field(
            item, "ipFamilies", path, choice({f.value: f for f in IPFamilies}), IPFamilies.AUTOMATIC
        ),
        waypoint=_waypoint(item["waypoint"], f"{path}.waypoint") if item.get("waypoint") is not None else None,
        ingress_use_waypoint=read_field(item, "ingressUseWaypoint", path, read_bool, False),
        visibility=read_field(item, "visibility", path, choice({v.value: v for v in Visibility}), Visibility.PUBLIC),
        weighted_waypoints=read_field(item, "weightedWaypoints", path, _weighted_waypoints, ()),
        load_balancing_mode=read_field(
            item,
            "loadBalancingMode",
            path,
            choice({m.value: m for m in LoadBalancingMode}),
            LoadBalancingMode.UNSPECIFIED,
        ),
        routing_preference=read_field(item, "routingPreferences", path, _routing_preference, ()),
    )


def _routing_preference(value: object, path: str) -> tuple[RoutingScope, ...]:
    """Rule 14."""
    items = read_list(value, path)
    if len(items) > MAX_ROUTING_SCOPES:
        raise LocalConfigError(f"{path}: {len(items)} scopes, more than {MAX_ROUTING_SCOPES}")
    scope = choice({s.value: s for s in RoutingScope})
    return tuple(scope(item, f"{path}[{index}]") for index, item in enumerate(items))


def parse_local_config(text: str) -> LocalConfig:
    """Read a local config file; any problem raises :class:`LocalConfigError` naming the field or line."""
    from ambit.model.localconfig_yaml import load_yaml  # YAML's modules only in processes that read such a file

    document = load_yaml(text)
    if document is None:
        return LocalConfig((), ())
    root = read_mapping(document, "(top level)", _ROOT_KEYS)
    workloads = tuple(
        _workload(item, f"workloads[{index}]")
        for index, item in enumerate(read_list(root.get("workloads"), "workloads"))
    )
    services = tuple(
        _service(item, f"services[{index}]") for index, item in enumerate(read_list(root.get("services"), "services"))
    )
    policies = tuple(
        read_policy(item, f"policies[{index}]")
        for index, item in enumerate(read_list(root.get("policies"), "policies"))
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
