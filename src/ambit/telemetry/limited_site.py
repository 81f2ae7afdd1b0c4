"""aiohttp's TCP site with a :class:`~ambit.telemetry.connection_limits.ConnectionGate` in front of its server.

Theory of operation
-------------------
The aiohttp servers that stay on aiohttp (``ambit dashboard``, the control plane's monitoring port) apply the rules of
:mod:`ambit.telemetry.connection_limits` through :class:`LimitedSite`: each accepted connection is first offered to
the gate (over a limit it is aborted at once), then handed to aiohttp's protocol; ``lifetime`` seconds later the
protocol is asked to close once the request it serves is done, and ``grace`` seconds after that the transport is
aborted. The node proxy does not use this module (it would import aiohttp): its ports are
:mod:`ambit.telemetry.http_server`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

from aiohttp import web

from ambit.telemetry.connection_limits import ConnectionGate, ConnectionLimits


class _GatedConnection(asyncio.Protocol):
    """One accepted connection: admitted by the gate and handed to aiohttp's protocol, or aborted."""

    def __init__(self, gate: ConnectionGate, make: Callable[[], asyncio.Protocol]) -> None:
        self._gate = gate
        self._make = make
        self._inner: asyncio.Protocol | None = None
        self._address = ""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses
        peer = transport.get_extra_info("peername")
        self._address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self._gate.admit(self._address):
            transport.abort()
            return
        self._inner = self._make()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._gate.limits.lifetime, self._expire, transport)
        self._inner.connection_made(transport)

    def _expire(self, transport: asyncio.Transport) -> None:
        close = getattr(self._inner, "close", None)  # aiohttp's RequestHandler: close once the request is served
        if callable(close):
            close()
        self._timer = asyncio.get_running_loop().call_later(self._gate.limits.grace, transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inner is not None:
            inner, self._inner = self._inner, None
            self._gate.release(self._address)
            inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class LimitedSite(web.BaseSite):
    """aiohttp's TCP site with a :class:`ConnectionGate` in front of the runner's server."""

    __slots__ = ("_gate", "_host", "_port", "_reuse_port")

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, limits: ConnectionLimits, *, reuse_port: bool = False
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._gate = ConnectionGate(limits)
        self._reuse_port = reuse_port
        """SO_REUSEPORT: a successor process may bind the same port while this one still serves."""

    @property
    def gate(self) -> ConnectionGate:
        return self._gate

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        gate = self._gate
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _GatedConnection(gate, server),
            self._host,
            self._port,
            reuse_address=True,
            reuse_port=self._reuse_port or None,
        )
