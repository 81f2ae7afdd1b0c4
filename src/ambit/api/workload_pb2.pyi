from google.protobuf import any_pb2 as _any_pb2
from google.protobuf import wrappers_pb2 as _wrappers_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IPFamilies(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUTOMATIC: _ClassVar[IPFamilies]
    IPV4_ONLY: _ClassVar[IPFamilies]
    IPV6_ONLY: _ClassVar[IPFamilies]
    DUAL: _ClassVar[IPFamilies]

class NetworkMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STANDARD: _ClassVar[NetworkMode]
    HOST_NETWORK: _ClassVar[NetworkMode]

class WorkloadStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEALTHY: _ClassVar[WorkloadStatus]
    UNHEALTHY: _ClassVar[WorkloadStatus]

class WorkloadType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEPLOYMENT: _ClassVar[WorkloadType]
    CRONJOB: _ClassVar[WorkloadType]
    POD: _ClassVar[WorkloadType]
    JOB: _ClassVar[WorkloadType]

class AppProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[AppProtocol]
    HTTP11: _ClassVar[AppProtocol]
    HTTP2: _ClassVar[AppProtocol]
    GRPC: _ClassVar[AppProtocol]
    TCP: _ClassVar[AppProtocol]
    TLS: _ClassVar[AppProtocol]

class TunnelProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[TunnelProtocol]
    HBONE: _ClassVar[TunnelProtocol]
    LEGACY_ISTIO_MTLS: _ClassVar[TunnelProtocol]
AUTOMATIC: IPFamilies
IPV4_ONLY: IPFamilies
IPV6_ONLY: IPFamilies
DUAL: IPFamilies
STANDARD: NetworkMode
HOST_NETWORK: NetworkMode
HEALTHY: WorkloadStatus
UNHEALTHY: WorkloadStatus
DEPLOYMENT: WorkloadType
CRONJOB: WorkloadType
POD: WorkloadType
JOB: WorkloadType
UNKNOWN: AppProtocol
HTTP11: AppProtocol
HTTP2: AppProtocol
GRPC: AppProtocol
TCP: AppProtocol
TLS: AppProtocol
NONE: TunnelProtocol
HBONE: TunnelProtocol
LEGACY_ISTIO_MTLS: TunnelProtocol

class Address(_message.Message):
    __slots__ = ("workload", "service")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    workload: Workload
    service: Service
    def __init__(self, workload: _Optional[_Union[Workload, _Mapping]] = ..., service: _Optional[_Union[Service, _Mapping]] = ...) -> None: ...

class Service(_message.Message):
    __slots__ = ("name", "namespace", "hostname", "addresses", "ports", "subject_alt_names", "waypoint", "load_balancing", "ip_families", "extensions", "canonical", "ingress_use_waypoint", "weighted_waypoints", "visibility")
    class Visibility(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PUBLIC: _ClassVar[Service.Visibility]
        NAMESPACE: _ClassVar[Service.Visibility]
    PUBLIC: Service.Visibility
    NAMESPACE: Service.Visibility
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ALT_NAMES_FIELD_NUMBER: _ClassVar[int]
    WAYPOINT_FIELD_NUMBER: _ClassVar[int]
    LOAD_BALANCING_FIELD_NUMBER: _ClassVar[int]
    IP_FAMILIES_FIELD_NUMBER: _ClassVar[int]
    EXTENSIONS_FIELD_NUMBER: _ClassVar[int]
    CANONICAL_FIELD_NUMBER: _ClassVar[int]
    INGRESS_USE_WAYPOINT_FIELD_NUMBER: _ClassVar[int]
    WEIGHTED_WAYPOINTS_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    hostname: str
    addresses: _containers.RepeatedCompositeFieldContainer[NetworkAddress]
    ports: _containers.RepeatedCompositeFieldContainer[Port]
    subject_alt_names: _containers.RepeatedScalarFieldContainer[str]
    waypoint: GatewayAddress
    load_balancing: LoadBalancing
    ip_families: IPFamilies
    extensions: _containers.RepeatedCompositeFieldContainer[Extension]
    canonical: bool
    ingress_use_waypoint: bool
    weighted_waypoints: _containers.RepeatedCompositeFieldContainer[WeightedWaypoint]
    visibility: Service.Visibility
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., hostname: _Optional[str] = ..., addresses: _Optional[_Iterable[_Union[NetworkAddress, _Mapping]]] = ..., ports: _Optional[_Iterable[_Union[Port, _Mapping]]] = ..., subject_alt_names: _Optional[_Iterable[str]] = ..., waypoint: _Optional[_Union[GatewayAddress, _Mapping]] = ..., load_balancing: _Optional[_Union[LoadBalancing, _Mapping]] = ..., ip_families: _Optional[_Union[IPFamilies, str]] = ..., extensions: _Optional[_Iterable[_Union[Extension, _Mapping]]] = ..., canonical: _Optional[bool] = ..., ingress_use_waypoint: _Optional[bool] = ..., weighted_waypoints: _Optional[_Iterable[_Union[WeightedWaypoint, _Mapping]]] = ..., visibility: _Optional[_Union[Service.Visibility, str]] = ...) -> None: ...

class LoadBalancing(_message.Message):
    __slots__ = ("routing_preference", "mode", "health_policy")
    class Scope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNSPECIFIED_SCOPE: _ClassVar[LoadBalancing.Scope]
        REGION: _ClassVar[LoadBalancing.Scope]
        ZONE: _ClassVar[LoadBalancing.Scope]
        SUBZONE: _ClassVar[LoadBalancing.Scope]
        NODE: _ClassVar[LoadBalancing.Scope]
        CLUSTER: _ClassVar[LoadBalancing.Scope]
        NETWORK: _ClassVar[LoadBalancing.Scope]
    UNSPECIFIED_SCOPE: LoadBalancing.Scope
    REGION: LoadBalancing.Scope
    ZONE: LoadBalancing.Scope
    SUBZONE: LoadBalancing.Scope
    NODE: LoadBalancing.Scope
    CLUSTER: LoadBalancing.Scope
    NETWORK: LoadBalancing.Scope
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNSPECIFIED_MODE: _ClassVar[LoadBalancing.Mode]
        STRICT: _ClassVar[LoadBalancing.Mode]
        FAILOVER: _ClassVar[LoadBalancing.Mode]
        PASSTHROUGH: _ClassVar[LoadBalancing.Mode]
    UNSPECIFIED_MODE: LoadBalancing.Mode
    STRICT: LoadBalancing.Mode
    FAILOVER: LoadBalancing.Mode
    PASSTHROUGH: LoadBalancing.Mode
    class HealthPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ONLY_HEALTHY: _ClassVar[LoadBalancing.HealthPolicy]
        ALLOW_ALL: _ClassVar[LoadBalancing.HealthPolicy]
    ONLY_HEALTHY: LoadBalancing.HealthPolicy
    ALLOW_ALL: LoadBalancing.HealthPolicy
    ROUTING_PREFERENCE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_POLICY_FIELD_NUMBER: _ClassVar[int]
    routing_preference: _containers.RepeatedScalarFieldContainer[LoadBalancing.Scope]
    mode: LoadBalancing.Mode
    health_policy: LoadBalancing.HealthPolicy
    def __init__(self, routing_preference: _Optional[_Iterable[_Union[LoadBalancing.Scope, str]]] = ..., mode: _Optional[_Union[LoadBalancing.Mode, str]] = ..., health_policy: _Optional[_Union[LoadBalancing.HealthPolicy, str]] = ...) -> None: ...

class Workload(_message.Message):
    __slots__ = ("uid", "name", "namespace", "addresses", "hostname", "network", "tunnel_protocol", "trust_domain", "service_account", "waypoint", "network_gateway", "node", "canonical_name", "canonical_revision", "workload_type", "workload_name", "native_tunnel", "application_tunnel", "services", "authorization_policies", "status", "cluster_id", "locality", "network_mode", "extensions", "capacity")
    class ServicesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: PortList
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[PortList, _Mapping]] = ...) -> None: ...
    UID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    TUNNEL_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    TRUST_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    SERVICE_ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    WAYPOINT_FIELD_NUMBER: _ClassVar[int]
    NETWORK_GATEWAY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CANONICAL_NAME_FIELD_NUMBER: _ClassVar[int]
    CANONICAL_REVISION_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_TYPE_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_NAME_FIELD_NUMBER: _ClassVar[int]
    NATIVE_TUNNEL_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_TUNNEL_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_POLICIES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    NETWORK_MODE_FIELD_NUMBER: _ClassVar[int]
    EXTENSIONS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    uid: str
    name: str
    namespace: str
    addresses: _containers.RepeatedScalarFieldContainer[bytes]
    hostname: str
    network: str
    tunnel_protocol: TunnelProtocol
    trust_domain: str
    service_account: str
    waypoint: GatewayAddress
    network_gateway: GatewayAddress
    node: str
    canonical_name: str
    canonical_revision: str
    workload_type: WorkloadType
    workload_name: str
    native_tunnel: bool
    application_tunnel: ApplicationTunnel
    services: _containers.MessageMap[str, PortList]
    authorization_policies: _containers.RepeatedScalarFieldContainer[str]
    status: WorkloadStatus
    cluster_id: str
    locality: Locality
    network_mode: NetworkMode
    extensions: _containers.RepeatedCompositeFieldContainer[Extension]
    capacity: _wrappers_pb2.UInt32Value
    def __init__(self, uid: _Optional[str] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., addresses: _Optional[_Iterable[bytes]] = ..., hostname: _Optional[str] = ..., network: _Optional[str] = ..., tunnel_protocol: _Optional[_Union[TunnelProtocol, str]] = ..., trust_domain: _Optional[str] = ..., service_account: _Optional[str] = ..., waypoint: _Optional[_Union[GatewayAddress, _Mapping]] = ..., network_gateway: _Optional[_Union[GatewayAddress, _Mapping]] = ..., node: _Optional[str] = ..., canonical_name: _Optional[str] = ..., canonical_revision: _Optional[str] = ..., workload_type: _Optional[_Union[WorkloadType, str]] = ..., workload_name: _Optional[str] = ..., native_tunnel: _Optional[bool] = ..., application_tunnel: _Optional[_Union[ApplicationTunnel, _Mapping]] = ..., services: _Optional[_Mapping[str, PortList]] = ..., authorization_policies: _Optional[_Iterable[str]] = ..., status: _Optional[_Union[WorkloadStatus, str]] = ..., cluster_id: _Optional[str] = ..., locality: _Optional[_Union[Locality, _Mapping]] = ..., network_mode: _Optional[_Union[NetworkMode, str]] = ..., extensions: _Optional[_Iterable[_Union[Extension, _Mapping]]] = ..., capacity: _Optional[_Union[_wrappers_pb2.UInt32Value, _Mapping]] = ...) -> None: ...

