"""The control plane's output as xDS resources: a :class:`LocalConfig` becomes named, versioned Addresses and
Authorizations.

Theory of operation: :func:`addresses` and :func:`authorizations` are pure. Each workload becomes an Address named by
its uid, each service one named ``namespace/hostname`` (spec §4.2), through :mod:`ambit.xds.convert`; each policy an
``istio.security.Authorization`` named by its key ``namespace/name`` (spec §4.3), through
:mod:`ambit.xds.authorization`. The version is a hash of the
resource's deterministic serialization, so it is stable across processes and restarts: a restarted control plane
gives an unchanged resource the version a reconnecting node proxy already holds, and nothing is resent.

Rules:

1. :func:`addresses` encodes the whole config; with an :class:`AddressCache` only the items that are not the same
   object as (or equal to) the one last encoded under their name are encoded again.
2. :func:`address_changes` gives the same result as a change to the previous map: told which workload uids may
   have changed since ``previous`` (the translation's
   :class:`~ambit.controlplane.translate.WorkloadChanges`), it looks up only those in the new config's workloads
   (ordered by uid: a binary search; of equal uids the last one wins, as in :func:`addresses`) and every service
   (a few per thousand workloads), and returns the entries to put and the names that went away. The cache must be
   the one :func:`addresses` or :func:`address_changes` last left for ``previous``. Workload uids and service keys
   (``namespace/hostname``) never collide: a uid has the form ``cluster//Kind/namespace/name``. When the new
   config's services are the previous config's tuple itself (a translation that reused its service stage,
   :mod:`~ambit.controlplane.translate.stage_memo`), no service is looked at: none changed.
3. :func:`authorization_changes` is :func:`authorizations`, or None when the new config's policies are the
   previous config's tuple itself (a translation that reused its policy stage): the map is the one last made, and
   the cache (the one last left for ``previous``) already holds exactly those policies.

4. What the maps and the cache hold of each Address is its encoding (:class:`~ambit.xds.convert.EncodedAddress`:
   the deterministic bytes, with the aliases and parents the table indexes it by), not the message: a message
   object costs ~3 KB (upb's arena per message), its bytes ~0.3 KB, and the control plane holds one per workload
   (issue 22: the Address messages, their ``Any`` and ``Resource`` copies were ~6 KB per workload, 350 MiB at
   55,000).

Invariants: equal configs give equal maps; a resource's version changes exactly when its bytes change; the cache
holds exactly the last config's items after either call.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Collection
from typing import Any

from google.protobuf.message import Message

from ambit.api import authorization_pb2 as apb
from ambit.api import workload_pb2 as pb
from ambit.model.localconfig import LocalConfig
from ambit.model.policy import Policy
from ambit.model.workload import Service, Workload
from ambit.xds.authorization import authorization_of
from ambit.xds.convert import EncodedAddress, address_of, resource_name

__all__ = [
    "AddressCache",
    "AuthorizationCache",
    "EncodedAddress",
    "address_changes",
    "addresses",
    "authorization_changes",
    "authorizations",
    "content_version",
]


def content_version(message: Message) -> str:
    """A stable version string for ``message``: the first 16 hex digits of the SHA-256 of its bytes."""
    return hashlib.sha256(message.SerializeToString(deterministic=True)).hexdigest()[:16]


AddressCache = dict[str, tuple[Workload | Service, tuple[str, EncodedAddress]]]


def addresses(config: LocalConfig, cache: AddressCache | None = None, *, encoded: bool = False) -> dict[str, Any]:
    """Resource name → (version, Address) for every workload and service of ``config``; with ``encoded``, (version,
    :class:`~ambit.xds.convert.EncodedAddress`) (rule 4), as the control plane's table takes them.

    ``cache`` (resource name → the item last encoded under it and its encoding) is read and then left holding
    exactly ``config``'s items, so a caller that passes the same dict every time encodes only items that changed
    (the same object, or an equal one, is not encoded again).
    """
    previous = cache if cache is not None else {}
    result: dict[str, tuple[str, EncodedAddress]] = {}
    fresh: AddressCache = {}
    items: list[Workload | Service] = [*config.workloads, *config.services]
    for item in items:
        name = item.uid if isinstance(item, Workload) else item.key
        known = previous.get(name)
        if known is not None and (known[0] is item or known[0] == item):
            entry = known[1]
        else:
            address = address_of(item)
            name = resource_name(address)
            entry = EncodedAddress.of(address)
        fresh[name] = (item, entry)
        result[name] = entry
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return result if encoded else _messages(result)


def _messages(entries: dict[str, tuple[str, EncodedAddress]]) -> dict[str, tuple[str, pb.Address]]:
    return {name: (version, entry.message()) for name, (version, entry) in entries.items()}


def address_changes(
    previous: LocalConfig,
    config: LocalConfig,
    cache: AddressCache,
    workload_uids: Collection[str],
    *,
    encoded: bool = False,
) -> tuple[dict[str, Any], frozenset[str]]:
    """(name → (version, Address) to put, names to take out) that turn ``previous``'s map into ``config``'s, given
    the uids of the workloads that may differ (rule 2); ``cache`` is left holding exactly ``config``'s items."""
    upserts: dict[str, tuple[str, EncodedAddress]] = {}
    removed: set[str] = set()
    workloads = config.workloads
    for uid in workload_uids:
        at = bisect.bisect_right(workloads, uid, key=_workload_uid)
        if at and workloads[at - 1].uid == uid:
            upserts[uid] = _encoded(workloads[at - 1], uid, cache)
        else:
            cache.pop(uid, None)
            removed.add(uid)
    if config.services is previous.services:
        return (upserts if encoded else _messages(upserts)), frozenset(removed)
    for service in config.services:
        upserts[service.key] = _encoded(service, service.key, cache)
    for service in previous.services:
        if service.key not in upserts:
            cache.pop(service.key, None)
            removed.add(service.key)
    return (upserts if encoded else _messages(upserts)), frozenset(removed)


