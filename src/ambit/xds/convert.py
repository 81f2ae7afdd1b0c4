"""Model workloads and services ↔ the ``istio.workload.Address`` resource (spec §4.1, proto3 defaults per §12).

Theory of operation: encoding (:func:`address_of`) is total over valid model values and elides the defaults the
way istiod does (trust domain ``cluster.local`` and service account ``default`` become empty strings). Decoding
(:func:`decode_address`, :func:`address_from_proto`) is where the peer's input is judged: every field the model
keeps is checked, and the first problem raises :class:`XdsConversionError` naming the resource and the field, for
example ``Kubernetes//Pod/shop/web-1: workload.addresses[0]: expected 4 or 16 bytes, got 5``. Fields the model does
not keep (network gateways, extensions...) are ignored, as an older ztunnel ignores newer
fields.

Rules:

1. A resource's name is the workload's uid or the service's ``namespace/hostname`` (:func:`resource_name`); a
   resource whose name disagrees with its body is refused.
2. Aliases (:func:`address_aliases`) are the ``network/IP`` keys an on-demand client may subscribe with: each
   workload address in the workload's network, each service VIP in its own network.
3. IPs are raw 4- or 16-byte strings. A service VIP may carry a prefix ``length`` (a ServiceEntry's CIDR range):
   0..the address's bits, host bits clear; a full-length one is one address. A waypoint address never has one.
4. Ports: service ports 1..65535, target ports 0..65535 (0 = named port, resolved per workload).
5. Nothing but :class:`XdsConversionError` escapes decoding.
6. A locality is sent only when one of its parts is known (istiod sends none for a node without topology labels);
   ``network_mode``, ``canonical``, ``ip_families`` and each port's ``app_protocol`` are sent as they are. An
   ``app_protocol`` value this build does not know decodes as UNKNOWN (it is a hint); other unknown enum values
   are refused.
7. A waypoint (``Workload.waypoint`` field 8, ``Service.waypoint`` field 7) is a ``GatewayAddress``: a
   ``NamespacedHostname`` (field 1) or a ``NetworkAddress`` (field 2, one full-length IP), and
   ``hbone_mtls_port`` (field 3) in 1..65535. An absent message is no waypoint; a present one with neither
   destination is refused. ``Service.ingress_use_waypoint`` (field 12) is sent as it is.
8. ``Service.visibility`` (field 14) is sent as it is; an unknown value is refused (a newer, narrower visibility
   must not be read as PUBLIC). ``Workload.hostname`` (field 21) must be a DNS name (:func:`check_dns_name`); a
   workload has addresses or a hostname (or neither: it is then never picked), not both.
9. ``Service.weighted_waypoints`` (field 13): each ``WeightedWaypoint`` needs a ``destination`` (field 1, a waypoint
   as in rule 7) and keeps its ``weight`` (field 2, uint32) as sent; more than :data:`MAX_WEIGHTED_WAYPOINTS`
   entries are refused (istiod sends two: the primary and the canary).
10. ``Workload.capacity`` (field 27, a ``UInt32Value``) is sent only when it is not 1 (istiod sends it for a
    ``weight``); an absent one is 1, as in ztunnel.
11. ``Service.load_balancing`` (field 8) is sent when its ``health_policy``, ``mode`` or ``routing_preference`` is
    not the default; the ``mode`` (field 2) is kept, an unknown one refused (a newer mode must not be read as
    another). Each ``routing_preference`` scope (field 1) is kept in order; an unknown or UNSPECIFIED one is refused
    (ztunnel refuses the service: a newer scope must not be read as another), as are more than
    :data:`MAX_ROUTING_SCOPES` (istiod sends at most five).
12. ``Workload.application_tunnel`` (field 23; ``protocol`` 1, ``port`` 2) is sent when set: an unknown protocol
    is refused (a newer tunnel must not be read as plain delivery), a port above 65535 too; port 0 means the
    client's port, as in ztunnel.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from google.protobuf import any_pb2
from google.protobuf.message import DecodeError

from ambit.api import workload_pb2 as pb
from ambit.model.dnsname import check_dns_name
from ambit.model.errors import IdentityError
from ambit.model.identity import (
    DEFAULT_SERVICE_ACCOUNT,
    DEFAULT_TRUST_DOMAIN,
    check_path_segment,
    check_trust_domain,
)
from ambit.model.routing_preference import MAX_ROUTING_SCOPES
from ambit.model.workload import (
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
)
from ambit.xds.errors import XdsConversionError
from ambit.xds.resource_set import XdsResource

__all__ = [
    "ADDRESS_TYPE_URL",
    "MAX_ROUTING_SCOPES",
    "MAX_WEIGHTED_WAYPOINTS",
    "EncodedAddress",
    "FieldReader",
    "XdsConversionError",
    "address_aliases",
    "address_from_proto",
    "address_of",
    "address_parents",
    "decode_address",
    "resource_name",
]

T = TypeVar("T")

ADDRESS_TYPE_URL = "type.googleapis.com/istio.workload.Address"
MAX_WEIGHTED_WAYPOINTS = 16
"""The most waypoints one Service's weighted set may hold (rule 9): bounds the work of each pick."""

