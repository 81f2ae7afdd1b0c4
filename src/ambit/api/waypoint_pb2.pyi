import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from ambit.api import authorization_pb2 as _authorization_pb2
from ambit.api import requestauth_pb2 as _requestauth_pb2
from ambit.api import metric_overrides_pb2 as _metric_overrides_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HeaderAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEADER_APPEND: _ClassVar[HeaderAction]
    HEADER_ADD_IF_ABSENT: _ClassVar[HeaderAction]
    HEADER_OVERWRITE: _ClassVar[HeaderAction]
    HEADER_OVERWRITE_IF_EXISTS: _ClassVar[HeaderAction]
    HEADER_REMOVE: _ClassVar[HeaderAction]

class ExtAuthzKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXT_AUTHZ_KIND_UNSPECIFIED: _ClassVar[ExtAuthzKind]
    EXT_AUTHZ_KIND_HTTP: _ClassVar[ExtAuthzKind]
    EXT_AUTHZ_KIND_GRPC: _ClassVar[ExtAuthzKind]

class PolicyScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_SCOPE_UNSPECIFIED: _ClassVar[PolicyScope]
    POLICY_SCOPE_WAYPOINT: _ClassVar[PolicyScope]
    POLICY_SCOPE_SERVICE: _ClassVar[PolicyScope]

class PolicyAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_ACTION_UNSPECIFIED: _ClassVar[PolicyAction]
    POLICY_ACTION_ALLOW: _ClassVar[PolicyAction]
    POLICY_ACTION_DENY: _ClassVar[PolicyAction]
    POLICY_ACTION_AUDIT: _ClassVar[PolicyAction]
    POLICY_ACTION_CUSTOM: _ClassVar[PolicyAction]

class PathMatchType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PATH_MATCH_TYPE_UNSPECIFIED: _ClassVar[PathMatchType]
    PATH_EXACT: _ClassVar[PathMatchType]
    PATH_PREFIX: _ClassVar[PathMatchType]
    PATH_REGULAR_EXPRESSION: _ClassVar[PathMatchType]
    PATH_STRING_PREFIX: _ClassVar[PathMatchType]

class ValueMatchType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALUE_EXACT: _ClassVar[ValueMatchType]
    VALUE_REGULAR_EXPRESSION: _ClassVar[ValueMatchType]
    VALUE_PREFIX: _ClassVar[ValueMatchType]
    VALUE_PRESENT: _ClassVar[ValueMatchType]

class PathModifierType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PATH_MODIFIER_TYPE_UNSPECIFIED: _ClassVar[PathModifierType]
    REPLACE_FULL_PATH: _ClassVar[PathModifierType]
    REPLACE_PREFIX_MATCH: _ClassVar[PathModifierType]

class LoadBalancerType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LB_LEAST_REQUEST: _ClassVar[LoadBalancerType]
    LB_ROUND_ROBIN: _ClassVar[LoadBalancerType]
    LB_RANDOM: _ClassVar[LoadBalancerType]
    LB_PASSTHROUGH: _ClassVar[LoadBalancerType]

class H2UpgradePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    H2_UPGRADE_DEFAULT: _ClassVar[H2UpgradePolicy]
    H2_DO_NOT_UPGRADE: _ClassVar[H2UpgradePolicy]
    H2_UPGRADE: _ClassVar[H2UpgradePolicy]

class TlsMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TLS_DISABLE: _ClassVar[TlsMode]
    TLS_SIMPLE: _ClassVar[TlsMode]
    TLS_MUTUAL: _ClassVar[TlsMode]
    TLS_ISTIO_MUTUAL: _ClassVar[TlsMode]

class ProxyProtocolVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROXY_PROTOCOL_NONE: _ClassVar[ProxyProtocolVersion]
    PROXY_PROTOCOL_V1: _ClassVar[ProxyProtocolVersion]
    PROXY_PROTOCOL_V2: _ClassVar[ProxyProtocolVersion]
