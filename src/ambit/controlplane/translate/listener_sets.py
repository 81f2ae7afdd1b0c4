"""ListenerSets: listeners that other objects, possibly of other namespaces, add to an ingress Gateway, merged as
istiod merges them (Gateway API ``ListenerSet``; pure).

Theory of operation: :func:`merge_listener_sets` takes one Gateway and every ListenerSet, and returns the
Gateway's judged listeners (:func:`ambit.controlplane.translate.listeners.judge_items`) together with a
:class:`ListenerSetVerdict` for each ListenerSet whose ``parentRef`` names that Gateway. The Gateway's status,
each ListenerSet's status and the gateway's served configuration all read these verdicts, so a ListenerSet's
listener is served exactly when its status says Programmed.

Rules:

1. Kinds: ``ListenerSet`` of ``gateway.networking.k8s.io`` (v1, what istiod reads since Gateway API v1.5) and
   ``XListenerSet`` of ``gateway.networking.x-k8s.io`` (v1alpha1, the experimental kind of Gateway API v1.3 and
   v1.4) are the same thing under two names (:data:`LISTENER_SET_KINDS`); a route's ``parentRefs`` and a
   ReferenceGrant's ``from`` name the kind the object has.
2. A ListenerSet's parent is its ``spec.parentRef``: group and kind must be Gateway API's ``Gateway`` (the
   defaults), the namespace defaults to the ListenerSet's. Another parent, or a Gateway that does not exist, gets
   no verdict and no status (istiod cannot tell the set is its own).
3. Only ingress Gateways (class ``istio``) take ListenerSets: under another class of ours (``istio-waypoint``) a
   ListenerSet is ``NotAllowed`` "The "<class>" GatewayClass does not support ListenerSet", as istiod reports it,
   and serves nothing.
4. The parent's ``spec.allowedListeners.namespaces.from`` admits the ListenerSet's namespace: ``All``; ``Same``
   (the Gateway's own); ``Selector`` (the namespace's labels, with ``kubernetes.io/metadata.name`` implied, must
   match; an unknown namespace does not); ``None`` and no ``allowedListeners`` at all (the default) admit none.
   A ListenerSet not admitted is ``NotAllowed`` "The parent Gateway does not allow this reference; check the
   'spec.allowedRoutes'" (istiod's message), has no listener status, and serves nothing: a tenant cannot add a
   hostname or port to a Gateway that did not invite its namespace, nor take a slot from an invited listener.
5. Conflicts (:mod:`ambit.controlplane.translate.listeners` rule 3) are decided over the merged list: the
   Gateway's listeners first, then those of each admitted ListenerSet ordered by ``creationTimestamp``, then
   ``namespace/name``. A ListenerSet listener's port defaults to 80 for ``HTTP`` and 443 for ``HTTPS``.
6. Each listener of an admitted ListenerSet is judged as a Gateway's is, in the ListenerSet's namespace (its
   ``certificateRefs`` to other namespaces need a ReferenceGrant from the ListenerSet's kind and namespace), with
   the parent's ``spec.tls.frontend``. An ``HTTPS`` or ``TLS`` listener without ``tls`` is not accepted
   (``UnsupportedProtocol`` "protocol is HTTPS but no TLS section is defined").
7. A ListenerSet is valid when at least one of its listeners is programmed (ready); the parent's
   ``attachedListenerSets`` counts the valid ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.controlplane.translate.fields import mapping as _mapping
from ambit.controlplane.translate.fields import text as _text
from ambit.controlplane.translate.listeners import (
    GATEWAY_GROUP,
    JudgedListener,
    Origin,
    SecretLookup,
    is_ingress,
    judge_items,
    listener_conflicts,
    listener_items,
    no_config_maps,
)
from ambit.controlplane.translate.reference_grants import NO_GRANTS, ReferenceGrants
from ambit.model.labels import selector_from_spec

__all__ = [
    "LISTENER_SET_KINDS",
    "ListenerSetVerdict",
    "MergedGateway",
    "admits_listener_set",
    "listener_set_parent",
    "merge_listener_sets",
]

Obj = Mapping[str, Any]

LISTENER_SET_KINDS: tuple[Origin, ...] = (
    (GATEWAY_GROUP, "ListenerSet"),
    ("gateway.networking.x-k8s.io", "XListenerSet"),
)
"""Rule 1: (group, kind) of both names of a ListenerSet."""
NOT_ALLOWED_MESSAGE = "The parent Gateway does not allow this reference; check the 'spec.allowedRoutes'"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
DEFAULT_PORTS = {"HTTP": 80, "HTTPS": 443}


@dataclass(frozen=True, slots=True)
class ListenerSetVerdict:
    obj: Obj
    origin: Origin
    namespace: str
    name: str
    refusal: tuple[str, str] | None = None
    """(reason, message) when the ListenerSet is not taken at all (rules 3 and 4)."""
    judged: tuple[JudgedListener, ...] = ()
    raw: Mapping[str, Obj] = dataclasses.field(default_factory=dict)
    """Listener name → its spec, the port defaulted (rule 5)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def valid(self) -> bool:
        """Rule 7."""
        return self.refusal is None and any(item.ready for item in self.judged)


@dataclass(frozen=True, slots=True)
class MergedGateway:
    judged: tuple[JudgedListener, ...]
    """The Gateway's own listeners."""
    sets: tuple[ListenerSetVerdict, ...] = ()
    """Every ListenerSet naming the Gateway, admitted ones in merge order (rule 5), then the others."""

    @property
    def attached_listener_sets(self) -> int:
        return sum(1 for item in self.sets if item.valid)


