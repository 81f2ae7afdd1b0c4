from ambit.api import requestauth_pb2 as _requestauth_pb2
from ambit.api import waypoint_pb2 as _waypoint_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ForwardClientCert(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FORWARD_CLIENT_CERT_UNSPECIFIED: _ClassVar[ForwardClientCert]
    SANITIZE: _ClassVar[ForwardClientCert]
    FORWARD_ONLY: _ClassVar[ForwardClientCert]
    APPEND_FORWARD: _ClassVar[ForwardClientCert]
    SANITIZE_SET: _ClassVar[ForwardClientCert]
    ALWAYS_FORWARD_ONLY: _ClassVar[ForwardClientCert]

class ListenerProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LISTENER_PROTOCOL_UNSPECIFIED: _ClassVar[ListenerProtocol]
    HTTP: _ClassVar[ListenerProtocol]
    HTTPS: _ClassVar[ListenerProtocol]
    TLS: _ClassVar[ListenerProtocol]
    TCP: _ClassVar[ListenerProtocol]
    TLS_TERMINATE: _ClassVar[ListenerProtocol]

class TlsMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIMPLE: _ClassVar[TlsMode]
    MUTUAL: _ClassVar[TlsMode]
    ISTIO_MUTUAL: _ClassVar[TlsMode]
    OPTIONAL_MUTUAL: _ClassVar[TlsMode]
FORWARD_CLIENT_CERT_UNSPECIFIED: ForwardClientCert
SANITIZE: ForwardClientCert
FORWARD_ONLY: ForwardClientCert
APPEND_FORWARD: ForwardClientCert
SANITIZE_SET: ForwardClientCert
ALWAYS_FORWARD_ONLY: ForwardClientCert
LISTENER_PROTOCOL_UNSPECIFIED: ListenerProtocol
HTTP: ListenerProtocol
HTTPS: ListenerProtocol
TLS: ListenerProtocol
TCP: ListenerProtocol
TLS_TERMINATE: ListenerProtocol
SIMPLE: TlsMode
MUTUAL: TlsMode
ISTIO_MUTUAL: TlsMode
OPTIONAL_MUTUAL: TlsMode

class GatewayConfig(_message.Message):
    __slots__ = ("gateway", "listeners", "policies", "request_authentications", "destination_rules", "envoy_patches", "forward_client_cert", "mesh_locality_lb")
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    LISTENERS_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_AUTHENTICATIONS_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_RULES_FIELD_NUMBER: _ClassVar[int]
    ENVOY_PATCHES_FIELD_NUMBER: _ClassVar[int]
    FORWARD_CLIENT_CERT_FIELD_NUMBER: _ClassVar[int]
    MESH_LOCALITY_LB_FIELD_NUMBER: _ClassVar[int]
    gateway: str
    listeners: _containers.RepeatedCompositeFieldContainer[Listener]
    policies: _containers.RepeatedCompositeFieldContainer[_waypoint_pb2.WaypointPolicy]
    request_authentications: _containers.RepeatedCompositeFieldContainer[_requestauth_pb2.RequestAuthentication]
    destination_rules: _containers.RepeatedCompositeFieldContainer[_waypoint_pb2.DestinationPolicy]
    envoy_patches: _waypoint_pb2.EnvoyPatches
    forward_client_cert: ForwardClientCert
    mesh_locality_lb: _waypoint_pb2.LocalityLbSetting
    def __init__(self, gateway: _Optional[str] = ..., listeners: _Optional[_Iterable[_Union[Listener, _Mapping]]] = ..., policies: _Optional[_Iterable[_Union[_waypoint_pb2.WaypointPolicy, _Mapping]]] = ..., request_authentications: _Optional[_Iterable[_Union[_requestauth_pb2.RequestAuthentication, _Mapping]]] = ..., destination_rules: _Optional[_Iterable[_Union[_waypoint_pb2.DestinationPolicy, _Mapping]]] = ..., envoy_patches: _Optional[_Union[_waypoint_pb2.EnvoyPatches, _Mapping]] = ..., forward_client_cert: _Optional[_Union[ForwardClientCert, str]] = ..., mesh_locality_lb: _Optional[_Union[_waypoint_pb2.LocalityLbSetting, _Mapping]] = ...) -> None: ...

class Certificate(_message.Message):
    __slots__ = ("cert_pem", "key_pem")
    CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    KEY_PEM_FIELD_NUMBER: _ClassVar[int]
    cert_pem: bytes
    key_pem: bytes
    def __init__(self, cert_pem: _Optional[bytes] = ..., key_pem: _Optional[bytes] = ...) -> None: ...

class VirtualHost(_message.Message):
    __slots__ = ("hostname", "http", "tcp_backends", "https_redirect")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    HTTP_FIELD_NUMBER: _ClassVar[int]
    TCP_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    HTTPS_REDIRECT_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    http: _containers.RepeatedCompositeFieldContainer[_waypoint_pb2.RouteRule]
    tcp_backends: _containers.RepeatedCompositeFieldContainer[_waypoint_pb2.WeightedBackend]
    https_redirect: bool
    def __init__(self, hostname: _Optional[str] = ..., http: _Optional[_Iterable[_Union[_waypoint_pb2.RouteRule, _Mapping]]] = ..., tcp_backends: _Optional[_Iterable[_Union[_waypoint_pb2.WeightedBackend, _Mapping]]] = ..., https_redirect: _Optional[bool] = ...) -> None: ...

class ListenerTls(_message.Message):
    __slots__ = ("mode", "ca_pem", "subject_alt_names", "spki_sha256", "cert_sha256", "min_version", "max_version", "cipher_suites")
    MODE_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ALT_NAMES_FIELD_NUMBER: _ClassVar[int]
    SPKI_SHA256_FIELD_NUMBER: _ClassVar[int]
    CERT_SHA256_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSION_FIELD_NUMBER: _ClassVar[int]
    CIPHER_SUITES_FIELD_NUMBER: _ClassVar[int]
    mode: TlsMode
    ca_pem: bytes
    subject_alt_names: _containers.RepeatedScalarFieldContainer[str]
    spki_sha256: _containers.RepeatedScalarFieldContainer[bytes]
    cert_sha256: _containers.RepeatedScalarFieldContainer[bytes]
    min_version: int
    max_version: int
    cipher_suites: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, mode: _Optional[_Union[TlsMode, str]] = ..., ca_pem: _Optional[bytes] = ..., subject_alt_names: _Optional[_Iterable[str]] = ..., spki_sha256: _Optional[_Iterable[bytes]] = ..., cert_sha256: _Optional[_Iterable[bytes]] = ..., min_version: _Optional[int] = ..., max_version: _Optional[int] = ..., cipher_suites: _Optional[_Iterable[str]] = ...) -> None: ...

class Listener(_message.Message):
    __slots__ = ("name", "port", "protocol", "hostname", "certificates", "virtual_hosts", "tls")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_HOSTS_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    name: str
    port: int
    protocol: ListenerProtocol
    hostname: str
    certificates: _containers.RepeatedCompositeFieldContainer[Certificate]
    virtual_hosts: _containers.RepeatedCompositeFieldContainer[VirtualHost]
    tls: ListenerTls
    def __init__(self, name: _Optional[str] = ..., port: _Optional[int] = ..., protocol: _Optional[_Union[ListenerProtocol, str]] = ..., hostname: _Optional[str] = ..., certificates: _Optional[_Iterable[_Union[Certificate, _Mapping]]] = ..., virtual_hosts: _Optional[_Iterable[_Union[VirtualHost, _Mapping]]] = ..., tls: _Optional[_Union[ListenerTls, _Mapping]] = ...) -> None: ...
