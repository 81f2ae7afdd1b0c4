"""The pure parts of the gRPC channel's shell (ambit.xds.grpc_channel): targets (its calls are in
tests/integration/test_grpc_channel.py, against grpcio and hostile servers)."""

from __future__ import annotations

import pytest

from ambit.hbone.grpc_calls import StatusCode
from ambit.xds.errors import GrpcCallError
from ambit.xds.grpc_channel import ChannelSettings, GrpcChannel, split_target


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("istiod.istio-system.svc:15012", ("istiod.istio-system.svc", 15012)),
        ("198.18.0.2:15012", ("198.18.0.2", 15012)),
        ("[2001:db8::2]:15012", ("2001:db8::2", 15012)),
        ("dns:///istiod.istio-system.svc:15012", ("istiod.istio-system.svc", 15012)),
    ],
)
def test_a_target_is_a_host_and_a_port(target: str, expected: tuple[str, int]) -> None:
    assert split_target(target) == expected


@pytest.mark.parametrize("target", ["istiod", ":15012", "istiod:", "istiod:0", "istiod:65536", "istiod:http", ""])
def test_a_target_without_a_usable_port_is_invalid_argument(target: str) -> None:
    with pytest.raises(GrpcCallError) as refused:
        split_target(target)
    assert refused.value.code is StatusCode.INVALID_ARGUMENT and repr(target) in str(refused.value)


def test_a_root_that_is_not_a_certificate_is_refused_when_the_channel_is_made() -> None:
    with pytest.raises(GrpcCallError, match="UNAVAILABLE: the root certificate is unusable"):
        GrpcChannel(ChannelSettings("istiod:15012", b"-----BEGIN CERTIFICATE-----\nnot base64\n"))
