"""What one client holds of one type, as the xDS server believes it: :class:`HeldVersions` (session rules 11, 12).

Theory of operation: a client's held versions are a base :class:`~ambit.xds.resource_set.ResourceSet` it holds
whole (each resource at that set's version) plus a dict of the names where it differs (a version of its own, or
None: not held). A wildcard client in sync holds its last set and nothing of its own, so a thousand clients of
100,000 workloads share one table instead of keeping a dict of every name each. :meth:`HeldVersions.against` holds
a reconnect's versions on the current set as their differences from it; :meth:`HeldVersions.rebase` moves the same
content onto a newer set. Rule numbers cited here are :mod:`ambit.xds.session`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from ambit.xds.resource_set import EMPTY, ResourceSet

__all__ = ["HeldVersions"]


class HeldVersions:
    """What one client holds of one type, name → version (session rule 11): every resource of a base set at that set's
    version, except where ``_differs`` says otherwise (a version of its own, or None: not held)."""

    __slots__ = ("_base", "_differs", "_size")

    def __init__(self, versions: Mapping[str, str] | None = None) -> None:
        self._base = EMPTY
        self._differs: dict[str, str | None] = dict(versions or {})
        self._size = len(self._differs)

    @classmethod
    def against(cls, current: ResourceSet, versions: Mapping[str, str]) -> HeldVersions:
        """``versions`` held on ``current`` as the base set (session rule 12): only the names whose version differs from
        it are kept, each as the set's own string where the set has the name, so that a reconnect naming a
        slightly older set costs its differences, not a dict of every name."""
        held = cls()
        differs: dict[str, str | None] = {}
        by_name = current.by_name
        unknown = 0
        for name, version in versions.items():
            resource = by_name.get(name)
            if resource is None:
                differs[name] = version
                unknown += 1
            elif resource.version != version:
                differs[resource.name] = version
        if len(versions) - unknown < len(by_name):  # some of the set's resources are not held
            differs.update((name, None) for name in by_name if name not in versions)
        held._base, held._differs, held._size = current, differs, len(versions)
        return held

    def differing(self) -> Iterable[tuple[str, str | None]]:
        """The names that differ from the base set, each with the version held (None: not held)."""
        return self._differs.items()

    @property
    def base(self) -> ResourceSet:
        return self._base

    @property
    def differences(self) -> int:
        """How many names differ from the base set (what this client costs on its own)."""
        return len(self._differs)

    def get(self, name: str) -> str | None:
        if name in self._differs:
            return self._differs[name]
        resource = self._base.by_name.get(name)
        return resource.version if resource is not None else None

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def set(self, name: str, version: str) -> None:
        if self.get(name) is None:
            self._size += 1
        resource = self._base.by_name.get(name)
        if resource is not None and resource.version == version:
            self._differs.pop(name, None)
        else:
            self._differs[name] = version

    def discard(self, name: str) -> bool:
        """Forget ``name``; whether it was held."""
        if self.get(name) is None:
            return False
        self._size -= 1
        if name in self._base.by_name:
            self._differs[name] = None
        else:
            del self._differs[name]
        return True

    def names(self) -> Iterator[str]:
        differs = self._differs
        yield from (name for name in self._base.by_name if name not in differs)
        yield from (name for name, version in differs.items() if version is not None)

    def as_dict(self) -> Mapping[str, str]:
        """Name → version as one mapping (the differences themselves when there is no base: not to be changed)."""
        if not self._base.by_name:
            return self._differs  # type: ignore[return-value]  # no base: nothing is None
        return {name: version for name in self.names() if (version := self.get(name)) is not None}

    def adopt(self, current: ResourceSet) -> None:
        """Hold exactly ``current``: each of its resources at its version, nothing else."""
        self._base, self._differs, self._size = current, {}, len(current.by_name)

    def rebase(self, current: ResourceSet) -> None:
        """The same content on ``current`` as the base set: only the names that differ from it are kept."""
        differs: dict[str, str | None] = {}
        by_name = current.by_name
        for name in {*self._differs, *current.changed_since(self._base)}:
            mine = self.get(name)
            resource = by_name.get(name)
            if mine != (resource.version if resource is not None else None):
                differs[name] = mine
        self._base, self._differs = current, differs
