"""The dashboard's query parsers (any text is a value or a BadQuery, never another exception) and its Host check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.observe.dashboard import (
    MAX_WINDOW,
    BadQuery,
    allowed_hosts,
    parse_node_id,
    parse_port,
    parse_ref,
    parse_window,
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | st.from_regex(r"[0-9]{1,8}", fullmatch=True))
def test_any_text_is_a_value_or_a_bad_query(text: str) -> None:
    query = {"window": text, "src": text, "port": text}
    for parse in (parse_window, parse_port, lambda q: parse_node_id(q, "src"), lambda q: parse_ref(q, "src")):
        try:
            value = parse(query)
        except BadQuery as exc:
            assert str(exc) and "\n" not in str(exc)
            continue
        assert value is not None


def test_the_parsers_accept_what_the_page_sends() -> None:
    assert parse_window({}) == 300 and parse_window({"window": "3600"}) == 3600
    assert parse_port({"port": "65535"}) == 65535
    assert parse_ref({"src": "apps/client-1"}, "src") == "apps/client-1"
    assert parse_node_id({"src": "wl:apps/<b>"}, "src") == "wl:apps/<b>"
    for bad in ("0", str(MAX_WINDOW + 1), "١٢", " 5", "5.0"):
        with pytest.raises(BadQuery):
            parse_window({"window": bad})
    for bad in ("Apps/x", "apps/", "/x", "apps/x/y", "a" * 64 + "/x"):
        with pytest.raises(BadQuery):
            parse_ref({"src": bad}, "src")


def test_the_host_check_names_the_bound_address_and_localhost() -> None:
    assert allowed_hosts("127.0.0.1", 20001) == {
        "127.0.0.1:20001",
        "localhost:20001",
        "[::1]:20001",
    }
    assert "[::1]:8" in (allowed_hosts("::1", 8) or set())
    assert "198.18.0.5:9" in (allowed_hosts("198.18.0.5", 9) or set())
    assert allowed_hosts("0.0.0.0", 9) is None and allowed_hosts("::", 9) is None