HEADER_APPEND: HeaderAction
HEADER_ADD_IF_ABSENT: HeaderAction
HEADER_OVERWRITE: HeaderAction
HEADER_OVERWRITE_IF_EXISTS: HeaderAction
HEADER_REMOVE: HeaderAction
EXT_AUTHZ_KIND_UNSPECIFIED: ExtAuthzKind
EXT_AUTHZ_KIND_HTTP: ExtAuthzKind
EXT_AUTHZ_KIND_GRPC: ExtAuthzKind
POLICY_SCOPE_UNSPECIFIED: PolicyScope
POLICY_SCOPE_WAYPOINT: PolicyScope
POLICY_SCOPE_SERVICE: PolicyScope
POLICY_ACTION_UNSPECIFIED: PolicyAction
POLICY_ACTION_ALLOW: PolicyAction
POLICY_ACTION_DENY: PolicyAction
POLICY_ACTION_AUDIT: PolicyAction
POLICY_ACTION_CUSTOM: PolicyAction
PATH_MATCH_TYPE_UNSPECIFIED: PathMatchType
PATH_EXACT: PathMatchType
PATH_PREFIX: PathMatchType
PATH_REGULAR_EXPRESSION: PathMatchType
PATH_STRING_PREFIX: PathMatchType
VALUE_EXACT: ValueMatchType
VALUE_REGULAR_EXPRESSION: ValueMatchType
VALUE_PREFIX: ValueMatchType
VALUE_PRESENT: ValueMatchType
PATH_MODIFIER_TYPE_UNSPECIFIED: PathModifierType
REPLACE_FULL_PATH: PathModifierType
REPLACE_PREFIX_MATCH: PathModifierType
LB_LEAST_REQUEST: LoadBalancerType
LB_ROUND_ROBIN: LoadBalancerType
LB_RANDOM: LoadBalancerType
LB_PASSTHROUGH: LoadBalancerType
H2_UPGRADE_DEFAULT: H2UpgradePolicy
H2_DO_NOT_UPGRADE: H2UpgradePolicy
H2_UPGRADE: H2UpgradePolicy
TLS_DISABLE: TlsMode
TLS_SIMPLE: TlsMode
TLS_MUTUAL: TlsMode
TLS_ISTIO_MUTUAL: TlsMode
PROXY_PROTOCOL_NONE: ProxyProtocolVersion
PROXY_PROTOCOL_V1: ProxyProtocolVersion
PROXY_PROTOCOL_V2: ProxyProtocolVersion

class WaypointConfig(_message.Message):
    __slots__ = ("waypoint", "tables", "policies", "request_authentications", "xfcc_client_identity", "destination_rules", "metrics", "services", "race_first_connect", "dynamic_dns", "envoy_patches", "default_retry", "default_per_try_timeout", "mesh_locality_lb")
    WAYPOINT_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_AUTHENTICATIONS_FIELD_NUMBER: _ClassVar[int]
    XFCC_CLIENT_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_RULES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    RACE_FIRST_CONNECT_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_DNS_FIELD_NUMBER: _ClassVar[int]
    ENVOY_PATCHES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_RETRY_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PER_TRY_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MESH_LOCALITY_LB_FIELD_NUMBER: _ClassVar[int]
    waypoint: str
    tables: _containers.RepeatedCompositeFieldContainer[RouteTable]
    policies: _containers.RepeatedCompositeFieldContainer[WaypointPolicy]
    request_authentications: _containers.RepeatedCompositeFieldContainer[_requestauth_pb2.RequestAuthentication]
    xfcc_client_identity: bool
    destination_rules: _containers.RepeatedCompositeFieldContainer[DestinationPolicy]
    metrics: _containers.RepeatedCompositeFieldContainer[_metric_overrides_pb2.ServiceMetrics]
    services: _containers.RepeatedScalarFieldContainer[str]
    race_first_connect: _containers.RepeatedScalarFieldContainer[str]
    dynamic_dns: _containers.RepeatedScalarFieldContainer[str]
    envoy_patches: EnvoyPatches
    default_retry: RetryPolicy
    default_per_try_timeout: _duration_pb2.Duration
    mesh_locality_lb: LocalityLbSetting
    def __init__(self, waypoint: _Optional[str] = ..., tables: _Optional[_Iterable[_Union[RouteTable, _Mapping]]] = ..., policies: _Optional[_Iterable[_Union[WaypointPolicy, _Mapping]]] = ..., request_authentications: _Optional[_Iterable[_Union[_requestauth_pb2.RequestAuthentication, _Mapping]]] = ..., xfcc_client_identity: _Optional[bool] = ..., destination_rules: _Optional[_Iterable[_Union[DestinationPolicy, _Mapping]]] = ..., metrics: _Optional[_Iterable[_Union[_metric_overrides_pb2.ServiceMetrics, _Mapping]]] = ..., services: _Optional[_Iterable[str]] = ..., race_first_connect: _Optional[_Iterable[str]] = ..., dynamic_dns: _Optional[_Iterable[str]] = ..., envoy_patches: _Optional[_Union[EnvoyPatches, _Mapping]] = ..., default_retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., default_per_try_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., mesh_locality_lb: _Optional[_Union[LocalityLbSetting, _Mapping]] = ...) -> None: ...

class EnvoyPatches(_message.Message):
    __slots__ = ("filters", "routes", "upstream_h2", "xff_trusted_hops")
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_H2_FIELD_NUMBER: _ClassVar[int]
    XFF_TRUSTED_HOPS_FIELD_NUMBER: _ClassVar[int]
    filters: _containers.RepeatedCompositeFieldContainer[HeaderPatch]
    routes: _containers.RepeatedCompositeFieldContainer[HeaderPatch]
    upstream_h2: _containers.RepeatedCompositeFieldContainer[PatchScope]
    xff_trusted_hops: int
    def __init__(self, filters: _Optional[_Iterable[_Union[HeaderPatch, _Mapping]]] = ..., routes: _Optional[_Iterable[_Union[HeaderPatch, _Mapping]]] = ..., upstream_h2: _Optional[_Iterable[_Union[PatchScope, _Mapping]]] = ..., xff_trusted_hops: _Optional[int] = ...) -> None: ...