_WORKLOAD_TYPES = {"deployment": pb.DEPLOYMENT, "cronjob": pb.CRONJOB, "pod": pb.POD, "job": pb.JOB}
_WORKLOAD_TYPE_NAMES = {value: key for key, value in _WORKLOAD_TYPES.items()}
_TUNNELS = {TunnelProtocol.NONE: pb.NONE, TunnelProtocol.HBONE: pb.HBONE}
_TUNNEL_NAMES = {value: key for key, value in _TUNNELS.items()}
_APP_TUNNELS = {AppTunnelProtocol.NONE: pb.ApplicationTunnel.NONE, AppTunnelProtocol.PROXY: pb.ApplicationTunnel.PROXY}
_APP_TUNNEL_NAMES = {value: key for key, value in _APP_TUNNELS.items()}
_STATUSES = {HealthStatus.HEALTHY: pb.HEALTHY, HealthStatus.UNHEALTHY: pb.UNHEALTHY}
_STATUS_NAMES = {value: key for key, value in _STATUSES.items()}
_POLICIES = {
    HealthPolicy.ONLY_HEALTHY: pb.LoadBalancing.ONLY_HEALTHY,
    HealthPolicy.ALLOW_ALL: pb.LoadBalancing.ALLOW_ALL,
}
_POLICY_NAMES = {value: key for key, value in _POLICIES.items()}
_LB_MODES: dict[LoadBalancingMode, Any] = {
    mode: pb.LoadBalancing.Mode.Value(f"{mode.name}_MODE" if mode is LoadBalancingMode.UNSPECIFIED else mode.name)
    for mode in LoadBalancingMode
}
_LB_MODE_NAMES = {value: key for key, value in _LB_MODES.items()}
_SCOPES: dict[RoutingScope, Any] = {scope: pb.LoadBalancing.Scope.Value(scope.name) for scope in RoutingScope}
_SCOPE_NAMES = {value: key for key, value in _SCOPES.items()}
_NETWORK_MODES = {NetworkMode.STANDARD: pb.STANDARD, NetworkMode.HOST_NETWORK: pb.HOST_NETWORK}
_NETWORK_MODE_NAMES = {value: key for key, value in _NETWORK_MODES.items()}
_IP_FAMILIES = {
    IPFamilies.AUTOMATIC: pb.AUTOMATIC,
    IPFamilies.IPV4_ONLY: pb.IPV4_ONLY,
    IPFamilies.IPV6_ONLY: pb.IPV6_ONLY,
    IPFamilies.DUAL: pb.DUAL,
}
_IP_FAMILY_NAMES = {value: key for key, value in _IP_FAMILIES.items()}
_VISIBILITIES = {Visibility.PUBLIC: pb.Service.PUBLIC, Visibility.NAMESPACE: pb.Service.NAMESPACE}
_VISIBILITY_NAMES = {value: key for key, value in _VISIBILITIES.items()}
_APP_PROTOCOLS: dict[AppProtocol, Any] = {protocol: pb.AppProtocol.Value(protocol.name) for protocol in AppProtocol}
_APP_PROTOCOL_NAMES = {value: key for key, value in _APP_PROTOCOLS.items()}


