"""Answering the xDS debug type ``istio.io/debug/syncz``: the control plane's sync status, to callers allowed it.

Theory of operation: a request of the debug type is not a subscription. :meth:`SynczAnswers.may_read` asks the
injected ``debug_access`` whether this caller may read the status (the service asks once per stream; no
``debug_access`` means nobody may; a check that fails refuses). :meth:`SynczAnswers.answer` writes one resource
``syncz`` holding the JSON document of :class:`~ambit.xds.sync.SyncRegistry` (a ``google.protobuf.StringValue``),
ignores the ACK of an earlier answer, and ends a stream it refuses with ``PERMISSION_DENIED``. The answers and
refusals are counted in the service's :class:`~ambit.xds.service_metrics.XdsStats`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import grpc  # type: ignore[import-untyped]
from google.protobuf import any_pb2, wrappers_pb2

from ambit.api import discovery_pb2 as dpb
from ambit.xds.callers import Caller, DebugAccess
from ambit.xds.service_metrics import XdsStats
from ambit.xds.sync import SYNCZ_TYPE_URL, SyncRegistry

__all__ = ["SynczAnswers"]

log = logging.getLogger("ambit.xds.server")  # one logger for the whole xDS server, whichever module logs


class SynczAnswers:
    """Who may read the sync status, and the answer to one debug request."""

    __slots__ = ("_clock", "_control_plane", "_debug_access", "_stale_after", "_stats", "_sync")

    def __init__(
        self,
        sync: SyncRegistry,
        stats: XdsStats,
        clock: Callable[[], float],
        *,
        debug_access: DebugAccess | None,
        control_plane: str,
        stale_after: float,
    ) -> None:
        self._sync, self._stats, self._clock = sync, stats, clock
        self._debug_access, self._control_plane, self._stale_after = debug_access, control_plane, stale_after

    async def may_read(self, caller: Caller) -> bool:
        if self._debug_access is None:
            return False
        try:
            return await self._debug_access(caller)
        except Exception:  # a failed check refuses; the peer learns nothing more
            log.exception("xds: debug access check failed for %s", caller.name)
            return False

    async def answer(self, nonce: str, context: Any, caller: Caller, allowed: bool) -> None:
        """One debug request: the sync document, or the end of the stream for a caller who may not read it."""
        stats = self._stats
        if not allowed:
            stats.debug_refused += 1
            log.info("xds: refused the sync status to %s", caller.name)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "xds: this caller may not read the sync status")
        if nonce:  # an ACK of a debug answer: nothing to do
            return
        stats.debug_answers += 1
        document = self._sync.document(self._clock(), control_plane=self._control_plane, stale_after=self._stale_after)
        body = any_pb2.Any()
        body.Pack(wrappers_pb2.StringValue(value=json.dumps(document, separators=(",", ":"))))
        answer = f"debug-{stats.debug_answers}"
        resource = dpb.Resource(name="syncz", version=answer, resource=body)
        await context.write(dpb.DeltaDiscoveryResponse(type_url=SYNCZ_TYPE_URL, nonce=answer, resources=[resource]))
