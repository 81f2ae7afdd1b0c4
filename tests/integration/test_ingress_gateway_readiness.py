"""An ingress gateway fed by the control plane is ready once the control plane has answered for its config, also
when the answer is that there is none: nothing selects the gateway yet (istio-ingressgateway installed before any
Istio Gateway names it). Istio's gateway is ready then, with no listeners; Ambit's waited for ever.

The gateway's subscription goes through the real client and server sessions (``ClientSession`` opening, the
``ServerSession`` answering from the control plane's table of gateway configs) and the update into the gateway's
own xDS hook, as its xDS client hands it over."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.integration.waypoint_rig import Rig, free_port

from ambit.model.ingress import GatewayConfig
from ambit.waypoint.ingress import CONFIG_TASK, IngressGateway
from ambit.waypoint.settings import WaypointLimits
from ambit.xds.client_session import ClientSession
from ambit.xds.gateway import (
    GATEWAY_CONFIG_TYPE_URL,
    decode_gateway_config,
    gateway_config_to_proto,
    pack_gateway_config,
)
from ambit.xds.resource_set import ResourceSet, XdsResource
from ambit.xds.session import ServerSession


def fed_gateway(tmp_path: Path) -> IngressGateway:
    local = Rig(tmp_path, WaypointLimits())
    settings = dataclasses.replace(
        local.settings,
        namespace="istio-system",
        gateway_name="istio-ingressgateway",
        config_file=None,
        xds_address=f"127.0.0.1:{free_port()}",
        root_cert_file=tmp_path / "root",
    )
    return IngressGateway(settings)


def answer(gateway: IngressGateway, table: ResourceSet) -> None:
    """Open the gateway's subscription, let the server answer from ``table``, hand the update to the gateway."""
    client = ClientSession(
        {GATEWAY_CONFIG_TYPE_URL: decode_gateway_config}, named={GATEWAY_CONFIG_TYPE_URL: (gateway.config_name,)}
    )
    (opening,) = client.initial_requests()
    (response,) = ServerSession().receive(opening, table).responses
    gateway._config_changed(client.apply(response))


def test_a_gateway_nothing_selects_is_ready_once_the_control_plane_answers_that_it_has_no_config(
    tmp_path: Path,
) -> None:
    gateway = fed_gateway(tmp_path)
    assert CONFIG_TASK in gateway.readiness.pending()
    answer(gateway, ResourceSet.build(()))
    assert CONFIG_TASK not in gateway.readiness.pending()
    assert gateway.router.config.listeners == () and gateway.config_updates == 0


def test_a_gateway_with_a_config_is_ready_with_it(tmp_path: Path) -> None:
    gateway = fed_gateway(tmp_path)
    config = GatewayConfig(gateway.config_name)
    body = pack_gateway_config(gateway_config_to_proto(config))
    answer(gateway, ResourceSet.build([XdsResource(gateway.config_name, "1", body)]))
    assert CONFIG_TASK not in gateway.readiness.pending() and gateway.config_updates == 1
