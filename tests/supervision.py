"""Waiting for a condition in asyncio tests, with a deadline."""

from __future__ import annotations

import asyncio


async def until_true(probe: object, what: str, within: float = 10.0) -> None:
    """Poll ``probe()`` every 20 ms until it is true; fail after ``within`` seconds, naming ``what``."""
    assert callable(probe)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not probe():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
