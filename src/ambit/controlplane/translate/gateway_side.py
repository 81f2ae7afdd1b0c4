"""The gateway stage of a translation: Istio's own Gateways, the policies at ingress gateways, the EnvoyFilters, and
every waypoint's and gateway's config but its DestinationRules.

Theory of operation: :func:`gateway_side` reads the service stage's value
(:class:`~ambit.controlplane.translate.service_side.ServiceSide`) and the objects the waypoints' and gateways'
configs still need: Istio Gateways with the pods they select, the VirtualServices bound to them, the
AuthorizationPolicies and RequestAuthentications that apply at ingress gateways, and the EnvoyFilters. Its value,
:class:`GatewaySide`, holds each config finished but for its ``destination_rules``, which read the workloads' labels
(DestinationRule subsets) and are filled in by the translation only where a DestinationRule exists.

Rules:

1. The pods take part only through the Istio Gateways' selectors and the Services that Gateway API Gateways
   deployed by hand name: with neither, the value does not depend on any pod
   (:mod:`~ambit.controlplane.translate.stage_memo` rule 5).
2. A config's ``destination_rules`` here are what no DestinationRule gives: none for a waypoint, only the
   gateway's own client certificate for an ingress gateway.
3. A Gateway deployed by hand (:mod:`~ambit.controlplane.translate.manual_gateways`) is read by the service account
   of the first pod behind the Services it names, and policies select it by that pod's labels; with no such pod,
   no one reads its config.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ambit.controlplane.translate.backendtls import with_gateway_client_certificate
from ambit.controlplane.translate.envoyfilter_routes import merge_routes
from ambit.controlplane.translate.envoyfilters import IngressProxy, PatchNote, translate_envoy_filters
from ambit.controlplane.translate.fields import mapping as _mapping
from ambit.controlplane.translate.fields import strings as _strings
from ambit.controlplane.translate.fields import text as _text
from ambit.controlplane.translate.gateway_policies import (
    IngressPods,
    gateway_authorization_policies,
    gateway_request_authentications,
)
from ambit.controlplane.translate.istio_gateways import translate_istio_gateways
from ambit.controlplane.translate.manual_gateways import backing_pod
from ambit.controlplane.translate.meshconfig import MeshConfig
from ambit.controlplane.translate.service_side import ServiceSide
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.waypoint_policies import policies_for, translate_selected_policy
from ambit.model.envoyfilter import ProxyPatches
from ambit.model.ingress import ForwardClientCert, GatewayConfig
from ambit.model.routes import WaypointConfig

__all__ = ["GatewaySide", "gateway_side"]

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class GatewaySide:
    """The gateway stage's value."""

    waypoint_configs: tuple[WaypointConfig, ...]
    """Each ready waypoint's config, ``destination_rules`` left empty (rule 2)."""
    gateway_configs: tuple[GatewayConfig, ...]
    """Each ingress gateway's config, Gateway API's then Istio's, ``destination_rules`` as rule 2 says."""
    gateway_accounts: tuple[tuple[str, str], ...]
    gateway_labels: Mapping[str, Mapping[str, str]]
    """Each ingress gateway's pods' labels, by gateway key (DestinationRules' ``workloadSelector``)."""
    envoy_filter_notes: tuple[PatchNote, ...]
    skips: tuple[Skipped, ...]


