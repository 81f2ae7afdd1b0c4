"""The waypoint inbound binding (waypoint_gateways rule 12, istiod's ``makeInboundBinding``): the annotation
``ambient.istio.io/waypoint-inbound-binding`` on a Gateway or its GatewayClass becomes the ``application_tunnel`` of
the Gateway's own pods, with the objects as users write them (Istio's sandwich guide)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.waypoint_gateways import INBOUND_BINDING
from ambit.controlplane.translate.waypoints import WaypointIndex
from ambit.model.errors import LocalConfigError
from ambit.model.localconfig import parse_local_config
from ambit.model.localconfig_forms import workload_to_dict
from ambit.model.workload import ApplicationTunnel, AppTunnelProtocol
from ambit.xds.convert import address_from_proto, address_of
from ambit.xds.errors import XdsConversionError

Obj = dict[str, Any]

GATEWAY = yaml.safe_load(
    """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: ingress-sandwich
  namespace: echo
  uid: gw-uid
  labels:
    istio.io/dataplane-mode: ambient
  annotations:
    ambient.istio.io/waypoint-inbound-binding: PROXY/15088
spec:
  gatewayClassName: istio
  listeners:
  - name: proxy-tunnel
    port: 15088
    protocol: istio.io/PROXY
    allowedRoutes:
      namespaces:
        from: All
  - name: http
    hostname: captured.echo.svc.cluster.local
    port: 80
    protocol: HTTP
status:
  addresses:
  - type: Hostname
    value: ingress-sandwich-istio.echo.svc.cluster.local
