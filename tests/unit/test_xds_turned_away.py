"""Streams the xDS server turns away (refused by admission, or unauthenticated): their first request is let land
before the status goes out, but for at most MAX_TURNED_AWAY streams at once, since a request may be up to
MAX_REQUEST_BYTES (16 MiB) and nobody who is turned away may make the server hold that much per stream."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

from ambit.xds.opening_gate import MAX_TURNED_AWAY
from ambit.xds.service import XdsService
from ambit.xds.table import AddressTable


class Silent:
    """A stream whose client never finishes its first request (a slow or hostile writer)."""

    def __init__(self) -> None:
        self.asked = False

    async def read(self) -> object:
        self.asked = True
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class Request:
    """A request as big as it gets: only its lifetime matters here."""


class Sent:
    """A stream whose client sent its first request."""

    def __init__(self) -> None:
        self.request: weakref.ref[Request] | None = None

    async def read(self) -> Request:
        request = Request()
        self.request = weakref.ref(request)
        return request


async def test_at_most_max_turned_away_first_requests_are_waited_for_at_once() -> None:
    service = XdsService(AddressTable(), lambda metadata: None)
    held = [Silent() for _ in range(MAX_TURNED_AWAY)]
    waits = [asyncio.create_task(service.openings.let_land(stream)) for stream in held]
    await asyncio.sleep(0.05)
    assert all(stream.asked for stream in held)  # each of these is waited for (up to a second)
    extra = Silent()
    began = time.monotonic()
    await service.openings.let_land(extra)  # one more is turned away at once: its request is never read
    assert not extra.asked and time.monotonic() - began < 0.5
    await asyncio.gather(*waits)  # the waits end by their own bound
    late = Silent()
    await asyncio.wait_for(service.openings.let_land(late), 2.0)
    assert late.asked  # the slots were given back


async def test_a_turned_away_request_is_let_go_as_soon_as_it_has_landed() -> None:
    service = XdsService(AddressTable(), lambda metadata: None)
    stream = Sent()
    gc.disable()  # freed by its reference count: a flood of them must not wait for the cycle collector
    try:
        await service.openings.let_land(stream)
        assert stream.request is not None and stream.request() is None
    finally:
        gc.enable()
