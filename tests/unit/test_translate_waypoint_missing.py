"""``istio.io/WaypointMissing`` on ServiceEntries (rule 11 of :mod:`ambit.controlplane.translate.waypoint_status`;
istiod's ``ServiceInfo.GetConditions``, upstream TestWaypointDNSConnectStrategy and the wildcard egress tests): set True
while a wildcard entry or one with ``istio.io/connect-strategy: RACE_FIRST_TCP_CONNECT`` has no waypoint, gone once it
is bound or neither holds; and the writer carries it beside ``WaypointBound`` in one patch."""

from __future__ import annotations

from typing import Any

import pytest

from ambit.controlplane.status import PolicyStatusWriter
from ambit.controlplane.translate import PolicyStatus, translate_all
from ambit.controlplane.translate.waypoint_status import WAYPOINT_BOUND, WAYPOINT_MISSING
from ambit.k8s import kinds

Obj = dict[str, Any]
WILDCARD_MESSAGE = "ServiceEntry will not apply until it is bound to a valid waypoint."
RACING_MESSAGE = (
    "ServiceEntry has a non-default connect strategy but no waypoint bound. "
    "A waypoint is required for connect strategies to take effect for ambient clients."
)


def waypoint() -> Obj:
    listener = {"name": "mesh", "port": 15008, "protocol": "HBONE"}
    return {
        "metadata": {"name": "waypoint", "namespace": "egress"},
        "spec": {"gatewayClassName": "istio-waypoint", "listeners": [listener]},
        "status": {"addresses": [{"type": "Hostname", "value": "waypoint.egress.svc.cluster.local"}]},
    }


def entry(hosts: list[str], *, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> Obj:
    """An egress entry as upstream writes them (DYNAMIC_DNS for a wildcard, DNS otherwise)."""
    wildcard = any(h.startswith("*") for h in hosts)
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {
            "name": "external",
            "namespace": "egress",
            "generation": 4,
            "annotations": annotations or {},
            "labels": labels or {},
        },
        "spec": {
            "hosts": hosts,
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "resolution": "DYNAMIC_DNS" if wildcard else "DNS",
        },
    }


def conditions(obj: Obj) -> dict[str, PolicyStatus]:
    translation = translate_all(
        [], [], [], [{"metadata": {"name": "egress"}}], service_entries=[obj], gateways=[waypoint()]
    )
    return {s.type: s for s in translation.service_entry_status}


def test_a_wildcard_entry_without_a_waypoint_is_missing_one() -> None:
    found = conditions(entry(["*.example.com"]))
    assert set(found) == {WAYPOINT_MISSING}
    missing = found[WAYPOINT_MISSING]
    assert (missing.key, missing.accepted, missing.reason, missing.message, missing.generation) == (
        "egress/external",
        True,
        "NoWaypointForWildcardService",
        WILDCARD_MESSAGE,
        4,
    )


@pytest.mark.parametrize("value", ["RACE_FIRST_TCP_CONNECT", "race_first_tcp_connect", "Race_First_Tcp_Connect"])
def test_a_racing_connect_strategy_without_a_waypoint_is_missing_one_in_any_case(value: str) -> None:
    missing = conditions(entry(["api.example.com"], annotations={"istio.io/connect-strategy": value}))[WAYPOINT_MISSING]
    assert (missing.accepted, missing.reason, missing.message) == (
        True,
        "NoWaypointForRacingConnectStrategy",
        RACING_MESSAGE,
    )


def test_the_connect_strategy_reason_wins_over_the_wildcard_one() -> None:
    obj = entry(["*.example.com"], annotations={"istio.io/connect-strategy": "RACE_FIRST_TCP_CONNECT"})
    assert conditions(obj)[WAYPOINT_MISSING].reason == "NoWaypointForRacingConnectStrategy"


@pytest.mark.parametrize("value", ["", "DEFAULT", "RACE_FIRST", "RACE_FIRST_TCP_CONNECT "])
def test_another_strategy_or_a_plain_host_is_not_missing_anything(value: str) -> None:
    assert conditions(entry(["api.example.com"], annotations={"istio.io/connect-strategy": value})) == {}