class PatchScope(_message.Message):
    __slots__ = ("hostname", "port")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    port: int
    def __init__(self, hostname: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class HeaderPatch(_message.Message):
    __slots__ = ("source", "request", "response", "scope", "level")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    source: str
    request: _containers.RepeatedCompositeFieldContainer[HeaderOp]
    response: _containers.RepeatedCompositeFieldContainer[HeaderOp]
    scope: PatchScope
    level: int
    def __init__(self, source: _Optional[str] = ..., request: _Optional[_Iterable[_Union[HeaderOp, _Mapping]]] = ..., response: _Optional[_Iterable[_Union[HeaderOp, _Mapping]]] = ..., scope: _Optional[_Union[PatchScope, _Mapping]] = ..., level: _Optional[int] = ...) -> None: ...

class HeaderOp(_message.Message):
    __slots__ = ("action", "name", "value")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    action: HeaderAction
    name: str
    value: str
    def __init__(self, action: _Optional[_Union[HeaderAction, str]] = ..., name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class WaypointPolicy(_message.Message):
    __slots__ = ("name", "namespace", "scope", "action", "rules", "dry_run", "services", "ext_authz")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    EXT_AUTHZ_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    scope: PolicyScope
    action: PolicyAction
    rules: _containers.RepeatedCompositeFieldContainer[PolicyRule]
    dry_run: bool
    services: _containers.RepeatedScalarFieldContainer[str]
    ext_authz: ExtAuthzProvider
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., scope: _Optional[_Union[PolicyScope, str]] = ..., action: _Optional[_Union[PolicyAction, str]] = ..., rules: _Optional[_Iterable[_Union[PolicyRule, _Mapping]]] = ..., dry_run: _Optional[bool] = ..., services: _Optional[_Iterable[str]] = ..., ext_authz: _Optional[_Union[ExtAuthzProvider, _Mapping]] = ...) -> None: ...

class ExtAuthzProvider(_message.Message):
    __slots__ = ("name", "kind", "service", "port", "timeout_ms", "fail_open", "status_on_error", "path_prefix", "include_request_headers", "include_additional_headers", "headers_to_upstream_on_allow", "headers_to_downstream_on_deny", "headers_to_downstream_on_allow", "max_request_bytes", "allow_partial_message", "pack_as_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    FAIL_OPEN_FIELD_NUMBER: _ClassVar[int]
    STATUS_ON_ERROR_FIELD_NUMBER: _ClassVar[int]
    PATH_PREFIX_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REQUEST_HEADERS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ADDITIONAL_HEADERS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_TO_UPSTREAM_ON_ALLOW_FIELD_NUMBER: _ClassVar[int]
    HEADERS_TO_DOWNSTREAM_ON_DENY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_TO_DOWNSTREAM_ON_ALLOW_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOW_PARTIAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PACK_AS_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: ExtAuthzKind
    service: str
    port: int
    timeout_ms: int
    fail_open: bool
    status_on_error: int
    path_prefix: str
    include_request_headers: _containers.RepeatedScalarFieldContainer[str]
    include_additional_headers: _containers.RepeatedCompositeFieldContainer[HeaderValue]
    headers_to_upstream_on_allow: _containers.RepeatedScalarFieldContainer[str]
    headers_to_downstream_on_deny: _containers.RepeatedScalarFieldContainer[str]
    headers_to_downstream_on_allow: _containers.RepeatedScalarFieldContainer[str]
    max_request_bytes: int
    allow_partial_message: bool
    pack_as_bytes: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[ExtAuthzKind, str]] = ..., service: _Optional[str] = ..., port: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., fail_open: _Optional[bool] = ..., status_on_error: _Optional[int] = ..., path_prefix: _Optional[str] = ..., include_request_headers: _Optional[_Iterable[str]] = ..., include_additional_headers: _Optional[_Iterable[_Union[HeaderValue, _Mapping]]] = ..., headers_to_upstream_on_allow: _Optional[_Iterable[str]] = ..., headers_to_downstream_on_deny: _Optional[_Iterable[str]] = ..., headers_to_downstream_on_allow: _Optional[_Iterable[str]] = ..., max_request_bytes: _Optional[int] = ..., allow_partial_message: _Optional[bool] = ..., pack_as_bytes: _Optional[bool] = ...) -> None: ...

class PolicyRule(_message.Message):
    __slots__ = ("clauses",)
    CLAUSES_FIELD_NUMBER: _ClassVar[int]
    clauses: _containers.RepeatedCompositeFieldContainer[PolicyClause]
    def __init__(self, clauses: _Optional[_Iterable[_Union[PolicyClause, _Mapping]]] = ...) -> None: ...

class PolicyClause(_message.Message):
    __slots__ = ("matches",)
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    matches: _containers.RepeatedCompositeFieldContainer[PolicyMatch]
    def __init__(self, matches: _Optional[_Iterable[_Union[PolicyMatch, _Mapping]]] = ...) -> None: ...

class KeyedMatch(_message.Message):
    __slots__ = ("key", "values", "not_values")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NOT_VALUES_FIELD_NUMBER: _ClassVar[int]
    key: _containers.RepeatedScalarFieldContainer[str]
    values: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    not_values: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    def __init__(self, key: _Optional[_Iterable[str]] = ..., values: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., not_values: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ...) -> None: ...

