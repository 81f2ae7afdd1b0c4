"""User namespaces of lab pods (``spec.hostUsers: false``): which host ids a pod's containers run as (pure).

Rules:

Rule 1. A pod with ``hostUsers: false`` gets a user namespace shared by its containers: container ids 0 to 65535
        map to a block of :data:`USERNS_LENGTH` host ids of its own, so root in the container is an unprivileged
        id on the host (uid and gid maps alike). Any other value (unset, true) is the host's user namespace.
Rule 2. Each node owns ``blocks`` consecutive blocks starting at host id ``first_id`` (a multiple of
        :data:`USERNS_LENGTH`, never block 0: host ids 0 to 65535 are the machine's own users). The lab gives
        node *i* its own stretch (:func:`node_id_range`), so no two pods of one lab share an id, whichever
        nodes they are on; the kubelet's scheme is the same per node.
Rule 3. :meth:`UsernsAllocator.allocate` gives a pod the lowest free block, and the same block again while it holds
        one; :meth:`UsernsAllocator.restore` takes back a block saved for a pod (a restarted runtime), refusing one
        outside the node's range or held by another pod; :meth:`UsernsAllocator.release` frees it. No free block
        is a :class:`UsernsError` (the pod waits, as the kubelet's "user namespace" errors do).
Rule 4. The saved form (``<pod dir>/userns.json``) is the kubelet's: ``uidMappings`` and ``gidMappings``, each one
        ``{"hostId", "containerId": 0, "length": 65536}``, both the same block; anything else does not parse.

Limit: the pod's network namespace is made by the host (the sandbox, before any container), so it belongs to the
host's user namespace. ``runc run`` joins it before it makes the pod's user namespace and works; runc 1.1's
``runc exec`` joins the user namespace first and then may not join the network namespace, so exec probes and
``ambit lab exec`` fail for these pods ("failed to setns into net namespace"). Making the network namespace inside
a pod-level user namespace (as containerd does) would lift this.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambit.errors import AmbitError

USERNS_LENGTH = 65536
NODE_BLOCKS = 1024
"""Blocks per lab node (its pods at once): 64 nodes fit in the 32-bit id space."""
USERNS_FILE = "userns.json"


class UsernsError(AmbitError):
    """A pod cannot get a user namespace (no free block, a saved block that is not the pod's)."""


@dataclass(frozen=True, slots=True)
class IdRange:
    """Host ids ``first`` to ``first + length - 1``, seen in the container from 0."""

    first: int
    length: int = USERNS_LENGTH

    def oci_mappings(self) -> list[dict[str, int]]:
        return [{"containerID": 0, "hostID": self.first, "size": self.length}]

    def host_id(self, container_id: int) -> int:
        """The host id of a container id (runAsUser, runAsGroup) inside the range."""
        if not 0 <= container_id < self.length:
            raise UsernsError(f"id {container_id} is outside the pod's user namespace (0 to {self.length - 1})")
        return self.first + container_id


def hosts_users(pod: Mapping[str, Any]) -> bool:
    """Rule 1: False exactly when the pod asks for a user namespace of its own."""
    spec = pod.get("spec")
    return not (isinstance(spec, Mapping) and spec.get("hostUsers") is False)


def node_id_range(node_index: int, blocks: int = NODE_BLOCKS) -> tuple[int, int]:
    """Rule 2: ``(first_id, blocks)`` of lab node ``node_index`` (1-based)."""
    if node_index < 1 or (1 + node_index * blocks) * USERNS_LENGTH > 2**32:
        raise ValueError(f"node {node_index} has no user namespace ids left")
    return (1 + (node_index - 1) * blocks) * USERNS_LENGTH, blocks


class UsernsAllocator:
    """Rule 3: blocks of one node. Invariants: every held block is inside the node's range; no two pods hold the
    same block; a pod holds at most one."""

    def __init__(self, first_id: int, blocks: int) -> None:
        if first_id <= 0 or first_id % USERNS_LENGTH or blocks <= 0:
            raise ValueError(f"a user namespace range starts at a positive multiple of {USERNS_LENGTH}")
        self.first_id = first_id
        self.blocks = blocks
        self._held: dict[str, int] = {}
        """Pod uid → block index."""

    def find(self, pod_uid: str) -> IdRange | None:
        block = self._held.get(pod_uid)
        return None if block is None else self._range(block)

    def allocate(self, pod_uid: str) -> IdRange:
        held = self.find(pod_uid)
        if held is not None:
            return held
        taken = set(self._held.values())
        for block in range(self.blocks):
            if block not in taken:
                self._held[pod_uid] = block
                return self._range(block)
        raise UsernsError(f"no free user namespace: all {self.blocks} ranges of this node are in use")

    def restore(self, pod_uid: str, ids: IdRange) -> None:
        offset = ids.first - self.first_id
        block = offset // USERNS_LENGTH
        if ids.length != USERNS_LENGTH or offset % USERNS_LENGTH or not 0 <= block < self.blocks:
            raise UsernsError(f"saved user namespace {ids.first}+{ids.length} is not one of this node's")
        owner = next((uid for uid, b in self._held.items() if b == block), None)
        if owner not in (None, pod_uid) or self._held.get(pod_uid, block) != block:
            raise UsernsError(f"saved user namespace {ids.first}+{ids.length} is held by another pod")
        self._held[pod_uid] = block

    def release(self, pod_uid: str) -> None:
        self._held.pop(pod_uid, None)

    def _range(self, block: int) -> IdRange:
        return IdRange(self.first_id + block * USERNS_LENGTH)


# -- rule 4 -------------------------------------------------------------------------------------------------------
def render_saved(ids: IdRange) -> str:
    mapping = [{"hostId": ids.first, "containerId": 0, "length": ids.length}]
    return json.dumps({"uidMappings": mapping, "gidMappings": mapping}) + "\n"


def parse_saved(text: str) -> IdRange:
    """Rule 4; raises :class:`UsernsError`."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise UsernsError("saved user namespace is not JSON") from None
    if not isinstance(data, dict):
        raise UsernsError("saved user namespace is not an object")
    found: list[IdRange] = []
    for key in ("uidMappings", "gidMappings"):
        entries = data.get(key)
        if not isinstance(entries, list) or len(entries) != 1 or not isinstance(entries[0], dict):
            raise UsernsError(f"saved user namespace: {key} must hold one mapping")
        entry = entries[0]
        host, inside, length = entry.get("hostId"), entry.get("containerId"), entry.get("length")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (host, inside, length)):
            raise UsernsError(f"saved user namespace: {key} needs integer hostId, containerId and length")
        assert isinstance(host, int) and isinstance(length, int)
        if inside != 0 or length != USERNS_LENGTH or host <= 0 or host % USERNS_LENGTH or host + length > 2**32:
            raise UsernsError(f"saved user namespace: {key} is not a {USERNS_LENGTH}-id block from container id 0")
        found.append(IdRange(host, length))
    if found[0] != found[1]:
        raise UsernsError("saved user namespace: uid and gid mappings differ")
    return found[0]
