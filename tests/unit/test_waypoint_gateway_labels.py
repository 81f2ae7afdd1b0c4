"""An ingress gateway's metric labels (ambit.waypoint.context ``Tunnel.labels`` with a ``SelfReport``): Istio's
gateways report client-side, the gateway itself the source, principals only over its own mutual TLS upstream."""

from __future__ import annotations

import ipaddress

from ambit.model.identity import SpiffeId
from ambit.model.workload import AppProtocol, Service, TunnelProtocol, Workload
from ambit.telemetry.metrics import Reporter, SecurityPolicy
from ambit.waypoint.context import SelfReport, Tunnel
from ambit.waypoint.destinations import ServiceTarget

GATEWAY = Workload(
    "Kubernetes//Pod/edge/gw-istio-1",
    "gw-istio-1",
    "edge",
    (ipaddress.ip_address("198.18.0.5"),),
    service_account="gw-istio",
    canonical_name="gw-istio",
    canonical_revision="latest",
    workload_name="gw-istio",
)
GATEWAY_ID = SpiffeId("cluster.local", "edge", "gw-istio")
CLIENT = SpiffeId("cluster.local", "apps", "client")
MESHED = Workload(
    "Kubernetes//Pod/app/echo-1", "echo-1", "app", (ipaddress.ip_address("198.18.1.9"),),
    tunnel_protocol=TunnelProtocol.HBONE, service_account="echo", workload_name="echo",
)  # fmt: skip
PLAIN = Workload("Kubernetes//Pod/app/old-1", "old-1", "app", (ipaddress.ip_address("198.18.1.10"),))
SERVICE = Service("echo", "app", "echo.app.svc.cluster.local")


def tunnel(report: SelfReport | None, *, client: SpiffeId | None = None) -> Tunnel:
    target = ServiceTarget(Service("gw", "edge", ""), 80, AppProtocol.HTTP11)
    return Tunnel(target, "198.18.0.5:80", client, "203.0.113.7:4000", None, Reporter.SOURCE, mtls=client is not None,
                  self_report=report)  # fmt: skip


def test_the_gateway_is_the_source_and_its_mesh_upstream_gives_both_principals() -> None:
    labels = tunnel(SelfReport(GATEWAY, GATEWAY_ID)).labels(MESHED, SERVICE)
    assert (labels.source_workload, labels.source_workload_namespace) == ("gw-istio", "edge")
    assert (labels.source_canonical_service, labels.source_principal) == ("gw-istio", str(GATEWAY_ID))
    assert labels.destination_principal == "spiffe://cluster.local/ns/app/sa/echo"
    assert labels.connection_security_policy is SecurityPolicy.UNKNOWN


def test_a_plain_upstream_or_a_captured_gateway_has_no_principals() -> None:
    plain = tunnel(SelfReport(GATEWAY, GATEWAY_ID)).labels(PLAIN, SERVICE)
    assert (plain.source_principal, plain.destination_principal) == ("", "")
    captured = tunnel(SelfReport(GATEWAY, None)).labels(MESHED, SERVICE)  # its node proxy does the mutual TLS
    assert (captured.source_workload, captured.source_principal, captured.destination_principal) == ("gw-istio", "", "")


def test_a_client_its_node_proxy_named_is_reported_as_the_source_without_a_self_report() -> None:
    labels = tunnel(None, client=CLIENT).labels(MESHED, SERVICE)
    assert labels.source_principal == str(CLIENT)
    assert labels.connection_security_policy is SecurityPolicy.MUTUAL_TLS
