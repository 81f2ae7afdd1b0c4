from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Version(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NOT_USED: _ClassVar[Version]
    V1: _ClassVar[Version]
NOT_USED: Version
V1: Version

class ZdsHello(_message.Message):
    __slots__ = ("version", "successor_notice")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SUCCESSOR_NOTICE_FIELD_NUMBER: _ClassVar[int]
    version: Version
    successor_notice: bool
    def __init__(self, version: _Optional[_Union[Version, str]] = ..., successor_notice: _Optional[bool] = ...) -> None: ...

class WorkloadInfo(_message.Message):
    __slots__ = ("name", "namespace", "service_account")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SERVICE_ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    service_account: str
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., service_account: _Optional[str] = ...) -> None: ...

class AddWorkload(_message.Message):
    __slots__ = ("uid", "workload_info")
    UID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_INFO_FIELD_NUMBER: _ClassVar[int]
    uid: str
    workload_info: WorkloadInfo
    def __init__(self, uid: _Optional[str] = ..., workload_info: _Optional[_Union[WorkloadInfo, _Mapping]] = ...) -> None: ...

class KeepWorkload(_message.Message):
    __slots__ = ("uid",)
    UID_FIELD_NUMBER: _ClassVar[int]
    uid: str
    def __init__(self, uid: _Optional[str] = ...) -> None: ...

class DelWorkload(_message.Message):
    __slots__ = ("uid",)
    UID_FIELD_NUMBER: _ClassVar[int]
    uid: str
    def __init__(self, uid: _Optional[str] = ...) -> None: ...

class SnapshotSent(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SuccessorReady(_message.Message):
    __slots__ = ("ready",)
    READY_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    def __init__(self, ready: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: str
    def __init__(self, error: _Optional[str] = ...) -> None: ...

class WorkloadRequest(_message.Message):
    __slots__ = ("add", "keep", "snapshot_sent", "successor_ready")
    ADD_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    DEL_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_SENT_FIELD_NUMBER: _ClassVar[int]
    SUCCESSOR_READY_FIELD_NUMBER: _ClassVar[int]
    add: AddWorkload
    keep: KeepWorkload
    snapshot_sent: SnapshotSent
    successor_ready: SuccessorReady
    def __init__(self, add: _Optional[_Union[AddWorkload, _Mapping]] = ..., keep: _Optional[_Union[KeepWorkload, _Mapping]] = ..., snapshot_sent: _Optional[_Union[SnapshotSent, _Mapping]] = ..., successor_ready: _Optional[_Union[SuccessorReady, _Mapping]] = ..., **kwargs) -> None: ...

class WorkloadResponse(_message.Message):
    __slots__ = ("ack",)
    ACK_FIELD_NUMBER: _ClassVar[int]
    ack: Ack
    def __init__(self, ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...
