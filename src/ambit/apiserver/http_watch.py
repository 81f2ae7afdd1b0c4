"""Watches of the HTTP shell (:mod:`ambit.apiserver.http`): one chunked response of events per watch request.

Theory of operation. A watch (``?watch=true``, or the legacy ``/watch/`` prefix) starts at ``resourceVersion`` (0:
now; a version newer than the store's is a 504 ``ResourceVersionTooLarge``, as kube-apiserver answers a client that
saw another server; one older than the store's horizon is an ``ERROR`` event 410 Gone, unless the initial events
are asked for). With ``sendInitialEvents=true`` the current objects come first as ``ADDED``, closed by a
``BOOKMARK`` annotated ``k8s.io/initial-events-end``. Then the events after the start, from a
:class:`~ambit.apiserver.watch_cursor.WatchCursor`, with bookmarks every ``bookmark_interval`` when the client
allows them, until ``timeoutSeconds`` (else ``default_timeout``).

Invariants:

- Each user has at most ``max_watches_per_user`` watches open; one more is a 429.
- Frames are written in batches of about :data:`WATCH_WRITE_BYTES`; a write that makes no progress within
  ``watch_send_timeout`` ends the watch by dropping the connection (a slow client re-watches or relists).
- An event in the storage version needing no conversion is written from its stored encoding, not re-encoded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ambit.apiserver import errors
from ambit.apiserver.http_bodies import int_param
from ambit.apiserver.http_responses import JSON, Target, as_version, table, wants_table
from ambit.apiserver.limits import LimitSettings, UserLimiter
from ambit.apiserver.requests import User
from ambit.apiserver.store import StoredObject, encode
from ambit.apiserver.verbs import ResourceManager
from ambit.apiserver.watch import ObjectFilter
from ambit.apiserver.watch_cursor import Bookmark, WatchCursor, WatchSettings

log = logging.getLogger("ambit.apiserver")

WATCH_WRITE_BYTES = 256 * 1024


class WatchServer:
    """Serves the watches of one :class:`~ambit.apiserver.verbs.ResourceManager`."""

    def __init__(
        self,
        manager: ResourceManager,
        limiter: UserLimiter,
        limits: LimitSettings,
        *,
        default_timeout: float,
        bookmark_interval: float,
    ) -> None:
        self.manager = manager
        self.limiter = limiter
        self.limits = limits
        self.default_timeout = default_timeout
        self.bookmark_interval = bookmark_interval

    async def serve(self, request: web.Request, t: Target, selection: ObjectFilter, user: User) -> web.StreamResponse:
        """Serve one watch request; each open watch counts against its user's bound of watches."""
        q = request.query
        m = self.manager
        rv_text = q.get("resourceVersion", "")
        send_initial = q.get("sendInitialEvents") == "true"
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(int_param(q, "timeoutSeconds") or self.default_timeout)
        try:
            start_rv = int(rv_text) if rv_text else 0
        except ValueError:
            raise errors.bad_request(f"resourceVersion {rv_text!r} is not a valid version") from None
        if start_rv > m.store.resource_version:
            # As kube-apiserver: a version from the future means the client saw another server (or state).
            raise errors.ApiError(
                504,
                "Timeout",
                f"Too large resource version: {start_rv}, current: {m.store.resource_version}",
                details={
                    "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                    "retryAfterSeconds": 1,
                },
            )
        if not self.limiter.open_watch(user):
            raise errors.too_many_requests(
                f"too many watches: {user.username} has {self.limiter.watches(user)} open, "
                f"the limit is {self.limits.max_watches_per_user}",
                1,
            )
        try:
            settings = WatchSettings(timeout, self.bookmark_interval if bookmarks else None)
            return await self._stream(request, t, selection, start_rv, send_initial, settings, user)
        finally:
            self.limiter.close_watch(user)

    async def _stream(
        self,
        request: web.Request,
        t: Target,
        selection: ObjectFilter,
        start_rv: int,
        send_initial: bool,
        settings: WatchSettings,
        user: User,
    ) -> web.StreamResponse:
        """Stream one watch; a write that makes no progress within ``watch_send_timeout`` ends it (slow client)."""
        m = self.manager
        response = web.StreamResponse(headers={"Content-Type": JSON, "Transfer-Encoding": "chunked"})
        await response.prepare(request)
        send_timeout = self.limits.watch_send_timeout

        async def write(data: bytes) -> None:
            async with asyncio.timeout(send_timeout):
                await response.write(data)

        as_table = wants_table(request)

        same_version = t.version == t.rtype.storage_version and t.rtype.from_storage is None

        def frame(etype: str, item: StoredObject) -> bytes:
            if as_table:
                obj: Any = table(request, t, [as_version(item.obj, t)], str(item.rv), "")
                return encode({"type": etype, "object": obj}) + b"\n"
            if same_version:  # the stored encoding is what the client gets: no re-encoding per watcher
                return b'{"type":"' + etype.encode() + b'","object":' + item.raw + b"}\n"
            return encode({"type": etype, "object": as_version(item.obj, t)}) + b"\n"

        async def send(etype: str, obj: dict[str, Any]) -> None:
            await write(encode({"type": etype, "object": obj}) + b"\n")

        if start_rv and start_rv < m.store.horizon and not send_initial:
            expired = errors.gone(f"too old resource version: {start_rv} ({m.store.horizon + 1})")
            await response.write(encode({"type": "ERROR", "object": expired.to_status()}) + b"\n")
            return response
        cursor = WatchCursor.open(
            m.hub,
            m.store,
            t.rtype.key,
            selection,
            start_rv=start_rv,
            send_initial=send_initial,
            list_items=lambda: m.list_items(t.rtype, selection).items,
            settings=settings,
            clock=asyncio.get_running_loop().time,
        )
        try:
            await _write_batched(write, (frame("ADDED", item) for item in cursor.initial))
            if send_initial:
                await send("BOOKMARK", _bookmark(t, cursor.subscribed_rv, initial_end=True))
            await _write_batched(write, (frame(etype, item) for etype, item in cursor.replay))
            while (step := await cursor.next()) is not None:
                if isinstance(step, Bookmark):
                    await send("BOOKMARK", _bookmark(t, step.resource_version))
                else:
                    await _write_batched(write, (frame(etype, item) for etype, item in step.items))
        except ConnectionResetError:
            pass  # the client went away; cancellation is not caught here and reaches aiohttp
        except TimeoutError:
            # The client does not read: drop the connection and what is buffered for it (a clean end would wait
            # for the same full buffer). Its client re-watches or relists, as after kube closes a slow watcher.
            log.info("closing watch of %s on %s: no progress in %gs", user.username, t.rtype.plural, send_timeout)
            if request.transport is not None:
                request.transport.abort()
        finally:
            cursor.close()
        return response


async def _write_batched(
    write: Callable[[bytes], Awaitable[None]], frames: Any, limit: int = WATCH_WRITE_BYTES
) -> None:
    """Write frames in writes of about ``limit`` bytes (what one watch holds encoded at a time)."""
    pending: list[bytes] = []
    size = 0
    for chunk in frames:
        pending.append(chunk)
        size += len(chunk)
        if size >= limit:
            await write(b"".join(pending))
            pending, size = [], 0
    if pending:
        await write(b"".join(pending))


def _bookmark(t: Target, rv: int, *, initial_end: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {"kind": t.rtype.kind, "apiVersion": t.rtype.api_version(t.version), "metadata": meta}