# Encoding.


def _ports(ports: tuple[PortMapping, ...]) -> list[pb.Port]:
    return [
        pb.Port(service_port=p.service_port, target_port=p.target_port, app_protocol=_APP_PROTOCOLS[p.app_protocol])
        for p in ports
    ]


def gateway_address_to_proto(address: GatewayAddress) -> pb.GatewayAddress:
    destination = address.destination
    if isinstance(destination, NamespacedHostname):
        return pb.GatewayAddress(
            hostname=pb.NamespacedHostname(namespace=destination.namespace, hostname=destination.hostname),
            hbone_mtls_port=address.hbone_mtls_port,
        )
    return pb.GatewayAddress(
        address=pb.NetworkAddress(network=destination.network, address=destination.ip.packed),
        hbone_mtls_port=address.hbone_mtls_port,
    )


def workload_to_proto(workload: Workload) -> pb.Workload:
    message = pb.Workload(
        uid=workload.uid,
        name=workload.name,
        namespace=workload.namespace,
        addresses=[ip.packed for ip in workload.addresses],
        network=workload.network,
        tunnel_protocol=_TUNNELS[workload.tunnel_protocol],
        trust_domain="" if workload.trust_domain == DEFAULT_TRUST_DOMAIN else workload.trust_domain,
        service_account="" if workload.service_account == DEFAULT_SERVICE_ACCOUNT else workload.service_account,
        node=workload.node,
        canonical_name=workload.canonical_name,
        canonical_revision=workload.canonical_revision,
        workload_type=_WORKLOAD_TYPES.get(workload.workload_type, pb.POD),
        workload_name=workload.workload_name,
        status=_STATUSES[workload.status],
        cluster_id=workload.cluster_id,
        authorization_policies=list(workload.authorization_policies),
        network_mode=_NETWORK_MODES[workload.network_mode],
        hostname=workload.hostname,
    )
    if workload.locality.known:
        locality = workload.locality
        message.locality.CopyFrom(pb.Locality(region=locality.region, zone=locality.zone, subzone=locality.subzone))
    for key, ports in workload.services.items():
        message.services[key].ports.extend(_ports(ports))
    if workload.waypoint is not None:
        message.waypoint.CopyFrom(gateway_address_to_proto(workload.waypoint))
    if workload.capacity != 1:
        message.capacity.value = workload.capacity
    if workload.application_tunnel is not None:
        tunnel = workload.application_tunnel
        message.application_tunnel.CopyFrom(
            pb.ApplicationTunnel(protocol=_APP_TUNNELS[tunnel.protocol], port=tunnel.port)
        )
    return message


def service_to_proto(service: Service) -> pb.Service:
    message = pb.Service(
        name=service.name,
        namespace=service.namespace,
        hostname=service.hostname,
        addresses=[
            pb.NetworkAddress(network=vip.network, address=vip.ip.packed, length=vip.length) for vip in service.vips
        ],
        ports=_ports(service.ports),
        subject_alt_names=list(service.subject_alt_names),
        load_balancing=(
            pb.LoadBalancing(
                health_policy=_POLICIES[service.health_policy],
                mode=_LB_MODES[service.load_balancing_mode],
                routing_preference=[_SCOPES[scope] for scope in service.routing_preference],
            )
            if service.health_policy is not HealthPolicy.ONLY_HEALTHY
            or service.load_balancing_mode is not LoadBalancingMode.UNSPECIFIED
            or service.routing_preference
            else None
        ),
        canonical=service.canonical,
        ip_families=_IP_FAMILIES[service.ip_families],
        ingress_use_waypoint=service.ingress_use_waypoint,
        visibility=_VISIBILITIES[service.visibility],
    )
    if service.waypoint is not None:
        message.waypoint.CopyFrom(gateway_address_to_proto(service.waypoint))
    for weighted in service.weighted_waypoints:
        message.weighted_waypoints.add(
            destination=gateway_address_to_proto(weighted.destination), weight=weighted.weight
        )
    return message


