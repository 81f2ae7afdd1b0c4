from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceMetrics(_message.Message):
    __slots__ = ("service_key", "disabled", "overrides")
    SERVICE_KEY_FIELD_NUMBER: _ClassVar[int]
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    service_key: str
    disabled: bool
    overrides: _containers.RepeatedCompositeFieldContainer[MetricOverride]
    def __init__(self, service_key: _Optional[str] = ..., disabled: _Optional[bool] = ..., overrides: _Optional[_Iterable[_Union[MetricOverride, _Mapping]]] = ...) -> None: ...

class MetricOverride(_message.Message):
    __slots__ = ("metric", "disabled", "tags")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    metric: str
    disabled: bool
    tags: _containers.RepeatedCompositeFieldContainer[TagOverride]
    def __init__(self, metric: _Optional[str] = ..., disabled: _Optional[bool] = ..., tags: _Optional[_Iterable[_Union[TagOverride, _Mapping]]] = ...) -> None: ...

class TagOverride(_message.Message):
    __slots__ = ("name", "remove", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    remove: bool
    value: str
    def __init__(self, name: _Optional[str] = ..., remove: _Optional[bool] = ..., value: _Optional[str] = ...) -> None: ...
