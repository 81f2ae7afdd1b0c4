"""The server's current resources of one type, and who to tell when they change.

Theory of operation: a :class:`ResourceTable` holds the control plane's output of one type as xDS resources (name →
version, packed body, aliases): :class:`AddressTable` for Addresses, :class:`AuthorizationTable` for
Authorizations, :class:`WaypointConfigTable` for waypoints' route tables. :meth:`ResourceTable.replace` takes a
whole new map (what :func:`ambit.controlplane.addresses.addresses` or ``authorizations`` returns), keeps entries
whose version did not change, and tells every listener the set of names that were added, changed or removed;
:meth:`ResourceTable.patch` takes only the entries that may have changed and the names that went away
(:func:`ambit.controlplane.addresses.address_changes`), at a cost in the size of the change, with the same result
and the same notification as a replace of the whole map.
Listeners are plain callables run synchronously on the caller's thread (the event loop): the xDS server's
per-client handler only records the names and wakes itself, so a replace never waits on a slow client. Packing into
``Any`` happens here, once per resource version, not once per client; an Address already encoded as the resource it is
served as (:class:`~ambit.xds.convert.EncodedAddress`) is taken as it is, so its bytes are held once.

Invariants: ``current`` is replaced, never mutated in place, so a handler holding an old :class:`ResourceSet` sees a
consistent snapshot; listeners are told only about real changes (same version = no notification).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from google.protobuf import any_pb2

from ambit.xds.authorization import pack_authorization
from ambit.xds.convert import ADDRESS_TYPE_URL, EncodedAddress, address_aliases, address_parents, pack_address
from ambit.xds.gateway import pack_gateway_config
from ambit.xds.resource_set import EMPTY, ResourceSet, XdsResource
from ambit.xds.routes import pack_waypoint_config

__all__ = [
    "AddressTable",
    "AuthorizationTable",
    "ChangeListener",
    "GatewayConfigTable",
    "ResourceSource",
    "ResourceTable",
    "WaypointConfigTable",
]

ChangeListener = Callable[[frozenset[str]], None]


class ResourceSource(Protocol):
    """What the xDS server serves Address resources from."""

    @property
    def current(self) -> ResourceSet: ...

    def add_listener(self, listener: ChangeListener) -> None: ...

    def remove_listener(self, listener: ChangeListener) -> None: ...


class ResourceTable:
    """The current resources of one type, with change notifications. Pure bookkeeping; no asyncio."""

    __slots__ = ("_current", "_listeners", "generation")

    def __init__(self, resources: Mapping[str, tuple[str, Any]] | None = None) -> None:
        self._current = EMPTY
        self._listeners: list[ChangeListener] = []
        self.generation = 0
        """How many replaces changed something."""
        if resources:
            self.replace(resources)

    @property
    def current(self) -> ResourceSet:
        return self._current

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: ChangeListener) -> None:
        self._listeners.remove(listener)

    def _pack(self, message: Any) -> any_pb2.Any:
        raise NotImplementedError

    def _aliases(self, message: Any) -> tuple[str, ...]:
        return ()

    def _parents(self, message: Any) -> tuple[str, ...]:
        return ()

    def _resource(self, name: str, version: str, message: Any) -> XdsResource:
        return XdsResource.built(name, version, self._pack(message), self._aliases(message), self._parents(message))

    def replace(self, resources: Mapping[str, tuple[str, Any]]) -> frozenset[str]:
        """Make ``resources`` (name → (version, message)) current; returns and announces the changed names."""
        old = self._current.by_name
        merged: dict[str, XdsResource] = {}
        changed: set[str] = set()
        for name, (version, message) in resources.items():
            previous = old.get(name)
            if previous is not None and previous.version == version:
                merged[name] = previous
                continue
            merged[name] = self._resource(name, version, message)
            changed.add(name)
        changed.update(name for name in old if name not in merged)
        if changed:
            upserts = [merged[name] for name in changed if name in merged]
            self._current = self._current.updated(upserts, (name for name in changed if name not in merged))
            self.generation += 1
            names = frozenset(changed)
            for listener in list(self._listeners):
                listener(names)
        return frozenset(changed)

    def patch(self, upserts: Mapping[str, tuple[str, Any]], removed: Iterable[str]) -> frozenset[str]:
        """Put ``upserts`` (name → (version, message)) in and take the ``removed`` names out, leaving every other
        resource as it is; returns and announces the changed names, as :meth:`replace` of the whole result would.
        A name in both is upserted."""
        old = self._current.by_name
        built: list[XdsResource] = []
        changed: set[str] = set()
        for name, (version, message) in upserts.items():
            previous = old.get(name)
            if previous is not None and previous.version == version:
                continue
            built.append(self._resource(name, version, message))
            changed.add(name)
        gone = {name for name in removed if name in old and name not in upserts}
        changed.update(gone)
        if changed:
            self._current = self._current.updated(built, gone)
            self.generation += 1
            names = frozenset(changed)
            for listener in list(self._listeners):
                listener(names)
        return frozenset(changed)


class AddressTable(ResourceTable):
    """The current ``istio.workload.Address`` resources (with their ``network/IP`` aliases, and each workload's
    services as its parents, so that looking a Service up returns its endpoints)."""

    __slots__ = ()

    def _pack(self, message: Any) -> any_pb2.Any:
        if isinstance(message, EncodedAddress):
            return any_pb2.Any(type_url=ADDRESS_TYPE_URL, value=message.data)
        return pack_address(message)

    def _aliases(self, message: Any) -> tuple[str, ...]:
        return message.aliases if isinstance(message, EncodedAddress) else address_aliases(message)

    def _parents(self, message: Any) -> tuple[str, ...]:
        return message.parents if isinstance(message, EncodedAddress) else address_parents(message)

    def _resource(self, name: str, version: str, message: Any) -> XdsResource:
        if isinstance(message, EncodedAddress):
            made = message.resource
            if made.name == name and made.version == version:
                return made  # the one the encoding holds: its bytes are kept once
        return super()._resource(name, version, message)


class AuthorizationTable(ResourceTable):
    """The current ``istio.security.Authorization`` resources, named by policy key."""

    __slots__ = ()

    def _pack(self, message: Any) -> any_pb2.Any:
        return pack_authorization(message)


class WaypointConfigTable(ResourceTable):
    """The current ``ambit.waypoint.v1.WaypointConfig`` resources, named by waypoint key ``namespace/name``."""

    __slots__ = ()

    def _pack(self, message: Any) -> any_pb2.Any:
        return pack_waypoint_config(message)


class GatewayConfigTable(ResourceTable):
    """The current ``ambit.gateway.v1.GatewayConfig`` resources, named by Gateway key ``namespace/name``."""

    __slots__ = ()

    def _pack(self, message: Any) -> any_pb2.Any:
        return pack_gateway_config(message)