def address_of(item: Workload | Service) -> pb.Address:
    """The Address resource for a model workload or service."""
    if isinstance(item, Workload):
        return pb.Address(workload=workload_to_proto(item))
    return pb.Address(service=service_to_proto(item))


def resource_name(address: pb.Address) -> str:
    """The xDS resource name: the workload's uid, or the service's ``namespace/hostname``."""
    if address.HasField("workload"):
        return address.workload.uid
    return f"{address.service.namespace}/{address.service.hostname}"


def address_aliases(address: pb.Address) -> tuple[str, ...]:
    """The ``network/IP`` keys an on-demand client may look this resource up by (invalid IPs are skipped)."""
    aliases: list[str] = []
    if address.HasField("workload"):
        for raw in address.workload.addresses:
            if len(raw) in (4, 16):
                aliases.append(f"{address.workload.network}/{ipaddress.ip_address(raw)}")
    else:
        for vip in address.service.addresses:
            if len(vip.address) in (4, 16):
                aliases.append(f"{vip.network}/{ipaddress.ip_address(vip.address)}")
    return tuple(dict.fromkeys(aliases))


def address_parents(address: pb.Address) -> tuple[str, ...]:
    """The resource names of the services a workload is an endpoint of (its services map keys); none for a
    service. A lookup of such a service answers with this workload too (istiod's ``Lookup``)."""
    if address.HasField("workload"):
        return tuple(sorted(address.workload.services))
    return ()


# Decoding.


class FieldReader:
    """Checks of one resource's fields; every failure names the resource and the field path (also the base of the
    Authorization decoder's reader)."""

    def __init__(self, resource: str) -> None:
        self.resource = resource

    def fail(self, field: str, problem: str) -> XdsConversionError:
        return XdsConversionError(self.resource, field, problem)

    def text(self, field: str, value: str, *, required: bool = False) -> str:
        if required and not value:
            raise self.fail(field, "required")
        if not value.isprintable():
            raise self.fail(field, f"has unprintable characters: {value!r}")
        return value

    def ip(self, field: str, raw: bytes) -> IPAddress:
        if len(raw) not in (4, 16):
            raise self.fail(field, f"expected 4 or 16 bytes, got {len(raw)}")
        return ipaddress.ip_address(raw)

    def identity_part(self, field: str, value: str, what: str) -> None:
        try:
            if what == "trust domain":
                check_trust_domain(value)
            else:
                check_path_segment(what, value)
        except IdentityError as exc:
            raise self.fail(field, f"bad SPIFFE part: {exc}") from None

    def ports(self, field: str, ports: Iterable[pb.Port]) -> tuple[PortMapping, ...]:
        mappings: list[PortMapping] = []
        for index, port in enumerate(ports):
            if not 1 <= port.service_port <= 65535:
                raise self.fail(f"{field}[{index}].service_port", f"out of range 1..65535: {port.service_port}")
            if port.target_port > 65535:
                raise self.fail(f"{field}[{index}].target_port", f"out of range 0..65535: {port.target_port}")
            # An app protocol this build does not know (a newer control plane) is only a hint: read as UNKNOWN.
            protocol = _APP_PROTOCOL_NAMES.get(port.app_protocol, AppProtocol.UNKNOWN)
            mappings.append(PortMapping(port.service_port, port.target_port, protocol))
        if len({m.service_port for m in mappings}) != len(mappings):
            raise self.fail(field, "a service port is given twice")
        return tuple(mappings)

    def gateway_address(self, field: str, message: pb.GatewayAddress) -> GatewayAddress:
        kind = message.WhichOneof("destination")
        destination: NamespacedHostname | NetworkAddress
        if kind == "hostname":
            namespace = self.text(f"{field}.hostname.namespace", message.hostname.namespace, required=True)
            self.identity_part(f"{field}.hostname.namespace", namespace, "namespace")
            hostname = self.text(f"{field}.hostname.hostname", message.hostname.hostname, required=True)
            destination = NamespacedHostname(namespace, hostname)
        elif kind == "address":
            ip = self.ip(f"{field}.address.address", message.address.address)
            if message.address.HasField("length") and message.address.length != ip.max_prefixlen:
                raise self.fail(f"{field}.address.length", f"prefixes are not supported, got /{message.address.length}")
            destination = NetworkAddress(self.text(f"{field}.address.network", message.address.network), ip)
        else:
            raise self.fail(field, "neither a hostname nor an address")
        if not 1 <= message.hbone_mtls_port <= 65535:
            raise self.fail(f"{field}.hbone_mtls_port", f"out of range 1..65535: {message.hbone_mtls_port}")
        return GatewayAddress(destination, message.hbone_mtls_port)

    def enum(self, field: str, value: int, names: Mapping[Any, T]) -> T:
        if value not in names:
            raise self.fail(field, f"unsupported value {value}")
        return names[value]


