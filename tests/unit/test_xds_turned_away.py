"""Streams the xDS server turns away (refused by admission, or unauthenticated): their first request is let land
before the status goes out, but for at most MAX_TURNED_AWAY streams at once, since a request may be up to
MAX_REQUEST_BYTES (16 MiB) and nobody who is turned away may make the server hold that much per stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from ambit.xds import server
from ambit.xds.table import AddressTable


class Silent:
    """A stream whose client never finishes its first request (a slow or hostile writer)."""

    def __init__(self) -> None:
        self.asked = False

    def __aiter__(self) -> AsyncIterator[object]:
        return self

    async def __anext__(self) -> object:
        self.asked = True
        await asyncio.sleep(3600)
        raise StopAsyncIteration


async def test_at_most_max_turned_away_first_requests_are_waited_for_at_once() -> None:
    service = server.XdsService(AddressTable(), lambda metadata: None)
    held = [Silent() for _ in range(server.MAX_TURNED_AWAY)]
    waits = [asyncio.create_task(service._let_land(stream)) for stream in held]
    await asyncio.sleep(0.05)
    assert all(stream.asked for stream in held)  # each of these is waited for (up to a second)
    extra = Silent()
    began = time.monotonic()
    await service._let_land(extra)  # one more is turned away at once: its request is never read
    assert not extra.asked and time.monotonic() - began < 0.5
    await asyncio.gather(*waits)  # the waits end by their own bound
    late = Silent()
    await asyncio.wait_for(service._let_land(late), 2.0)
    assert late.asked  # the slots were given back
