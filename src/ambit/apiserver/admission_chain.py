"""The admission steps of a write: the attributes webhooks see, then mutating and validating webhooks.

Theory of operation: a write calls :meth:`AdmissionChain.mutate` after defaults and before validation, and
:meth:`AdmissionChain.validate` after validation, just before the store (kube-apiserver's order). The webhook
configurations are read from the store at each call, so a configuration applies from the write after it is
stored. Webhook warnings go to :data:`ambit.apiserver.requests.request_warnings`, also when a webhook denies.
Without a controller (no webhook client) both steps pass the object through.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ambit.apiserver.admission import AdmissionAttributes, AdmissionController, AdmissionError
from ambit.apiserver.registry import ResourceType
from ambit.apiserver.requests import JsonObject, User, warn
from ambit.apiserver.store import Store

NAMESPACES = ("", "namespaces")
VALIDATING = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")
MUTATING = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One write as admission sees it."""

    operation: str
    rtype: ResourceType
    version: str
    namespace: str
    name: str
    user: User
    subresource: str = ""
    dry_run: bool = False


class AdmissionChain:
    def __init__(self, store: Store, controller: AdmissionController | None) -> None:
        self.store = store
        self.controller = controller

    def attributes(
        self, request: Request, obj: JsonObject | None, old: JsonObject | None, *, own_labels: bool
    ) -> AdmissionAttributes:
        """``own_labels``: the object is a namespace, so its own labels are the namespace labels."""
        rtype = request.rtype
        if own_labels:
            ns_labels = ((obj or old or {}).get("metadata") or {}).get("labels") or {}
        elif rtype.namespaced:
            ns = self.store.get(NAMESPACES, "", request.namespace)
            ns_labels = (ns.obj["metadata"].get("labels") or {}) if ns else {}
        else:
            ns_labels = None
        return AdmissionAttributes(
            operation=request.operation,
            group=rtype.group,
            version=request.version,
            resource=rtype.plural,
            subresource=request.subresource,
            kind_group=rtype.group,
            kind_version=request.version,
            kind=rtype.kind,
            namespace=request.namespace if rtype.namespaced else "",
            name=request.name,
            object=obj,
            old_object=old,
            user_info=request.user.info(),
            dry_run=request.dry_run,
            namespace_labels=ns_labels,
        )

    async def mutate(self, attrs: AdmissionAttributes, obj: JsonObject) -> JsonObject:
        if self.controller is None:
            return obj
        configs = self._configurations(MUTATING)
        if not configs:
            return obj
        try:
            mutated, warnings = await self.controller.mutate(configs, attrs)
        except AdmissionError as exc:
            warn(exc.warnings)
            raise
        warn(warnings)
        return mutated if mutated is not None else obj

    async def validate(self, attrs: AdmissionAttributes, obj: JsonObject | None) -> None:
        if self.controller is None:
            return
        configs = self._configurations(VALIDATING)
        if configs:
            if obj is not None:
                attrs = dataclasses.replace(attrs, object=obj)
            try:
                warn(await self.controller.validate(configs, attrs))
            except AdmissionError as exc:
                warn(exc.warnings)
                raise

    async def aclose(self) -> None:
        if self.controller is not None:
            await self.controller.aclose()

    def _configurations(self, key: tuple[str, str]) -> list[Mapping[str, Any]]:
        return [item.obj for item in self.store.items(key)]
