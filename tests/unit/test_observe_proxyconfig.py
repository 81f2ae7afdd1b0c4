"""The tables of ``ambit proxy-config`` from a recorded node proxy dump, and what malformed dumps give.

``golden/proxyconfig/dump.json`` was recorded from the real node proxy of :mod:`tests.proxyconfig_rig` (its PEM
blocks elided); tests/integration/test_proxy_config_cli.py checks it still matches a fresh dump.
"""

from __future__ import annotations

import copy
import datetime
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.localconfig_forms import service_to_dict
from ambit.model.workload import GatewayAddress, NamespacedHostname, Service, WeightedWaypoint
from ambit.observe.admin_client import AdminFetchError, config_dump_url
from ambit.observe.proxyconfig import (
    ConfigDumpError,
    Filters,
    Section,
    Table,
    build_table,
    read_config_dump,
    render_structured,
    render_text,
    select_entries,
)

RECORDED: dict[str, Any] = json.loads((Path(__file__).parent / "golden" / "proxyconfig" / "dump.json").read_text())
LEAF = RECORDED["certificates"][0]["certChain"][0]
ISSUED = datetime.datetime.fromisoformat(LEAF["validFrom"].replace("Z", "+00:00")).timestamp()
EXPIRES = datetime.datetime.fromisoformat(LEAF["expirationTime"].replace("Z", "+00:00")).timestamp()
NOW = ISSUED + 3600


def dump() -> dict[str, Any]:
    return copy.deepcopy(RECORDED)


ALL = Filters()


def table(section: Section, filters: Filters = ALL, *, now: float = NOW, source: Any = None) -> Table:
    return build_table(RECORDED if source is None else source, section, filters, now=now)


def test_workloads_have_istioctls_columns_sorted_by_namespace_and_name() -> None:
    shown = table(Section.WORKLOADS)
    assert shown.columns == ("NAMESPACE", "POD NAME", "ADDRESS", "NODE", "WAYPOINT", "PROTOCOL")
    assert shown.rows == (
        ("apps", "client", "198.18.16.5", "node-1", "None", "HBONE"),
        ("apps", "legacy", "198.18.16.9", "node-1", "waypoint", "TCP"),  # waypoint named by its VIP
        ("apps", "server", "198.18.17.7", "node-2", "waypoint", "HBONE"),  # by hostname
        ("istio-system", "waypoint-0", "198.18.17.3", "node-2", "None", "HBONE"),
    )


def test_workloads_filter_by_namespace_and_address_case_insensitively() -> None:
    assert [row[1] for row in table(Section.WORKLOADS, Filters(namespace="ISTIO-system")).rows] == ["waypoint-0"]
    assert [row[1] for row in table(Section.WORKLOADS, Filters(address="198.18.16.9")).rows] == ["legacy"]
    assert table(Section.WORKLOADS, Filters(namespace="apps", address="198.18.17.3")).rows == ()


def test_a_waypoint_the_dump_cannot_name_is_shown_as_the_dump_says_it() -> None:
    source = dump()
    source["services"] = [svc for svc in source["services"] if svc["name"] != "waypoint"]
    rows = {row[1]: row[4] for row in table(Section.WORKLOADS, source=source).rows}
    assert rows["server"] == "waypoint.apps.svc.cluster.local"
    assert rows["legacy"] == "/198.19.0.30"


def test_a_waypoint_named_by_a_workloads_address_shows_that_workloads_whole_name() -> None:
    source = dump()
    source["workloads"][3]["name"] = "waypoint.v2-0"  # pod names may have dots
    source["workloads"][1]["waypoint"] = {"address": "/198.18.17.3", "hboneMtlsPort": 15008}
    rows = {row[1]: row[4] for row in table(Section.WORKLOADS, source=source).rows}
    assert rows["legacy"] == "waypoint.v2-0"


