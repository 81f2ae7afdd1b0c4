"""Which changes wake the gateway deployment controller (:mod:`.controller`): a pass runs ``debounce`` seconds after
any of them.

- Any change to a Gateway, ListenerSet, GatewayClass, route, credential Secret, ReferenceGrant, Namespace (its
  ``istio.io/rev`` label can choose the revision of its Gateways) or object the controller deployed.
- Of ConfigMaps, only those that may overlay a Gateway: the injection templates (``istio-sidecar-injector``,
  :mod:`.injection`) or a class defaults ConfigMap in the control plane's namespace, or one a Gateway's
  ``parametersRef`` or frontend ``caCertificateRefs`` names. The control plane writes others (the root
  certificate's in every namespace) and must not wake the controller with them. An update is judged on the old and
  the new object alike (a label removed is a change too).
- Of the cluster view's Services and EndpointSlices (:meth:`Wakeups.backing_event_handlers`), only those of the
  Services a manual deployment named at the last pass (:mod:`.static_addresses`); other Services' churn does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ambit.controlplane.gateway.cache import Obj, field_of
from ambit.controlplane.gateway.injection import injector_name
from ambit.controlplane.gateway.overlay import CLASS_DEFAULTS_LABEL, parameters_ref
from ambit.controlplane.gateway.static_addresses import SERVICE_NAME_LABEL
from ambit.controlplane.translate.listeners import frontend_config_maps
from ambit.controlplane.view import EventHandlers
from ambit.k8s import kinds

if TYPE_CHECKING:
    from ambit.controlplane.gateway.controller import GatewayControllerSettings


class Wakeups:
    """The informers' handlers: each sets ``dirty`` when its change matters."""

    def __init__(
        self, dirty: asyncio.Event, settings: GatewayControllerSettings, gateways: Callable[[], list[Obj]]
    ) -> None:
        self.dirty = dirty
        self.settings = settings
        self.gateways = gateways
        """Every Gateway as last seen."""
        self.backing: frozenset[tuple[str, str]] = frozenset()
        """(namespace, name) of the Services the manual deployments named at the last pass: their changes, and
        their EndpointSlices', wake the controller (:meth:`backing_event_handlers`)."""

    def changed(self, obj: Obj) -> None:
        self.dirty.set()

    def updated(self, old: Obj, new: Obj) -> None:
        self.dirty.set()

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
            if (str(meta.get("namespace") or ""), str(name or "")) in self.backing:
                self.dirty.set()

        def updated(old: Obj, new: Obj) -> None:
            changed(new)

        return changed, updated, changed

    def config_map_changed(self, obj: Obj) -> None:
        """Only the ConfigMaps that may overlay a Gateway matter: the control plane writes others (the root
        certificate's in every namespace) and must not wake the controller with them."""
        namespace, name = field_of(obj, "metadata", "namespace"), field_of(obj, "metadata", "name")
        labels = field_of(obj, "metadata", "labels")
        if namespace == self.settings.system_namespace and (
            (isinstance(labels, Mapping) and CLASS_DEFAULTS_LABEL in labels)
            or name == injector_name(self.settings.template.revision)
        ):
            self.dirty.set()
            return
        for gateway in self.gateways():
            if parameters_ref(gateway) == (namespace, name) or (namespace, name) in frontend_config_maps(gateway):
                self.dirty.set()
                return

    def config_map_updated(self, old: Obj, new: Obj) -> None:
        self.config_map_changed(old)  # a label removed is a change too
        self.config_map_changed(new)
