"""The admission steps of a write: the attributes webhooks see, then mutating and validating admission.

Theory of operation: a write calls :meth:`AdmissionChain.mutate` after defaults and before validation, and
:meth:`AdmissionChain.validate` after validation, just before the store (kube-apiserver's order). Validation runs
the built-in NodeRestriction (:mod:`ambit.apiserver.node_authorizer`) and PodSecurity
(:mod:`ambit.apiserver.pod_security`) plugins first, always on as in kube-apiserver, then the validating
webhooks. The webhook configurations are read from the store at each call, so a configuration applies from the
write after it is stored. Warnings (PodSecurity's and webhooks') go to
:data:`ambit.apiserver.requests.request_warnings`, also when the write is then refused. Without a controller (no
webhook client) the webhook steps pass the object through.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from ambit.apiserver import errors
from ambit.apiserver.admission import AdmissionAttributes, AdmissionController, AdmissionError
from ambit.apiserver.node_authorizer import node_of, restrict, restrict_eviction
from ambit.apiserver.pod_security import (
    WORKLOAD_TEMPLATES,
    ExistingPod,
    NamespaceRequest,
    PodRequest,
    PodSecuritySettings,
    Review,
    review_namespace,
    review_pod,
    review_template,
    template_of,
)
from ambit.apiserver.registry import ResourceType
from ambit.apiserver.requests import JsonObject, User, warn
from ambit.apiserver.store import Store

log = logging.getLogger("ambit.apiserver.admission")

NAMESPACES = ("", "namespaces")
PODS = ("", "pods")
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
    def __init__(
        self, store: Store, controller: AdmissionController | None, pod_security: PodSecuritySettings | None = None
    ) -> None:
        self.store = store
        self.controller = controller
        self.pod_security = pod_security or PodSecuritySettings()

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
        self.check_node_restriction(attrs, obj)
        self.check_pod_security(attrs, obj)
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

    def check_node_restriction(self, attrs: AdmissionAttributes, obj: JsonObject | None) -> None:
        """NodeRestriction (:mod:`ambit.apiserver.node_authorizer`, rules 4-8) on a write by a node."""
        info = attrs.user_info
        node = node_of(str(info.get("username", "")), tuple(info.get("groups") or ()))
        if node is not None and (attrs.group, attrs.resource, attrs.subresource) == ("", "pods", "eviction"):
            pod = self.store.get(PODS, attrs.namespace, attrs.name)
            restrict_eviction(node, attrs.namespace, attrs.name, pod.obj if pod is not None else None)
        elif node is not None:
            restrict(
                node,
                attrs.operation,
                attrs.resource,
                attrs.subresource,
                attrs.namespace,
                attrs.name,
                obj,
                attrs.old_object,
            )

    def check_pod_security(self, attrs: AdmissionAttributes, obj: JsonObject | None) -> None:
        """The PodSecurity plugin on this write: warnings to the client, audit notes to the log, refusals raised."""
        if attrs.operation not in ("CREATE", "UPDATE") or obj is None:
            return
        key = (attrs.group, attrs.resource)
        username = str(attrs.user_info.get("username", ""))
        old = attrs.old_object
        review: Review
        if key == PODS:
            request = PodRequest(
                attrs.operation,
                attrs.namespace,
                attrs.name,
                username,
                _mapping(obj.get("metadata")),
                _mapping(obj.get("spec")),
                attrs.namespace_labels,
                _mapping(old.get("metadata")) if old else None,
                _mapping(old.get("spec")) if old else None,
                attrs.subresource,
            )
            review = review_pod(self.pod_security, request)
        elif key in WORKLOAD_TEMPLATES:
            meta, spec = template_of(key, obj)
            old_meta, old_spec = template_of(key, old) if old else (None, None)
            request = PodRequest(
                attrs.operation,
                attrs.namespace,
                attrs.name,
                username,
                meta,
                spec,
                attrs.namespace_labels,
                old_meta,
                old_spec,
                attrs.subresource,
            )
            review = review_template(self.pod_security, request)
        elif key == NAMESPACES:
            labels = _mapping(obj.get("metadata")).get("labels")
            old_labels = _mapping(old.get("metadata")).get("labels") if old else None
            ns_request = NamespaceRequest(attrs.operation, attrs.name, labels, old_labels, attrs.subresource)
            review = review_namespace(self.pod_security, ns_request, self._existing_pods(attrs.name))
        else:
            return
        warn(list(review.warnings))
        for note in review.audit:
            log.info(
                "PodSecurity audit: %s %s/%s by %s: %s", attrs.resource, attrs.namespace, attrs.name, username, note
            )
        if review.invalid:
            causes = [(e.field, f'Invalid value: "{e.value}": {e.message}') for e in review.invalid]
            raise errors.invalid(attrs.kind, attrs.name, causes)
        if review.forbidden:
            raise errors.ApiError(
                403, "Forbidden", review.forbidden, details={"name": attrs.name, "group": "", "kind": "pods"}
            )

    def _existing_pods(self, namespace: str) -> Iterator[ExistingPod]:
        for item in self.store.items(PODS, namespace):
            meta = _mapping(item.obj.get("metadata"))
            yield ExistingPod(str(meta.get("name", "")), meta, _mapping(item.obj.get("spec")))

    async def aclose(self) -> None:
        if self.controller is not None:
            await self.controller.aclose()

    def _configurations(self, key: tuple[str, str]) -> list[Mapping[str, Any]]:
        return [item.obj for item in self.store.items(key)]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