def test_services_count_healthy_and_all_endpoints() -> None:
    shown = table(Section.SERVICES)
    assert shown.columns == ("NAMESPACE", "SERVICE NAME", "SERVICE VIP", "WAYPOINT", "ENDPOINTS")
    assert shown.rows == (
        ("apps", "echo", "198.19.0.20", "waypoint", "1/2"),
        ("apps", "waypoint", "198.19.0.30", "None", "0/0"),
    )
    assert table(Section.SERVICES, Filters(namespace="istio-system")).rows == ()


def test_a_service_with_a_canary_waypoint_shows_its_weighted_set_after_its_waypoint() -> None:
    primary = GatewayAddress(NamespacedHostname("apps", "waypoint.apps.svc.cluster.local"))
    canary = GatewayAddress(NamespacedHostname("infra", "canary.infra.svc.cluster.local"))
    service = Service(
        "reviews",
        "apps",
        "reviews.apps.svc.cluster.local",
        waypoint=primary,
        weighted_waypoints=(WeightedWaypoint(primary, 90), WeightedWaypoint(canary, 10)),
    )
    source = dump()
    source["services"].append(json.loads(json.dumps(service_to_dict(service))))  # the node proxy's dump shape
    rows = {row[1]: row[3] for row in table(Section.SERVICES, source=source).rows}
    assert rows["reviews"] == "waypoint(waypoint=90%,canary.infra.svc.cluster.local=10%)"
    assert rows["echo"] == "waypoint"  # no canary: istioctl's cell
    text = render_text([table(Section.SERVICES, source=source)])
    assert "waypoint(waypoint=90%,canary.infra.svc.cluster.local=10%) 0/0" in text


def test_policies_have_name_action_and_scope() -> None:
    shown = table(Section.POLICIES)
    assert shown.columns == ("NAMESPACE", "POLICY NAME", "ACTION", "SCOPE")
    assert shown.rows == (
        ("apps", "allow-client", "ALLOW", "NAMESPACE"),
        ("istio-system", "deny-all", "DENY", "GLOBAL"),
    )


def test_certificates_give_one_row_per_certificate_with_its_validity_at_now() -> None:
    shown = table(Section.CERTIFICATES)
    assert shown.columns == (
        "CERTIFICATE NAME",
        "TYPE",
        "STATUS",
        "VALID CERT",
        "SERIAL NUMBER",
        "NOT AFTER",
        "NOT BEFORE",
    )
    client = "spiffe://cluster.local/ns/apps/sa/client"
    assert [row[:4] for row in shown.rows] == [
        (client, "Leaf", "Available", "true"),
        (client, "Root", "Available", "true"),
        ("spiffe://cluster.local/ns/apps/sa/default", "Leaf", "Available", "true"),
        ("spiffe://cluster.local/ns/apps/sa/default", "Root", "Available", "true"),
    ]
    assert shown.rows[0][4:] == (LEAF["serialNumber"], LEAF["expirationTime"], LEAF["validFrom"])
    later = table(Section.CERTIFICATES, now=EXPIRES + 1)
    assert [row[3] for row in later.rows] == ["false", "true", "false", "true"]  # the roots last ten years


def test_a_certificate_not_issued_yet_or_refused_is_one_row_without_dates() -> None:
    source = dump()
    source["certificates"] = [
        {"identity": "spiffe://cluster.local/ns/a/sa/b", "state": "Initializing", "certChain": [], "rootCerts": []},
        {"identity": "spiffe://cluster.local/ns/a/sa/c", "state": "Unavailable: CA said no", "certChain": []},
    ]
    assert table(Section.CERTIFICATES, source=source).rows == (
        ("spiffe://cluster.local/ns/a/sa/b", "NA", "Initializing", "false", "NA", "NA", "NA"),
        ("spiffe://cluster.local/ns/a/sa/c", "NA", "Unavailable", "false", "NA", "NA", "NA"),
    )
    assert select_entries(source, Section.CERTIFICATES, Filters())[1]["state"] == "Unavailable: CA said no"


