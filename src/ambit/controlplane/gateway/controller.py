"""The gateway deployment controller (istiod's role, spec §1.1, §1.5): every Gateway of class ``istio-waypoint``
(a waypoint) or ``istio`` (an ingress gateway) gets a ServiceAccount, Deployment and Service, and a status saying
whether it is ready.

Theory of operation: informers over Gateways, ListenerSets (both names), GatewayClasses, HTTPRoutes, TLSRoutes and
TCPRoutes (for ``attachedRoutes``), Secrets of type
``kubernetes.io/tls`` (an ingress listener's certificates), ConfigMaps (the overlays of :mod:`.overlay`) and the
Deployments, Services, ServiceAccounts, HorizontalPodAutoscalers and PodDisruptionBudgets
labelled ``gateway.istio.io/managed`` with one of this controller's values; any
change marks the controller dirty (as does a change to a Namespace, whose ``istio.io/rev`` label can choose
the revision of its Gateways; of ConfigMaps, only the injection templates ``istio-sidecar-injector``
(:mod:`.injection`) or a class defaults ConfigMap in the control plane's namespace, or one a Gateway's
``parametersRef`` names), and one task, ``debounce`` seconds later, reconciles every waypoint
Gateway: find its overlays (its template's, then the ConfigMaps'), render its objects with them (:mod:`.render`),
plan each write against the cache
(:mod:`.apply`), carry the plan out, then
plan and write the Gateway's status (:mod:`.status`, :mod:`.ingress_status`) and that of every ListenerSet naming it
(:mod:`ambit.controlplane.translate.listener_sets`: an admitted one's ports are opened on the Gateway's Service too),
and the ``Accepted`` status of the
GatewayClasses whose ``controllerName`` is ``istio.io/mesh-controller`` or ``istio.io/gateway-controller``. At
start, and in any pass that finds one gone (deleted), it creates the GatewayClasses ``istio-waypoint`` and ``istio``
when they are missing, as istiod's class controller does.

An ingress Gateway deployed by hand (its ``spec.addresses`` name a Service: :mod:`.static_addresses`) gets nothing
deployed; its status is judged from the named Services and their EndpointSlices, which the controller reads
through its ``services`` seam (the cluster view's caches, not a copy of its own) and whose changes wake it
(:meth:`GatewayController.backing_event_handlers`).

Invariants:

- Deleting a Gateway deletes its objects through their owner references (the API server's garbage collector, in
  a cluster and in the embedded API server alike); the controller deletes nothing.
- A Gateway being deleted (``deletionTimestamp``) is not reconciled.
- A Gateway of another control plane revision (:mod:`.revision`) is not reconciled: nothing is deployed for it
  and its status is left to its own control plane.
- One Gateway's failure (an API server refusal, a conflict) is reported in its status and logged, and never stops
  the others; a pass with a failed write is retried after ``retry`` seconds or the next change.
- The informers may lag behind the controller's own writes: the object a write returned stands in for the cached
  one until the cache moves past the version the write was decided on, so that the controller neither writes
  twice nor loses its status to a 409 loop.
- Optional kinds (the Gateway API CRDs, HTTPRoutes) that the API server does not serve or does not let us list
  leave the controller idle, with one warning, as the cluster view does. HorizontalPodAutoscalers and
  PodDisruptionBudgets are deployed only when an overlay asks for them; without them (not served, not allowed)
  such a Gateway reports the API server's refusal and the others go on.
- A Gateway whose ``parametersRef`` is unusable, whose template does not evaluate, or whose overlays cannot be
  applied, gets nothing written:
  what was deployed for it stays as it is, and its status says why.

The controller's task ends only by cancellation: a pass that fails by a defect (logged with its traceback) is
retried after ``retry`` seconds, as one with a failed write is.

This module holds the passes and the statuses they plan. Its parts: :mod:`.cache` (the informers, absent kinds, and
the writes standing in while the informers lag), :mod:`.wakeups` (which changes mark the controller dirty) and
:mod:`.deploy` (a Gateway's overlays, objects and the status writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ambit.controlplane.gateway.cache import GatewayCache, Obj, field_of, object_key
from ambit.controlplane.gateway.deploy import KIND_OF, OPTIONAL_OWNED_KINDS, OWNED_KINDS, GatewayDeployer
from ambit.controlplane.gateway.ingress_status import (
    gateway_ports,
    ingress_addresses,
    ingress_attached_routes,
    ingress_status,
    listener_set_server_ports,
    listener_set_status,
)
from ambit.controlplane.gateway.render import (
    CONTROLLER_LABEL,
    GATEWAY_CONTROLLER,
    GATEWAY_CONTROLLER_LABEL,
    INGRESS_CLASS,
    MANAGED_LABEL,
    MESH_CONTROLLER,
    WaypointTemplateSettings,
    deployed_name,
    is_ingress,
    service_hostname,
)
from ambit.controlplane.gateway.revision import is_ours
from ambit.controlplane.gateway.static_addresses import (
    NO_SERVICES,
    Bound,
    ServiceLookup,
    bind,
)
from ambit.controlplane.gateway.status import (
    Deployed,
    attached_routes,
    class_status,
    gateway_status,
)
from ambit.controlplane.gateway.wakeups import Wakeups
from ambit.controlplane.status import rfc3339
from ambit.controlplane.translate.listener_sets import LISTENER_SET_KINDS, MergedGateway, merge_listener_sets
from ambit.controlplane.translate.listeners import backend_client_certificate
from ambit.controlplane.translate.manual_gateways import is_managed, requested_services, service_key
from ambit.controlplane.translate.reference_grants import ReferenceGrants
from ambit.controlplane.translate.waypoint_gateways import WAYPOINT_CLASS
from ambit.controlplane.view import CREDENTIAL_SECRETS, EventHandlers
from ambit.errors import AmbitError
from ambit.k8s import (
    Informer,
    InformerSettings,
    KubeAlreadyExistsError,
    KubeClient,
    KubeClientError,
    kinds,
)

__all__ = ["GatewayController", "GatewayControllerError", "GatewayControllerSettings"]

log = logging.getLogger("ambit.controlplane.gateway")

WAYPOINT_CLASS_DESCRIPTION = "The default Istio waypoint GatewayClass"
INGRESS_CLASS_DESCRIPTION = "The default Istio GatewayClass"
CLASSES = (
    (WAYPOINT_CLASS, MESH_CONTROLLER, WAYPOINT_CLASS_DESCRIPTION),
    (INGRESS_CLASS, GATEWAY_CONTROLLER, INGRESS_CLASS_DESCRIPTION),
)
OPTIONAL_KINDS = (
    kinds.GATEWAYS,
    kinds.GATEWAY_CLASSES,
    kinds.HTTP_ROUTES,
    kinds.GRPC_ROUTES,
    kinds.TLS_ROUTES,
    kinds.TCP_ROUTES,
    kinds.SECRETS,
    kinds.NAMESPACES,
    kinds.CONFIG_MAPS,
    kinds.REFERENCE_GRANTS,
    kinds.LISTENER_SETS,
    kinds.X_LISTENER_SETS,
    *OPTIONAL_OWNED_KINDS,
)
OWNED_SELECTOR = f"{MANAGED_LABEL} in ({CONTROLLER_LABEL},{GATEWAY_CONTROLLER_LABEL})"
TLS_SECRETS = CREDENTIAL_SECRETS
"""The Secrets a listener's ``certificateRefs`` or ``caCertificateRefs`` may name: those the translation sees, so
a listener's status and what is served agree."""