class Locality(_message.Message):
    __slots__ = ("region", "zone", "subzone")
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    SUBZONE_FIELD_NUMBER: _ClassVar[int]
    region: str
    zone: str
    subzone: str
    def __init__(self, region: _Optional[str] = ..., zone: _Optional[str] = ..., subzone: _Optional[str] = ...) -> None: ...

class PortList(_message.Message):
    __slots__ = ("ports",)
    PORTS_FIELD_NUMBER: _ClassVar[int]
    ports: _containers.RepeatedCompositeFieldContainer[Port]
    def __init__(self, ports: _Optional[_Iterable[_Union[Port, _Mapping]]] = ...) -> None: ...

class Port(_message.Message):
    __slots__ = ("service_port", "target_port", "app_protocol")
    SERVICE_PORT_FIELD_NUMBER: _ClassVar[int]
    TARGET_PORT_FIELD_NUMBER: _ClassVar[int]
    APP_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    service_port: int
    target_port: int
    app_protocol: AppProtocol
    def __init__(self, service_port: _Optional[int] = ..., target_port: _Optional[int] = ..., app_protocol: _Optional[_Union[AppProtocol, str]] = ...) -> None: ...

class ApplicationTunnel(_message.Message):
    __slots__ = ("protocol", "port")
    class Protocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[ApplicationTunnel.Protocol]
        PROXY: _ClassVar[ApplicationTunnel.Protocol]
    NONE: ApplicationTunnel.Protocol
    PROXY: ApplicationTunnel.Protocol
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    protocol: ApplicationTunnel.Protocol
    port: int
    def __init__(self, protocol: _Optional[_Union[ApplicationTunnel.Protocol, str]] = ..., port: _Optional[int] = ...) -> None: ...