def _policy_key(read: FieldReader, field: str, key: str) -> str:
    _namespace, slash, name = read.text(field, key, required=True).partition("/")
    if not (slash and name):
        raise read.fail(field, f"not a policy key 'namespace/name': {key!r}")
    return key


def _workload_from_proto(message: pb.Workload, read: FieldReader) -> Workload:
    read.text("workload.uid", message.uid, required=True)
    namespace = read.text("workload.namespace", message.namespace, required=True)
    read.identity_part("workload.namespace", namespace, "namespace")
    trust_domain = read.text("workload.trust_domain", message.trust_domain) or DEFAULT_TRUST_DOMAIN
    read.identity_part("workload.trust_domain", trust_domain, "trust domain")
    service_account = read.text("workload.service_account", message.service_account) or DEFAULT_SERVICE_ACCOUNT
    read.identity_part("workload.service_account", service_account, "service account")
    hostname = read.text("workload.hostname", message.hostname)
    if hostname:
        if message.addresses:
            raise read.fail("workload.hostname", "a workload has addresses or a hostname, not both")
        problem = check_dns_name(hostname)
        if problem:
            raise read.fail("workload.hostname", problem)
    services: dict[str, tuple[PortMapping, ...]] = {}
    for key in sorted(message.services):
        field = f"workload.services[{key!r}]"
        ns, slash, host = read.text(field, key).partition("/")
        if not (ns and slash and host):
            raise read.fail(field, "key is not 'namespace/hostname'")
        services[key] = read.ports(f"{field}.ports", message.services[key].ports)
    return Workload(
        uid=message.uid,
        name=read.text("workload.name", message.name, required=True),
        namespace=namespace,
        addresses=tuple(read.ip(f"workload.addresses[{i}]", raw) for i, raw in enumerate(message.addresses)),
        network=read.text("workload.network", message.network),
        tunnel_protocol=read.enum("workload.tunnel_protocol", message.tunnel_protocol, _TUNNEL_NAMES),
        trust_domain=trust_domain,
        service_account=service_account,
        node=read.text("workload.node", message.node),
        canonical_name=read.text("workload.canonical_name", message.canonical_name),
        canonical_revision=read.text("workload.canonical_revision", message.canonical_revision),
        workload_name=read.text("workload.workload_name", message.workload_name),
        workload_type=read.enum("workload.workload_type", message.workload_type, _WORKLOAD_TYPE_NAMES),
        cluster_id=read.text("workload.cluster_id", message.cluster_id),
        status=read.enum("workload.status", message.status, _STATUS_NAMES),
        services=services,
        authorization_policies=tuple(
            _policy_key(read, f"workload.authorization_policies[{i}]", key)
            for i, key in enumerate(message.authorization_policies)
        ),
        network_mode=read.enum("workload.network_mode", message.network_mode, _NETWORK_MODE_NAMES),
        locality=Locality(
            region=read.text("workload.locality.region", message.locality.region),
            zone=read.text("workload.locality.zone", message.locality.zone),
            subzone=read.text("workload.locality.subzone", message.locality.subzone),
        ),
        waypoint=read.gateway_address("workload.waypoint", message.waypoint) if message.HasField("waypoint") else None,
        hostname=hostname,
        capacity=message.capacity.value if message.HasField("capacity") else 1,
        application_tunnel=(
            _application_tunnel(read, message.application_tunnel) if message.HasField("application_tunnel") else None
        ),
    )