def test_connections_name_both_ends_unless_raw() -> None:
    shown = table(Section.CONNECTIONS)
    assert shown.columns == ("WORKLOAD", "DIRECTION", "LOCAL", "REMOTE", "AGE")
    assert shown.rows == (
        ("client.apps", "Inbound", "client.apps:15008", "server.apps:40112", "0s"),
        ("client.apps", "Outbound", "client.apps:51000", "echo.apps.svc.cluster.local:80", "0s"),
    )
    raw = table(Section.CONNECTIONS, Filters(raw=True, direction="outbound"))
    assert raw.rows == (("client.apps", "Outbound", "198.18.16.5:51000", "198.19.0.20:80", "0s"),)
    assert table(Section.CONNECTIONS, Filters(namespace="other")).rows == ()


@pytest.mark.parametrize(("seconds", "shown"), [(0.4, "0s"), (59, "59s"), (60, "1m"), (7200, "2h"), (200000, "2d")])
def test_connection_ages_are_kubectls_short_form(seconds: float, shown: str) -> None:
    source = dump()
    source["connections"] = source["connections"][:1]
    source["connections"][0]["ageSeconds"] = seconds
    assert table(Section.CONNECTIONS, source=source).rows[0][4] == shown


def test_a_waypoints_dump_without_pods_still_shows_its_workloads_but_not_connections() -> None:
    source = {"workloads": RECORDED["workloads"], "services": RECORDED["services"]}
    assert len(table(Section.WORKLOADS, source=source).rows) == 4
    with pytest.raises(ConfigDumpError, match=r"^config_dump has no 'pods' section \(is this a node proxy"):
        table(Section.CONNECTIONS, source=source)


def test_text_pads_columns_as_istioctl_and_titles_tables_when_asked() -> None:
    text = render_text([table(Section.POLICIES)])
    assert text == (
        "NAMESPACE    POLICY NAME  ACTION SCOPE\n"
        "apps         allow-client ALLOW  NAMESPACE\n"
        "istio-system deny-all     DENY   GLOBAL\n"
    )
    both = render_text([table(Section.POLICIES), table(Section.SERVICES)], titles=True)
    assert both.startswith("POLICIES:\nNAMESPACE") and "\n\nSERVICES:\nNAMESPACE" in both


def test_structured_output_is_the_dumps_own_entries_after_filters() -> None:
    picked = select_entries(RECORDED, Section.WORKLOADS, Filters(namespace="apps"))
    assert [w["name"] for w in picked] == ["client", "legacy", "server"]
    assert json.loads(render_structured(picked, "json")) == picked
    assert yaml.safe_load(render_structured(picked, "yaml")) == picked
    assert len(select_entries(RECORDED, Section.CERTIFICATES, Filters())) == 2  # one per identity, not per row


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("workloads"), r"^config_dump has no 'workloads' section"),
        (lambda d: d.update(workloads={}), r"^config_dump workloads: expected a list, got an object$"),
        (lambda d: d["workloads"].append(7), r"^config_dump workloads\[4\]: expected an object, got 7$"),
        (lambda d: d["workloads"][1].pop("name"), r"^config_dump workloads\[1\]: no 'name'$"),
        (lambda d: d["workloads"][0].update(workloadIps=["a", 5]), r"workloads\[0\]\.workloadIps\[1\]: .*got 5$"),
        (lambda d: d["workloads"][2].update(waypoint="w"), r"workloads\[2\]\.waypoint: expected an object"),
        (lambda d: d["workloads"][0].update(services=[]), r"workloads\[0\]\.services: expected an object"),
        (lambda d: d["services"][0].update(vips="/1.2.3.4"), r"services\[0\]\.vips: expected a list"),
        (lambda d: d["services"][0].update(hostname=None), r"services\[0\]\.hostname: expected a string, got null"),
        (lambda d: d["services"][0].update(weightedWaypoints={}), r"services\[0\]\.weightedWaypoints: expected a list"),
        (
            lambda d: d["services"][0].update(weightedWaypoints=[{"weight": 5}]),
            r"services\[0\]\.weightedWaypoints\[0\]: no 'destination'$",
        ),
        (
            lambda d: d["services"][0].update(
                weightedWaypoints=[{"destination": {"address": "/1.2.3.4"}, "weight": 101}]
            ),
            r"weightedWaypoints\[0\]\.weight: expected a percentage \(0 to 100\), got 101$",
        ),
        (
            lambda d: d["services"][0].update(weightedWaypoints=[{"destination": "w", "weight": 1}]),
            r"weightedWaypoints\[0\]\.destination: expected an object",
        ),
    ],
)
def test_a_malformed_dump_names_the_field(change: Any, message: str) -> None:
    source = dump()
    change(source)
    with pytest.raises(ConfigDumpError, match=message):
        for section in (Section.WORKLOADS, Section.SERVICES):
            table(section, source=source)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(expirationTime="tomorrow"), r"expirationTime: expected an RFC 3339 time, got \"tomorrow\""),
        (lambda c: c.update(validFrom="2026-13-45T00:00:00Z"), r"validFrom: expected an RFC 3339 time"),
        (lambda c: c.update(serialNumber=12), r"serialNumber: expected a string, got 12"),
    ],
)
def test_a_malformed_certificate_names_the_field(change: Any, message: str) -> None:
    source = dump()
    change(source["certificates"][0]["certChain"][0])
    with pytest.raises(ConfigDumpError, match=r"^config_dump certificates\[0\]\.certChain\[0\]\." + message):
        table(Section.CERTIFICATES, source=source)


