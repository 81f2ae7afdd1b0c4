"""Which texts are IP address literals (ambit.model.dnsname rule 2), the one test every caller of ``is_ip`` leans
on; and the two callers that ask something narrower, each at its call site: a ServiceEntry endpoint refuses a zone
id, a dynamic DNS host refuses all-digit labels too."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.model.dnsname import is_ip
from ambit.waypoint.destinations import Refusal
from ambit.waypoint.dynamic_hosts import judge_name

CASES = [
    ("198.18.0.1", True, "IPv4"),
    ("0.0.0.0", True, "IPv4, all zeros"),
    ("255.255.255.255", True, "IPv4, all ones"),
    ("::1", True, "IPv6 loopback"),
    ("2001:db8::8a2e:370:7334", True, "IPv6, compressed"),
    ("2001:0db8:0000:0000:0000:0000:0000:0001", True, "IPv6, full"),
    ("::ffff:198.18.0.1", True, "IPv4-mapped IPv6"),
    ("fe80::1%eth0", True, "IPv6 with a zone id"),
    ("fe80::1%", False, "an empty zone id"),
    ("198.18.0.1%eth0", False, "IPv4 with a zone id"),
    ("[::1]", False, "brackets"),
    ("[198.18.0.1]", False, "IPv4 in brackets"),
    ("010.1.1.1", False, "a leading zero (octal to some parsers)"),
    ("198.18.0.01", False, "a leading zero in the last octet"),
    ("198.18.0.1\n", False, "a trailing newline"),
    (" 198.18.0.1", False, "a leading space"),
    ("::1\n", False, "IPv6 with a trailing newline"),
    ("198.18.0", False, "three octets"),
    ("198.18.0.256", False, "an octet over 255"),
    ("0x7f.0.0.1", False, "hexadecimal"),
    ("2130706433", False, "one decimal number"),
    ("\uff11.2.3.4", False, "a full-width digit"),
    ("198.18.0.1/32", False, "a prefix"),
    ("example.com", False, "a host name"),
    ("", False, "empty"),
]


@pytest.mark.parametrize(("text", "expected", "why"), CASES, ids=[why for _, _, why in CASES])
def test_a_text_is_an_ip_literal_only_as_the_table_says(text: str, expected: bool, why: str) -> None:
    assert is_ip(text) is expected, why


@pytest.mark.parametrize("value", [2130706433, b"\xc6\x12\x00\x01", None, ["198.18.0.1"], 1.5, True])
def test_a_value_that_is_not_a_str_is_no_ip_literal(value: object) -> None:
    assert is_ip(value) is False  # ipaddress.ip_address would take the int and the packed bytes


@given(st.one_of(st.text(max_size=60), st.binary(max_size=20), st.integers()))
def test_any_value_gives_a_verdict_without_raising(value: object) -> None:
    assert is_ip(value) in (True, False)


@pytest.mark.parametrize("name", ["198.18.0.1", "1.2.3", "10", "::1", "fe80::1%eth0"])
def test_a_dynamic_dns_host_refuses_addresses_and_all_digit_names(name: str) -> None:
    judged = judge_name(name, "*")
    assert isinstance(judged, Refusal)
    assert "IP literal" in judged.reason
