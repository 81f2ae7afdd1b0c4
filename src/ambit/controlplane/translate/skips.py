"""What the translation had to leave out, and why: one :class:`Skipped` per object (or part of one) it dropped.

Theory of operation: translation never fails on bad input. An object that cannot become a workload or a service
(a ServiceEntry without hosts, a WorkloadEntry whose address is not an IP), or a part of one that cannot be used
(one unparsable VIP, one endpoint given by hostname), is dropped and described by a :class:`Skipped` naming the
object, the field to fix and the reason. The control plane turns each into a Warning Event on the object.

:class:`SkipMemory` decides which of them are news: translations run after every burst of changes and report the
same problems again each time, but an Event is wanted once per problem, again only if the problem went away and
came back, or the object was recreated (a new uid), or the reason changed.

Invariants: equal inputs give equal skip lists (they are sorted); nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ObjectKind:
    """The ``apiVersion`` and ``kind`` of an input list (list items often carry neither)."""

    api_version: str
    kind: str


POD = ObjectKind("v1", "Pod")
SERVICE = ObjectKind("v1", "Service")
SERVICE_ENTRY = ObjectKind("networking.istio.io/v1", "ServiceEntry")
WORKLOAD_ENTRY = ObjectKind("networking.istio.io/v1", "WorkloadEntry")
ENDPOINT_SLICE = ObjectKind("discovery.k8s.io/v1", "EndpointSlice")


@dataclass(frozen=True, slots=True, order=True)
class Skipped:
    """One object, or one part of an object, that the translation left out."""

    kind: str
    namespace: str
    name: str
    field: str
    """The path of the field to fix, e.g. ``spec.endpoints[1].address``."""
    reason: str
    api_version: str = ""
    uid: str = ""

    @property
    def note(self) -> str:
        """One line for a human: the field and what is wrong with it."""
        return f"{self.field}: {self.reason}"

    def regarding(self) -> dict[str, Any]:
        """The object as :meth:`ambit.k8s.EventRecorder.record` wants it (enough to build its reference)."""
        meta = {"name": self.name, "namespace": self.namespace}
        if self.uid:
            meta["uid"] = self.uid
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": meta}


def skipped(kind: ObjectKind, obj: Mapping[str, Any], field: str, reason: str) -> Skipped:
    """A :class:`Skipped` for ``obj`` (an API dict of ``kind``)."""
    meta = obj.get("metadata") or {}
    return Skipped(
        kind=kind.kind,
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        field=field,
        reason=reason,
        api_version=str(obj.get("apiVersion") or kind.api_version),
        uid=str(meta.get("uid") or ""),
    )


class SkipMemory:
    """Remembers the problems last reported, so that each is reported once while it lasts."""

    def __init__(self) -> None:
        self._current: frozenset[Skipped] = frozenset()

    def news(self, skipped: Iterable[Skipped]) -> list[Skipped]:
        """The problems of this translation that the previous one did not have (sorted); remembers this one's."""
        current = frozenset(skipped)
        fresh = sorted(current - self._current)
        self._current = current
        return fresh
