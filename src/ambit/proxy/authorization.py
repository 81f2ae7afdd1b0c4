"""The seam where the L4 authorization decision sits (spec §7.3); the policy engine comes with its own issue.

Theory of operation: every inbound connection (HBONE on 15008, plaintext on 15006, and the same-node fast path) is
described by a :class:`ConnectionFacts` and asked to an :class:`Authorizer` before the proxy dials the pod. A
refusal is answered with 401 on HBONE and a reset on plaintext, counted with ``response_flags=DENY``. Until
AuthorizationPolicy is translated, the proxy runs :func:`allow_all`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ambit.model.identity import SpiffeId
from ambit.model.workload import Workload


@dataclass(frozen=True, slots=True)
class ConnectionFacts:
    """What a policy may look at for one inbound connection."""

    source_ip: str
    source_identity: SpiffeId | None
    """None without mutual TLS (plaintext inbound)."""
    destination: Workload
    destination_ip: str
    destination_port: int


Authorizer = Callable[[ConnectionFacts], bool]


def allow_all(facts: ConnectionFacts) -> bool:
    return True
