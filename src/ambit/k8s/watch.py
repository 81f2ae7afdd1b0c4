"""One watch request: a chunked HTTP response of newline-separated JSON events, read as :class:`WatchEvent`.

Theory of operation: the request is sent when iteration starts. Bytes are split into lines as they arrive (a line
may span chunks; one chunk may hold many lines) and each line is decoded with msgspec straight into the event's
type and its object as a plain dict. The stream ends when the server closes it (its ``timeoutSeconds`` passed,
or it dropped us): iteration then stops, and the caller re-watches from :attr:`Watch.resource_version`.

Invariants:
- ``resource_version`` is that of the last event handed out, bookmarks included, so re-watching from it neither
  repeats nor skips an event.
- An ``ERROR`` event never reaches the caller: it becomes the Status exception (410 → :class:`KubeGoneError`,
  the same class an HTTP 410 answer raises). Any failure closes the response before it is raised.
- The response is closed when iteration ends or fails, and by ``aclose()`` / ``async with`` when the caller stops
  early.
"""

from __future__ import annotations

import contextlib
import enum
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx2 as httpx
import msgspec

from ambit.k8s.errors import KubeClientError, response_error, status_error
from ambit.k8s.kinds import ResourceKind


class WatchEventType(enum.StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    """Only ``metadata.resourceVersion`` of the object is meaningful: the watch has seen everything up to it."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: WatchEventType
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        meta = self.object.get("metadata")
        return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""


class _WireEvent(msgspec.Struct):
    type: str
    object: dict[str, Any]


_decode_event = msgspec.json.Decoder(_WireEvent).decode


class Watch:
    """An open (or about to open) watch; iterate it with ``async for``."""

    def __init__(
        self, http: httpx.AsyncClient, kind: ResourceKind, request: httpx.Request, resource_version: str
    ) -> None:
        self._http = http
        self._kind = kind
        self._request = request
        self._response: httpx.Response | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._lines: deque[bytes] = deque()
        self._partial = b""
        self._closed = False
        self.resource_version = resource_version
        """The version of the last event handed out (initially the one the watch started from)."""

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._closed:
            raise StopAsyncIteration
        if self._chunks is None:
            await self._open()
        while True:
            while self._lines:
                line = self._lines.popleft()
                if line.strip():
                    return await self._event(line)
            try:
                assert self._chunks is not None
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                await self.aclose()
                raise
            except httpx.HTTPError as exc:
                await self.aclose()
                raise KubeClientError(f"watch {self._kind} broke: {exc!r}") from exc
            lines = (self._partial + chunk).split(b"\n")
            self._partial = lines.pop()
            self._lines.extend(lines)

    async def _open(self) -> None:
        if self._http.is_closed:
            self._closed = True
            raise KubeClientError(f"watch {self._kind}: the API client is closed")
        try:
            response = await self._http.send(self._request, stream=True)
        except httpx.HTTPError as exc:
            self._closed = True
            raise KubeClientError(f"watch {self._kind}: {exc!r}") from exc
        self._response = response
        if response.status_code != 200:
            try:
                body = await response.aread()
            except httpx.HTTPError:
                body = b""
            await self.aclose()
            raise response_error(response.status_code, response.reason_phrase, body)
        self._chunks = response.aiter_bytes()

    async def _event(self, line: bytes) -> WatchEvent:
        try:
            wire = _decode_event(line)
        except msgspec.DecodeError as exc:
            await self.aclose()
            raise KubeClientError(f"watch {self._kind}: undecodable event: {exc}") from exc
        if wire.type == "ERROR":
            await self.aclose()
            raise status_error(wire.object)
        try:
            etype = WatchEventType(wire.type)
        except ValueError:
            await self.aclose()
            raise KubeClientError(f"watch {self._kind}: unknown event type {wire.type!r}") from None
        obj = wire.object
        if etype is not WatchEventType.BOOKMARK:
            obj.setdefault("apiVersion", self._kind.api_version)
            obj.setdefault("kind", self._kind.kind)
        event = WatchEvent(etype, obj)
        version = event.resource_version
        if version:
            self.resource_version = version
        return event

    async def aclose(self) -> None:
        if self._closed and self._response is None:
            return
        self._closed = True
        chunks, response = self._chunks, self._response
        self._chunks = self._response = None
        if chunks is not None:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                # RuntimeError: closed from another task while it reads.
                with contextlib.suppress(RuntimeError, httpx.HTTPError):
                    await aclose()
        if response is not None:
            with contextlib.suppress(httpx.HTTPError):
                await response.aclose()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