def _application_tunnel(read: FieldReader, message: pb.ApplicationTunnel) -> ApplicationTunnel:
    """Rule 12."""
    protocol = read.enum("workload.application_tunnel.protocol", message.protocol, _APP_TUNNEL_NAMES)
    if message.port > 65535:
        raise read.fail("workload.application_tunnel.port", f"out of range 0..65535: {message.port}")
    return ApplicationTunnel(protocol, message.port)


def _service_from_proto(message: pb.Service, read: FieldReader) -> Service:
    namespace = read.text("service.namespace", message.namespace, required=True)
    read.identity_part("service.namespace", namespace, "namespace")
    vips: list[NetworkAddress] = []
    for index, vip in enumerate(message.addresses):
        field = f"service.addresses[{index}]"
        ip = read.ip(f"{field}.address", vip.address)
        length: int | None = None
        if vip.HasField("length") and vip.length != ip.max_prefixlen:
            if vip.length > ip.max_prefixlen:
                raise read.fail(f"{field}.length", f"out of range 0..{ip.max_prefixlen}: {vip.length}")
            if ipaddress.ip_network((ip, vip.length), strict=False).network_address != ip:
                raise read.fail(f"{field}.length", f"{ip}/{vip.length} has host bits set")
            length = vip.length
        vips.append(NetworkAddress(read.text(f"{field}.network", vip.network), ip, length))
    return Service(
        name=read.text("service.name", message.name, required=True),
        namespace=namespace,
        hostname=read.text("service.hostname", message.hostname, required=True),
        vips=tuple(vips),
        ports=read.ports("service.ports", message.ports),
        subject_alt_names=tuple(
            read.text(f"service.subject_alt_names[{i}]", san, required=True)
            for i, san in enumerate(message.subject_alt_names)
        ),
        health_policy=read.enum(
            "service.load_balancing.health_policy", message.load_balancing.health_policy, _POLICY_NAMES
        ),
        load_balancing_mode=read.enum("service.load_balancing.mode", message.load_balancing.mode, _LB_MODE_NAMES),
        routing_preference=_routing_preference(message.load_balancing, read),
        canonical=message.canonical,
        ip_families=read.enum("service.ip_families", message.ip_families, _IP_FAMILY_NAMES),
        waypoint=read.gateway_address("service.waypoint", message.waypoint) if message.HasField("waypoint") else None,
        ingress_use_waypoint=message.ingress_use_waypoint,
        visibility=read.enum("service.visibility", message.visibility, _VISIBILITY_NAMES),
        weighted_waypoints=_weighted_waypoints(message, read),
    )


def _routing_preference(message: pb.LoadBalancing, read: FieldReader) -> tuple[RoutingScope, ...]:
    field = "service.load_balancing.routing_preference"
    if len(message.routing_preference) > MAX_ROUTING_SCOPES:
        raise read.fail(field, f"{len(message.routing_preference)} scopes, more than {MAX_ROUTING_SCOPES}")
    return tuple(
        read.enum(f"{field}[{index}]", scope, _SCOPE_NAMES) for index, scope in enumerate(message.routing_preference)
    )