def gateway_side(
    side: ServiceSide,
    *,
    pods: list[Obj],
    istio_gateways: list[Obj],
    virtual_services: list[Obj],
    services: list[Obj],
    authorization_policies: list[Obj],
    envoy_filters: list[Obj],
    mesh: MeshConfig,
    domain: str,
    root_namespace: str,
    proxy_version: str,
) -> GatewaySide:
    """The gateway stage (rules 1 and 2)."""
    skips: list[Skipped] = []
    ingress = side.ingress
    classic = translate_istio_gateways(
        gateways=istio_gateways,
        virtual_services=virtual_services,
        pods=pods,
        services=side.translated,
        service_objects=services,
        find_secret=lambda namespace, name: side.secret_table.get((namespace, name)),
        taken=frozenset(c.gateway for c in ingress.configs),
        domain=domain,
        skips=skips,
        default_export_to=mesh.default_virtual_service_export_to,
        default_retry=mesh.default_http_retry,
    )
    gateway_api_keys = {p.key for p in side.ingress_pods}
    backing = {key: backing_pod(requested, domain, services, pods) for key, requested in side.manual_gateways}
    ingress_pods = [*_by_hand(side.ingress_pods, backing), *(g.as_ingress_pods() for g in classic.pods)]
    gateway_authz = gateway_authorization_policies(
        ingress_pods,
        side.waypoint_policies,
        # Only ingress gateways enforce selector policies here: without one, no policy's L7 form is needed.
        [
            p
            for p in (translate_selected_policy(o, mesh.ext_authz_providers) for o in authorization_policies)
            if p is not None
        ]
        if ingress_pods
        else [],
        root_namespace=root_namespace,
    )
    gateway_authn = gateway_request_authentications(
        ingress_pods, side.authn_translations, root_namespace=root_namespace
    )
    envoy = translate_envoy_filters(
        envoy_filters,
        (c.waypoint for c in side.configs),
        root_namespace=root_namespace,
        proxy_version=proxy_version,
        gateways=[IngressProxy(p.key, p.labels, p.key in gateway_api_keys) for p in ingress_pods],
    )
    default_trust, default_xfcc = mesh.trusted_proxies, mesh.forward_client_cert
    gateway_configs = tuple(
        replace(
            c,
            policies=gateway_authz.get(c.gateway, ()),
            request_authentications=gateway_authn.get(c.gateway, ()),
            destination_rules=with_gateway_client_certificate((), ingress.backend_certificates.get(c.gateway)),
            envoy_patches=_with_trusted_proxies(
                envoy.for_gateway(c.gateway), side.trusted.get(c.gateway, default_trust)
            ),
            forward_client_cert=side.forward_client_cert.get(c.gateway, default_xfcc) or ForwardClientCert.SANITIZE_SET,
        )
        for c in (*ingress.configs, *classic.configs)
    )
    waypoint_configs = tuple(
        replace(
            c,
            policies=policies_for(side.waypoint_policies, c.waypoint),
            destination_rules=(),
            race_first_connect=tuple(k for k in c.services if k in side.racing),
            dynamic_dns=tuple(k for k in c.services if k in side.dynamic),
            envoy_patches=envoy.for_waypoint(c.waypoint),
            tables=merge_routes(c.tables, envoy.route_merges_for(c.waypoint)),
        )
        for c in side.configs
    )
    return GatewaySide(
        waypoint_configs=waypoint_configs,
        gateway_configs=gateway_configs,
        gateway_accounts=(*_readers(ingress.accounts, backing), *classic.accounts),
        gateway_labels={p.key: p.labels for p in ingress_pods},
        envoy_filter_notes=envoy.notes,
        skips=tuple(skips),
    )


def _with_trusted_proxies(patches: ProxyPatches, count: int | None) -> ProxyPatches:
    """The gateway's ``xff_num_trusted_hops``: an EnvoyFilter's merge, else ``numTrustedProxies``
    (:mod:`ambit.controlplane.translate.gateway_topology` rule 3)."""
    if patches.xff_trusted_hops is not None or not count:
        return patches
    return replace(patches, xff_trusted_hops=count)


def _by_hand(ingress_pods: Sequence[IngressPods], backing: Mapping[str, Obj | None]) -> list[IngressPods]:
    """Rule 3: a Gateway deployed by hand as policies see it, by the labels of the pod behind its Services."""
    out = []
    for pods in ingress_pods:
        pod = backing.get(pods.key)
        labels = _strings(_mapping(pod.get("metadata")).get("labels")) if pod is not None else None
        out.append(pods if labels is None else replace(pods, labels=labels))
    return out


def _readers(accounts: Iterable[tuple[str, str]], backing: Mapping[str, Obj | None]) -> list[tuple[str, str]]:
    """Rule 3: who reads each Gateway API ingress gateway's config (none for one deployed by hand without pods)."""
    out = []
    for key, account in accounts:
        if key not in backing:
            out.append((key, account))
        elif (pod := backing[key]) is not None:
            out.append((key, _text(_mapping(pod.get("spec")).get("serviceAccountName")) or "default"))
    return out
