"""The control plane's view of the cluster: informers over the objects the workload API is made from.

Theory of operation: informers over Pods, Services, EndpointSlices, Namespaces, Nodes, ServiceEntries,
WorkloadEntries, AuthorizationPolicies, PeerAuthentications, DestinationRules, Gateways, GatewayClasses, HTTPRoutes,
GRPCRoutes, TCPRoutes, TLSRoutes, ReferenceGrants and Istio's own Gateways fill their caches; every change only
marks the view dirty. A Node update marks it only when the Node's locality labels changed (Nodes' status changes all
the time and only their locality is translated); a Gateway or ServiceEntry update only when its spec, metadata or
``status.addresses`` changed (a ServiceEntry's auto-allocated addresses are kept there); an update of a kind whose
status is not translated (policies, DestinationRules, Services, GatewayClasses, routes, ReferenceGrants) only when
its spec or metadata changed, so the control plane's own status writes cause no translation. One task waits for the
mark, lets ``debounce`` seconds pass so that a burst of changes (a Deployment scaling up, a namespace being deleted)
becomes one translation, clears the mark, translates the caches (:func:`ambit.controlplane.translate.translate_all`;
only the pods that changed, while nothing else they depend on did, and only the stages whose kinds changed:
:class:`~ambit.controlplane.translate.TranslationMemo`, :mod:`~ambit.controlplane.translate.pod_workloads` and
:mod:`~ambit.controlplane.translate.stage_memo`) and
hands the result to ``on_config``, then what the translation had to leave out to ``on_skipped``, the policies'
status to ``on_status`` and the Services' and ServiceEntries' waypoint status to ``on_waypoint_status`` and the
whole translation (waypoint configurations, route status) to ``on_routes`` (when given); ``on_workload_changes``
(when given) hears first which workloads changed since the previous translation, when that is known
(:class:`~ambit.controlplane.translate.WorkloadChanges`), so that the encoders can patch instead of compare. An
``observer`` (:class:`ViewObserver`, the monitoring port's metrics) is told how long each translation took and,
for each burst, the time from its first change to the end of its hand-over (istiod's ``pilot_debounce_time``).

ServiceEntries, WorkloadEntries, AuthorizationPolicies, PeerAuthentications and the Gateway API kinds are CRDs,
which a real cluster may not have, and Nodes are cluster-scoped, which a narrowly scoped control plane may not be
allowed to read: before starting their informers the view lists each once, and a kind the API server does not serve
(404) or does not let us list (403) is logged once and treated as empty from then on (installing the CRD or granting
the permission later needs a restart). Without Nodes every pod's locality is unknown.

The mesh config is the ``mesh`` key of the ConfigMap ``istio`` in the root namespace (the control plane's own, as
istiod reads it from its namespace): ConfigMaps are cached like the rest, so an edit of it marks the view dirty and
the next translation applies it (:mod:`ambit.controlplane.translate.meshconfig`; a text that does not parse keeps
the previous config, held in the translation memo, and is reported as a Warning Event on the ConfigMap). Its
``discoverySelectors`` are applied by the translation over the full caches
(:mod:`ambit.controlplane.translate.discovery`): every Namespace change marks the view dirty, so a namespace
relabelled in or out is seen at the next translation.

Every informer event, whether it marks the view or not, records its object's (kind, namespace, name); each
translation is handed those objects as the caches hold them then (None: deleted), and the record starts again. The
first translation, and the one after a translation that raised, get None instead (what changed is not known), and
translate every object.

The caches keep what their readers read (:mod:`ambit.controlplane.cached_fields`: each informer's transform), and
the CA's node authorization shares the pod cache (:meth:`ClusterView.informer`) rather than keeping its own.

Invariants:

- Nothing is handed over before every informer has listed once: a partial cache would tell the proxies that
  workloads are gone.
- A change that arrives while ``on_config`` runs marks the view dirty again and causes another translation.
- ``on_config`` failing (``OSError``, e.g. a full disk for the file writer) is retried after the next debounce;
  so is any other error of a hand-over (a defect in a consumer, logged with its traceback): only cancellation ends
  the view's task, else the control plane would push no later change of the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from ambit import ISTIO_VERSION
from ambit.controlplane.cached_fields import transform_for
from ambit.controlplane.translate import (
    DEFAULT_ROOT_NAMESPACE,
    Changes,
    PolicyMemo,
    PolicyStatus,
    Skipped,
    Translation,
    TranslationMemo,
    WorkloadChanges,
    translate_all,
)
from ambit.controlplane.translate.listener_sets import LISTENER_SET_KINDS
from ambit.controlplane.translate.nodes import node_localities
from ambit.errors import AmbitError
from ambit.k8s import (
    Informer,
    InformerSettings,
    KubeClient,
    KubeClientError,
    KubeForbiddenError,
    KubeNotFoundError,
    kinds,
)
from ambit.k8s.informer import OnAdd, OnDelete, OnUpdate
from ambit.model.localconfig import LocalConfig

log = logging.getLogger("ambit.controlplane.view")

EventHandlers = tuple[OnAdd, OnUpdate, OnDelete]

REQUIRED_KINDS = (kinds.PODS, kinds.SERVICES, kinds.ENDPOINT_SLICES, kinds.NAMESPACES)
CREDENTIAL_SECRETS = "type!=kubernetes.io/service-account-token,type!=helm.sh/release.v1,type!=istio.io/ca-root"
"""The Secrets a ``credentialName`` or ``certificateRefs`` may name: istiod's credentials controller watches every
type but service-account tokens and Helm releases (``SecretsFieldSelector``), since Istio reads generic Secrets
(``cert``/``key``/``cacert``, a ``<name>-cacert`` CA Secret) as well as ``kubernetes.io/tls`` ones; the mesh CA's
own root Secret is left out too, so no translation can ever hand its key to a gateway."""
OPTIONAL_KINDS = (
    kinds.NODES,
    kinds.SERVICE_ENTRIES,
    kinds.WORKLOAD_ENTRIES,
    kinds.AUTHORIZATION_POLICIES,
    kinds.PEER_AUTHENTICATIONS,
    kinds.REQUEST_AUTHENTICATIONS,
    kinds.DESTINATION_RULES,
    kinds.TELEMETRIES,
    kinds.ENVOY_FILTERS,
    kinds.GATEWAYS,
    kinds.GATEWAY_CLASSES,
    kinds.HTTP_ROUTES,
    kinds.GRPC_ROUTES,
    kinds.TCP_ROUTES,
    kinds.TLS_ROUTES,
    kinds.REFERENCE_GRANTS,
    kinds.VIRTUAL_SERVICES,
    kinds.ISTIO_GATEWAYS,
    kinds.SECRETS,
    kinds.BACKEND_TLS_POLICIES,
    kinds.CONFIG_MAPS,
    kinds.LISTENER_SETS,
    kinds.X_LISTENER_SETS,
)
"""Kinds served by CRDs (and Nodes, which need cluster-wide read): the view goes on without them when the cluster
does not have them or does not let us list them."""


SPEC_ONLY_KINDS = (
    kinds.AUTHORIZATION_POLICIES,
    kinds.DESTINATION_RULES,
    kinds.PEER_AUTHENTICATIONS,
    kinds.REQUEST_AUTHENTICATIONS,
    kinds.TELEMETRIES,
    kinds.ENVOY_FILTERS,
    kinds.SERVICES,
    kinds.GATEWAY_CLASSES,
    kinds.HTTP_ROUTES,
    kinds.GRPC_ROUTES,
    kinds.TCP_ROUTES,
    kinds.TLS_ROUTES,
    kinds.REFERENCE_GRANTS,
    kinds.VIRTUAL_SERVICES,
    kinds.ISTIO_GATEWAYS,
    kinds.BACKEND_TLS_POLICIES,
    kinds.LISTENER_SETS,
    kinds.X_LISTENER_SETS,
)
"""Kinds whose translation reads only their spec and metadata: a status-only update changes nothing."""


def cache_name(kind: kinds.ResourceKind) -> str:
    """The name of ``kind``'s cache (:meth:`ClusterView.items`): its plural, but ``gateways.networking.istio.io``
    for Istio's Gateway, whose plural is Gateway API's too."""
    return f"{kind.plural}.{kind.group}" if kind is kinds.ISTIO_GATEWAYS else kind.plural


def _translated_part(obj: dict[str, Any]) -> tuple[Any, ...]:
    meta = obj.get("metadata") or {}
    return (
        obj.get("spec"),
        meta.get("labels"),
        meta.get("annotations"),
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        meta.get("uid"),
    )


def _addresses(obj: dict[str, Any]) -> Any:
    status = obj.get("status")
    return status.get("addresses") if isinstance(status, dict) else None


class ViewObserver(Protocol):
    """Told how long each translation took and how long each burst of changes waited (the monitoring port's)."""

    def translated(self, seconds: float) -> None: ...

    def debounced(self, seconds: float) -> None: ...


class ClusterViewError(AmbitError):
    """The cluster view could not start (the API server did not answer in time)."""


@dataclass(frozen=True, slots=True)
class ClusterViewSettings:
    debounce: float = 0.1
    """Seconds to let changes gather before translating."""
    cluster_id: str = "Kubernetes"
    trust_domain: str = "cluster.local"
    domain: str = "cluster.local"
    """The cluster's DNS domain (Service hostnames are ``<name>.<ns>.svc.<domain>``)."""
    root_namespace: str = DEFAULT_ROOT_NAMESPACE
    """Where mesh-wide AuthorizationPolicies and PeerAuthentications live."""
    enable_dry_run: bool = False
    """Send dry-run AuthorizationPolicies (istiod's ``AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY``, off)."""
    sync_timeout: float = 300.0
    """Seconds to wait for the informers' first lists before giving up. Listing 110,000 objects while 1,000 node
    proxies reconnect took over 60 s on 2 loaded CPUs (issue 22's restart), and a control plane that gives up there
    never serves; istiod waits for its caches without a bound (it is not ready meanwhile)."""
    informer: InformerSettings | None = None


class ClusterView:
    """Calls ``on_config`` with the translated cluster after the first sync and after every burst of changes."""

    def __init__(
        self,
        client: KubeClient,
        settings: ClusterViewSettings,
        on_config: Callable[[LocalConfig], None],
        *,
        on_skipped: Callable[[tuple[Skipped, ...]], None] | None = None,
        on_status: Callable[[tuple[PolicyStatus, ...]], None] | None = None,
        on_waypoint_status: Callable[[tuple[PolicyStatus, ...], tuple[PolicyStatus, ...]], None] | None = None,
        on_routes: Callable[[Translation], None] | None = None,
        on_workload_changes: Callable[[WorkloadChanges | None], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        observer: ViewObserver | None = None,
    ) -> None:
        self.settings = settings
        self._observer = observer
        self._clock = clock
        self._dirty_since: float | None = None
        self.change_started: float | None = None
        """When (by ``clock``) the first change that the hand-over in progress (or the last one) translates was
        seen; None for the first hand-over after the caches synced."""
        self.client = client
        self._on_config = on_config
        self._on_skipped = on_skipped
        self._on_status = on_status
        self._on_waypoint_status = on_waypoint_status
        self._on_routes = on_routes
        self._on_workload_changes = on_workload_changes
        self._policy_memo: PolicyMemo = {}
        self._translation_memo = TranslationMemo()
        self.absent: set[str] = set()
        """Plural names of the optional kinds the cluster does not serve (or does not let us list)."""
        self._dirty = asyncio.Event()
        self._changes: set[tuple[str, str, str]] | None = None
        """(cache name, namespace, name) of each object added, updated or deleted since the last translation; None
        until the first one, or after a translation that failed (unknown: translate everything)."""
        self._informers = {
            cache_name(kind): Informer(
                client,
                kind,
                on_add=self._change_handler(cache_name(kind)),
                on_update=self._recording(cache_name(kind), self._update_handler(kind)),
                on_delete=self._change_handler(cache_name(kind)),
                settings=settings.informer,
                field_selector=CREDENTIAL_SECRETS if kind is kinds.SECRETS else None,
                transform=transform_for(kind),
            )
            for kind in (*REQUIRED_KINDS, *OPTIONAL_KINDS)
        }
        self._task: asyncio.Task[None] | None = None

    def _mark(self) -> None:
        if self._dirty_since is None:
            self._dirty_since = self._clock()
        self._dirty.set()

    def add_event_handlers(self, make: Callable[[kinds.ResourceKind], EventHandlers | None]) -> None:
        """Also call ``make(kind)``'s handlers (add, update, delete) for every event of each informer's kind, the
        first list's adds included (the monitoring counts them); before :meth:`start`."""
        for informer in self._informers.values():
            handlers = make(informer.kind)
            if handlers is not None:
                informer.add_handler(on_add=handlers[0], on_update=handlers[1], on_delete=handlers[2])

    def _record(self, plural: str, obj: dict[str, Any]) -> None:
        if self._changes is None:
            return
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            self._changes = None  # cannot name it: the next translation looks at everything
            return
        self._changes.add((plural, str(meta.get("namespace") or ""), str(meta.get("name") or "")))

    def _change_handler(self, plural: str) -> Callable[[dict[str, Any]], None]:
        def changed(obj: dict[str, Any]) -> None:
            self._record(plural, obj)
            self._mark()

        return changed

    def _recording(
        self, plural: str, handler: Callable[[dict[str, Any], dict[str, Any]], None]
    ) -> Callable[[dict[str, Any], dict[str, Any]], None]:
        spec_only = plural in {cache_name(kind) for kind in SPEC_ONLY_KINDS}

        def updated(old: dict[str, Any], new: dict[str, Any]) -> None:
            # Our own status writes are not changes to translate either: recorded, 1,000 policies' status made the
            # next translations redo the policy and service stages (issue 22).
            if not spec_only or _translated_part(old) != _translated_part(new):
                self._record(plural, new)
            handler(old, new)

        return updated

    def _take_changes(self) -> Changes | None:
        """What changed since the last translation, each object as the caches hold it now (None: deleted), and a
        fresh record for the next one; None when not known."""
        taken, self._changes = self._changes, set()
        if taken is None:
            return None
        return {
            (plural, f"{namespace}/{name}"): (
                None if plural in self.absent else self._informers[plural].find(name, namespace or None)
            )
            for plural, namespace, name in taken
        }

    def _updated(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self._mark()

    def _update_handler(self, kind: kinds.ResourceKind) -> Callable[[dict[str, Any], dict[str, Any]], None]:
        if kind is kinds.NODES:
            return self._node_updated
        if kind in (kinds.GATEWAYS, kinds.SERVICE_ENTRIES):
            return self._gateway_updated
        if kind in SPEC_ONLY_KINDS:
            return self._policy_updated
        return self._updated

    def _policy_updated(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        # Our own status writes must not cause a translation each (10,000 policies: 10,000 translations).
        if _translated_part(old) != _translated_part(new):
            self._mark()

    def _gateway_updated(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        # Gateway controllers rewrite conditions often; only the addresses say whether a waypoint is ready.
        if _translated_part(old) != _translated_part(new) or _addresses(old) != _addresses(new):
            self._mark()

    def _node_updated(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        if node_localities((old,)) != node_localities((new,)):
            self._mark()

    def informer(self, kind: kinds.ResourceKind) -> Informer:
        """The informer on ``kind``, to share its cache (add handlers before :meth:`start`)."""
        return self._informers[cache_name(kind)]

    def find_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Service as last seen (the gateway controller's manual deployments name theirs)."""
        return self._informers[cache_name(kinds.SERVICES)].find(name, namespace)

    def endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        """The EndpointSlices of one Service, as last seen: a walk over every slice, for the few Services that
        manual deployments name."""
        return [
            item
            for item in self.items(cache_name(kinds.ENDPOINT_SLICES))
            if (item.get("metadata") or {}).get("namespace") == namespace
            and ((item.get("metadata") or {}).get("labels") or {}).get("kubernetes.io/service-name") == service
        ]

    def generation(self, plural: str) -> str:
        """A value that changes whenever the cached objects of ``plural`` may have: its informer's last
        resourceVersion (listed or watched; "" for a kind the cluster does not serve)."""
        return "" if plural in self.absent else self._informers[plural].resource_version

    def items(self, plural: str) -> list[dict[str, Any]]:
        """The cached objects of one kind (empty for a kind the cluster does not serve)."""
        return [] if plural in self.absent else self._informers[plural].items()

    def translate_all(self) -> Translation:
        """The workload API's content for the current caches, and what had to be left out.

        Each call hands the translation what changed since the previous one (:meth:`_take_changes`), so that it
        looks at those pods only while nothing else of theirs changed; a call that fails makes the next one
        translate everything."""
        changed = self._take_changes()
        try:
            return self._translate(changed)
        except BaseException:
            self._changes = None
            raise

    def _translate(self, changed: Changes | None) -> Translation:
        s = self.settings
        return translate_all(
            self.items("pods"),
            self.items("services"),
            self.items("endpointslices"),
            self.items("namespaces"),
            service_entries=self.items("serviceentries"),
            workload_entries=self.items("workloadentries"),
            authorization_policies=self.items("authorizationpolicies"),
            peer_authentications=self.items("peerauthentications"),
            nodes=self.items("nodes"),
            gateways=self.items("gateways"),
            gateway_classes=self.items("gatewayclasses"),
            http_routes=self.items("httproutes"),
            grpc_routes=self.items("grpcroutes"),
            tcp_routes=self.items("tcproutes"),
            tls_routes=self.items("tlsroutes"),
            reference_grants=self.items("referencegrants"),
            virtual_services=self.items("virtualservices"),
            istio_gateways=self.items(cache_name(kinds.ISTIO_GATEWAYS)),
            request_authentications=self.items("requestauthentications"),
            destination_rules=self.items("destinationrules"),
            secrets=self.items("secrets"),
            telemetries=self.items("telemetries"),
            backend_tls_policies=self.items("backendtlspolicies"),
            listener_sets=[
                *((LISTENER_SET_KINDS[0], item) for item in self.items(kinds.LISTENER_SETS.plural)),
                *((LISTENER_SET_KINDS[1], item) for item in self.items(kinds.X_LISTENER_SETS.plural)),
            ],
            config_maps=self.items("configmaps"),
            envoy_filters=self.items("envoyfilters"),
            proxy_version=ISTIO_VERSION,
            cluster_id=s.cluster_id,
            trust_domain=s.trust_domain,
            domain=s.domain,
            root_namespace=s.root_namespace,
            enable_dry_run=s.enable_dry_run,
            policy_memo=self._policy_memo,
            translation_memo=self._translation_memo,
            changed=changed,
        )

    def translate(self) -> LocalConfig:
        """The workload API's content for the current caches."""
        return self.translate_all().config

    def _hand_over(self) -> None:
        started = self._clock()
        translation = self.translate_all()
        if self._observer is not None:
            self._observer.translated(self._clock() - started)
        if self._on_workload_changes is not None:
            self._on_workload_changes(translation.workload_changes)
        self._on_config(translation.config)
        if self._on_skipped is not None:
            self._on_skipped(translation.skipped)
        if self._on_status is not None:
            self._on_status(translation.policy_status)
        if self._on_waypoint_status is not None:
            self._on_waypoint_status(translation.service_status, translation.service_entry_status)
        if self._on_routes is not None:
            self._on_routes(translation)

    async def _probe(self, kind: kinds.ResourceKind) -> None:
        """Mark ``kind`` absent if the API server does not serve it to us; anything else is the informer's."""
        try:
            await self.client.probe(kind)  # one request, however many objects the kind has
        except KubeNotFoundError:
            log.warning("%s are not served (is the CRD installed?); going on without them", kind)
        except KubeForbiddenError:
            log.warning("not allowed to list %s; going on without them", kind)
        except KubeClientError:
            return  # the API server is unreachable: the informer retries, and the sync waits for it
        else:
            return
        self.absent.add(cache_name(kind))

    async def start(self) -> None:
        """Start the informers, wait until each has listed, hand over once, then follow changes."""
        if self._task is not None:
            return
        try:
            async with asyncio.timeout(self.settings.sync_timeout):
                for kind in OPTIONAL_KINDS:
                    await self._probe(kind)
                active = [i for plural, i in self._informers.items() if plural not in self.absent]
                for informer in active:
                    informer.start()
                for informer in active:
                    await informer.wait_synced()
            self._dirty.clear()
            self._dirty_since = None
            self._hand_over()
        except TimeoutError:
            await self.aclose()
            raise ClusterViewError(
                f"the cluster view's caches did not sync within {self.settings.sync_timeout:g} s"
            ) from None
        except BaseException:
            await self.aclose()
            raise
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster view")

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.settings.debounce)
            self._dirty.clear()
            self.change_started, self._dirty_since = self._dirty_since, None
            try:
                self._hand_over()
                if self._observer is not None and self.change_started is not None:
                    self._observer.debounced(self._clock() - self.change_started)
            except Exception as exc:  # an OSError, or a defect in a consumer: the view must go on handing over
                if isinstance(exc, OSError):
                    log.error("cannot apply the cluster's configuration: %s", exc)
                else:
                    log.exception("cannot apply the cluster's configuration: %r", exc)
                self._dirty_since = self.change_started if self._dirty_since is None else self._dirty_since
                self._dirty.set()  # try again after the next debounce
                await asyncio.sleep(1.0)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for informer in self._informers.values():
            await informer.aclose()

    async def __aenter__(self) -> ClusterView:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