def listener_set_parent(obj: Obj) -> str | None:
    """Rule 2: ``namespace/name`` of the Gateway a ListenerSet names, or None when it names no Gateway."""
    ref = _mapping(_mapping(obj.get("spec")).get("parentRef"))
    group = _text(ref.get("group")) if "group" in ref else GATEWAY_GROUP
    kind = _text(ref.get("kind")) or "Gateway"
    name = _text(ref.get("name"))
    if group != GATEWAY_GROUP or kind != "Gateway" or not name:
        return None
    namespace = _text(ref.get("namespace")) or _text(_mapping(obj.get("metadata")).get("namespace"))
    return f"{namespace}/{name}"


def admits_listener_set(gateway: Obj, namespace: str, namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
    """Rule 4: the Gateway's ``allowedListeners`` admit ListenerSets of ``namespace``."""
    allowed = _mapping(_mapping(_mapping(gateway.get("spec")).get("allowedListeners")).get("namespaces"))
    if not allowed:
        return False
    source = _text(allowed.get("from"))
    if source == "All":
        return True
    if source == "Same":
        return namespace == _text(_mapping(gateway.get("metadata")).get("namespace"))
    if source not in ("Selector", ""):
        return False  # None, or a value we do not know
    if namespace not in namespace_labels:
        return False
    try:
        selector = selector_from_spec(allowed.get("selector"))
    except (ValueError, TypeError):
        return False
    labels = {**namespace_labels[namespace], NAMESPACE_NAME_LABEL: namespace}
    return selector is not None and selector.matches(labels)


def _merge_order(obj: Obj) -> tuple[str, str]:
    """Rule 5: creation time (RFC 3339 in UTC sorts as text), then ``namespace/name``."""
    meta = _mapping(obj.get("metadata"))
    return _text(meta.get("creationTimestamp")), f"{_text(meta.get('namespace'))}/{_text(meta.get('name'))}"


def _with_port(listener: Obj) -> Obj:
    """Rule 5: a ListenerSet listener with its port defaulted."""
    if "port" in listener:
        return listener
    port = DEFAULT_PORTS.get(_text(listener.get("protocol")))
    return {**listener, "port": port} if port is not None else listener


def merge_listener_sets(
    gateway: Obj,
    listener_sets: Iterable[tuple[Origin, Obj]],
    *,
    find_secret: SecretLookup,
    find_config_map: SecretLookup = no_config_maps,
    grants: ReferenceGrants = NO_GRANTS,
    namespace_labels: Mapping[str, Mapping[str, str]],
) -> MergedGateway:
    """Rules 1-7 for one Gateway (an ingress one, or one of ours of another class); ``listener_sets`` are
    (group and kind, object) pairs."""
    meta = _mapping(gateway.get("metadata"))
    namespace = _text(meta.get("namespace"))
    key = f"{namespace}/{_text(meta.get('name'))}"
    spec = gateway.get("spec")
    admitted: list[tuple[Obj, Origin]] = []
    refused: list[ListenerSetVerdict] = []
    for origin, obj in listener_sets:
        if origin not in LISTENER_SET_KINDS or listener_set_parent(obj) != key:
            continue
        set_meta = _mapping(obj.get("metadata"))
        set_ns, set_name = _text(set_meta.get("namespace")), _text(set_meta.get("name"))
        if not is_ingress(gateway):
            gateway_class = _text(_mapping(spec).get("gatewayClassName"))
            message = f'The "{gateway_class}" GatewayClass does not support ListenerSet'
            refused.append(ListenerSetVerdict(obj, origin, set_ns, set_name, ("NotAllowed", message)))
        elif not admits_listener_set(gateway, set_ns, namespace_labels):
            refused.append(ListenerSetVerdict(obj, origin, set_ns, set_name, ("NotAllowed", NOT_ALLOWED_MESSAGE)))
        else:
            admitted.append((obj, origin))
    own = listener_items(gateway)
    if not is_ingress(gateway):
        return MergedGateway((), tuple(sorted(refused, key=lambda v: v.key)))
    admitted.sort(key=lambda pair: _merge_order(pair[0]))
    per_set = [[_with_port(item) for item in listener_items(obj)] for obj, _ in admitted]
    conflicts = listener_conflicts([*own, *(item for items in per_set for item in items)])
    judged = judge_items(
        own,
        namespace=namespace,
        spec=spec,
        conflicts=conflicts,
        find_secret=find_secret,
        find_config_map=find_config_map,
        grants=grants,
    )
    verdicts: list[ListenerSetVerdict] = []
    for (obj, origin), items in zip(admitted, per_set, strict=True):
        set_meta = _mapping(obj.get("metadata"))
        set_ns = _text(set_meta.get("namespace"))
        set_judged = judge_items(
            items,
            namespace=set_ns,
            spec=spec,
            conflicts=conflicts,
            find_secret=find_secret,
            find_config_map=find_config_map,
            grants=grants,
            origin=origin,
        )
        raw = {_text(item.get("name")): item for item in items}
        verdicts.append(ListenerSetVerdict(obj, origin, set_ns, _text(set_meta.get("name")), None, set_judged, raw))
    return MergedGateway(judged, (*verdicts, *sorted(refused, key=lambda v: v.key)))
