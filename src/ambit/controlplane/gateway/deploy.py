"""The gateway deployment controller's writes (:mod:`.controller`): deploying one Gateway (find its overlays, render
its objects with them, plan each write against the cache and carry it out) and writing statuses.

Theory of operation. A Gateway's overlays apply in this order: its injection template's (:mod:`.injection`, from the
``istio-sidecar-injector`` ConfigMap of the control plane's namespace, parsed again only when that ConfigMap
changes, and evaluated again per Gateway only when the Gateway changes), then its class's defaults ConfigMap, then
the ConfigMap its ``parametersRef`` names (:mod:`.overlay` rule 1). :mod:`.render` turns the Gateway and its
overlays into its ServiceAccount, Deployment and Service (and the HorizontalPodAutoscaler and PodDisruptionBudget an
overlay asks for); each is planned against what the cache holds (:mod:`.apply`) and created or patched.

Rules:

1. An unusable ``parametersRef``, a template that does not evaluate, or overlays that cannot be applied: nothing is
   written, what was deployed stays, and the reason goes to the Gateway's status.
2. A name taken by an object not in the cache is read and planned again once (someone else's object is refused).
3. A conflict (409), or a second lost race, ends the Gateway's pass with :data:`RETRY`: the controller runs the pass
   again after ``retry`` seconds or the next change. Any other refusal of the API server is the Gateway's problem,
   reported in its status.
4. What a write returned stands in for the cached object (:meth:`~.cache.GatewayCache.remember`).
5. A status is patched only when the planned one (:func:`~.status.plan_status`) differs from the object's; a
   status whose object is gone is done with, a conflict or another refusal fails the pass (rule 3).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ambit.controlplane.gateway.apply import Create, Leave, Patch, Refuse, plan_apply
from ambit.controlplane.gateway.cache import GatewayCache, Obj, field_of
from ambit.controlplane.gateway.injection import (
    InjectionConfig,
    TemplateFailed,
    injector_name,
    parse_injection_config,
    template_overlay,
)
from ambit.controlplane.gateway.overlay import (
    InvalidParameters,
    Overlay,
    class_defaults,
    missing_parameters,
    parameters_ref,
)
from ambit.controlplane.gateway.render import INGRESS_CLASS, Unrenderable, deployed_name, render_waypoint
from ambit.controlplane.gateway.status import Deployed, cluster_ips, plan_status
from ambit.controlplane.translate.waypoint_gateways import WAYPOINT_CLASS
from ambit.k8s import (
    KubeAlreadyExistsError,
    KubeApiStatusError,
    KubeClient,
    KubeClientError,
    KubeConflictError,
    KubeNotFoundError,
    kinds,
)

if TYPE_CHECKING:
    from ambit.controlplane.gateway.controller import GatewayControllerSettings

log = logging.getLogger("ambit.controlplane.gateway")

OWNED_KINDS = (kinds.SERVICE_ACCOUNTS, kinds.DEPLOYMENTS, kinds.SERVICES)
OPTIONAL_OWNED_KINDS = (kinds.HORIZONTAL_POD_AUTOSCALERS, kinds.POD_DISRUPTION_BUDGETS)
"""Deployed only when an overlay names them: the controller works without them."""
KIND_OF = {kind.kind: kind for kind in (*OWNED_KINDS, *OPTIONAL_OWNED_KINDS)}


class Retry(enum.Enum):
    RETRY = "retry"


RETRY = Retry.RETRY


def _ready(deployment: Mapping[str, Any] | None) -> bool:
    ready = ((deployment or {}).get("status") or {}).get("readyReplicas")
    return isinstance(ready, int) and not isinstance(ready, bool) and ready >= 1


class GatewayDeployer:
    """Applies Gateways' objects through ``client``, reading through ``cache``; :meth:`begin_pass` once a pass."""

    def __init__(self, client: KubeClient, settings: GatewayControllerSettings, cache: GatewayCache) -> None:
        self.client = client
        self.settings = settings
        self.cache = cache
        self._class_defaults: dict[str, Mapping[str, Any] | None] = {}
        """Class name → its defaults ConfigMap, found once per pass."""
        self._injection: InjectionConfig | TemplateFailed | None = None
        self._injection_key: tuple[str, str] | None = None
        """(uid, resourceVersion) of the injection ConfigMap parsed into ``_injection``: parsed once per change."""
        self._templated: dict[tuple[str, str], Overlay | TemplateFailed | None] = {}
        """A Gateway's (uid, resourceVersion) → its template overlay under ``_injection``: a template is evaluated
        again only when it or the Gateway changes (evaluation is bounded, but not free)."""

    def begin_pass(self) -> None:
        """Find the class defaults and the injection ConfigMap as they are now."""
        system = self.settings.system_namespace
        in_system = [
            cm for cm in self.cache.items(kinds.CONFIG_MAPS) if field_of(cm, "metadata", "namespace") == system
        ]
        self._class_defaults = {name: class_defaults(in_system, name) for name in (WAYPOINT_CLASS, INGRESS_CLASS)}
        self._find_injection()

    async def deploy(self, gateway: Obj, extra_listeners: Sequence[Mapping[str, Any]] = ()) -> Deployed | None:
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
            if problem is RETRY:
                return None
            if isinstance(problem, str):
                return Deployed(problem=problem)
        return self._found(gateway)

    def _found(self, gateway: Obj, invalid_parameters: str | None = None) -> Deployed:
        namespace, name = str(gateway["metadata"]["namespace"]), deployed_name(gateway)
        service = self.cache.find(kinds.SERVICES, namespace, name)
        deployment = self.cache.find(kinds.DEPLOYMENTS, namespace, name)
        return Deployed(
            service_exists=service is not None,
            ready=_ready(deployment),
            cluster_ips=cluster_ips(service),
            invalid_parameters=invalid_parameters,
        )

    def _find_injection(self) -> None:
        """The injection ConfigMap (:mod:`.injection`), parsed again only when it changed."""
        name = injector_name(self.settings.template.revision)
        found = self.cache.find(kinds.CONFIG_MAPS, self.settings.system_namespace, name)
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
            if len(self._templated) >= 4 * max(len(self.cache.items(kinds.GATEWAYS)), 64):
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
        defaults = self._class_defaults.get(str(field_of(gateway, "spec", "gatewayClassName")))
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
        if kinds.CONFIG_MAPS.plural in self.cache.absent:
            return InvalidParameters(f"parametersRef ConfigMap {ref[0]}/{ref[1]} cannot be read")
        config_map = self.cache.find(kinds.CONFIG_MAPS, *ref)
        return missing_parameters(*ref) if config_map is None else Overlay.of(config_map)

    def invalid_parameters(self, gateway: Obj) -> str | None:
        """Why the ``parametersRef`` cannot be used, if it cannot: istiod checks it for a manual deployment too."""
        parameters = self._parameters(gateway)
        return parameters.message if isinstance(parameters, InvalidParameters) else None

    async def _apply(self, kind: kinds.ResourceKind, namespace: str, want: Obj) -> str | Retry | None:
        """Create or patch one object; None on success, :data:`RETRY` after a lost race, else the problem for
        the Gateway's status."""
        name = str(want["metadata"]["name"])
        have = self.cache.find(kind, namespace, name)
        for _ in range(2):
            plan = plan_apply(want, have)
            try:
                if isinstance(plan, Leave):
                    return None
                if isinstance(plan, Refuse):
                    return plan.message
                if isinstance(plan, Create):
                    created = await self.client.create(kind, plan.obj, namespace)
                    self.cache.remember(kind, created)
                    log.info("created %s %s/%s", kind.kind, namespace, name)
                    return None
                assert isinstance(plan, Patch)
                patched = await self.client.patch(kind, name, plan.patch, namespace)
                self.cache.remember(kind, patched)
                log.info("updated %s %s/%s", kind.kind, namespace, name)
                return None
            except KubeAlreadyExistsError:
                # Not in our cache: someone else's object (no label), or ours not yet seen. Look, and plan again.
                try:
                    have = await self.client.get(kind, name, namespace)
                except KubeClientError as exc:
                    return f"cannot read {kind.kind} {name!r}: {exc}"
            except KubeConflictError:
                return RETRY
            except KubeApiStatusError as exc:
                log.warning("cannot write %s %s/%s: %s", kind.kind, namespace, name, exc)
                return f"the API server refused the {kind.kind} {name!r}: {exc}"
        return RETRY

    async def write_status(self, kind: kinds.ResourceKind, obj: Obj, wanted: Mapping[str, Any], now: str) -> bool:
        """Patch ``obj``'s status to ``wanted`` unless it already says that; False when the write failed (rule 3:
        the pass runs again)."""
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        current = self.cache.find(kind, namespace, name) or obj
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
        self.cache.remember(kind, patched)
        return True
