import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestAuthentication(_message.Message):
    __slots__ = ("name", "namespace", "rules", "services")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    rules: _containers.RepeatedCompositeFieldContainer[JwtRule]
    services: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., rules: _Optional[_Iterable[_Union[JwtRule, _Mapping]]] = ..., services: _Optional[_Iterable[str]] = ...) -> None: ...

class JwtHeader(_message.Message):
    __slots__ = ("name", "prefix")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    name: str
    prefix: str
    def __init__(self, name: _Optional[str] = ..., prefix: _Optional[str] = ...) -> None: ...

class ClaimToHeader(_message.Message):
    __slots__ = ("header", "claim")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    header: str
    claim: str
    def __init__(self, header: _Optional[str] = ..., claim: _Optional[str] = ...) -> None: ...

class JwtRule(_message.Message):
    __slots__ = ("issuer", "audiences", "jwks", "jwks_uri", "from_headers", "from_params", "from_cookies", "output_payload_to_header", "output_claim_to_headers", "forward_original_token", "timeout", "space_delimited_claims")
    ISSUER_FIELD_NUMBER: _ClassVar[int]
    AUDIENCES_FIELD_NUMBER: _ClassVar[int]
    JWKS_FIELD_NUMBER: _ClassVar[int]
    JWKS_URI_FIELD_NUMBER: _ClassVar[int]
    FROM_HEADERS_FIELD_NUMBER: _ClassVar[int]
    FROM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    FROM_COOKIES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PAYLOAD_TO_HEADER_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CLAIM_TO_HEADERS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_ORIGINAL_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    SPACE_DELIMITED_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    issuer: str
    audiences: _containers.RepeatedScalarFieldContainer[str]
    jwks: str
    jwks_uri: str
    from_headers: _containers.RepeatedCompositeFieldContainer[JwtHeader]
    from_params: _containers.RepeatedScalarFieldContainer[str]
    from_cookies: _containers.RepeatedScalarFieldContainer[str]
    output_payload_to_header: str
    output_claim_to_headers: _containers.RepeatedCompositeFieldContainer[ClaimToHeader]
    forward_original_token: bool
    timeout: _duration_pb2.Duration
    space_delimited_claims: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, issuer: _Optional[str] = ..., audiences: _Optional[_Iterable[str]] = ..., jwks: _Optional[str] = ..., jwks_uri: _Optional[str] = ..., from_headers: _Optional[_Iterable[_Union[JwtHeader, _Mapping]]] = ..., from_params: _Optional[_Iterable[str]] = ..., from_cookies: _Optional[_Iterable[str]] = ..., output_payload_to_header: _Optional[str] = ..., output_claim_to_headers: _Optional[_Iterable[_Union[ClaimToHeader, _Mapping]]] = ..., forward_original_token: _Optional[bool] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., space_delimited_claims: _Optional[_Iterable[str]] = ...) -> None: ...