def _weighted_waypoints(message: pb.Service, read: FieldReader) -> tuple[WeightedWaypoint, ...]:
    if len(message.weighted_waypoints) > MAX_WEIGHTED_WAYPOINTS:
        raise read.fail(
            "service.weighted_waypoints",
            f"{len(message.weighted_waypoints)} entries, more than {MAX_WEIGHTED_WAYPOINTS}",
        )
    out: list[WeightedWaypoint] = []
    for index, item in enumerate(message.weighted_waypoints):
        field = f"service.weighted_waypoints[{index}]"
        if not item.HasField("destination"):
            raise read.fail(f"{field}.destination", "missing")
        out.append(WeightedWaypoint(read.gateway_address(f"{field}.destination", item.destination), item.weight))
    return tuple(out)


def address_from_proto(address: pb.Address, name: str = "") -> Workload | Service:
    """The model value of an Address; ``name`` (the xDS resource name), when given, must match its body."""
    read = FieldReader(name or "(unnamed)")
    kind = address.WhichOneof("type")
    if kind is None:
        raise read.fail("type", "neither a workload nor a service")
    if not name:
        read = FieldReader(resource_name(address))
    try:
        item: Workload | Service = (
            _workload_from_proto(address.workload, read)
            if kind == "workload"
            else _service_from_proto(address.service, read)
        )
    except (ValueError, TypeError, OverflowError) as exc:  # a model invariant we did not anticipate
        raise read.fail(kind, str(exc)) from None
    actual = item.uid if isinstance(item, Workload) else item.key
    if name and actual != name:
        raise read.fail("name", f"resource name does not match its {kind} ({actual!r})")
    return item


def decode_address(name: str, body: any_pb2.Any) -> Workload | Service:
    """Unpack and convert one xDS resource body of type :data:`ADDRESS_TYPE_URL`."""
    if body.type_url != ADDRESS_TYPE_URL:
        raise XdsConversionError(name, "resource.type_url", f"expected {ADDRESS_TYPE_URL}, got {body.type_url!r}")
    address = pb.Address()
    try:
        address.ParseFromString(body.value)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise XdsConversionError(name, "resource.value", f"not a valid Address message: {exc}") from None
    return address_from_proto(address, name)


class EncodedAddress:
    """An Address as the control plane keeps it: the :class:`~ambit.xds.resource_set.XdsResource` it is served as, made
    once from its deterministic bytes (named by :func:`resource_name`, versioned by their hash, with its aliases and
    parents). The address table serves this very resource (:class:`ambit.xds.table.AddressTable`), so the bytes are
    held once; a message object costs ~3 KB, its bytes ~0.3 KB (issue 22)."""

    __slots__ = ("resource",)

    def __init__(self, resource: XdsResource) -> None:
        self.resource = resource

    @classmethod
    def of(cls, address: pb.Address) -> tuple[str, EncodedAddress]:
        """(version, encoding) of ``address``: the version is the first 16 hex digits of the bytes' SHA-256
        (:func:`ambit.controlplane.addresses.content_version`)."""
        data = address.SerializeToString(deterministic=True)
        version = hashlib.sha256(data).hexdigest()[:16]
        body = any_pb2.Any(type_url=ADDRESS_TYPE_URL, value=data)
        name = resource_name(address)
        return version, cls(XdsResource.built(name, version, body, address_aliases(address), address_parents(address)))

    @property
    def data(self) -> bytes:
        """The Address's deterministic bytes."""
        return self.resource.body.value

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.resource.aliases

    @property
    def parents(self) -> tuple[str, ...]:
        return self.resource.parents

    def message(self) -> pb.Address:
        return pb.Address.FromString(self.data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EncodedAddress) and self.resource.wire == other.resource.wire

    def __hash__(self) -> int:
        return hash(self.resource.wire)


def pack_address(address: pb.Address) -> any_pb2.Any:
    """``address`` as a google.protobuf.Any with the Address type URL (deterministic bytes)."""
    return any_pb2.Any(type_url=ADDRESS_TYPE_URL, value=address.SerializeToString(deterministic=True))
