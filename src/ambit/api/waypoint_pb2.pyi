import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from ambit.api import requestauth_pb2 as _requestauth_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PathMatchType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PATH_MATCH_TYPE_UNSPECIFIED: _ClassVar[PathMatchType]
    PATH_EXACT: _ClassVar[PathMatchType]
    PATH_PREFIX: _ClassVar[PathMatchType]
    PATH_REGULAR_EXPRESSION: _ClassVar[PathMatchType]

class ValueMatchType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALUE_EXACT: _ClassVar[ValueMatchType]
    VALUE_REGULAR_EXPRESSION: _ClassVar[ValueMatchType]

class PathModifierType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PATH_MODIFIER_TYPE_UNSPECIFIED: _ClassVar[PathModifierType]
    REPLACE_FULL_PATH: _ClassVar[PathModifierType]
    REPLACE_PREFIX_MATCH: _ClassVar[PathModifierType]
PATH_MATCH_TYPE_UNSPECIFIED: PathMatchType
PATH_EXACT: PathMatchType
PATH_PREFIX: PathMatchType
PATH_REGULAR_EXPRESSION: PathMatchType
VALUE_EXACT: ValueMatchType
VALUE_REGULAR_EXPRESSION: ValueMatchType
PATH_MODIFIER_TYPE_UNSPECIFIED: PathModifierType
REPLACE_FULL_PATH: PathModifierType
REPLACE_PREFIX_MATCH: PathModifierType

class WaypointConfig(_message.Message):
    __slots__ = ("waypoint", "tables", "request_authentications")
    WAYPOINT_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_AUTHENTICATIONS_FIELD_NUMBER: _ClassVar[int]
    waypoint: str
    tables: _containers.RepeatedCompositeFieldContainer[RouteTable]
    request_authentications: _containers.RepeatedCompositeFieldContainer[_requestauth_pb2.RequestAuthentication]
    def __init__(self, waypoint: _Optional[str] = ..., tables: _Optional[_Iterable[_Union[RouteTable, _Mapping]]] = ..., request_authentications: _Optional[_Iterable[_Union[_requestauth_pb2.RequestAuthentication, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("route", "match", "backends", "request_headers", "response_headers", "redirect", "rewrite", "mirrors", "timeouts", "retry", "rule_name")
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
    def __init__(self, route: _Optional[str] = ..., match: _Optional[_Union[RouteMatch, _Mapping]] = ..., backends: _Optional[_Iterable[_Union[WeightedBackend, _Mapping]]] = ..., request_headers: _Optional[_Union[HeaderModifier, _Mapping]] = ..., response_headers: _Optional[_Union[HeaderModifier, _Mapping]] = ..., redirect: _Optional[_Union[RequestRedirect, _Mapping]] = ..., rewrite: _Optional[_Union[URLRewrite, _Mapping]] = ..., mirrors: _Optional[_Iterable[_Union[RequestMirror, _Mapping]]] = ..., timeouts: _Optional[_Union[Timeouts, _Mapping]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., rule_name: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("path", "headers", "query_params", "method")
    PATH_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    QUERY_PARAMS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    path: PathMatch
    headers: _containers.RepeatedCompositeFieldContainer[ValueMatch]
    query_params: _containers.RepeatedCompositeFieldContainer[ValueMatch]
    method: str
    def __init__(self, path: _Optional[_Union[PathMatch, _Mapping]] = ..., headers: _Optional[_Iterable[_Union[ValueMatch, _Mapping]]] = ..., query_params: _Optional[_Iterable[_Union[ValueMatch, _Mapping]]] = ..., method: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("scheme", "hostname", "path", "port", "status_code")
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    scheme: str
    hostname: str
    path: PathModifier
    port: int
    status_code: int
    def __init__(self, scheme: _Optional[str] = ..., hostname: _Optional[str] = ..., path: _Optional[_Union[PathModifier, _Mapping]] = ..., port: _Optional[int] = ..., status_code: _Optional[int] = ...) -> None: ...

class URLRewrite(_message.Message):
    __slots__ = ("hostname", "path")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    path: PathModifier
    def __init__(self, hostname: _Optional[str] = ..., path: _Optional[_Union[PathModifier, _Mapping]] = ...) -> None: ...

class BackendService(_message.Message):
    __slots__ = ("namespace", "hostname", "port")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hostname: str
    port: int
    def __init__(self, namespace: _Optional[str] = ..., hostname: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class RequestMirror(_message.Message):
    __slots__ = ("backend", "percent")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    backend: BackendService
    percent: float
    def __init__(self, backend: _Optional[_Union[BackendService, _Mapping]] = ..., percent: _Optional[float] = ...) -> None: ...

class WeightedBackend(_message.Message):
    __slots__ = ("backend", "weight", "request_headers")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HEADERS_FIELD_NUMBER: _ClassVar[int]
    backend: BackendService
    weight: int
    request_headers: HeaderModifier
    def __init__(self, backend: _Optional[_Union[BackendService, _Mapping]] = ..., weight: _Optional[int] = ..., request_headers: _Optional[_Union[HeaderModifier, _Mapping]] = ...) -> None: ...

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
