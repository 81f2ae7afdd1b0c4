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
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ambit.controlplane.gateway.apply import Create, Leave, Patch, Refuse, plan_apply
from ambit.controlplane.gateway.ingress_status import (
    gateway_ports,
    ingress_addresses,
    ingress_attached_routes,
    ingress_status,
    listener_set_server_ports,
    listener_set_status,
)
from ambit.controlplane.gateway.injection import (
    InjectionConfig,
    TemplateFailed,
    injector_name,
    parse_injection_config,
    template_overlay,
)
from ambit.controlplane.gateway.overlay import (
    CLASS_DEFAULTS_LABEL,
    InvalidParameters,
    Overlay,
    class_defaults,
    missing_parameters,
    parameters_ref,
)
from ambit.controlplane.gateway.render import (
    CONTROLLER_LABEL,
    GATEWAY_CONTROLLER,
    GATEWAY_CONTROLLER_LABEL,
    INGRESS_CLASS,
    MANAGED_LABEL,
    MESH_CONTROLLER,
    Unrenderable,
    WaypointTemplateSettings,
    deployed_name,
    is_ingress,
    render_waypoint,
    service_hostname,
)
from ambit.controlplane.gateway.revision import is_ours
from ambit.controlplane.gateway.static_addresses import (
    NO_SERVICES,
    SERVICE_NAME_LABEL,
    Bound,
    ServiceLookup,
    bind,
)
from ambit.controlplane.gateway.status import (
    Deployed,
    attached_routes,
    class_status,
    cluster_ips,
    gateway_status,
    plan_status,
)
from ambit.controlplane.status import rfc3339
from ambit.controlplane.translate.listener_sets import LISTENER_SET_KINDS, MergedGateway, merge_listener_sets
from ambit.controlplane.translate.listeners import backend_client_certificate, frontend_config_maps
from ambit.controlplane.translate.manual_gateways import is_managed, requested_services, service_key
from ambit.controlplane.translate.reference_grants import ReferenceGrants
from ambit.controlplane.translate.waypoint_gateways import WAYPOINT_CLASS
from ambit.controlplane.view import CREDENTIAL_SECRETS, EventHandlers
from ambit.errors import AmbitError
from ambit.k8s import (
    Informer,
    InformerSettings,
    KubeAlreadyExistsError,
    KubeApiStatusError,
    KubeClient,
    KubeClientError,
    KubeConflictError,
    KubeForbiddenError,
    KubeNotFoundError,
    kinds,
)

__all__ = ["GatewayController", "GatewayControllerError", "GatewayControllerSettings"]

log = logging.getLogger("ambit.controlplane.gateway")

Obj = dict[str, Any]
Key = tuple[str, str, str]
"""(plural, namespace, name)."""

WAYPOINT_CLASS_DESCRIPTION = "The default Istio waypoint GatewayClass"
INGRESS_CLASS_DESCRIPTION = "The default Istio GatewayClass"
CLASSES = (
    (WAYPOINT_CLASS, MESH_CONTROLLER, WAYPOINT_CLASS_DESCRIPTION),
    (INGRESS_CLASS, GATEWAY_CONTROLLER, INGRESS_CLASS_DESCRIPTION),
)
OWNED_KINDS = (kinds.SERVICE_ACCOUNTS, kinds.DEPLOYMENTS, kinds.SERVICES)
OPTIONAL_OWNED_KINDS = (kinds.HORIZONTAL_POD_AUTOSCALERS, kinds.POD_DISRUPTION_BUDGETS)
"""Deployed only when an overlay names them: the controller works without them."""
KIND_OF = {kind.kind: kind for kind in (*OWNED_KINDS, *OPTIONAL_OWNED_KINDS)}
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


class _Retry(enum.Enum):
    RETRY = "retry"


_RETRY = _Retry.RETRY


