"""SPIFFE identities as the mesh uses them: ``spiffe://<trust domain>/ns/<namespace>/sa/<service account>``.

Theory of operation: a :class:`SpiffeId` is three validated strings. Parsing is strict, because ids arrive in peer
certificates and in policy: exactly the scheme ``spiffe://`` (lower case), a trust domain, and the path
``/ns/<ns>/sa/<sa>``; nothing else (no port, userinfo, query, fragment, percent-escapes or extra segments).

Invariants:

- The trust domain uses the SPIFFE charset (lower-case letters, digits, ``.``, ``-``, ``_``); each path segment
  uses letters, digits, ``.``, ``-``, ``_`` and is not ``.`` or ``..``. No part is empty.
- Construction validates too, so every ``SpiffeId`` renders to a string that :meth:`SpiffeId.parse` reads back as
  an equal value, and ids compare and sort by (trust domain, namespace, service account).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ambit.model.errors import IdentityError

__all__ = ["DEFAULT_TRUST_DOMAIN", "IdentityError", "SpiffeId", "check_path_segment", "check_trust_domain"]

DEFAULT_TRUST_DOMAIN = "cluster.local"
"""The mesh's trust domain when none is configured; proto3 encodes it as the empty string (spec §12)."""

DEFAULT_SERVICE_ACCOUNT = "default"
"""The service account of a workload that names none; proto3 encodes it as the empty string (spec §12)."""

_SCHEME = "spiffe://"
_MAX_ID_LENGTH = 2048  # SPIFFE ID spec: URIs longer than this are rejected.
_MAX_TRUST_DOMAIN_LENGTH = 255
_TRUST_DOMAIN = re.compile(r"[a-z0-9._-]+")
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")


def check_trust_domain(value: str) -> None:
    """Raise :class:`IdentityError` unless ``value`` is a usable trust domain."""
    if not value:
        raise IdentityError("trust domain is empty")
    if len(value) > _MAX_TRUST_DOMAIN_LENGTH:
        raise IdentityError(f"trust domain is longer than {_MAX_TRUST_DOMAIN_LENGTH} characters")
    if _TRUST_DOMAIN.fullmatch(value) is None:
        raise IdentityError(f"trust domain {value!r} has characters outside [a-z0-9._-]")


def check_path_segment(what: str, value: str) -> None:
    """Raise :class:`IdentityError` unless ``value`` can be the ``what`` segment (namespace, service account)."""
    if not value:
        raise IdentityError(f"{what} is empty")
    if _PATH_SEGMENT.fullmatch(value) is None:
        raise IdentityError(f"{what} {value!r} has characters outside [A-Za-z0-9._-]")
    if value in {".", ".."}:
        raise IdentityError(f"{what} {value!r} is a relative path segment")


@dataclass(frozen=True, slots=True, order=True)
class SpiffeId:
    """A workload identity: who a certificate speaks for, and whom policy names."""

    trust_domain: str
    namespace: str
    service_account: str

    def __post_init__(self) -> None:
        check_trust_domain(self.trust_domain)
        check_path_segment("namespace", self.namespace)
        check_path_segment("service account", self.service_account)

    @classmethod
    def parse(cls, uri: str) -> SpiffeId:
        """Read ``spiffe://td/ns/<ns>/sa/<sa>``; anything else raises :class:`IdentityError` naming the problem."""
        if not isinstance(uri, str):
            raise IdentityError(f"SPIFFE id must be a string, not {type(uri).__name__}")
        if len(uri) > _MAX_ID_LENGTH:
            raise IdentityError(f"SPIFFE id is longer than {_MAX_ID_LENGTH} characters")
        if not uri.startswith(_SCHEME):
            raise IdentityError(f"not a SPIFFE id (must start with {_SCHEME!r}): {uri!r}")
        trust_domain, slash, path = uri[len(_SCHEME) :].partition("/")
        if not slash:
            raise IdentityError(f"SPIFFE id has no path: {uri!r}")
        segments = path.split("/")
        if len(segments) != 4 or segments[0] != "ns" or segments[2] != "sa":
            raise IdentityError(f"SPIFFE id path must be /ns/<namespace>/sa/<service account>: {uri!r}")
        try:
            return cls(trust_domain, segments[1], segments[3])
        except IdentityError as exc:
            raise IdentityError(f"{exc}: {uri!r}") from None

    def __str__(self) -> str:
        return f"{_SCHEME}{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"
