"""Kubernetes and Istio objects → the Workload API (spec §4.1), as pure functions over plain API dicts.

Theory of operation, the order of work and what keeps the output deterministic:
:mod:`~ambit.controlplane.translate.pipeline`, whose :func:`translate_all` and :func:`translate` are this package's
entry points; the values they return and keep (:class:`Translation`, :class:`TranslationMemo`) are
:mod:`~ambit.controlplane.translate.translation`'s. Their names are importable from here.

Modules: ``pipeline`` (:func:`translate_all`: the stages in order), ``translation`` (what it returns and keeps
between calls), ``workload_side`` (the workload stages other than the pods'), ``workloads`` (a Pod becomes a
Workload), ``pod_workloads`` (the pods' workloads kept between calls and patched by the pods that changed),
``services`` (a Service becomes a Service), ``serviceentries`` (a ServiceEntry becomes Services and endpoint
Workloads), ``workloadentries`` (a WorkloadEntry becomes a Workload), ``endpointslices`` (endpoints added to a
Service's EndpointSlices by hand become Workloads), ``index`` (which services select which endpoints, on which
ports), ``stage_memo`` (which stages a translation told what changed takes from the previous one), ``policy_side``,
``service_side`` and ``gateway_side`` (those stages), ``policies`` (an AuthorizationPolicy becomes a Policy and a
status), ``peerauth`` (PeerAuthentications become DENY policies), ``nodes`` (a Node's labels become its pods'
locality), ``waypoints`` (Gateways become waypoints, labels bind to them), ``routes`` and ``routerules`` (Gateway
API routes become waypoint route tables), ``virtualservices`` (VirtualServices join those tables), ``requestauth``
(RequestAuthentications attached by ``targetRefs`` join their waypoints' configs), ``destinationrules`` (the
DestinationRule each waypoint applies to each Service it serves, subsets resolved to workload uids), ``telemetry``
(Telemetries become each waypoint's metric overrides per destination service), ``istio_gateways`` (Istio Gateways
and their VirtualServices become the configs of the gateway pods they select), ``envoyfilters`` (the EnvoyFilters a
waypoint takes become the header edits and HTTP/2 backends it honours, the rest notes the control plane logs),
``protocols`` (a port's application protocol), ``skips`` (what was left out).
"""

from ambit.controlplane.translate.pipeline import translate, translate_all
from ambit.controlplane.translate.pod_workloads import Changes
from ambit.controlplane.translate.policies import DEFAULT_ROOT_NAMESPACE, PolicyStatus
from ambit.controlplane.translate.policy_side import PolicyMemo
from ambit.controlplane.translate.routes import RouteStatus
from ambit.controlplane.translate.skips import SkipMemory, Skipped
from ambit.controlplane.translate.translation import Translation, TranslationMemo, WorkloadChanges

__all__ = [
    "DEFAULT_ROOT_NAMESPACE",
    "Changes",
    "PolicyMemo",
    "PolicyStatus",
    "RouteStatus",
    "SkipMemory",
    "Skipped",
    "Translation",
    "TranslationMemo",
    "WorkloadChanges",
    "translate",
    "translate_all",
]
