"""The events, commands, plans and small records that are msgspec Structs keep what their frozen dataclasses gave
callers: fields that cannot be assigned, equality and hashing by value, a repr naming every field, positional
construction and ``match`` patterns."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import socket

import msgspec
import pytest

from ambit.hbone.events import DataReceived, StreamReset
from ambit.inpod.listeners import ListenerSpec, Port
from ambit.zds.protocol import WorkloadInfo

MODULES = (
    "ambit.hbone.events",
    "ambit.hbone.liveness",
    "ambit.zds.events",
    "ambit.zds.commands",
    "ambit.zds.protocol",
    "ambit.inpod.drain",
    "ambit.inpod.listeners",
    "ambit.proxy.plans",
    "ambit.hbone.grpc_calls",
    "ambit.proxy.sockets",
    "ambit.proxy.hostnames",
    "ambit.xds.client",
    "ambit.xds.client_session",
    "ambit.proxyprotocol",
)

RECORDS = sorted(
    (
        cls
        for module in MODULES
        for _, cls in inspect.getmembers(importlib.import_module(module), inspect.isclass)
        if cls.__module__ == module and issubclass(cls, msgspec.Struct)
    ),
    key=lambda cls: f"{cls.__module__}.{cls.__qualname__}",
)


def test_the_records_are_found() -> None:
    assert len(RECORDS) >= 58


@pytest.mark.parametrize("cls", RECORDS, ids=lambda cls: cls.__qualname__)
def test_every_record_is_frozen_compared_by_value_and_unordered(cls: type[msgspec.Struct]) -> None:
    config = cls.__struct_config__
    assert config.frozen and config.eq and not config.order
    assert cls.__dictoffset__ == 0  # no per-instance dict, as with slots=True


def test_a_field_cannot_be_assigned_and_the_error_is_an_attribute_error_as_before() -> None:
    event = DataReceived(1, b"abc", 3)
    with pytest.raises(AttributeError):
        event.stream_id = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del event.data  # type: ignore[misc]
    assert issubclass(dataclasses.FrozenInstanceError, AttributeError)  # what callers caught before still catches


def test_equality_hash_and_repr_are_by_value_as_a_dataclass_gives_them() -> None:
    reset = StreamReset(3, 8, True)
    assert repr(reset) == "StreamReset(stream_id=3, error_code=8, remote=True)"
    assert reset == StreamReset(3, 8, remote=True) and hash(reset) == hash(StreamReset(3, 8, True))
    assert reset != StreamReset(3, 8, False)
    assert {reset, StreamReset(3, 8, True)} == {reset}
    assert reset != DataReceived(3, b"", 0)


def test_defaults_positional_arguments_and_match_patterns_work_as_before() -> None:
    spec = ListenerSpec(Port.DNS, "::1", socket.SOCK_DGRAM)
    assert (spec.transparent, spec.optional, spec.family) == (False, False, socket.AF_INET6)
    assert spec == ListenerSpec(port=Port.DNS, host="::1", kind=socket.SOCK_DGRAM, transparent=False)
    match DataReceived(5, b"x", 1):
        case DataReceived(stream_id, data, flow_length):
            assert (stream_id, data, flow_length) == (5, b"x", 1)
        case _:
            pytest.fail("a positional pattern did not match")
    with pytest.raises(TypeError):
        WorkloadInfo()  # type: ignore[call-arg]