class PolicyMatch(_message.Message):
    __slots__ = ("namespaces", "not_namespaces", "service_accounts", "not_service_accounts", "principals", "not_principals", "source_ips", "not_source_ips", "destination_ips", "not_destination_ips", "destination_ports", "not_destination_ports", "hosts", "not_hosts", "methods", "not_methods", "paths", "not_paths", "request_principals", "not_request_principals", "remote_ips", "not_remote_ips", "request_headers", "request_claims", "audiences", "not_audiences", "presenters", "not_presenters", "sni", "not_sni", "path_templates", "not_path_templates")
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    NOT_NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    SERVICE_ACCOUNTS_FIELD_NUMBER: _ClassVar[int]
    NOT_SERVICE_ACCOUNTS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    NOT_PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IPS_FIELD_NUMBER: _ClassVar[int]
    NOT_SOURCE_IPS_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_IPS_FIELD_NUMBER: _ClassVar[int]
    NOT_DESTINATION_IPS_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_PORTS_FIELD_NUMBER: _ClassVar[int]
    NOT_DESTINATION_PORTS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    NOT_HOSTS_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    NOT_METHODS_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    NOT_PATHS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    NOT_REQUEST_PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_IPS_FIELD_NUMBER: _ClassVar[int]
    NOT_REMOTE_IPS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HEADERS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    AUDIENCES_FIELD_NUMBER: _ClassVar[int]
    NOT_AUDIENCES_FIELD_NUMBER: _ClassVar[int]
    PRESENTERS_FIELD_NUMBER: _ClassVar[int]
    NOT_PRESENTERS_FIELD_NUMBER: _ClassVar[int]
    SNI_FIELD_NUMBER: _ClassVar[int]
    NOT_SNI_FIELD_NUMBER: _ClassVar[int]
    PATH_TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    NOT_PATH_TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    not_namespaces: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    service_accounts: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.ServiceAccountMatch]
    not_service_accounts: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.ServiceAccountMatch]
    principals: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    not_principals: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    source_ips: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.Address]
    not_source_ips: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.Address]
    destination_ips: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.Address]
    not_destination_ips: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.Address]
    destination_ports: _containers.RepeatedScalarFieldContainer[int]
    not_destination_ports: _containers.RepeatedScalarFieldContainer[int]
    hosts: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    not_hosts: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    methods: _containers.RepeatedScalarFieldContainer[str]
    not_methods: _containers.RepeatedScalarFieldContainer[str]
    paths: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    not_paths: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    request_principals: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    not_request_principals: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    remote_ips: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.Address]
    not_remote_ips: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.Address]
    request_headers: _containers.RepeatedCompositeFieldContainer[KeyedMatch]
    request_claims: _containers.RepeatedCompositeFieldContainer[KeyedMatch]
    audiences: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    not_audiences: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    presenters: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    not_presenters: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    sni: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    not_sni: _containers.RepeatedCompositeFieldContainer[_authorization_pb2.StringMatch]
    path_templates: _containers.RepeatedScalarFieldContainer[str]
    not_path_templates: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespaces: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., not_namespaces: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., service_accounts: _Optional[_Iterable[_Union[_authorization_pb2.ServiceAccountMatch, _Mapping]]] = ..., not_service_accounts: _Optional[_Iterable[_Union[_authorization_pb2.ServiceAccountMatch, _Mapping]]] = ..., principals: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., not_principals: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., source_ips: _Optional[_Iterable[_Union[_authorization_pb2.Address, _Mapping]]] = ..., not_source_ips: _Optional[_Iterable[_Union[_authorization_pb2.Address, _Mapping]]] = ..., destination_ips: _Optional[_Iterable[_Union[_authorization_pb2.Address, _Mapping]]] = ..., not_destination_ips: _Optional[_Iterable[_Union[_authorization_pb2.Address, _Mapping]]] = ..., destination_ports: _Optional[_Iterable[int]] = ..., not_destination_ports: _Optional[_Iterable[int]] = ..., hosts: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., not_hosts: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., methods: _Optional[_Iterable[str]] = ..., not_methods: _Optional[_Iterable[str]] = ..., paths: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., not_paths: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., request_principals: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., not_request_principals: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., remote_ips: _Optional[_Iterable[_Union[_authorization_pb2.Address, _Mapping]]] = ..., not_remote_ips: _Optional[_Iterable[_Union[_authorization_pb2.Address, _Mapping]]] = ..., request_headers: _Optional[_Iterable[_Union[KeyedMatch, _Mapping]]] = ..., request_claims: _Optional[_Iterable[_Union[KeyedMatch, _Mapping]]] = ..., audiences: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., not_audiences: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., presenters: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., not_presenters: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., sni: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., not_sni: _Optional[_Iterable[_Union[_authorization_pb2.StringMatch, _Mapping]]] = ..., path_templates: _Optional[_Iterable[str]] = ..., not_path_templates: _Optional[_Iterable[str]] = ...) -> None: ...