def _key(kind: kinds.ResourceKind, obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (kind.plural, str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _field(obj: Mapping[str, Any], *keys: str) -> Any:
    """``obj[k1][k2]...``, or None where a level is missing or not a map (objects come from users)."""
    value: Any = obj
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _version(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def _ready(deployment: Mapping[str, Any] | None) -> bool:
    ready = ((deployment or {}).get("status") or {}).get("readyReplicas")
    return isinstance(ready, int) and not isinstance(ready, bool) and ready >= 1


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
        self._backing: frozenset[tuple[str, str]] = frozenset()
        """(namespace, name) of the Services the manual deployments named at the last pass: their changes, and
        their EndpointSlices', wake the controller (:meth:`backing_event_handlers`)."""
        self._naming: set[tuple[str, str]] = set()
        self.settings = settings
        self._clock = clock
        self._dirty = asyncio.Event()
        self._informers: dict[str, Informer] = {}
        for kind in (*OPTIONAL_KINDS, *OWNED_KINDS):
            selector = OWNED_SELECTOR if kind in KIND_OF.values() else None
            config_map = kind is kinds.CONFIG_MAPS
            self._informers[kind.plural] = Informer(
                client,
                kind,
                label_selector=selector,
                field_selector=TLS_SECRETS if kind is kinds.SECRETS else None,
                on_add=self._config_map_changed if config_map else self._changed,
                on_update=self._config_map_updated if config_map else self._updated,
                on_delete=self._config_map_changed if config_map else self._changed,
                settings=settings.informer,
            )
        self.absent: set[str] = set()
        self._fresh: dict[Key, tuple[str, Obj]] = {}
        """Key → (the cache's version when we wrote, what the write returned): see the invariants above."""
        self._task: asyncio.Task[None] | None = None
        self._class_defaults: dict[str, Mapping[str, Any] | None] = {}
        """Class name → its defaults ConfigMap, found once per pass."""
        self._injection: InjectionConfig | TemplateFailed | None = None
        self._injection_key: tuple[str, str] | None = None
        """(uid, resourceVersion) of the injection ConfigMap parsed into ``_injection``: parsed once per change."""
        self._templated: dict[tuple[str, str], Overlay | TemplateFailed | None] = {}
        """A Gateway's (uid, resourceVersion) → its template overlay under ``_injection``: a template is evaluated
        again only when it or the Gateway changes (evaluation is bounded, but not free)."""
        self.passes = 0
        self.writes = 0

    def _changed(self, obj: Obj) -> None:
        self._dirty.set()

    def _updated(self, old: Obj, new: Obj) -> None:
        self._dirty.set()

    def backing_event_handlers(self, kind: kinds.ResourceKind) -> EventHandlers | None:
        """Handlers for the cluster view's informers (:meth:`~ambit.controlplane.view.ClusterView.add_event_handlers`):
        a change to a Service a manual deployment names, or to one of its EndpointSlices, marks the controller
        dirty; other Services' churn does not."""
        if kind is kinds.SERVICES:
            label = None
        elif kind is kinds.ENDPOINT_SLICES:
            label = SERVICE_NAME_LABEL
        else:
            return None

        def changed(obj: Obj) -> None:
            meta = obj.get("metadata")
            if not isinstance(meta, Mapping):
                return
            labels = meta.get("labels")
            name = meta.get("name") if label is None else labels.get(label) if isinstance(labels, Mapping) else None
            if (str(meta.get("namespace") or ""), str(name or "")) in self._backing:
                self._dirty.set()

        def updated(old: Obj, new: Obj) -> None:
            changed(new)

        return changed, updated, changed

    def _config_map_changed(self, obj: Obj) -> None:
        """Only the ConfigMaps that may overlay a Gateway matter: the control plane writes others (the root
        certificate's in every namespace) and must not wake the controller with them."""
        namespace, name = _field(obj, "metadata", "namespace"), _field(obj, "metadata", "name")
        labels = _field(obj, "metadata", "labels")
        if namespace == self.settings.system_namespace and (
            (isinstance(labels, Mapping) and CLASS_DEFAULTS_LABEL in labels)
            or name == injector_name(self.settings.template.revision)
        ):
            self._dirty.set()
            return
        for gateway in self._items(kinds.GATEWAYS):
            if parameters_ref(gateway) == (namespace, name) or (namespace, name) in frontend_config_maps(gateway):
                self._dirty.set()
                return

    def _config_map_updated(self, old: Obj, new: Obj) -> None:
        self._config_map_changed(old)  # a label removed is a change too
        self._config_map_changed(new)

    # -- cache ----------------------------------------------------------------------------------------------
    def _items(self, kind: kinds.ResourceKind) -> list[Obj]:
        return [] if kind.plural in self.absent else self._informers[kind.plural].items()

    def find(self, kind: kinds.ResourceKind, namespace: str, name: str) -> Obj | None:
        """The object as last seen: the cache's, or what our own write returned if the cache lags behind it."""
        cached = None if kind.plural in self.absent else self._informers[kind.plural].find(name, namespace or None)
        key = (kind.plural, namespace, name)
        fresh = self._fresh.get(key)
        if fresh is not None:
            if _version(cached) == fresh[0]:
                return fresh[1]
            del self._fresh[key]
        return cached

    def _remember(self, kind: kinds.ResourceKind, after: Obj) -> None:
        """Let ``after`` (what a write returned) stand in until the cache moves past the version it has now."""
        plural, namespace, name = key = _key(kind, after)
        cached = None if plural in self.absent else self._informers[plural].find(name, namespace or None)
        self._fresh[key] = (_version(cached), after)
        self.writes += 1

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def _probe(self, kind: kinds.ResourceKind) -> None:
        # Without the optional owned kinds only a Gateway whose overlay asks for one is affected, and says so.
        report = log.info if kind in OPTIONAL_OWNED_KINDS else log.warning
        try:
            await self.client.probe(kind)
        except KubeNotFoundError:
            report("%s are not served (is the CRD installed?)", kind)
        except KubeForbiddenError:
            report("not allowed to list %s", kind)
        except KubeClientError:
            return
        else:
            return
        self.absent.add(kind.plural)

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
                    await self._probe(kind)
                needed = (kinds.GATEWAYS, *OWNED_KINDS)
                if any(kind.plural in self.absent for kind in needed):
                    log.warning(
                        "the gateway deployment controller is idle: it cannot read %s", ", ".join(map(str, needed))
                    )
                    return
                if self.settings.create_class and kinds.GATEWAY_CLASSES.plural not in self.absent:
                    await self.ensure_class()
                active = [i for plural, i in self._informers.items() if plural not in self.absent]
                for informer in active:
                    informer.start()
                for informer in active:
                    await informer.wait_synced()
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
        for informer in self._informers.values():
            await informer.aclose()

    # -- reconcile ------------------------------------------------------------------------------------------
    async def reconcile_once(self) -> bool:
        """One pass over every waypoint Gateway and mesh GatewayClass; False when some write failed."""
        self.passes += 1
        ok = True
        now = rfc3339(self._clock())
        if self.settings.create_class and kinds.GATEWAY_CLASSES.plural not in self.absent:
            present = {_field(item, "metadata", "name") for item in self._items(kinds.GATEWAY_CLASSES)}
            if any(name not in present for name, _, _ in CLASSES):  # deleted: istiod's class controller re-creates it
                await self.ensure_class()
        for gateway_class in self._items(kinds.GATEWAY_CLASSES):
            if _field(gateway_class, "spec", "controllerName") in (MESH_CONTROLLER, GATEWAY_CONTROLLER):
                ok &= await self._write_status(kinds.GATEWAY_CLASSES, gateway_class, class_status(gateway_class), now)
        routes = self._items(kinds.HTTP_ROUTES)
        system = self.settings.system_namespace
        in_system = [cm for cm in self._items(kinds.CONFIG_MAPS) if _field(cm, "metadata", "namespace") == system]
        self._class_defaults = {name: class_defaults(in_system, name) for name in (WAYPOINT_CLASS, INGRESS_CLASS)}
        self._find_injection()
        self._naming = set()
        for gateway in self._items(kinds.GATEWAYS):
            if _field(gateway, "spec", "gatewayClassName") not in (WAYPOINT_CLASS, INGRESS_CLASS):
                continue
            if _field(gateway, "metadata", "deletionTimestamp"):
                continue
            if not is_ours(gateway, self._namespace(gateway), self.settings.template.revision):
                continue
            try:
                ok &= await self._reconcile_gateway(gateway, routes, now)
            except KubeClientError:
                raise  # the API server is unreachable: the whole pass is retried
            except Exception:  # a bug must not stop the other Gateways, nor the controller
                log.exception("reconciling Gateway %s/%s failed", *_key(kinds.GATEWAYS, gateway)[1:])
                ok = False
        self._backing = frozenset(self._naming)
        return ok

    async def _reconcile_gateway(self, gateway: Obj, routes: list[Obj], now: str) -> bool:
        grants = ReferenceGrants.build(self._items(kinds.REFERENCE_GRANTS))
        namespace_labels = {
            str(_field(ns, "metadata", "name")): dict(_field(ns, "metadata", "labels") or {})
            for ns in self._items(kinds.NAMESPACES)
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
            found: Deployed | None = Deployed(invalid_parameters=self._invalid_parameters(gateway))
        else:
            found = await self._deploy(gateway, admitted)
        if found is None:
            return False
        namespace = str(gateway["metadata"]["namespace"])
        name = deployed_name(gateway)
        host = service_hostname(name, namespace, self.settings.template.domain)
        by_kind = {
            "HTTPRoute": routes,
            "GRPCRoute": self._items(kinds.GRPC_ROUTES),
            "TLSRoute": self._items(kinds.TLS_ROUTES),
            "TCPRoute": self._items(kinds.TCP_ROUTES),
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
        ok = await self._write_status(kinds.GATEWAYS, gateway, wanted, now)
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
            for obj in self._items(kind)
            if not _field(obj, "metadata", "deletionTimestamp")
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
            ok &= await self._write_status(kind, dict(verdict.obj), wanted, now)
        return ok

    def _namespace(self, gateway: Obj) -> Obj | None:
        """The Gateway's Namespace as last seen; None when unknown (or Namespaces cannot be read)."""
        name = _field(gateway, "metadata", "namespace")
        return self.find(kinds.NAMESPACES, "", str(name)) if name else None

    def find_secret(self, namespace: str, name: str) -> Obj | None:
        """A credential Secret as last seen (None when Secrets cannot be read)."""
        return self.find(kinds.SECRETS, namespace, name)

    def find_config_map(self, namespace: str, name: str) -> Obj | None:
        """A ConfigMap as last seen (a Gateway's frontend ``caCertificateRefs``)."""
        return self.find(kinds.CONFIG_MAPS, namespace, name)

    async def _deploy(self, gateway: Obj, extra_listeners: Sequence[Mapping[str, Any]] = ()) -> Deployed | None:
        """Apply one Gateway's objects (``extra_listeners``: those of the ListenerSets it admits, whose ports its
        Service opens); what was found, or None when a write lost a race (to be retried)."""
        namespace = str(gateway["metadata"]["namespace"])
        overlays = self._overlays(gateway)
        if isinstance(overlays, InvalidParameters):
            return self._found(gateway, invalid_parameters=overlays.message)
        if isinstance(overlays, TemplateFailed):
            log.warning("Gateway %s/%s: %s", namespace, gateway["metadata"].get("name"), overlays.message)
            return Deployed(problem=overlays.message)
        rendered = render_waypoint(gateway, self.settings.template, overlays, extra_listeners)
        if isinstance(rendered, Unrenderable):
            return Deployed(problem=rendered.message)
        for want in rendered.objects():
            problem = await self._apply(KIND_OF[want["kind"]], namespace, want)
            if problem is _RETRY:
                return None
            if isinstance(problem, str):
                return Deployed(problem=problem)
        return self._found(gateway)

    def _found(self, gateway: Obj, invalid_parameters: str | None = None) -> Deployed:
        namespace, name = str(gateway["metadata"]["namespace"]), deployed_name(gateway)
        service = self.find(kinds.SERVICES, namespace, name)
        deployment = self.find(kinds.DEPLOYMENTS, namespace, name)
        return Deployed(
            service_exists=service is not None,
            ready=_ready(deployment),
            cluster_ips=cluster_ips(service),
            invalid_parameters=invalid_parameters,
        )

    def _find_injection(self) -> None:
        """The injection ConfigMap (:mod:`.injection`), parsed again only when it changed."""
        name = injector_name(self.settings.template.revision)
        found = self.find(kinds.CONFIG_MAPS, self.settings.system_namespace, name)
        if found is None:
            self._injection, self._injection_key = None, None
            self._templated.clear()
            return
        meta = found.get("metadata") or {}
        key = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
        if key != self._injection_key or not all(key):
            self._injection, self._injection_key = parse_injection_config(found), key
            self._templated.clear()
            if isinstance(self._injection, TemplateFailed):
                log.warning("%s", self._injection.message)

    def _template_overlay(self, gateway: Obj) -> Overlay | TemplateFailed | None:
        meta = gateway.get("metadata") or {}
        key = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
        if key in self._templated:
            return self._templated[key]
        found = template_overlay(
            gateway, self.settings.template, self._injection, system_namespace=self.settings.system_namespace
        )
        if all(key):
            if len(self._templated) >= 4 * max(len(self._items(kinds.GATEWAYS)), 64):
                self._templated.clear()  # versions of Gateways that changed since: drop them all, recompute
            self._templated[key] = found
        return found

    def _overlays(self, gateway: Obj) -> list[Overlay] | InvalidParameters | TemplateFailed:
        """The Gateway's overlays in the order they apply: its template's (:mod:`.injection`), then those of
        :mod:`.overlay` rule 1."""
        overlays: list[Overlay] = []
        from_template = self._template_overlay(gateway)
        if isinstance(from_template, TemplateFailed):
            return from_template
        if from_template is not None:
            overlays.append(from_template)
        defaults = self._class_defaults.get(str(_field(gateway, "spec", "gatewayClassName")))
        if defaults is not None:
            overlays.append(Overlay.of(defaults))
        parameters = self._parameters(gateway)
        if isinstance(parameters, InvalidParameters):
            return parameters
        if parameters is not None:
            overlays.append(parameters)
        return overlays

    def _parameters(self, gateway: Obj) -> Overlay | InvalidParameters | None:
        """The overlay the Gateway's ``parametersRef`` names (:mod:`.overlay` rule 1), or why it cannot be used."""
        ref = parameters_ref(gateway)
        if ref is None or isinstance(ref, InvalidParameters):
            return ref
        if kinds.CONFIG_MAPS.plural in self.absent:
            return InvalidParameters(f"parametersRef ConfigMap {ref[0]}/{ref[1]} cannot be read")
        config_map = self.find(kinds.CONFIG_MAPS, *ref)
        return missing_parameters(*ref) if config_map is None else Overlay.of(config_map)

    def _invalid_parameters(self, gateway: Obj) -> str | None:
        """Why the ``parametersRef`` cannot be used, if it cannot: istiod checks it for a manual deployment too."""
        parameters = self._parameters(gateway)
        return parameters.message if isinstance(parameters, InvalidParameters) else None

    async def _apply(self, kind: kinds.ResourceKind, namespace: str, want: Obj) -> str | _Retry | None:
        """Create or patch one object; None on success, :data:`_RETRY` after a lost race, else the problem for
        the Gateway's status."""
        name = str(want["metadata"]["name"])
        have = self.find(kind, namespace, name)
        for _ in range(2):
            plan = plan_apply(want, have)
            try:
                if isinstance(plan, Leave):
                    return None
                if isinstance(plan, Refuse):
                    return plan.message
                if isinstance(plan, Create):
                    created = await self.client.create(kind, plan.obj, namespace)
                    self._remember(kind, created)
                    log.info("created %s %s/%s", kind.kind, namespace, name)
                    return None
                assert isinstance(plan, Patch)
                patched = await self.client.patch(kind, name, plan.patch, namespace)
                self._remember(kind, patched)
                log.info("updated %s %s/%s", kind.kind, namespace, name)
                return None
            except KubeAlreadyExistsError:
                # Not in our cache: someone else's object (no label), or ours not yet seen. Look, and plan again.
                try:
                    have = await self.client.get(kind, name, namespace)
                except KubeClientError as exc:
                    return f"cannot read {kind.kind} {name!r}: {exc}"
            except KubeConflictError:
                return _RETRY
            except KubeApiStatusError as exc:
                log.warning("cannot write %s %s/%s: %s", kind.kind, namespace, name, exc)
                return f"the API server refused the {kind.kind} {name!r}: {exc}"
        return _RETRY

    async def _write_status(self, kind: kinds.ResourceKind, obj: Obj, wanted: Mapping[str, Any], now: str) -> bool:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        current = self.find(kind, namespace, name) or obj
        patch = plan_status(current, wanted, now)
        if patch is None:
            return True
        try:
            patched = await self.client.patch_status(kind, name, patch, namespace or None)
        except KubeNotFoundError:
            return True
        except KubeConflictError:
            return False  # the cache will bring the newer object; plan again then
        except KubeClientError as exc:
            log.warning("cannot write the status of %s %s/%s: %s", kind.kind, namespace, name, exc)
            return False
        self._remember(kind, patched)
        return True
