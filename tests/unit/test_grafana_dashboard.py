"""deploy/grafana/ambit-mesh-dashboard.json asks only for metrics and labels the proxies really export (issue 20).

The names are read from what a node proxy's and a waypoint's metrics render after one connection, one denial, one
request and one DNS query, so a renamed metric or label fails here rather than on a user's empty panel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ambit.telemetry.metrics import DnsLabels, ProxyMetrics, Reporter, TrafficLabels
from ambit.waypoint.telemetry import WaypointMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "ambit-mesh-dashboard.json"
METRIC = re.compile(r"\b(istio_[a-z_]+)\b")
MATCHER = re.compile(r"([a-z_]+)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")


def exported() -> tuple[set[str], set[str]]:
    """The sample names and label names the proxies render."""
    node, waypoint = ProxyMetrics(build_version="t"), WaypointMetrics(build_version="t")
    labels = TrafficLabels(Reporter.DESTINATION, source_workload="a", destination_workload="b")
    node.connection_opened(node.shared_labels(labels)).close()
    node.connection_failed(TrafficLabels(Reporter.DESTINATION, response_flags="DENY"))
    node.dns_request(DnsLabels(request_query_type="a"))
    node.dns_forwarded(DnsLabels(request_query_type="a"), 0.01, failed=False)
    waypoint.request(
        TrafficLabels(Reporter.WAYPOINT), response_code=403, duration_ms=1.0, request_bytes=1, response_bytes=2
    )
    names: set[str] = set()
    label_names: set[str] = set()
    for metrics in (node, waypoint):
        for family in text_string_to_metric_families(metrics.render().decode()):
            for sample in family.samples:
                names.add(sample.name)
                label_names.update(sample.labels)
    return names, label_names


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_every_query_names_exported_metrics_and_labels() -> None:
    names, label_names = exported()
    exprs = expressions()
    assert len(exprs) >= 10
    for expr in exprs:
        used = set(METRIC.findall(expr))
        assert used and used <= names, (expr, used - names)
        matched = set(MATCHER.findall(expr))
        grouped = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}
        assert (matched | grouped) - {"le"} <= label_names, (expr, (matched | grouped) - label_names)


def test_the_dashboard_is_grafana_json_with_unique_panel_ids_and_the_namespace_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "ambit-mesh"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace"}
    assert all("$namespace" in e for e in expressions() if "destination_workload_namespace" in e)
