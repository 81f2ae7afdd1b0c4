"""The control plane's output as xDS resources: a :class:`LocalConfig` becomes named, versioned Addresses and
Authorizations.

Theory of operation: :func:`addresses` and :func:`authorizations` are pure. Each workload becomes an Address named by
its uid, each service one named ``namespace/hostname`` (spec §4.2), through :mod:`ambit.xds.convert`; each policy an
``istio.security.Authorization`` named by its key ``namespace/name`` (spec §4.3), through
:mod:`ambit.xds.authorization`. The version is a hash of the
resource's deterministic serialization, so it is stable across processes and restarts: a restarted control plane
gives an unchanged resource the version a reconnecting node proxy already holds, and nothing is resent.

Invariants: equal configs give equal maps; a resource's version changes exactly when its bytes change.
"""

from __future__ import annotations

import hashlib

from google.protobuf.message import Message

from ambit.api import authorization_pb2 as apb
from ambit.api import workload_pb2 as pb
from ambit.model.localconfig import LocalConfig
from ambit.model.policy import Policy
from ambit.model.workload import Service, Workload
from ambit.xds.authorization import authorization_of
from ambit.xds.convert import address_of, resource_name

__all__ = ["AddressCache", "AuthorizationCache", "addresses", "authorizations", "content_version"]


def content_version(message: Message) -> str:
    """A stable version string for ``message``: the first 16 hex digits of the SHA-256 of its bytes."""
    return hashlib.sha256(message.SerializeToString(deterministic=True)).hexdigest()[:16]


AddressCache = dict[str, tuple[Workload | Service, tuple[str, pb.Address]]]


def addresses(config: LocalConfig, cache: AddressCache | None = None) -> dict[str, tuple[str, pb.Address]]:
    """Resource name → (version, Address) for every workload and service of ``config``.

    ``cache`` (resource name → the item last encoded under it and its encoding) is read and then left holding
    exactly ``config``'s items, so a caller that passes the same dict every time encodes only items that changed
    (the same object, or an equal one, is not encoded again).
    """
    previous = cache if cache is not None else {}
    result: dict[str, tuple[str, pb.Address]] = {}
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
            entry = (content_version(address), address)
        fresh[name] = (item, entry)
        result[name] = entry
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return result


AuthorizationCache = dict[Policy, tuple[str, apb.Authorization]]


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
