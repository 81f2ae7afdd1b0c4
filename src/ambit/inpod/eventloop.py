"""Which event loop runs the node proxy: the standard library's, or uvloop (libuv underneath asyncio's API).

Theory of operation: :func:`run` is the node proxy's ``asyncio.run``. It resolves the loop's name to a loop factory
once, at start-up, and drives the main coroutine with :class:`asyncio.Runner` on a fresh loop from that factory,
so both loops get the same lifecycle: the main coroutine runs to completion, tasks still pending are cancelled,
async generators and the default executor are shut down, then the loop is closed. ``main`` is a factory rather
than a coroutine so that a bad name fails before any coroutine exists (no "never awaited" warning).

The data path relies only on what both loops provide: ``add_reader``/``add_writer`` on sockets
(:class:`~ambit.proxy.streams.SocketStream`), ``sock_accept``/``sock_connect``, TLS transports from
``create_connection(sock=..., ssl=...)`` and ``connect_accepted_socket(..., ssl=...)``, ``call_soon_threadsafe``
(the netns socket threads) and signal handlers. uvloop cannot open netlink sockets, so nothing that talks netlink
may run on the loop (the node proxy has none; pyroute2 runs in threads, DESIGN.md §5).

uvloop is the node proxy's default (:class:`~ambit.inpod.settings.NodeProxySettings`, ``--event-loop``) because
the connection-churn soak test (``tests/integration/test_uvloop_churn.py``: HBONE tunnels over mutual TLS with
every kind of ending, TLS connections dropped without close_notify or cancelled mid-handshake, plain TCP relays
with resets) passes under it as under asyncio: no crash, no fd or object leak, flat memory. A prototype with
uvloop 0.23 had aborted (double free) under churn (DESIGN.md §5). One difference the soak allows for: uvloop
frees the objects of a TLS handshake cancelled half way (not its fd, closed at once) only when its handshake
timeout fires.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ambit.errors import AmbitError

__all__ = ["EVENT_LOOPS", "EventLoopError", "loop_factory", "run"]

EVENT_LOOPS = ("asyncio", "uvloop")
"""The event loops :func:`run` knows, by the name settings and the command line use."""

T = TypeVar("T")


class EventLoopError(AmbitError):
    """The event loop named in the settings is unknown or cannot be used here."""


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The function that makes a new loop of the kind ``name`` (one of :data:`EVENT_LOOPS`)."""
    if name == "asyncio":
        return asyncio.new_event_loop
    if name == "uvloop":
        try:
            import uvloop
        except ImportError as exc:  # an optional extension module: say what is missing, not a traceback
            raise EventLoopError(f"event loop 'uvloop' is not available: {exc}") from None
        return uvloop.new_event_loop
    raise EventLoopError(f"unknown event loop {name!r}: expected one of {', '.join(EVENT_LOOPS)}")


def run(main: Callable[[], Coroutine[Any, Any, T]], loop_name: str) -> T:
    """Run ``main()`` to completion on a fresh loop of the kind ``loop_name``, then close the loop."""
    factory = loop_factory(loop_name)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())