def _workload_uid(workload: Workload) -> str:
    return workload.uid


def _encoded(item: Workload | Service, name: str, cache: AddressCache) -> tuple[str, EncodedAddress]:
    known = cache.get(name)
    if known is not None and (known[0] is item or known[0] == item):
        cache[name] = (item, known[1])
        return known[1]
    entry = EncodedAddress.of(address_of(item))
    cache[name] = (item, entry)
    return entry


AuthorizationCache = dict[Policy, tuple[str, apb.Authorization]]


def authorization_changes(
    previous: LocalConfig | None, config: LocalConfig, cache: AuthorizationCache
) -> dict[str, tuple[str, apb.Authorization]] | None:
    """Rule 3: :func:`authorizations` of ``config``, or None when its policies are ``previous``'s tuple itself (no
    policy changed); ``cache`` must be the one last left for ``previous``."""
    if previous is not None and config.policies is previous.policies:
        return None
    return authorizations(config, cache)


def authorizations(
    config: LocalConfig, cache: AuthorizationCache | None = None
) -> dict[str, tuple[str, apb.Authorization]]:
    """Resource name (the policy key) → (version, Authorization) for every policy of ``config``.

    ``cache`` (policy → its encoding) is read and then left holding exactly ``config``'s policies, so a caller that
    passes the same dict every time encodes only policies that changed.
    """
    previous = dict(cache) if cache is not None else {}
    result: dict[str, tuple[str, apb.Authorization]] = {}
    fresh: AuthorizationCache = {}
    for policy in config.policies:
        entry = previous.get(policy)
        if entry is None:
            message = authorization_of(policy)
            entry = (content_version(message), message)
        fresh[policy] = entry
        result[policy.key] = entry
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return result