@dataclass(frozen=True, slots=True)
class GatewayControllerSettings:
    template: WaypointTemplateSettings = field(default_factory=WaypointTemplateSettings)
    debounce: float = 0.1
    """Seconds to let changes gather before reconciling."""
    retry: float = 2.0
    """Seconds before a pass with a failed write runs again (when nothing else changes)."""
    system_namespace: str = "istio-system"
    """The control plane's namespace: where the class defaults ConfigMaps (label
    ``gateway.istio.io/defaults-for-class``) are looked for."""
    create_class: bool = True
    """Create the GatewayClasses ``istio-waypoint`` and ``istio`` at start when they are missing."""
    sync_timeout: float = 60.0
    """Seconds to wait for the informers' first lists before giving up."""
    informer: InformerSettings | None = None


class GatewayControllerError(AmbitError):
    """The gateway deployment controller could not start (the API server did not answer in time)."""


class GatewayController:
    """Deploys waypoints for Gateways; ``start`` then ``aclose``."""

    def __init__(
        self,
        client: KubeClient,
        settings: GatewayControllerSettings,
        *,
        clock: Callable[[], float],
        services: ServiceLookup = NO_SERVICES,
    ) -> None:
        self.client = client
        self.services = services
        """Every Service and EndpointSlice (the cluster view's caches): those a manual deployment names."""
        self._naming: set[tuple[str, str]] = set()
        self.settings = settings
        self._clock = clock
        self._dirty = asyncio.Event()
        self.wakeups = Wakeups(self._dirty, settings, lambda: self.cache.items(kinds.GATEWAYS))
        informers: dict[str, Informer] = {}
        for kind in (*OPTIONAL_KINDS, *OWNED_KINDS):
            selector = OWNED_SELECTOR if kind in KIND_OF.values() else None
            config_map = kind is kinds.CONFIG_MAPS
            informers[kind.plural] = Informer(
                client,
                kind,
                label_selector=selector,
                field_selector=TLS_SECRETS if kind is kinds.SECRETS else None,
                on_add=self.wakeups.config_map_changed if config_map else self.wakeups.changed,
                on_update=self.wakeups.config_map_updated if config_map else self.wakeups.updated,
                on_delete=self.wakeups.config_map_changed if config_map else self.wakeups.changed,
                settings=settings.informer,
            )
        self.cache = GatewayCache(informers)
        self.deployer = GatewayDeployer(client, settings, self.cache)
        self._task: asyncio.Task[None] | None = None
        self.passes = 0

    def backing_event_handlers(self, kind: kinds.ResourceKind) -> EventHandlers | None:
        """Handlers for the cluster view's informers (:meth:`.wakeups.Wakeups.backing_event_handlers`)."""
        return self.wakeups.backing_event_handlers(kind)

    # -- cache (:mod:`.cache`) -----------------------------------------------------------------------------
    @property
    def absent(self) -> set[str]:
        """Plurals of the kinds that cannot be read."""
        return self.cache.absent

    @property
    def writes(self) -> int:
        return self.cache.writes

    def find(self, kind: kinds.ResourceKind, namespace: str, name: str) -> Obj | None:
        """The object as last seen: the cache's, or what our own write returned if the cache lags behind it."""
        return self.cache.find(kind, namespace, name)

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def ensure_class(self) -> None:
        """Create the GatewayClasses ``istio-waypoint`` and ``istio`` unless they exist (istiod's class
        controller)."""
        for name, controller, description in CLASSES:
            gateway_class = {
                "metadata": {"name": name},
                "spec": {"controllerName": controller, "description": description},
            }
            try:
                await self.client.create(kinds.GATEWAY_CLASSES, gateway_class)
            except KubeAlreadyExistsError:
                continue
            except KubeClientError as exc:
                log.warning("cannot create the GatewayClass %s: %s", name, exc)
                continue
            log.info("created the GatewayClass %s", name)

    async def start(self) -> None:
        """Probe the kinds, create the GatewayClass, sync the informers, then reconcile on every change. Without
        Gateways, or without read access to one of the owned kinds, the controller stays idle."""
        if self._task is not None:
            return
        try:
            async with asyncio.timeout(self.settings.sync_timeout):
                for kind in (*OPTIONAL_KINDS, *OWNED_KINDS):
                    await self.cache.probe(self.client, kind, optional=kind in OPTIONAL_OWNED_KINDS)
                needed = (kinds.GATEWAYS, *OWNED_KINDS)
                if any(kind.plural in self.absent for kind in needed):
                    log.warning(
                        "the gateway deployment controller is idle: it cannot read %s", ", ".join(map(str, needed))
                    )
                    return
                if self.settings.create_class and kinds.GATEWAY_CLASSES.plural not in self.absent:
                    await self.ensure_class()
                await self.cache.start()
        except TimeoutError:
            await self.aclose()
            raise GatewayControllerError(
                f"the gateway controller's caches did not sync within {self.settings.sync_timeout:g} s"
            ) from None
        except BaseException:
            await self.aclose()
            raise
        self._dirty.set()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gateway deployment controller")

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.settings.debounce)
            self._dirty.clear()
            try:
                ok = await self.reconcile_once()
            except KubeClientError as exc:  # the API server's refusals are handled per Gateway
                log.warning("gateway controller pass failed: %s", exc)
                ok = False
            except Exception:  # a defect with one object must not stop every later pass: retried like a failure
                log.exception("gateway controller pass failed")
                ok = False
            if not ok:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._dirty.wait(), self.settings.retry)
                self._dirty.set()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.cache.aclose()

    # -- reconcile ------------------------------------------------------------------------------------------
    async def reconcile_once(self) -> bool:
        """One pass over every waypoint Gateway and mesh GatewayClass; False when some write failed."""
        self.passes += 1
        ok = True
        now = rfc3339(self._clock())
        if self.settings.create_class and kinds.GATEWAY_CLASSES.plural not in self.absent:
            present = {field_of(item, "metadata", "name") for item in self.cache.items(kinds.GATEWAY_CLASSES)}
            if any(name not in present for name, _, _ in CLASSES):  # deleted: istiod's class controller re-creates it
                await self.ensure_class()
        for gateway_class in self.cache.items(kinds.GATEWAY_CLASSES):
            if field_of(gateway_class, "spec", "controllerName") in (MESH_CONTROLLER, GATEWAY_CONTROLLER):
                ok &= await self.deployer.write_status(
                    kinds.GATEWAY_CLASSES, gateway_class, class_status(gateway_class), now
                )
        routes = self.cache.items(kinds.HTTP_ROUTES)
        self.deployer.begin_pass()
        self._naming = set()
        for gateway in self.cache.items(kinds.GATEWAYS):
            if field_of(gateway, "spec", "gatewayClassName") not in (WAYPOINT_CLASS, INGRESS_CLASS):
                continue
            if field_of(gateway, "metadata", "deletionTimestamp"):
                continue
            if not is_ours(gateway, self._namespace(gateway), self.settings.template.revision):
                continue
            try:
                ok &= await self._reconcile_gateway(gateway, routes, now)
            except KubeClientError:
                raise  # the API server is unreachable: the whole pass is retried
            except Exception:  # a bug must not stop the other Gateways, nor the controller
                log.exception("reconciling Gateway %s/%s failed", *object_key(kinds.GATEWAYS, gateway)[1:])
                ok = False
        self.wakeups.backing = frozenset(self._naming)
        return ok

    async def _reconcile_gateway(self, gateway: Obj, routes: list[Obj], now: str) -> bool:
        grants = ReferenceGrants.build(self.cache.items(kinds.REFERENCE_GRANTS))
        namespace_labels = {
            str(field_of(ns, "metadata", "name")): dict(field_of(ns, "metadata", "labels") or {})
            for ns in self.cache.items(kinds.NAMESPACES)
        }
        merged = merge_listener_sets(
            gateway,
            self._listener_sets(),
            find_secret=self.find_secret,
            find_config_map=self.find_config_map,
            grants=grants,
            namespace_labels=namespace_labels,
        )
        admitted = [item for verdict in merged.sets if verdict.refusal is None for item in verdict.raw.values()]
        bound = self._bound(gateway, merged) if is_ingress(gateway) and not is_managed(gateway) else None
        if bound is not None:
            # static_addresses rule 1: the proxies behind the named Services are the gateway; nothing is deployed
            found: Deployed | None = Deployed(invalid_parameters=self.deployer.invalid_parameters(gateway))
        else:
            found = await self.deployer.deploy(gateway, admitted)
        if found is None:
            return False
        namespace = str(gateway["metadata"]["namespace"])
        name = deployed_name(gateway)
        host = service_hostname(name, namespace, self.settings.template.domain)
        by_kind = {
            "HTTPRoute": routes,
            "GRPCRoute": self.cache.items(kinds.GRPC_ROUTES),
            "TLSRoute": self.cache.items(kinds.TLS_ROUTES),
            "TCPRoute": self.cache.items(kinds.TCP_ROUTES),
        }
        addresses = ingress_addresses(self.find(kinds.SERVICES, namespace, name), host)
        if is_ingress(gateway):
            wanted = ingress_status(
                gateway,
                found,
                merged.judged,
                host=host,
                addresses=addresses,
                attached=ingress_attached_routes(gateway, by_kind, namespace_labels=namespace_labels),
                listener_sets=merged.sets,
                resolved=backend_client_certificate(gateway, self.find_secret, grants),
                bound=bound,
            )
        else:
            attached = attached_routes(gateway, routes)
            wanted = gateway_status(gateway, found, domain=self.settings.template.domain, attached=attached)
        ok = await self.deployer.write_status(kinds.GATEWAYS, gateway, wanted, now)
        return (
            await self._write_listener_set_status(
                merged, found, host, addresses, by_kind, namespace_labels, now, bound=bound
            )
            and ok
        )

    def _bound(self, gateway: Obj, merged: MergedGateway) -> Bound:
        """A manual deployment's Services (:mod:`.static_addresses`), noted for :meth:`backing_event_handlers`."""
        domain = self.settings.template.domain
        requested = requested_services(gateway, domain)
        self._naming.update(key for host in requested.services if (key := service_key(host, domain)) is not None)
        ports = gateway_ports(merged.judged, merged.sets)
        return bind(requested, ports, self.services, domain)

    def _listener_sets(self) -> list[tuple[tuple[str, str], Obj]]:
        """Every ListenerSet, of both names, with its (group, kind)."""
        return [
            (origin, obj)
            for origin, kind in zip(LISTENER_SET_KINDS, (kinds.LISTENER_SETS, kinds.X_LISTENER_SETS), strict=True)
            for obj in self.cache.items(kind)
            if not field_of(obj, "metadata", "deletionTimestamp")
        ]

    async def _write_listener_set_status(
        self,
        merged: MergedGateway,
        found: Deployed,
        host: str,
        addresses: Sequence[Mapping[str, str]],
        by_kind: Mapping[str, Sequence[Obj]],
        namespace_labels: Mapping[str, Mapping[str, str]],
        now: str,
        *,
        bound: Bound | None = None,
    ) -> bool:
        """The status of each ListenerSet naming the Gateway (:mod:`.ingress_status` rules 7 and 10)."""
        ok = True
        domain = self.settings.template.domain
        for verdict in merged.sets:
            set_bound = None
            if bound is not None:
                set_bound = bind(bound.requested, listener_set_server_ports(verdict), self.services, domain)
            kind = kinds.LISTENER_SETS if verdict.origin == LISTENER_SET_KINDS[0] else kinds.X_LISTENER_SETS
            attached = ingress_attached_routes(
                verdict.obj,
                by_kind,
                origin=verdict.origin,
                listeners=list(verdict.raw.values()),
                namespace_labels=namespace_labels,
            )
            wanted = listener_set_status(
                verdict, found, host=host, addresses=addresses, attached=attached, bound=set_bound
            )
            ok &= await self.deployer.write_status(kind, dict(verdict.obj), wanted, now)
        return ok

    def _namespace(self, gateway: Obj) -> Obj | None:
        """The Gateway's Namespace as last seen; None when unknown (or Namespaces cannot be read)."""
        name = field_of(gateway, "metadata", "namespace")
        return self.find(kinds.NAMESPACES, "", str(name)) if name else None

    def find_secret(self, namespace: str, name: str) -> Obj | None:
        """A credential Secret as last seen (None when Secrets cannot be read)."""
        return self.find(kinds.SECRETS, namespace, name)

    def find_config_map(self, namespace: str, name: str) -> Obj | None:
        """A ConfigMap as last seen (a Gateway's frontend ``caCertificateRefs``)."""
        return self.find(kinds.CONFIG_MAPS, namespace, name)
