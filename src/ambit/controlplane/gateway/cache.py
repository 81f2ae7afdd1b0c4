"""What the gateway deployment controller (:mod:`.controller`) knows of the cluster: its informers, the kinds it
cannot read, and its own writes while the informers lag behind them.

Theory of operation. The controller watches each kind it reads with one informer, by plural. A kind the API server
does not serve, or does not let the controller list, is found by :meth:`GatewayCache.probe` at start and noted in
``absent``: it reads as empty and its informer never starts.

Invariant: the informers may lag behind the controller's own writes. What a write returned stands in for the cached
object (:meth:`GatewayCache.remember`) until the cache moves past the version it held when the write was decided,
so that the controller neither writes twice nor loses its status to a 409 loop (:meth:`GatewayCache.find`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ambit.k8s import Informer, KubeClient, KubeClientError, KubeForbiddenError, KubeNotFoundError, kinds

log = logging.getLogger("ambit.controlplane.gateway")

Obj = dict[str, Any]
Key = tuple[str, str, str]
"""(plural, namespace, name)."""


def object_key(kind: kinds.ResourceKind, obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (kind.plural, str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def field_of(obj: Mapping[str, Any], *keys: str) -> Any:
    """``obj[k1][k2]...``, or None where a level is missing or not a map (objects come from users)."""
    value: Any = obj
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _version(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


class GatewayCache:
    """The controller's informers, by plural, with its own writes standing in while they lag."""

    def __init__(self, informers: Mapping[str, Informer]) -> None:
        self.informers = dict(informers)
        self.absent: set[str] = set()
        """Plurals of the kinds that cannot be read: they read as empty."""
        self._fresh: dict[Key, tuple[str, Obj]] = {}
        """Key → (the cache's version when we wrote, what the write returned): see the invariant above."""
        self.writes = 0

    async def probe(self, client: KubeClient, kind: kinds.ResourceKind, *, optional: bool = False) -> None:
        """Note ``kind`` as absent when it is not served or not allowed; an ``optional`` one is reported as
        information, not as a warning (only a Gateway whose overlay asks for it is affected, and says so)."""
        report = log.info if optional else log.warning
        try:
            await client.probe(kind)
        except KubeNotFoundError:
            report("%s are not served (is the CRD installed?)", kind)
        except KubeForbiddenError:
            report("not allowed to list %s", kind)
        except KubeClientError:
            return
        else:
            return
        self.absent.add(kind.plural)

    async def start(self) -> None:
        """Start the informers of the kinds that can be read, and wait for their first lists."""
        active = [i for plural, i in self.informers.items() if plural not in self.absent]
        for informer in active:
            informer.start()
        for informer in active:
            await informer.wait_synced()

    async def aclose(self) -> None:
        for informer in self.informers.values():
            await informer.aclose()

    def items(self, kind: kinds.ResourceKind) -> list[Obj]:
        return [] if kind.plural in self.absent else self.informers[kind.plural].items()

    def find(self, kind: kinds.ResourceKind, namespace: str, name: str) -> Obj | None:
        """The object as last seen: the cache's, or what our own write returned if the cache lags behind it."""
        cached = None if kind.plural in self.absent else self.informers[kind.plural].find(name, namespace or None)
        key = (kind.plural, namespace, name)
        fresh = self._fresh.get(key)
        if fresh is not None:
            if _version(cached) == fresh[0]:
                return fresh[1]
            del self._fresh[key]
        return cached

    def remember(self, kind: kinds.ResourceKind, after: Obj) -> None:
        """Let ``after`` (what a write returned) stand in until the cache moves past the version it has now."""
        plural, namespace, name = key = object_key(kind, after)
        cached = None if plural in self.absent else self.informers[plural].find(name, namespace or None)
        self._fresh[key] = (_version(cached), after)
        self.writes += 1