def test_a_bound_entry_is_not_missing_its_waypoint() -> None:
    obj = entry(
        ["*.example.com"],
        annotations={"istio.io/connect-strategy": "RACE_FIRST_TCP_CONNECT"},
        labels={"istio.io/use-waypoint": "waypoint"},
    )
    found = conditions(obj)
    assert set(found) == {WAYPOINT_BOUND}
    assert found[WAYPOINT_BOUND].message == "Successfully attached to waypoint egress/waypoint"


def test_a_waypoint_that_is_not_ready_leaves_both_conditions() -> None:
    obj = entry(["*.example.com"], labels={"istio.io/use-waypoint": "nowhere"})
    found = conditions(obj)
    assert (found[WAYPOINT_BOUND].accepted, found[WAYPOINT_BOUND].reason) == (False, "WaypointIsNotReady")
    assert found[WAYPOINT_MISSING].reason == "NoWaypointForWildcardService"


def test_a_bound_racing_entry_tells_its_waypoint_to_race_its_hosts_and_no_other() -> None:
    racing = entry(
        ["api.example.com", "api2.example.com"],
        annotations={"istio.io/connect-strategy": "race_first_tcp_connect"},
        labels={"istio.io/use-waypoint": "waypoint"},
    )
    plain = entry(["plain.example.com"], labels={"istio.io/use-waypoint": "waypoint"})
    plain["metadata"]["name"] = "plain"
    translation = translate_all(
        [], [], [], [{"metadata": {"name": "egress"}}], service_entries=[racing, plain], gateways=[waypoint()]
    )
    (config,) = translation.waypoint_configs
    assert config.services == ("egress/api.example.com", "egress/api2.example.com", "egress/plain.example.com")
    assert config.race_first_connect == ("egress/api.example.com", "egress/api2.example.com")


class _Client:
    """Never called: the writer's plan is pure and tested here without I/O."""


def writer() -> PolicyStatusWriter:
    return PolicyStatusWriter(
        _Client(),  # type: ignore[arg-type]
        list,
        clock=lambda: 0.0,
        kind=kinds.SERVICE_ENTRIES,
        condition_type=WAYPOINT_BOUND,
        more_types=(WAYPOINT_MISSING,),
    )


def test_the_writer_adds_the_condition_then_removes_it_once_it_no_longer_holds() -> None:
    w = writer()
    obj = entry(["api.example.com"], annotations={"istio.io/connect-strategy": "RACE_FIRST_TCP_CONNECT"})
    w.submit(translate_all([], [], [], [], service_entries=[obj]).service_entry_status)
    planned = w._plan({}, "egress/external", "egress", "2026-12-03T07:00:00Z")
    assert planned is not None
    (written,) = planned["conditions"]
    assert {k: written[k] for k in ("type", "status", "reason", "observedGeneration")} == {
        "type": WAYPOINT_MISSING,
        "status": "True",
        "reason": "NoWaypointForRacingConnectStrategy",
        "observedGeneration": 4,
    }
    # The same again: nothing to write.
    assert w._plan({"conditions": [written]}, "egress/external", "egress", "2026-12-03T07:01:00Z") is None
    # The annotation is removed (an Update, as the upstream test does): the condition goes, others stay.
    other = {"type": "Reconciled", "status": "True"}
    del obj["metadata"]["annotations"]["istio.io/connect-strategy"]
    w.submit(translate_all([], [], [], [], service_entries=[obj]).service_entry_status)
    planned = w._plan({"conditions": [other, written]}, "egress/external", "egress", "2026-12-03T07:02:00Z")
    assert planned == {"conditions": [other]}


def test_the_writer_writes_bound_and_missing_in_one_patch() -> None:
    w = writer()
    obj = entry(["*.example.com"], labels={"istio.io/use-waypoint": "nowhere"})
    w.submit(translate_all([], [], [], [], service_entries=[obj]).service_entry_status)
    planned = w._plan({}, "egress/external", "egress", "2026-12-03T07:00:00Z")
    assert planned is not None
    assert [c["type"] for c in planned["conditions"]] == [WAYPOINT_BOUND, WAYPOINT_MISSING]
