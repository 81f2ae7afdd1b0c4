"""Reading the server name of a TLS ClientHello (ambit.tls.clienthello): real hellos from OpenSSL, split and cut,
and arbitrary bytes (a name, None for "read more", or a clear ClientHelloError; nothing else)."""

from __future__ import annotations

import ssl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.tls.clienthello import HELLO_LIMIT, ClientHello, ClientHelloError, read_client_hello


def openssl_hello(server_name: str | None, alpn: tuple[str, ...] = ()) -> bytes:
    """The first flight OpenSSL sends as a client asking for ``server_name``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if alpn:
        context.set_alpn_protocols(list(alpn))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def record(payload: bytes, content_type: int = 22) -> bytes:
    return bytes([content_type, 3, 1]) + len(payload).to_bytes(2, "big") + payload


def hello_body(extensions: bytes | None) -> bytes:
    body = b"\x03\x03" + b"\x00" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    if extensions is not None:
        body += len(extensions).to_bytes(2, "big") + extensions
    return b"\x01" + len(body).to_bytes(3, "big") + body


def sni_extension(*entries: tuple[int, bytes]) -> bytes:
    listed = b"".join(bytes([kind]) + len(name).to_bytes(2, "big") + name for kind, name in entries)
    value = len(listed).to_bytes(2, "big") + listed
    return b"\x00\x00" + len(value).to_bytes(2, "big") + value


DNS_NAME = r"\A[a-z]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z]([a-z0-9-]{0,20}[a-z0-9])?){0,3}\Z"
HELLO = openssl_hello("Echo.Example.COM", ("h2", "http/1.1"))


def test_openssl_hello_gives_its_server_name_lower_case_and_alpn() -> None:
    found = read_client_hello(HELLO)
    assert found == ClientHello("echo.example.com", ("h2", "http/1.1"))


def test_hello_without_server_name_has_none() -> None:
    found = read_client_hello(openssl_hello(None))
    assert found is not None and found.server_name is None


def test_hello_without_extensions_has_no_name() -> None:
    assert read_client_hello(record(hello_body(None))) == ClientHello(None, ())


def test_every_strict_prefix_of_a_hello_asks_for_more() -> None:
    for cut in range(len(HELLO)):
        assert read_client_hello(HELLO[:cut]) is None, cut


def test_hello_split_over_records_is_reassembled() -> None:
    handshake = hello_body(sni_extension((0, b"split.example")))
    data = record(handshake[:7]) + record(handshake[7:40]) + record(handshake[40:])
    found = read_client_hello(data)
    assert found is not None and found.server_name == "split.example"


def test_bytes_after_the_hello_are_not_read() -> None:
    assert read_client_hello(HELLO + b"\x17\x03\x03garbage") == read_client_hello(HELLO)


def test_trailing_dot_is_dropped_and_first_host_name_wins() -> None:
    data = record(hello_body(sni_extension((7, b"other"), (0, b"a.example."), (0, b"b.example"))))
    found = read_client_hello(data)
    assert found is not None and found.server_name == "a.example"


@pytest.mark.parametrize("sent", [b"example.com\n", b"example\n.com", b"example.com\n."])
def test_a_server_name_with_a_newline_is_not_a_dns_name(sent: bytes) -> None:
    found = read_client_hello(record(hello_body(sni_extension((0, sent.replace(b"\n", b""))))))
    assert found is not None and found.server_name == "example.com"
    with pytest.raises(ClientHelloError, match="not a DNS name"):
        read_client_hello(record(hello_body(sni_extension((0, sent)))))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET / HTTP/1.1\r\n", "not a TLS handshake record"),
        (b"\x16\x02\x01", "not a TLS record"),
        (b"\x16\x03\x01\x00\x00", "length 0 out of range"),
        (b"\x16\x03\x01\x50\x00", "out of range"),
        (record(b"\x02\x00\x00\x00"), "not a ClientHello"),
        (record(hello_body(sni_extension((0, b"10.0.0.1")))), "IP address literal"),
        (record(hello_body(sni_extension((0, b"bad_name.example")))), "not a DNS name"),
        (record(hello_body(sni_extension((0, b"a" * 64 + b".example")))), "not a DNS name"),
        (record(hello_body(sni_extension((0, b"")))), "not a DNS name"),
        (record(hello_body(sni_extension((0, b"x")) * 2)), "appears twice"),
        (record(b"\x01\x00\x00\x02\x03\x03"), "truncated"),
        (record(hello_body(None))[:5] + b"\x15" + record(hello_body(None))[6:], "not a ClientHello"),
    ],
)
def test_malformed_bytes_are_a_clear_error(data: bytes, reason: str) -> None:
    with pytest.raises(ClientHelloError, match=reason):
        read_client_hello(data)


def test_application_data_record_before_the_hello_is_complete_is_an_error() -> None:
    handshake = hello_body(sni_extension((0, b"a.example")))
    with pytest.raises(ClientHelloError, match="content type 23"):
        read_client_hello(record(handshake[:10]) + record(b"x", 23))


def test_a_hello_longer_than_the_limit_is_refused_as_soon_as_its_length_says_so() -> None:
    padding = b"\x00\x15" + (20000).to_bytes(2, "big") + b"\x00" * 20000
    handshake = hello_body(sni_extension((0, b"big.example")) + padding)
    data = b"".join(record(handshake[i : i + 16000]) for i in range(0, len(handshake), 16000))
    with pytest.raises(ClientHelloError, match="does not fit"):
        read_client_hello(data[:10])  # only the first record's header and the handshake length


def test_many_tiny_records_stop_at_the_limit() -> None:
    handshake = hello_body(sni_extension((0, b"a.example")) + b"\x00\x15\x10\x00" + b"\x00" * 4096)
    data = b"".join(record(handshake[i : i + 1]) for i in range(len(handshake)))
    with pytest.raises(ClientHelloError, match="does not fit"):
        read_client_hello(data, limit=HELLO_LIMIT)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_give_a_hello_more_or_a_clear_error(data: bytes) -> None:
    try:
        found = read_client_hello(data)
    except ClientHelloError as exc:
        assert exc.reason
        return
    assert found is None or isinstance(found, ClientHello)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_real_hellos_never_raise_anything_else(data: st.DataObject) -> None:
    raw = bytearray(HELLO)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        found = read_client_hello(bytes(raw))
    except ClientHelloError:
        return
    assert found is None or found.server_name is None or found.server_name == found.server_name.lower()


@settings(max_examples=100, deadline=None)
@given(st.from_regex(DNS_NAME), st.integers(1, 200))
def test_any_dns_name_survives_any_record_split(name: str, size: int) -> None:
    handshake = hello_body(sni_extension((0, name.encode())))
    data = b"".join(record(handshake[i : i + size]) for i in range(0, len(handshake), size))
    found = read_client_hello(data)
    assert found is not None and found.server_name == name
