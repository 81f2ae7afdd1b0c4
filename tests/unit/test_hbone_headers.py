"""HBONE CONNECT headers: authority parsing, baggage, traceparent, forwarded."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.hbone import (
    AuthorityError,
    HboneClientConnection,
    HboneError,
    connect_headers,
    decode_baggage,
    encode_baggage,
    new_traceparent,
    parse_authority,
)
from ambit.hbone.headers import _DOTTED_DIGITS


@pytest.mark.parametrize(
    ("authority", "expected"),
    [
        ("1.2.3.4:80", ("1.2.3.4", 80)),
        ("198.18.200.7:65535", ("198.18.200.7", 65535)),
        ("[::1]:80", ("::1", 80)),
        ("[FD00:0:0::7]:15008", ("fd00::7", 15008)),
        ("host.ns.svc.cluster.local:80", ("host.ns.svc.cluster.local", 80)),
        ("echo:1", ("echo", 1)),
        ("a-b.c9:8080", ("a-b.c9", 8080)),
    ],
)
def test_good_authorities_parse(authority: str, expected: tuple[str, int]) -> None:
    assert parse_authority(authority) == expected


@pytest.mark.parametrize(
    "authority",
    [
        "",
        "1.2.3.4",
        "1.2.3.4:",
        "1.2.3.4:0",
        "1.2.3.4:65536",
        "1.2.3.4:080",
        "1.2.3.4:+80",
        "1.2.3.4: 80",
        "1.2.3.4:8_0",
        "1.2.3.256:80",
        "1.2.3:80",
        "01.2.3.4:80",
        "::1:80",
        "[::1]",
        "[::1%eth0]:80",
        "[1.2.3.4]:80",
        "[zz::1]:80",
        "host_name:80",
        "-host:80",
        "host-:80",
        "host..local:80",
        "host.local.:80",
        "h\u00e9st:80",
        "a" * 64 + ":80",
        "http://host:80",
        "host:80/path",
        "user@host:80",
        ":80",
    ],
)
def test_bad_authorities_raise_authority_error(authority: str) -> None:
    with pytest.raises(AuthorityError):
        parse_authority(authority)


@given(st.text(max_size=80))
def test_parse_authority_raises_only_authority_error(text: str) -> None:
    try:
        host, port = parse_authority(text)
    except AuthorityError:
        return
    assert 1 <= port <= 65535
    assert host and text.endswith(f":{port}")


@given(st.ip_addresses(), st.integers(1, 65535))
def test_ip_authorities_round_trip(address: object, port: int) -> None:
    text = f"[{address}]:{port}" if ":" in str(address) else f"{address}:{port}"
    assert parse_authority(text) == (str(address), port)


baggage_keys = st.from_regex(r"[a-z][a-z0-9._-]{0,20}", fullmatch=True)


@given(st.dictionaries(baggage_keys, st.text(max_size=30), max_size=8))
def test_baggage_round_trips(items: dict[str, str]) -> None:
    text = encode_baggage(items)
    assert text.count(",") == max(len(items) - 1, 0)  # commas inside values are escaped
    assert decode_baggage(text) == items


def test_baggage_encodes_only_present_keys_in_order() -> None:
    text = encode_baggage({"k8s.cluster.name": "Kubernetes", "service.name": "echo v1,2"})
    assert text == "k8s.cluster.name=Kubernetes,service.name=echo%20v1%2C2"


def test_baggage_decoding_is_tolerant() -> None:
    assert decode_baggage(" a = 1 ; prop=x ,, junk, =v, b=%ZZ, c=%41") == {"a": "1", "b": "%ZZ", "c": "A"}
    assert decode_baggage("") == {}


@given(st.text(max_size=100))
def test_baggage_decoding_never_raises(text: str) -> None:
    assert isinstance(decode_baggage(text), dict)


def test_baggage_keys_must_be_tokens() -> None:
    with pytest.raises(HboneError):
        encode_baggage({"bad key": "v"})


@given(st.binary(min_size=24, max_size=24))
def test_traceparent_has_the_w3c_format(random: bytes) -> None:
    value = new_traceparent(random)
    match = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-00", value)
    assert match
    assert match.group(1) != "0" * 32 and match.group(2) != "0" * 16


def test_traceparent_is_pure_and_uses_the_bytes_in_order() -> None:
    random = bytes(range(24))
    assert (
        new_traceparent(random)
        == new_traceparent(random)
        == ("00-000102030405060708090a0b0c0d0e0f-1011121314151617-00")
    )
    assert new_traceparent(bytes(24)) == "00-" + "0" * 31 + "1-" + "0" * 15 + "1-00"
    with pytest.raises(HboneError):
        new_traceparent(b"short")


def test_connect_headers_follow_the_spec() -> None:
    headers = connect_headers(
        forwarded_for="198.18.200.5:43122",
        host="echo.default.svc.cluster.local",
        baggage={"k8s.namespace.name": "default", "service.name": "echo"},
        traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-00",
    )
    assert headers == [
        ("forwarded", 'for="198.18.200.5:43122";host=echo.default.svc.cluster.local'),
        ("baggage", "k8s.namespace.name=default,service.name=echo"),
        ("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-00"),
    ]


def test_connect_headers_omit_what_is_not_known() -> None:
    assert connect_headers(forwarded_for="[fd00::5]:43122") == [("forwarded", 'for="[fd00::5]:43122"')]
    with pytest.raises(HboneError):
        connect_headers(forwarded_for='1.2.3.4:5"')


def test_remembered_ipv4_authorities_parse_the_same_and_bad_ones_are_refused_every_time() -> None:
    for _ in range(3):
        assert parse_authority("198.18.200.7:8080") == ("198.18.200.7", 8080)
        with pytest.raises(AuthorityError):
            parse_authority("198.18.200.256:8080")


def _old_ipv4_shape(host: str) -> bool:
    """The IPv4 test ``parse_authority`` ran before it became one regex match."""
    return bool(host) and all(part.isdigit() and part.isascii() for part in host.split("."))


@given(st.one_of(st.text(), st.from_regex(r"[0-9.\n]{0,20}", fullmatch=True), st.text(alphabet="0123456789.٣²")))
def test_the_ipv4_shape_is_the_same_as_the_per_part_test(host: str) -> None:
    assert (_DOTTED_DIGITS.fullmatch(host) is not None) == _old_ipv4_shape(host)


@pytest.mark.parametrize("value", ["a\rb", "a\nb", "a\0b", "\r", "x\n", "\0"])
def test_a_connect_header_value_with_cr_lf_or_nul_is_refused(value: str) -> None:
    with pytest.raises(HboneError, match="CR, LF or NUL"):
        HboneClientConnection().open_tunnel("198.18.0.7:80", [("x-a", value)])