@pytest.mark.parametrize("age", [True, "1s", float("nan"), float("inf")])
def test_a_connection_age_that_is_not_a_finite_number_is_refused(age: object) -> None:
    source = dump()
    source["connections"][0]["ageSeconds"] = age
    with pytest.raises(ConfigDumpError, match=r"connections\[0\]\.ageSeconds: expected a number"):
        table(Section.CONNECTIONS, source=source)


@pytest.mark.parametrize("text", [b"", b"\xff\xfe", b"nope", b"[" * 100000, b"1", b'"x"', b"null"])
def test_a_body_that_is_not_a_json_object_is_refused(text: bytes) -> None:
    with pytest.raises(ConfigDumpError, match=r"^config_dump"):
        read_config_dump(text)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:15000", "http://127.0.0.1:15000/config_dump"),
        ("https://proxy.example:8443/admin/", "https://proxy.example:8443/admin/config_dump"),
    ],
)
def test_the_config_dump_url_is_under_the_admin_url(url: str, expected: str) -> None:
    assert config_dump_url(url) == expected


@pytest.mark.parametrize("url", ["", "ftp://x/", "http://", "http://h:0x/", "http://h/#f", "//h:1"])
def test_a_bad_admin_url_is_refused(url: str) -> None:
    with pytest.raises(AdminFetchError, match=r"^bad admin URL"):
        config_dump_url(url)


# --- hypothesis: whatever a dump holds, one clear error or a table ----------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


PATHS = [path for path in _paths(RECORDED) if path]


def _check_every_view(source: Any) -> None:
    for section in Section:
        try:
            shown = build_table(source, section, Filters(), now=NOW)
        except ConfigDumpError as exc:
            assert str(exc).startswith("config_dump") and "\n" not in str(exc)
            continue
        text = render_text([shown])
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", text)
        select_entries(source, section, Filters())


@settings(max_examples=300, deadline=None)
@given(path=st.sampled_from(PATHS), value=JSON, delete=st.booleans())
def test_any_field_of_a_real_dump_replaced_or_removed_gives_a_table_or_one_clear_error(
    path: tuple[Any, ...], value: Any, delete: bool
) -> None:
    source = dump()
    parent: Any = source
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    _check_every_view(source)


@settings(max_examples=200, deadline=None)
@given(document=st.dictionaries(st.sampled_from([s.value for s in Section] + ["pods", "x"]), JSON, max_size=6))
def test_any_json_object_gives_a_table_or_one_clear_error(document: dict[str, Any]) -> None:
    _check_every_view(read_config_dump(json.dumps(document)))


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=64))
def test_any_body_is_a_json_object_or_one_clear_error(body: bytes) -> None:
    try:
        read_config_dump(body)
    except ConfigDumpError as exc:
        assert "\n" not in str(exc)
