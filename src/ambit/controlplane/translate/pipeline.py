"""The translation pipeline: Kubernetes and Istio objects → the Workload API (spec §4.1), the waypoints' and
gateways' configs and the status to write, as one pure function over plain API dicts.

Theory of operation: :func:`translate_all` takes snapshots of the kinds istiod's ambient index reads for L4 (Pods,
Services, EndpointSlices, Namespaces, ServiceEntries, WorkloadEntries, and Nodes for the pods' locality; spec §10.1)
and for L4 policy (AuthorizationPolicies, PeerAuthentications; spec §7) and for waypoints (Gateways, GatewayClasses,
the HTTPRoutes, GRPCRoutes, TCPRoutes, TLSRoutes, ReferenceGrants and VirtualServices of their routing, spec §1.4,
the RequestAuthentications attached to them, spec §7.5, and the DestinationRules that apply to their Services), and
Istio's own Gateways with the VirtualServices bound to them (classic ingress gateways, ``istio_gateways``), and
returns a :class:`Translation`: one :class:`~ambit.model.localconfig.LocalConfig` (workloads, services, policies),
the ``ZtunnelAccepted`` status of each AuthorizationPolicy, the ``istio.io/WaypointBound`` status of Services and
ServiceEntries and the ``istio.io/WaypointMissing`` status of ServiceEntries
(:class:`~ambit.controlplane.translate.policies.PolicyStatus`, for the control plane to write), each ready
waypoint's :class:`~ambit.model.routes.WaypointConfig` with the routes' status
(:class:`~ambit.controlplane.translate.routes.RouteStatus`), and the list of what had to be left out
(:class:`Skipped`, each naming the object and the field to fix). :func:`translate` is the same without the list.
Nothing here keeps state between calls or does I/O: the caller (an informer-driven view, a test) decides when to
translate again.

Order of work: the mesh config first, and with it the namespaces the translation sees (``discoverySelectors``,
:mod:`~ambit.controlplane.translate.discovery`: the objects of other namespaces are dropped from every input before
anything else reads them); then Kubernetes Services, then ServiceEntries (their hosts may not take a Service's key),
then one index of every selecting service, then the workloads (pods, WorkloadEntries, hand-added EndpointSlice
endpoints, inline ServiceEntry endpoints) with their services maps and the policy keys they list (selector
AuthorizationPolicies of their namespace and of the root namespace, then what PeerAuthentication resolves to for
them). Waypoints are indexed once, before the services, and every Service, ServiceEntry host and workload gets the
waypoint its labels (or its namespace's) bind it to; the routes come last, over the bound services
(:mod:`~ambit.controlplane.translate.routes`), and each waypoint's config then gets the targetRefs
AuthorizationPolicies bound to it, with their ``WaypointAccepted`` status
(:mod:`~ambit.controlplane.translate.waypoint_policies`).

The output is deterministic: workloads are ordered by uid, services by namespace then hostname, policies and
statuses by key, each workload's policy keys sorted, skips sorted, and equal inputs give equal outputs, so a writer
can compare renderings to skip rewriting an unchanged file.

The values it returns and keeps are :mod:`~ambit.controlplane.translate.translation`'s; the workload stages that
are not the pods' own, :mod:`~ambit.controlplane.translate.workload_side`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ambit.controlplane.translate.backendtls import with_gateway_client_certificate
from ambit.controlplane.translate.destinationrules import destination_policies
from ambit.controlplane.translate.discovery import DiscoveryFilter
from ambit.controlplane.translate.fields import object_labels
from ambit.controlplane.translate.gateway_side import gateway_side
from ambit.controlplane.translate.ingress import merge_route_status
from ambit.controlplane.translate.meshconfig import MESH_CONFIG_MAP, mesh_config_of
from ambit.controlplane.translate.nodes import node_localities
from ambit.controlplane.translate.pod_workloads import Changes, PodEntry, PodWorkloads
from ambit.controlplane.translate.policies import DEFAULT_ROOT_NAMESPACE
from ambit.controlplane.translate.policy_side import PolicyMemo, policy_side
from ambit.controlplane.translate.service_side import ServiceMemo, service_side
from ambit.controlplane.translate.skips import Skipped
from ambit.controlplane.translate.stage_memo import POD_SIDE, POLICY_KINDS, ChangedKinds
from ambit.controlplane.translate.translation import StageMemos, Translation, TranslationMemo
from ambit.controlplane.translate.workload_side import (
    entry_workloads,
    hand_added_workloads,
    pod_workload,
    service_index,
    workload_changes_since,
)
from ambit.controlplane.translate.workloadentries import translate_workload_entry
from ambit.model.localconfig import LocalConfig
from ambit.model.locality_lb import MESH_DEFAULT as MESH_LOCALITY
from ambit.model.workload import Workload

__all__ = ["translate", "translate_all"]


def translate_all(
    pods: Iterable[Mapping[str, Any]],
    services: Iterable[Mapping[str, Any]],
    endpoint_slices: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]],
    *,
    service_entries: Iterable[Mapping[str, Any]] = (),
    workload_entries: Iterable[Mapping[str, Any]] = (),
    authorization_policies: Iterable[Mapping[str, Any]] = (),
    peer_authentications: Iterable[Mapping[str, Any]] = (),
    nodes: Iterable[Mapping[str, Any]] = (),
    gateways: Iterable[Mapping[str, Any]] = (),
    gateway_classes: Iterable[Mapping[str, Any]] = (),
    http_routes: Iterable[Mapping[str, Any]] = (),
    grpc_routes: Iterable[Mapping[str, Any]] = (),
    tcp_routes: Iterable[Mapping[str, Any]] = (),
    tls_routes: Iterable[Mapping[str, Any]] = (),
    reference_grants: Iterable[Mapping[str, Any]] = (),
    virtual_services: Iterable[Mapping[str, Any]] = (),
    istio_gateways: Iterable[Mapping[str, Any]] = (),
    request_authentications: Iterable[Mapping[str, Any]] = (),
    destination_rules: Iterable[Mapping[str, Any]] = (),
    secrets: Iterable[Mapping[str, Any]] = (),
    telemetries: Iterable[Mapping[str, Any]] = (),
    backend_tls_policies: Iterable[Mapping[str, Any]] = (),
    listener_sets: Iterable[tuple[tuple[str, str], Mapping[str, Any]]] = (),
    config_maps: Iterable[Mapping[str, Any]] = (),
    envoy_filters: Iterable[Mapping[str, Any]] = (),
    proxy_version: str = "",
    cluster_id: str = "Kubernetes",
    trust_domain: str = "cluster.local",
    domain: str = "cluster.local",
    root_namespace: str = DEFAULT_ROOT_NAMESPACE,
    enable_dry_run: bool = False,
    policy_memo: PolicyMemo | None = None,
    translation_memo: TranslationMemo | None = None,
    changed: Changes | None = None,
) -> Translation:
    """The workloads, services and policies the node proxies should know, policy status, and the problems found.

    ``policy_memo``, when given, keeps each AuthorizationPolicy's translation by uid and resourceVersion between
    calls (the caller owns it and passes the same one each time), so only changed policies are translated again;
    ``translation_memo`` does the same for pods and Services (:class:`TranslationMemo`). ``changed`` names the
    objects that changed since the previous call through the same ``translation_memo`` (``(kind plural,
    "namespace/name")`` → the object now, None when deleted; None: not known): while the pods' context holds, only
    the changed pods are translated and the other pods' workloads are taken from the memo as they are
    (:mod:`~ambit.controlplane.translate.pod_workloads` rule 2), and each stage whose kinds of objects did not
    change (the policies, the Services with their waypoints and routes, the gateways, the service index, the
    hand-added and ServiceEntry endpoints) is taken from the memo as it is
    (:mod:`~ambit.controlplane.translate.stage_memo`). The output is the same either way.
    """
    skips: list[Skipped] = []
    config_maps = list(config_maps)
    mesh = mesh_config_of(
        config_maps,
        namespace=root_namespace,
        memo=translation_memo.mesh if translation_memo is not None else None,
        skips=skips,
    )
    namespace_list = list(namespaces)
    seen = DiscoveryFilter.build(namespace_list, mesh, root_namespace=root_namespace)
    pods, services, endpoint_slices = seen.keep(pods), seen.keep(services), seen.keep(endpoint_slices)
    service_entries, workload_entries = seen.keep(service_entries), seen.keep(workload_entries)
    authorization_policies, peer_authentications = seen.keep(authorization_policies), seen.keep(peer_authentications)
    request_authentications, telemetries = seen.keep(request_authentications), seen.keep(telemetries)
    destination_rules, virtual_services = seen.keep(destination_rules), seen.keep(virtual_services)
    gateways, istio_gateways = seen.keep(gateways), seen.keep(istio_gateways)
    http_routes, grpc_routes = seen.keep(http_routes), seen.keep(grpc_routes)
    tcp_routes, tls_routes, reference_grants = seen.keep(tcp_routes), seen.keep(tls_routes), seen.keep(reference_grants)
    backend_tls_policies, secrets = seen.keep(backend_tls_policies), seen.keep(secrets)
    config_maps = seen.keep(config_maps)  # after the mesh config was read: the rest are credentials
    envoy_filters = seen.keep(envoy_filters)
    listener_sets = [(origin, obj) for origin, obj in listener_sets if seen.admits(obj)]
    stages = translation_memo.stages if translation_memo is not None else StageMemos()
    known = ChangedKinds.of(changed if translation_memo is not None and translation_memo.complete else None)
    read = stages.services.value.config_maps if stages.services.value is not None else None
    if read is not None:  # stage memo rule 9: a ConfigMap nothing read is no change
        mesh_key = f"{root_namespace}/{MESH_CONFIG_MAP}"
        known = known.ignoring("configmaps", lambda key: key != mesh_key and not read.was_read(key))
    if translation_memo is not None:
        translation_memo.complete = False
    policy_objects = list(authorization_policies)
    policy_settings = (root_namespace, enable_dry_run)
    policy = stages.policies.find(policy_settings, known.none_of(POLICY_KINDS))
    if policy is None:
        policy = stages.policies.keep(
            policy_settings,
            policy_side(
                policy_objects,
                peer_authentications,
                root_namespace=root_namespace,
                enable_dry_run=enable_dry_run,
                memo=policy_memo,
            ),
        )
    skips.extend(policy.skips)
    keys = policy.keys
    service_list = list(services)
    service_settings = (domain, cluster_id, trust_domain, root_namespace)
    side = stages.services.find(service_settings, known.only(POD_SIDE))
    if side is None:
        remembered_services: ServiceMemo = {}
        side = stages.services.keep(
            service_settings,
            service_side(
                namespaces=namespace_list,
                mesh=mesh,
                services=service_list,
                service_entries=service_entries,
                authorization_policies=policy_objects,
                gateways=gateways,
                gateway_classes=list(gateway_classes),
                http_routes=http_routes,
                grpc_routes=grpc_routes,
                tcp_routes=tcp_routes,
                tls_routes=tls_routes,
                reference_grants=reference_grants,
                virtual_services=virtual_services,
                request_authentications=request_authentications,
                telemetries=telemetries,
                secrets=secrets,
                config_maps=config_maps,
                backend_tls_policies=backend_tls_policies,
                destination_rules=destination_rules,
                listener_sets=listener_sets,
                domain=domain,
                root_namespace=root_namespace,
                known=translation_memo.services if translation_memo is not None else {},
                remembered=remembered_services,
            ),
        )
        if translation_memo is not None:
            translation_memo.services = remembered_services
    skips.extend(side.skips)
    network, waypoints = side.network, side.waypoints
    gateway_settings = (proxy_version,)
    gateway = stages.gateways.find(
        gateway_settings,
        stages.services.reused
        and (
            (not istio_gateways and not side.manual_gateways) or not any(kind == "pods" for kind in known.kinds or ())
        ),
    )
    if gateway is None:
        gateway = stages.gateways.keep(
            gateway_settings,
            gateway_side(
                side,
                pods=pods,
                istio_gateways=istio_gateways,
                virtual_services=virtual_services,
                services=service_list,
                authorization_policies=policy_objects,
                envoy_filters=envoy_filters,
                mesh=mesh,
                domain=domain,
                root_namespace=root_namespace,
                proxy_version=proxy_version,
            ),
        )
    skips.extend(gateway.skips)
    slice_list = list(endpoint_slices)
    index = service_index(stages, known, side, service_list, slice_list, domain, translation_memo)
    localities = node_localities(nodes)
    context = (index, network, localities, keys, waypoints, cluster_id, trust_domain)
    pod_state = translation_memo.pods if translation_memo is not None else PodWorkloads()

    def pod_entry(pod: Mapping[str, Any]) -> PodEntry:
        return pod_workload(pod, index, keys, waypoints, cluster_id, trust_domain, network, localities)

    if known.changed is not None and pod_state.can_patch(context, seen, known.changed):
        pod_state.patch(known.changed, pod_entry)
    else:
        pod_state.build(pods, context, seen, pod_entry)
    skips.extend(pod_state.all_skips())
    # The workloads that are not pods', in the order they are made, and their labels by uid (over the pods' of an
    # equal uid).
    workloads: list[Workload] = []
    workload_labels: dict[str, Mapping[str, str]] = {}
    for wle in workload_entries:
        w = translate_workload_entry(
            wle, index, cluster_id=cluster_id, trust_domain=trust_domain, network=network, skips=skips
        )
        if w is not None:
            meta, spec = wle.get("metadata") or {}, wle.get("spec") or {}
            labels = {**(meta.get("labels") or {}), **(spec.get("labels") or {})}
            workload_labels[w.uid] = {str(k): str(v) for k, v in labels.items()}
            waypoint = waypoints.find_for_workload(w.namespace, object_labels(wle)).address
            workloads.append(replace(w, authorization_policies=keys.find(w.namespace, labels), waypoint=waypoint))
    slice_workloads, slice_skips = hand_added_workloads(
        stages, known, side, service_list, slice_list, domain, cluster_id, trust_domain, translation_memo
    )
    workloads.extend(slice_workloads)
    skips.extend(slice_skips)
    entry_made = entry_workloads(stages, side, keys, waypoints, network, cluster_id, trust_domain)
    for w, endpoint_labels in entry_made[0]:
        workload_labels[w.uid] = endpoint_labels  # DestinationRule subsets select inline endpoints by these
        workloads.append(w)
    skips.extend(entry_made[1])
    rule_index = side.rule_index
    all_workloads = pod_state.workloads_with(workloads)
    workload_changes = None
    if translation_memo is not None:
        workload_changes = workload_changes_since(translation_memo, pod_state.changed_uids, workloads)
        translation_memo.workloads, translation_memo.other_workloads = all_workloads, tuple(workloads)
    waypoint_configs, gateway_configs = gateway.waypoint_configs, gateway.gateway_configs
    if rule_index.has_rules:
        # Each service's (uid, labels) of its workloads, for DestinationRule subsets (a set of uids each): read
        # only where a rule applies, so only built when there is one.
        members: dict[str, list[tuple[str, Mapping[str, str]]]] = {}
        pod_labels = pod_state.labels
        for w in all_workloads:
            found = workload_labels.get(w.uid)
            member_labels = pod_labels.get(w.uid, {}) if found is None else found
            for key in w.services:
                members.setdefault(key, []).append((w.uid, member_labels))
        by_key = side.by_key
        certificates = side.ingress.backend_certificates
        gateway_configs = tuple(
            replace(
                c,
                destination_rules=with_gateway_client_certificate(
                    destination_policies(
                        rule_index,
                        c.gateway.partition("/")[0],
                        [by_key[k] for k in c.backend_keys() if k in by_key],
                        members,
                        gateway.gateway_labels.get(c.gateway, {}),
                    ),
                    certificates.get(c.gateway),
                ),
            )
            for c in gateway_configs
        )
        waypoint_configs = tuple(
            replace(
                c,
                destination_rules=destination_policies(
                    rule_index, c.waypoint.partition("/")[0], side.served.get(c.waypoint, ()), members
                ),
            )
            for c in waypoint_configs
        )
    if mesh.locality_lb != MESH_LOCALITY:  # the mesh config's localityLbSetting, for the rules that state none
        waypoint_configs = tuple(replace(c, mesh_locality=mesh.locality_lb) for c in waypoint_configs)
        gateway_configs = tuple(replace(c, mesh_locality=mesh.locality_lb) for c in gateway_configs)
    translation = Translation(
        config=LocalConfig(workloads=all_workloads, services=side.sorted_services, policies=policy.policies),
        skipped=tuple(sorted(set(skips))),
        policy_status=policy.statuses,
        service_status=side.service_status,
        service_entry_status=side.entry_status,
        waypoint_configs=waypoint_configs,
        route_status=merge_route_status(side.routes.status, side.ingress.status),
        waypoint_accounts=side.routes.accounts,
        gateway_configs=gateway_configs,
        gateway_accounts=gateway.gateway_accounts,
        waypoint_policy_status=tuple(
            sorted((t.status for t in side.waypoint_policies if t.status is not None), key=lambda s: s.key)
        ),
        backend_tls_status=side.backend_tls.status,
        discovery=seen,
        envoy_filter_notes=gateway.envoy_filter_notes,
        workload_changes=workload_changes,
    )
    if translation_memo is not None:
        translation_memo.complete = True
    return translation


def translate(
    pods: Iterable[Mapping[str, Any]],
    services: Iterable[Mapping[str, Any]],
    endpoint_slices: Iterable[Mapping[str, Any]],
    namespaces: Iterable[Mapping[str, Any]],
    *,
    service_entries: Iterable[Mapping[str, Any]] = (),
    workload_entries: Iterable[Mapping[str, Any]] = (),
    authorization_policies: Iterable[Mapping[str, Any]] = (),
    peer_authentications: Iterable[Mapping[str, Any]] = (),
    nodes: Iterable[Mapping[str, Any]] = (),
    gateways: Iterable[Mapping[str, Any]] = (),
    gateway_classes: Iterable[Mapping[str, Any]] = (),
    cluster_id: str = "Kubernetes",
    trust_domain: str = "cluster.local",
    domain: str = "cluster.local",
    root_namespace: str = DEFAULT_ROOT_NAMESPACE,
    enable_dry_run: bool = False,
) -> LocalConfig:
    """:func:`translate_all` without the problems."""
    return translate_all(
        pods,
        services,
        endpoint_slices,
        namespaces,
        service_entries=service_entries,
        workload_entries=workload_entries,
        authorization_policies=authorization_policies,
        peer_authentications=peer_authentications,
        nodes=nodes,
        gateways=gateways,
        gateway_classes=gateway_classes,
        cluster_id=cluster_id,
        trust_domain=trust_domain,
        domain=domain,
        root_namespace=root_namespace,
        enable_dry_run=enable_dry_run,
    ).config