class RouteTable(_message.Message):
    __slots__ = ("service_key", "port", "http", "tcp_backends", "hostnames")
    SERVICE_KEY_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    HTTP_FIELD_NUMBER: _ClassVar[int]
    TCP_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAMES_FIELD_NUMBER: _ClassVar[int]
    service_key: str
    port: int
    http: _containers.RepeatedCompositeFieldContainer[RouteRule]
    tcp_backends: _containers.RepeatedCompositeFieldContainer[WeightedBackend]
    hostnames: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, service_key: _Optional[str] = ..., port: _Optional[int] = ..., http: _Optional[_Iterable[_Union[RouteRule, _Mapping]]] = ..., tcp_backends: _Optional[_Iterable[_Union[WeightedBackend, _Mapping]]] = ..., hostnames: _Optional[_Iterable[str]] = ...) -> None: ...

class RouteRule(_message.Message):
    __slots__ = ("route", "match", "backends", "request_headers", "response_headers", "redirect", "rewrite", "mirrors", "timeouts", "retry", "rule_name", "fault", "direct_response", "missing_backend_status", "regex_rewrite", "cors")
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HEADERS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_HEADERS_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    REWRITE_FIELD_NUMBER: _ClassVar[int]
    MIRRORS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    RULE_NAME_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    DIRECT_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    MISSING_BACKEND_STATUS_FIELD_NUMBER: _ClassVar[int]
    REGEX_REWRITE_FIELD_NUMBER: _ClassVar[int]
    CORS_FIELD_NUMBER: _ClassVar[int]
    route: str
    match: RouteMatch
    backends: _containers.RepeatedCompositeFieldContainer[WeightedBackend]
    request_headers: HeaderModifier
    response_headers: HeaderModifier
    redirect: RequestRedirect
    rewrite: URLRewrite
    mirrors: _containers.RepeatedCompositeFieldContainer[RequestMirror]
    timeouts: Timeouts
    retry: RetryPolicy
    rule_name: str
    fault: Fault
    direct_response: DirectResponse
    missing_backend_status: int
    regex_rewrite: RegexRewrite
    cors: CorsPolicy
    def __init__(self, route: _Optional[str] = ..., match: _Optional[_Union[RouteMatch, _Mapping]] = ..., backends: _Optional[_Iterable[_Union[WeightedBackend, _Mapping]]] = ..., request_headers: _Optional[_Union[HeaderModifier, _Mapping]] = ..., response_headers: _Optional[_Union[HeaderModifier, _Mapping]] = ..., redirect: _Optional[_Union[RequestRedirect, _Mapping]] = ..., rewrite: _Optional[_Union[URLRewrite, _Mapping]] = ..., mirrors: _Optional[_Iterable[_Union[RequestMirror, _Mapping]]] = ..., timeouts: _Optional[_Union[Timeouts, _Mapping]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., rule_name: _Optional[str] = ..., fault: _Optional[_Union[Fault, _Mapping]] = ..., direct_response: _Optional[_Union[DirectResponse, _Mapping]] = ..., missing_backend_status: _Optional[int] = ..., regex_rewrite: _Optional[_Union[RegexRewrite, _Mapping]] = ..., cors: _Optional[_Union[CorsPolicy, _Mapping]] = ...) -> None: ...

class CorsPolicy(_message.Message):
    __slots__ = ("allow_origins", "allow_methods", "allow_headers", "expose_headers", "max_age", "allow_credentials", "ignore_unmatched_preflights")
    ALLOW_ORIGINS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_METHODS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_HEADERS_FIELD_NUMBER: _ClassVar[int]
    EXPOSE_HEADERS_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_UNMATCHED_PREFLIGHTS_FIELD_NUMBER: _ClassVar[int]
    allow_origins: _containers.RepeatedCompositeFieldContainer[ValueMatch]
    allow_methods: str
    allow_headers: str
    expose_headers: str
    max_age: int
    allow_credentials: bool
    ignore_unmatched_preflights: bool
    def __init__(self, allow_origins: _Optional[_Iterable[_Union[ValueMatch, _Mapping]]] = ..., allow_methods: _Optional[str] = ..., allow_headers: _Optional[str] = ..., expose_headers: _Optional[str] = ..., max_age: _Optional[int] = ..., allow_credentials: _Optional[bool] = ..., ignore_unmatched_preflights: _Optional[bool] = ...) -> None: ...

class RegexRewrite(_message.Message):
    __slots__ = ("pattern", "substitution")
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    SUBSTITUTION_FIELD_NUMBER: _ClassVar[int]
    pattern: str
    substitution: str
    def __init__(self, pattern: _Optional[str] = ..., substitution: _Optional[str] = ...) -> None: ...

class Fault(_message.Message):
    __slots__ = ("delay", "delay_percent", "abort_status", "abort_percent", "abort_grpc_status")
    DELAY_FIELD_NUMBER: _ClassVar[int]
    DELAY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    ABORT_STATUS_FIELD_NUMBER: _ClassVar[int]
    ABORT_PERCENT_FIELD_NUMBER: _ClassVar[int]
    ABORT_GRPC_STATUS_FIELD_NUMBER: _ClassVar[int]
    delay: _duration_pb2.Duration
    delay_percent: float
    abort_status: int
    abort_percent: float
    abort_grpc_status: int
    def __init__(self, delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., delay_percent: _Optional[float] = ..., abort_status: _Optional[int] = ..., abort_percent: _Optional[float] = ..., abort_grpc_status: _Optional[int] = ...) -> None: ...

class DirectResponse(_message.Message):
    __slots__ = ("status", "body")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    status: int
    body: bytes
    def __init__(self, status: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class PathMatch(_message.Message):
    __slots__ = ("kind", "value")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    kind: PathMatchType
    value: str
    def __init__(self, kind: _Optional[_Union[PathMatchType, str]] = ..., value: _Optional[str] = ...) -> None: ...

class ValueMatch(_message.Message):
    __slots__ = ("name", "value", "kind")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    kind: ValueMatchType
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., kind: _Optional[_Union[ValueMatchType, str]] = ...) -> None: ...

class RouteMatch(_message.Message):
    __slots__ = ("path", "headers", "query_params", "method", "ignore_path_case", "without_headers", "claims", "without_claims")
    PATH_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    QUERY_PARAMS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    IGNORE_PATH_CASE_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_HEADERS_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    path: PathMatch
    headers: _containers.RepeatedCompositeFieldContainer[ValueMatch]
    query_params: _containers.RepeatedCompositeFieldContainer[ValueMatch]
    method: str
    ignore_path_case: bool
    without_headers: _containers.RepeatedCompositeFieldContainer[ValueMatch]
    claims: _containers.RepeatedCompositeFieldContainer[ClaimMatch]
    without_claims: _containers.RepeatedCompositeFieldContainer[ClaimMatch]
    def __init__(self, path: _Optional[_Union[PathMatch, _Mapping]] = ..., headers: _Optional[_Iterable[_Union[ValueMatch, _Mapping]]] = ..., query_params: _Optional[_Iterable[_Union[ValueMatch, _Mapping]]] = ..., method: _Optional[str] = ..., ignore_path_case: _Optional[bool] = ..., without_headers: _Optional[_Iterable[_Union[ValueMatch, _Mapping]]] = ..., claims: _Optional[_Iterable[_Union[ClaimMatch, _Mapping]]] = ..., without_claims: _Optional[_Iterable[_Union[ClaimMatch, _Mapping]]] = ...) -> None: ...

class ClaimMatch(_message.Message):
    __slots__ = ("path", "value", "kind")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    path: _containers.RepeatedScalarFieldContainer[str]
    value: str
    kind: ValueMatchType
    def __init__(self, path: _Optional[_Iterable[str]] = ..., value: _Optional[str] = ..., kind: _Optional[_Union[ValueMatchType, str]] = ...) -> None: ...

class HeaderValue(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class HeaderModifier(_message.Message):
    __slots__ = ("set", "add", "remove")
    SET_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    set: _containers.RepeatedCompositeFieldContainer[HeaderValue]
    add: _containers.RepeatedCompositeFieldContainer[HeaderValue]
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, set: _Optional[_Iterable[_Union[HeaderValue, _Mapping]]] = ..., add: _Optional[_Iterable[_Union[HeaderValue, _Mapping]]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class PathModifier(_message.Message):
    __slots__ = ("kind", "value")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    kind: PathModifierType
    value: str
    def __init__(self, kind: _Optional[_Union[PathModifierType, str]] = ..., value: _Optional[str] = ...) -> None: ...

class RequestRedirect(_message.Message):
    __slots__ = ("scheme", "hostname", "path", "port", "status_code", "keeps_host_port")
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    KEEPS_HOST_PORT_FIELD_NUMBER: _ClassVar[int]
    scheme: str
    hostname: str
    path: PathModifier
    port: int
    status_code: int
    keeps_host_port: bool
    def __init__(self, scheme: _Optional[str] = ..., hostname: _Optional[str] = ..., path: _Optional[_Union[PathModifier, _Mapping]] = ..., port: _Optional[int] = ..., status_code: _Optional[int] = ..., keeps_host_port: _Optional[bool] = ...) -> None: ...

class URLRewrite(_message.Message):
    __slots__ = ("hostname", "path")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    path: PathModifier
    def __init__(self, hostname: _Optional[str] = ..., path: _Optional[_Union[PathModifier, _Mapping]] = ...) -> None: ...

class BackendService(_message.Message):
    __slots__ = ("namespace", "hostname", "port", "subset")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    SUBSET_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hostname: str
    port: int
    subset: str
    def __init__(self, namespace: _Optional[str] = ..., hostname: _Optional[str] = ..., port: _Optional[int] = ..., subset: _Optional[str] = ...) -> None: ...

class RequestMirror(_message.Message):
    __slots__ = ("backend", "percent")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    backend: BackendService
    percent: float
    def __init__(self, backend: _Optional[_Union[BackendService, _Mapping]] = ..., percent: _Optional[float] = ...) -> None: ...

class WeightedBackend(_message.Message):
    __slots__ = ("backend", "weight", "request_headers", "response_headers")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HEADERS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_HEADERS_FIELD_NUMBER: _ClassVar[int]
    backend: BackendService
    weight: int
    request_headers: HeaderModifier
    response_headers: HeaderModifier
    def __init__(self, backend: _Optional[_Union[BackendService, _Mapping]] = ..., weight: _Optional[int] = ..., request_headers: _Optional[_Union[HeaderModifier, _Mapping]] = ..., response_headers: _Optional[_Union[HeaderModifier, _Mapping]] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("attempts", "codes", "backoff", "on_connect_failure")
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_FIELD_NUMBER: _ClassVar[int]
    ON_CONNECT_FAILURE_FIELD_NUMBER: _ClassVar[int]
    attempts: int
    codes: _containers.RepeatedScalarFieldContainer[int]
    backoff: _duration_pb2.Duration
    on_connect_failure: bool
    def __init__(self, attempts: _Optional[int] = ..., codes: _Optional[_Iterable[int]] = ..., backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., on_connect_failure: _Optional[bool] = ...) -> None: ...

class Timeouts(_message.Message):
    __slots__ = ("request", "backend_request")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    BACKEND_REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: _duration_pb2.Duration
    backend_request: _duration_pb2.Duration
    def __init__(self, request: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backend_request: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DestinationPolicy(_message.Message):
    __slots__ = ("service_key", "rule", "traffic_policy", "subsets")
    SERVICE_KEY_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_POLICY_FIELD_NUMBER: _ClassVar[int]
    SUBSETS_FIELD_NUMBER: _ClassVar[int]
    service_key: str
    rule: str
    traffic_policy: TrafficPolicy
    subsets: _containers.RepeatedCompositeFieldContainer[Subset]
    def __init__(self, service_key: _Optional[str] = ..., rule: _Optional[str] = ..., traffic_policy: _Optional[_Union[TrafficPolicy, _Mapping]] = ..., subsets: _Optional[_Iterable[_Union[Subset, _Mapping]]] = ...) -> None: ...

class Subset(_message.Message):
    __slots__ = ("name", "workloads", "traffic_policy")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_POLICY_FIELD_NUMBER: _ClassVar[int]
    name: str
    workloads: _containers.RepeatedScalarFieldContainer[str]
    traffic_policy: TrafficPolicy
    def __init__(self, name: _Optional[str] = ..., workloads: _Optional[_Iterable[str]] = ..., traffic_policy: _Optional[_Union[TrafficPolicy, _Mapping]] = ...) -> None: ...

class TrafficPolicy(_message.Message):
    __slots__ = ("load_balancer", "connection_pool", "outlier_detection", "tls", "proxy_protocol", "port_level")
    LOAD_BALANCER_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_POOL_FIELD_NUMBER: _ClassVar[int]
    OUTLIER_DETECTION_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    PROXY_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    PORT_LEVEL_FIELD_NUMBER: _ClassVar[int]
    load_balancer: LoadBalancer
    connection_pool: ConnectionPool
    outlier_detection: OutlierDetection
    tls: ClientTls
    proxy_protocol: ProxyProtocolVersion
    port_level: _containers.RepeatedCompositeFieldContainer[PortTrafficPolicy]
    def __init__(self, load_balancer: _Optional[_Union[LoadBalancer, _Mapping]] = ..., connection_pool: _Optional[_Union[ConnectionPool, _Mapping]] = ..., outlier_detection: _Optional[_Union[OutlierDetection, _Mapping]] = ..., tls: _Optional[_Union[ClientTls, _Mapping]] = ..., proxy_protocol: _Optional[_Union[ProxyProtocolVersion, str]] = ..., port_level: _Optional[_Iterable[_Union[PortTrafficPolicy, _Mapping]]] = ...) -> None: ...

class PortTrafficPolicy(_message.Message):
    __slots__ = ("port", "load_balancer", "connection_pool", "outlier_detection", "tls")
    PORT_FIELD_NUMBER: _ClassVar[int]
    LOAD_BALANCER_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_POOL_FIELD_NUMBER: _ClassVar[int]
    OUTLIER_DETECTION_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    port: int
    load_balancer: LoadBalancer
    connection_pool: ConnectionPool
    outlier_detection: OutlierDetection
    tls: ClientTls
    def __init__(self, port: _Optional[int] = ..., load_balancer: _Optional[_Union[LoadBalancer, _Mapping]] = ..., connection_pool: _Optional[_Union[ConnectionPool, _Mapping]] = ..., outlier_detection: _Optional[_Union[OutlierDetection, _Mapping]] = ..., tls: _Optional[_Union[ClientTls, _Mapping]] = ...) -> None: ...

class ConsistentHash(_message.Message):
    __slots__ = ("header_name", "query_parameter", "use_source_ip")
    HEADER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUERY_PARAMETER_FIELD_NUMBER: _ClassVar[int]
    USE_SOURCE_IP_FIELD_NUMBER: _ClassVar[int]
    header_name: str
    query_parameter: str
    use_source_ip: bool
    def __init__(self, header_name: _Optional[str] = ..., query_parameter: _Optional[str] = ..., use_source_ip: _Optional[bool] = ...) -> None: ...

class LoadBalancer(_message.Message):
    __slots__ = ("simple", "consistent_hash", "locality")
    SIMPLE_FIELD_NUMBER: _ClassVar[int]
    CONSISTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    simple: LoadBalancerType
    consistent_hash: ConsistentHash
    locality: LocalityLbSetting
    def __init__(self, simple: _Optional[_Union[LoadBalancerType, str]] = ..., consistent_hash: _Optional[_Union[ConsistentHash, _Mapping]] = ..., locality: _Optional[_Union[LocalityLbSetting, _Mapping]] = ...) -> None: ...

class LocalityLbSetting(_message.Message):
    __slots__ = ("disabled", "distribute", "failover", "failover_priority")
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    disabled: bool
    distribute: _containers.RepeatedCompositeFieldContainer[LocalityDistribute]
    failover: _containers.RepeatedCompositeFieldContainer[LocalityFailover]
    failover_priority: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, disabled: _Optional[bool] = ..., distribute: _Optional[_Iterable[_Union[LocalityDistribute, _Mapping]]] = ..., failover: _Optional[_Iterable[_Union[LocalityFailover, _Mapping]]] = ..., failover_priority: _Optional[_Iterable[str]] = ...) -> None: ...

class LocalityDistribute(_message.Message):
    __slots__ = ("source", "to")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    source: str
    to: _containers.RepeatedCompositeFieldContainer[LocalityWeight]
    def __init__(self, source: _Optional[str] = ..., to: _Optional[_Iterable[_Union[LocalityWeight, _Mapping]]] = ...) -> None: ...

class LocalityWeight(_message.Message):
    __slots__ = ("locality", "weight")
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    locality: str
    weight: int
    def __init__(self, locality: _Optional[str] = ..., weight: _Optional[int] = ...) -> None: ...

class LocalityFailover(_message.Message):
    __slots__ = ("source", "to")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    source: str
    to: str
    def __init__(self, source: _Optional[str] = ..., to: _Optional[str] = ...) -> None: ...

class ConnectionPool(_message.Message):
    __slots__ = ("max_connections", "connect_timeout", "http1_max_pending_requests", "http2_max_requests", "max_requests_per_connection", "h2_upgrade", "use_client_protocol")
    MAX_CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    CONNECT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    HTTP1_MAX_PENDING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    HTTP2_MAX_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUESTS_PER_CONNECTION_FIELD_NUMBER: _ClassVar[int]
    H2_UPGRADE_FIELD_NUMBER: _ClassVar[int]
    USE_CLIENT_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    max_connections: int
    connect_timeout: _duration_pb2.Duration
    http1_max_pending_requests: int
    http2_max_requests: int
    max_requests_per_connection: int
    h2_upgrade: H2UpgradePolicy
    use_client_protocol: bool
    def __init__(self, max_connections: _Optional[int] = ..., connect_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., http1_max_pending_requests: _Optional[int] = ..., http2_max_requests: _Optional[int] = ..., max_requests_per_connection: _Optional[int] = ..., h2_upgrade: _Optional[_Union[H2UpgradePolicy, str]] = ..., use_client_protocol: _Optional[bool] = ...) -> None: ...

class OutlierDetection(_message.Message):
    __slots__ = ("consecutive_5xx", "interval", "base_ejection_time", "max_ejection_percent")
    CONSECUTIVE_5XX_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    BASE_EJECTION_TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_EJECTION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    consecutive_5xx: int
    interval: _duration_pb2.Duration
    base_ejection_time: _duration_pb2.Duration
    max_ejection_percent: int
    def __init__(self, consecutive_5xx: _Optional[int] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., base_ejection_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_ejection_percent: _Optional[int] = ...) -> None: ...

class ClientTls(_message.Message):
    __slots__ = ("mode", "sni", "insecure_skip_verify", "ca_certificates", "subject_alt_names", "client_certificate", "private_key", "ca_certificates_path", "client_certificate_path", "private_key_path", "trust_unresolved")
    MODE_FIELD_NUMBER: _ClassVar[int]
    SNI_FIELD_NUMBER: _ClassVar[int]
    INSECURE_SKIP_VERIFY_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ALT_NAMES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_KEY_FIELD_NUMBER: _ClassVar[int]
    CA_CERTIFICATES_PATH_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CERTIFICATE_PATH_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_KEY_PATH_FIELD_NUMBER: _ClassVar[int]
    TRUST_UNRESOLVED_FIELD_NUMBER: _ClassVar[int]
    mode: TlsMode
    sni: str
    insecure_skip_verify: bool
    ca_certificates: str
    subject_alt_names: _containers.RepeatedScalarFieldContainer[str]
    client_certificate: str
    private_key: str
    ca_certificates_path: str
    client_certificate_path: str
    private_key_path: str
    trust_unresolved: bool
    def __init__(self, mode: _Optional[_Union[TlsMode, str]] = ..., sni: _Optional[str] = ..., insecure_skip_verify: _Optional[bool] = ..., ca_certificates: _Optional[str] = ..., subject_alt_names: _Optional[_Iterable[str]] = ..., client_certificate: _Optional[str] = ..., private_key: _Optional[str] = ..., ca_certificates_path: _Optional[str] = ..., client_certificate_path: _Optional[str] = ..., private_key_path: _Optional[str] = ..., trust_unresolved: _Optional[bool] = ...) -> None: ...
