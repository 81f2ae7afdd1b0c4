from ambit.api import requestauth_pb2 as _requestauth_pb2
from ambit.api import waypoint_pb2 as _waypoint_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListenerProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LISTENER_PROTOCOL_UNSPECIFIED: _ClassVar[ListenerProtocol]
    HTTP: _ClassVar[ListenerProtocol]
    HTTPS: _ClassVar[ListenerProtocol]
    TLS: _ClassVar[ListenerProtocol]
    TCP: _ClassVar[ListenerProtocol]
LISTENER_PROTOCOL_UNSPECIFIED: ListenerProtocol
HTTP: ListenerProtocol
HTTPS: ListenerProtocol
TLS: ListenerProtocol
TCP: ListenerProtocol

class GatewayConfig(_message.Message):
    __slots__ = ("gateway", "listeners", "policies", "request_authentications")
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    LISTENERS_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_AUTHENTICATIONS_FIELD_NUMBER: _ClassVar[int]
    gateway: str
    listeners: _containers.RepeatedCompositeFieldContainer[Listener]
    policies: _containers.RepeatedCompositeFieldContainer[_waypoint_pb2.WaypointPolicy]
    request_authentications: _containers.RepeatedCompositeFieldContainer[_requestauth_pb2.RequestAuthentication]
    def __init__(self, gateway: _Optional[str] = ..., listeners: _Optional[_Iterable[_Union[Listener, _Mapping]]] = ..., policies: _Optional[_Iterable[_Union[_waypoint_pb2.WaypointPolicy, _Mapping]]] = ..., request_authentications: _Optional[_Iterable[_Union[_requestauth_pb2.RequestAuthentication, _Mapping]]] = ...) -> None: ...

class Certificate(_message.Message):
    __slots__ = ("cert_pem", "key_pem")
    CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    KEY_PEM_FIELD_NUMBER: _ClassVar[int]
    cert_pem: bytes
    key_pem: bytes
    def __init__(self, cert_pem: _Optional[bytes] = ..., key_pem: _Optional[bytes] = ...) -> None: ...

class VirtualHost(_message.Message):
    __slots__ = ("hostname", "http", "tcp_backends")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    HTTP_FIELD_NUMBER: _ClassVar[int]
    TCP_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    http: _containers.RepeatedCompositeFieldContainer[_waypoint_pb2.RouteRule]
    tcp_backends: _containers.RepeatedCompositeFieldContainer[_waypoint_pb2.WeightedBackend]
    def __init__(self, hostname: _Optional[str] = ..., http: _Optional[_Iterable[_Union[_waypoint_pb2.RouteRule, _Mapping]]] = ..., tcp_backends: _Optional[_Iterable[_Union[_waypoint_pb2.WeightedBackend, _Mapping]]] = ...) -> None: ...

class Listener(_message.Message):
    __slots__ = ("name", "port", "protocol", "hostname", "certificates", "virtual_hosts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_HOSTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    port: int
    protocol: ListenerProtocol
    hostname: str
    certificates: _containers.RepeatedCompositeFieldContainer[Certificate]
    virtual_hosts: _containers.RepeatedCompositeFieldContainer[VirtualHost]
    def __init__(self, name: _Optional[str] = ..., port: _Optional[int] = ..., protocol: _Optional[_Union[ListenerProtocol, str]] = ..., hostname: _Optional[str] = ..., certificates: _Optional[_Iterable[_Union[Certificate, _Mapping]]] = ..., virtual_hosts: _Optional[_Iterable[_Union[VirtualHost, _Mapping]]] = ...) -> None: ...
