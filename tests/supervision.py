"""Helpers shared by the tests that run the lab's supervisor with real child processes."""

from __future__ import annotations

import asyncio

from ambit.lab.cluster.supervisor import SupervisorSettings

FAST = SupervisorSettings(initial=0.05, maximum=0.2, stable=5.0, term_grace=2.0)
"""Restart delays short enough for a test to see several restarts."""


async def until_true(probe: object, what: str, within: float = 10.0) -> None:
    """Poll ``probe()`` every 20 ms until it is true; fail after ``within`` seconds, naming ``what``."""
    assert callable(probe)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not probe():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