class GatewayAddress(_message.Message):
    __slots__ = ("hostname", "address", "hbone_mtls_port")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HBONE_MTLS_PORT_FIELD_NUMBER: _ClassVar[int]
    hostname: NamespacedHostname
    address: NetworkAddress
    hbone_mtls_port: int
    def __init__(self, hostname: _Optional[_Union[NamespacedHostname, _Mapping]] = ..., address: _Optional[_Union[NetworkAddress, _Mapping]] = ..., hbone_mtls_port: _Optional[int] = ...) -> None: ...

class WeightedWaypoint(_message.Message):
    __slots__ = ("destination", "weight")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    destination: GatewayAddress
    weight: int
    def __init__(self, destination: _Optional[_Union[GatewayAddress, _Mapping]] = ..., weight: _Optional[int] = ...) -> None: ...

class NetworkAddress(_message.Message):
    __slots__ = ("network", "address", "length")
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    network: str
    address: bytes
    length: int
    def __init__(self, network: _Optional[str] = ..., address: _Optional[bytes] = ..., length: _Optional[int] = ...) -> None: ...

class NamespacedHostname(_message.Message):
    __slots__ = ("namespace", "hostname")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hostname: str
    def __init__(self, namespace: _Optional[str] = ..., hostname: _Optional[str] = ...) -> None: ...

class Extension(_message.Message):
    __slots__ = ("name", "config")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    config: _any_pb2.Any
    def __init__(self, name: _Optional[str] = ..., config: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...
