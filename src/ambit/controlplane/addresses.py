"""The control plane's output as xDS resources: a :class:`LocalConfig` becomes named, versioned Addresses.

Theory of operation: :func:`addresses` is pure. Each workload becomes an Address named by its uid, each service
one named ``namespace/hostname`` (spec §4.2), through :mod:`ambit.xds.convert`. The version is a hash of the
resource's deterministic serialization, so it is stable across processes and restarts: a restarted control plane
gives an unchanged resource the version a reconnecting node proxy already holds, and nothing is resent.

Invariants: equal configs give equal maps; a resource's version changes exactly when its bytes change.
"""

from __future__ import annotations

import hashlib

from ambit.api import workload_pb2 as pb
from ambit.model.localconfig import LocalConfig
from ambit.model.workload import Service, Workload
from ambit.xds.convert import address_of, resource_name

__all__ = ["addresses", "content_version"]


def content_version(address: pb.Address) -> str:
    """A stable version string for ``address``: the first 16 hex digits of the SHA-256 of its bytes."""
    return hashlib.sha256(address.SerializeToString(deterministic=True)).hexdigest()[:16]


def addresses(config: LocalConfig) -> dict[str, tuple[str, pb.Address]]:
    """Resource name → (version, Address) for every workload and service of ``config``."""
    result: dict[str, tuple[str, pb.Address]] = {}
    items: list[Workload | Service] = [*config.workloads, *config.services]
    for item in items:
        address = address_of(item)
        result[resource_name(address)] = (content_version(address), address)
    return result
