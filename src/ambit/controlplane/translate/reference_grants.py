"""Gateway API ``ReferenceGrant``: whether an object of one namespace may refer to an object of another (pure).

Theory of operation: :meth:`ReferenceGrants.build` reads the ReferenceGrant objects once per translation and
indexes them by their own namespace (the namespace of the objects they open up); :meth:`ReferenceGrants.permits`
answers one reference. Every cross-namespace reference Ambit follows asks here: a route's ``backendRefs`` to a
Service (:mod:`ambit.controlplane.translate.routes`, :mod:`ambit.controlplane.translate.ingress`) and an ingress
listener's ``certificateRefs`` to a Secret (:mod:`ambit.controlplane.translate.listeners`), as istiod's
``ReferenceGrants`` index answers both ``BackendAllowed`` and ``SecretAllowed``.

Rules:

1. A reference from (group, kind, namespace) to an object (group, kind, name) in ``to_namespace`` is permitted when
   a ReferenceGrant in ``to_namespace`` lists that (group, kind, namespace) among its ``from`` and, among its
   ``to``, that group and kind with the object's name or without a name (every object of the kind).
2. The core group is ``""`` (``core`` is read as it too); groups, kinds and names compare exactly.
3. A reference within one namespace needs no grant; callers do not ask (a grant is never consulted for it).
4. Malformed entries (not objects, fields of the wrong type) grant nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ambit.controlplane.translate.fields import Obj, mapping, sequence, text

__all__ = ["NO_GRANTS", "ReferenceGrants"]


def _group(value: str) -> str:
    return "" if value == "core" else value


@dataclass(frozen=True, slots=True)
class _Grant:
    froms: frozenset[tuple[str, str, str]]
    """(group, kind, namespace) that may refer."""
    tos: tuple[tuple[str, str, str], ...]
    """(group, kind, name or ``""`` for all) that may be referred to."""


@dataclass(frozen=True, slots=True)
class ReferenceGrants:
    """The grants of one translation, by the namespace they open up (rules 1-4)."""

    by_namespace: Mapping[str, tuple[_Grant, ...]] = field(default_factory=dict)

    @classmethod
    def build(cls, reference_grants: Iterable[Obj]) -> ReferenceGrants:
        found: dict[str, list[_Grant]] = {}
        for grant in reference_grants:
            spec = mapping(grant.get("spec"))
            froms = frozenset(
                (_group(text(f.get("group"))), text(f.get("kind")), text(f.get("namespace")))
                for f in sequence(spec.get("from"))
                if isinstance(f, Mapping)
            )
            tos = tuple(
                (_group(text(t.get("group"))), text(t.get("kind")), text(t.get("name")))
                for t in sequence(spec.get("to"))
                if isinstance(t, Mapping)
            )
            namespace = text(mapping(grant.get("metadata")).get("namespace"))
            found.setdefault(namespace, []).append(_Grant(froms, tos))
        return cls({namespace: tuple(grants) for namespace, grants in found.items()})

    def permits(
        self,
        *,
        from_group: str,
        from_kind: str,
        from_namespace: str,
        to_group: str,
        to_kind: str,
        to_namespace: str,
        to_name: str,
    ) -> bool:
        """Rule 1."""
        source = (_group(from_group), from_kind, from_namespace)
        target_group = _group(to_group)
        for grant in self.by_namespace.get(to_namespace, ()):
            if source not in grant.froms:
                continue
            if any(g == target_group and k == to_kind and n in ("", to_name) for g, k, n in grant.tos):
                return True
        return False


NO_GRANTS = ReferenceGrants()
