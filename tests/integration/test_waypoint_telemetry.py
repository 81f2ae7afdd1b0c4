"""The Telemetry API's metric overrides through a real waypoint (spec §11.3 TestCustomizeMetrics): upstream's
Telemetry object, translated by the control plane's translator, sent in WaypointConfig field 7 (encoded and
decoded as on the xDS stream), changes the scraped ``istio_requests_total`` series of the Service it targets and
no other; a header-valued tag takes each request's value; a hostile header value cannot break the exposition."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from tests.integration.waypoint_rig import ECHO_VIP, MIXED_VIP, HttpOverTunnel, Rig, http_get, started_rig
from tests.upstream_objects import customize_metrics_telemetry

from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.telemetry import ServiceRef, translate_telemetry, waypoint_metrics
from ambit.model.routes import WaypointConfig
from ambit.waypoint.settings import WaypointLimits
from ambit.xds.routes import decode_waypoint_config, pack_waypoint_config, waypoint_config_to_proto

LIMITS = WaypointLimits(max_head_bytes=8 * 1024, head_timeout=0.5, sniff_timeout=0.5, startup_wait=5.0)
ECHO, MIXED = "app/echo.app.svc.cluster.local", "app/mixed.app.svc.cluster.local"
PRINCIPAL = "spiffe://cluster.local/ns/app/sa/client"


def upstream_telemetry(service: str, **extra_tags: dict[str, str]) -> dict[str, Any]:
    """TestCustomizeMetrics' object, targeting ``service``."""
    return customize_metrics_telemetry(service, "app", **extra_tags)


def configure(rig: Rig, telemetry: dict[str, Any]) -> None:
    """Translate ``telemetry`` for the rig's waypoint and hand the result over as the xDS client would."""
    skips: list[Skipped] = []
    translated = translate_telemetry(telemetry, skips=skips)
    assert translated is not None and skips == []
    services = {ECHO: ServiceRef("Service", "app", "echo"), MIXED: ServiceRef("Service", "app", "mixed")}
    found = waypoint_metrics(
        [translated],
        waypoints=["app/waypoint"],
        services=services,
        bound=dict.fromkeys(services, "app/waypoint"),
        canaries={},
        root_namespace="istio-system",
    )
    config = WaypointConfig("app/waypoint", metrics=found["app/waypoint"])
    wire = pack_waypoint_config(waypoint_config_to_proto(config))
    rig.waypoint.context.routes.replace(decode_waypoint_config("app/waypoint", wire))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, LIMITS) as rig:
        yield rig


async def requests_total(rig: Rig) -> list[Sample]:
    status, text = await http_get(f"http://127.0.0.1:{rig.settings.stats_port}/metrics")
    assert status == 200
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "istio_requests_total"]


async def send(rig: Rig, vip: str, host: str, count: int, headers: list[tuple[str, str]] | None = None) -> None:
    client, stream = await rig.tunnel(f"{vip}:80")
    http = HttpOverTunnel(stream, host=host)
    for _ in range(count):
        await http.request("GET", "/echo", headers=headers)
    await client.aclose()


async def test_upstreams_telemetry_relabels_its_services_series_and_leaves_another_services_alone(rig: Rig) -> None:
    configure(rig, upstream_telemetry("echo"))
    await send(rig, ECHO_VIP, "echo.app.svc.cluster.local", 4)
    await send(rig, MIXED_VIP, "mixed.app.svc.cluster.local", 2)
    samples = await requests_total(rig)
    echo = [s for s in samples if s.labels["destination_service"] == "echo.app.svc.cluster.local"]
    mixed = [s for s in samples if s.labels["destination_service"] == "mixed.app.svc.cluster.local"]
    assert echo and sum(s.value for s in echo) == 4
    for s in echo:
        assert s.labels["custom_dimension"] == "test" and "source_principal" not in s.labels
        assert s.labels["reporter"] == "waypoint" and s.labels["response_code"] == "200"
    assert mixed and sum(s.value for s in mixed) == 2
    for s in mixed:
        assert "custom_dimension" not in s.labels and s.labels["source_principal"] == PRINCIPAL
    # the histograms were not overridden: both services keep the standard labels there
    _, text = await http_get(f"http://127.0.0.1:{rig.settings.stats_port}/metrics")
    assert "custom_dimension" not in "".join(
        line for line in text.splitlines() if line.startswith("istio_request_duration_milliseconds")
    )


async def test_a_header_tag_takes_each_requests_value_and_a_hostile_value_stays_one_label(rig: Rig) -> None:
    configure(rig, upstream_telemetry("echo", tenant={"value": "request.headers['x-tenant']"}))
    await send(rig, ECHO_VIP, "echo.app.svc.cluster.local", 2, [("x-tenant", "a")])
    await send(rig, ECHO_VIP, "echo.app.svc.cluster.local", 1, [("x-tenant", 'b"} 99 fake_metric{x="1')])
    await send(rig, ECHO_VIP, "echo.app.svc.cluster.local", 1)
    samples = await requests_total(rig)
    by_tenant: dict[str, float] = {}
    for s in samples:
        by_tenant[s.labels["tenant"]] = by_tenant.get(s.labels["tenant"], 0) + s.value
    assert by_tenant["a"] == 2 and by_tenant["unknown"] == 1
    (hostile,) = set(by_tenant) - {"a", "unknown"}
    assert by_tenant[hostile] == 1 and "fake_metric" in hostile  # escaped inside the label, not a new sample
    _, text = await http_get(f"http://127.0.0.1:{rig.settings.stats_port}/metrics")
    assert not any(line.startswith("fake_metric") for line in text.splitlines())
