"""The proxy-status table from a recorded sync document (rules of :mod:`ambit.cli.sync_status`), and the parser's
answer to bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.cli.sync_status import SyncDocumentError, format_age, parse_document, status_table

RECORDED = Path(__file__).parent / "golden" / "proxy_status" / "syncz.json"


def _recorded() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(RECORDED.read_text())
    return document


def test_the_table_has_istios_columns_one_per_type_opened_and_ages_on_the_control_planes_clock() -> None:
    headers, rows = status_table(parse_document(_recorded()))
    assert headers == ["NAME", "CLUSTER", "ISTIOD", "VERSION", "ADDRESSES", "AUTHORIZATION", "WAYPOINT", "LAST PUSH"]
    assert rows == [
        [
            "node-a",
            "Kubernetes",
            "istiod-7d9c5b6f4-x2k8q",
            "-",
            "SYNCED (2m5s)",
            "SYNCED (3s)",
            "NOT SENT",
            "3s",
        ],
        ["node-b", "Kubernetes", "istiod-7d9c5b6f4-x2k8q", "-", "NOT SENT", "NOT SENT", "NOT SENT", "-"],
        [
            "waypoint-6b7c9.shop",
            "Kubernetes",
            "istiod-7d9c5b6f4-x2k8q",
            "1.0.0",
            "STALE (1m10s)",
            "NOT SENT",
            "ERROR (10s)",
            "10s",
        ],
    ]


def test_the_parsed_proxies_keep_nonces_and_the_nack_message() -> None:
    waypoint = next(p for p in parse_document(_recorded()) if p.stream == 3)
    config = waypoint.types["type.googleapis.com/ambit.waypoint.v1.WaypointConfig"]
    assert config.error == "shop/waypoint: routes[0]: unknown filter" and config.nonce == config.answered == "s3-4"
    assert waypoint.name == "waypoint-6b7c9.shop"


def test_documents_of_two_control_planes_make_one_table_sorted_by_name() -> None:
    second = _recorded()
    second["controlPlane"] = "istiod-b"
    second["clients"] = second["clients"][:1]
    _, rows = status_table([*parse_document(_recorded()), *parse_document(second)])
    assert [(r[0], r[2]) for r in rows[:2]] == [("node-a", "istiod-7d9c5b6f4-x2k8q"), ("node-a", "istiod-b")]


def test_an_empty_mesh_is_a_table_with_only_the_fixed_columns() -> None:
    headers, rows = status_table(parse_document({"generatedAt": 1.0, "clients": []}))
    assert headers == ["NAME", "CLUSTER", "ISTIOD", "VERSION", "LAST PUSH"] and rows == []


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0s"), (59.9, "59s"), (60, "1m0s"), (3599, "59m59s"), (3600, "1h0m"), (90061, "1d1h")]
)
def test_ages_read_as_kubectl_prints_them(seconds: float, text: str) -> None:
    assert format_age(seconds) == text


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("generatedAt"), "generatedAt"),
        (lambda d: d.update(clients={}), "clients"),
        (lambda d: d["clients"][0].update(stream="1"), "clients[0].stream"),
        (lambda d: d["clients"][1].update(types=[]), "clients[1].types"),
        (lambda d: d["clients"][0]["types"][next(iter(d["clients"][0]["types"]))].update(sentAt="x"), "sentAt"),
        (lambda d: d["clients"][2].update(lastPushAt=float("nan")), "clients[2].lastPushAt"),
    ],
    ids=["no generatedAt", "clients not a list", "stream not an int", "types not an object", "sentAt", "nan"],
)
def test_a_malformed_document_is_refused_naming_the_field(mutate: Any, field: str) -> None:
    document = _recorded()
    mutate(document)
    with pytest.raises(SyncDocumentError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_document(document)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
client_like = st.fixed_dictionaries(
    {},
    optional={
        "stream": json_values,
        "node": json_values,
        "identity": json_values,
        "types": st.dictionaries(
            st.text(max_size=8), st.dictionaries(st.sampled_from(["status", "sentAt"]), json_values)
        ),
        "lastPushAt": json_values,
    },
)


@given(
    st.fixed_dictionaries(
        {}, optional={"generatedAt": json_values, "controlPlane": json_values, "clients": st.lists(client_like)}
    )
    | json_values
)
def test_any_json_either_parses_or_is_a_sync_document_error(document: object) -> None:
    try:
        proxies = parse_document(document)
    except SyncDocumentError:
        return
    status_table(proxies)