"""
)
GATEWAY_CLASS = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "istio"}}
PROXY_15088 = ApplicationTunnel(AppTunnelProtocol.PROXY, 15088)


def gateway(annotation: str | None) -> Obj:
    out: Obj = yaml.safe_load(yaml.safe_dump(GATEWAY))
    if annotation is None:
        del out["metadata"]["annotations"][INBOUND_BINDING]
    else:
        out["metadata"]["annotations"][INBOUND_BINDING] = annotation
    return out


def gateway_class(annotation: str | None) -> Obj:
    out: Obj = yaml.safe_load(yaml.safe_dump(GATEWAY_CLASS))
    if annotation is not None:
        out["metadata"]["annotations"] = {INBOUND_BINDING: annotation}
    return out


def pod(name: str, ip: str, **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "echo", "uid": f"{name}-uid", "labels": labels},
        "spec": {"serviceAccountName": "ingress-sandwich-istio"},
        "status": {"phase": "Running", "podIP": ip},
    }


GATEWAY_POD = pod(
    "ingress-sandwich-istio-1", "198.18.1.20", **{"gateway.networking.k8s.io/gateway-name": "ingress-sandwich"}
)
OTHER_POD = pod("client", "198.18.1.21", app="client")


def translate(gateways: list[Obj], classes: list[Obj]) -> Any:
    return translate_all(
        [GATEWAY_POD, OTHER_POD], [], [], [{"metadata": {"name": "echo"}}], gateways=gateways, gateway_classes=classes
    )


def tunnels(out: Any) -> dict[str, ApplicationTunnel | None]:
    return {w.name: w.application_tunnel for w in out.config.workloads}


def test_the_gateways_own_pods_get_the_application_tunnel_and_others_do_not() -> None:
    out = translate([GATEWAY], [gateway_class(None)])
    assert tunnels(out) == {"ingress-sandwich-istio-1": PROXY_15088, "client": None}
    assert out.skipped == ()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("PROXY", ApplicationTunnel(AppTunnelProtocol.PROXY, 0)),
        ("PROXY/15088", PROXY_15088),
        ("NONE", ApplicationTunnel(AppTunnelProtocol.NONE, 0)),
        ("NONE/8080", ApplicationTunnel(AppTunnelProtocol.NONE, 8080)),
        ("PROXY/0", ApplicationTunnel(AppTunnelProtocol.PROXY, 0)),
        ("PROXY/015088", PROXY_15088),
    ],
)
def test_valid_values_read_as_istiod_reads_them(value: str, expected: ApplicationTunnel) -> None:
    out = translate([gateway(value)], [])
    assert tunnels(out)["ingress-sandwich-istio-1"] == expected
    assert out.skipped == ()


@pytest.mark.parametrize(
    ("value", "expected", "reason"),
    [
        ("PROXY/1/2", None, "must be of the format"),
        ("proxy", None, "invalid protocol 'proxy'"),
        ("HTTP/15088", None, "invalid protocol 'HTTP'"),
        ("", None, "invalid protocol ''"),
        ("PROXY/", ApplicationTunnel(AppTunnelProtocol.PROXY), "invalid port ''"),
        ("PROXY/http", ApplicationTunnel(AppTunnelProtocol.PROXY), "invalid port 'http'"),
        ("PROXY/70000", ApplicationTunnel(AppTunnelProtocol.PROXY), "invalid port '70000'"),
        ("PROXY/-1", ApplicationTunnel(AppTunnelProtocol.PROXY), "invalid port '-1'"),
        ("PROXY/\uff11\uff15\uff10\uff18\uff18", ApplicationTunnel(AppTunnelProtocol.PROXY), "invalid port"),
    ],
)
def test_invalid_values_are_warned_about_on_the_gateway_and_ignored_as_istiod_does(
    value: str, expected: ApplicationTunnel | None, reason: str
) -> None:
    out = translate([gateway(value)], [])
    assert tunnels(out)["ingress-sandwich-istio-1"] == expected
    (problem,) = out.skipped
    assert (problem.kind, problem.namespace, problem.name, problem.uid) == (
        "Gateway",
        "echo",
        "ingress-sandwich",
        "gw-uid",
    )
    assert problem.field == f"metadata.annotations['{INBOUND_BINDING}']"
    assert reason in problem.reason


def test_the_gateway_class_gives_the_default_and_the_gateways_own_annotation_wins() -> None:
    out = translate([gateway(None)], [gateway_class("PROXY/15099")])
    assert tunnels(out)["ingress-sandwich-istio-1"] == ApplicationTunnel(AppTunnelProtocol.PROXY, 15099)
    out = translate([gateway("NONE")], [gateway_class("PROXY/15099")])
    assert tunnels(out)["ingress-sandwich-istio-1"] == ApplicationTunnel(AppTunnelProtocol.NONE)


def test_a_bad_class_annotation_is_warned_about_on_the_class() -> None:
    out = translate([gateway(None)], [gateway_class("TCP")])
    assert tunnels(out)["ingress-sandwich-istio-1"] is None
    (problem,) = out.skipped
    assert (problem.kind, problem.namespace, problem.name) == ("GatewayClass", "", "istio")


def test_without_the_annotation_nothing_changes() -> None:
    out = translate([gateway(None)], [gateway_class(None)])
    assert tunnels(out) == {"ingress-sandwich-istio-1": None, "client": None}


def test_a_gateway_not_yet_ready_still_binds_its_pods() -> None:
    unready = gateway("PROXY/15088")
    del unready["status"]
    index = WaypointIndex.build([unready], [], [], network="")
    assert index.ready == {}
    labels = GATEWAY_POD["metadata"]["labels"]
    assert index.find_application_tunnel("echo", labels) == PROXY_15088
    assert index.find_application_tunnel("other", labels) is None


def test_the_bound_listener_says_which_namespaces_may_bind() -> None:
    # The PROXY listener admits All; without the binding the Gateway (no HBONE listener) admits its own only.
    bound = WaypointIndex.build([GATEWAY], [], [], network="").ready["echo/ingress-sandwich"]
    assert bound.allowed_from == "All"
    unbound = WaypointIndex.build([gateway(None)], [], [], network="").ready["echo/ingress-sandwich"]
    assert unbound.allowed_from == "Same"
    by_protocol = WaypointIndex.build([gateway("PROXY")], [], [], network="").ready["echo/ingress-sandwich"]
    assert by_protocol.allowed_from == "All"


def test_the_application_tunnel_goes_over_the_wire_and_back() -> None:
    out = translate([GATEWAY], [])
    (workload,) = [w for w in out.config.workloads if w.application_tunnel is not None]
    message = address_of(workload)
    assert (message.workload.application_tunnel.protocol, message.workload.application_tunnel.port) == (1, 15088)
    assert address_from_proto(message) == workload


def test_a_tunnel_protocol_this_build_does_not_know_is_refused_on_decoding() -> None:
    out = translate([GATEWAY], [])
    (workload,) = [w for w in out.config.workloads if w.application_tunnel is not None]
    message = address_of(workload)
    message.workload.application_tunnel.protocol = 7  # type: ignore[assignment]
    with pytest.raises(XdsConversionError, match=r"application_tunnel\.protocol: unsupported value 7"):
        address_from_proto(message)


def test_the_local_config_file_form_keeps_it() -> None:
    out = translate([GATEWAY], [])
    (workload,) = [w for w in out.config.workloads if w.application_tunnel is not None]
    text = yaml.safe_dump({"workloads": [workload_to_dict(workload)]})
    (read,) = parse_local_config(text).workloads
    assert read.application_tunnel == PROXY_15088
    bad = text.replace("port: 15088", "port: 70000")
    with pytest.raises(LocalConfigError, match=r"applicationTunnel\.port: expected a port number 0\.\.65535"):
        parse_local_config(bad)
