"""Where the L4 authorization decision sits in the node proxy (spec §7.3).

Theory of operation: every inbound connection (HBONE on 15008, plaintext on 15006, and the same-node fast path) is
described by an :class:`ambit.rbac.Connection` and put to the proxy's :data:`Authorizer` with the destination
workload before the proxy dials the pod; by default that is :meth:`ambit.rbac.PolicyIndex.check` on the policies
the xDS client keeps. A refusal is answered with 401 on HBONE and a reset on plaintext, counted with
``response_flags=DENY``.

A connection that was let in is remembered as a :class:`Guarded` entry for as long as it is relayed, so that a
policy change can re-check it (:meth:`Guards.recheck`) and close the ones now denied, as ztunnel does ("connection
closed due to policy change").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from ambit.model.workload import Workload
from ambit.rbac import Connection, Decision
from ambit.telemetry.flows import POLICY_CHANGE

__all__ = ["ALLOWED", "Authorizer", "Guarded", "Guards", "allow_all"]

log = logging.getLogger("ambit.proxy.authorization")

Authorizer = Callable[[Workload, Connection], Decision]

ALLOWED = Decision(True)


def allow_all(workload: Workload, connection: Connection) -> Decision:
    return ALLOWED


class Closable(Protocol):
    """What a guard closes: a running relay (:class:`~ambit.proxy.relay.Splice`)."""

    def finish(self, error: str = "") -> None: ...


class Guarded:
    """One relayed inbound connection: the workload it reaches and the facts it was authorized on."""

    __slots__ = ("connection", "relay", "workload_uid")

    def __init__(self, relay: Closable, workload_uid: str, connection: Connection) -> None:
        self.relay, self.workload_uid, self.connection = relay, workload_uid, connection


class Guards:
    """The relayed inbound connections, by the identity of their relay."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, Guarded] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, relay: Closable, workload_uid: str, connection: Connection) -> None:
        self._entries[id(relay)] = Guarded(relay, workload_uid, connection)

    def discard(self, relay: object) -> None:
        self._entries.pop(id(relay), None)

    def close_all(self, reason: str) -> None:
        """Finish every guarded relay with ``reason`` (the proxy is going away)."""
        entries, self._entries = self._entries, {}
        for guarded in entries.values():
            guarded.relay.finish(reason)

    def recheck(self, find_workload: Callable[[str], Workload | None], authorize: Authorizer) -> int:
        """Close every connection the current policies deny; returns how many were closed.

        A connection whose workload is no longer known is left alone (its pod's removal ends it).
        """
        closing: list[tuple[Guarded, Decision]] = []
        for guarded in self._entries.values():
            workload = find_workload(guarded.workload_uid)
            if workload is None:
                continue
            decision = authorize(workload, guarded.connection)
            if not decision.allowed:
                closing.append((guarded, decision))
        for guarded, decision in closing:
            self._entries.pop(id(guarded.relay), None)
            c = guarded.connection
            log.info(
                "%s: %s -> %s:%d (%s)",
                POLICY_CHANGE,
                c.source_ip,
                c.destination_ip,
                c.destination_port,
                decision.reason,
            )
            guarded.relay.finish(f"{POLICY_CHANGE}: {decision.reason}")
        return len(closing)
