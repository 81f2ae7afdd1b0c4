"""Who is on the other end of an xDS stream, and which resources of a per-caller type that caller may read.

Theory of operation: each stream the server admits authenticates its caller from the gRPC metadata with the
injected :data:`Authenticator` (a :class:`Caller`, or None: the stream ends ``UNAUTHENTICATED`` before any resource
is sent). A type served with a :data:`ReadCheck` is served per caller: each stream sees, through its own
:class:`CallerView`, only the source's resources ``check(caller, name)`` allows (a filtered
:class:`~ambit.xds.resource_set.ResourceSet`, rebuilt when the source's set is replaced), so a subscription to a name
the caller may not read is answered as for a resource that does not exist, and a change to it is never pushed to that
caller. Waypoint configurations are served this way: only to the waypoint's own service account. Whether a caller
may read the debug types (the sync status) is the injected :data:`DebugAccess`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ambit.xds.resource_set import EMPTY, ResourceSet
from ambit.xds.table import ResourceSource

__all__ = ["Authenticator", "Caller", "CallerView", "DebugAccess", "Metadata", "ReadCheck"]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is on the other end of a stream, as ``authenticate`` established it."""

    name: str
    """E.g. the service account ``system:serviceaccount:istio-system:ztunnel``."""
    cluster_id: str = ""


Metadata = Sequence[tuple[str, str | bytes]]
Authenticator = Callable[[Metadata], "Caller | Awaitable[Caller | None] | None"]
ReadCheck = Callable[[Caller, str], bool]
"""Whether a caller may read the resource of this name (a type served per caller)."""
DebugAccess = Callable[[Caller], Awaitable[bool]]
"""Whether a caller may read the control plane's debug types (the sync status)."""


class CallerView:
    """One caller's view of a per-caller type: the source's resources the check allows, cached per source set."""

    __slots__ = ("_caller", "_check", "_seen", "_set", "_source")

    def __init__(self, source: ResourceSource, check: ReadCheck, caller: Caller) -> None:
        self._source, self._check, self._caller = source, check, caller
        self._seen: ResourceSet | None = None
        self._set = EMPTY

    @property
    def current(self) -> ResourceSet:
        current = self._source.current
        if current is not self._seen:
            self._seen = current
            self._set = ResourceSet.build(r for r in current.by_name.values() if self._check(self._caller, r.name))
        return self._set
