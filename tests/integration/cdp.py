"""A headless Chromium driven over the Chrome DevTools protocol (a websocket of JSON commands and events), for the
dashboard's browser test. No driver beyond aiohttp's client websocket.

:func:`headless_chromium` starts Debian's ``chromium`` with ``--remote-debugging-port=0`` in a fresh profile, reads
the port it chose from the profile's ``DevToolsActivePort`` file, and yields a :class:`Browser` attached to its first
page with the Runtime, Log and Page domains enabled. Every console error, uncaught exception and log entry of level
error is kept in :attr:`Browser.errors`. The browser's process group is ended with SIGTERM (then SIGKILL after 10 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.errors: list[str] = []
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read(), name="cdp reader")

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            if "id" in data:
                future = self._waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            self._event(data.get("method", ""), data.get("params", {}))
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("the browser closed its DevTools connection"))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
            self.errors.append("console: " + " ".join(args))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append("exception: " + str(details.get("exception", {}).get("description", details)))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")

    async def send(self, method: str, params: dict[str, Any] | None = None, *, within: float = 60) -> dict[str, Any]:
        call_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        await self.ws.send_str(json.dumps({"id": call_id, "method": method, "params": params or {}}))
        async with asyncio.timeout(within):
            answer = await future
        if "error" in answer:
            raise AssertionError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (an exception in it fails the test)."""
        result = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, *, within: float = 60) -> Any:
        """Until ``expression`` is truthy in the page (polled; the bound is generous, not a measurement)."""
        deadline = time.monotonic() + within
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"never true within {within} s: {expression}")
            await asyncio.sleep(0.1)

    async def aclose(self) -> None:
        await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@asynccontextmanager
async def headless_chromium(profile: Path, *, width: int = 1400, height: int = 900) -> AsyncIterator[Browser]:
    assert CHROMIUM is not None, "chromium is not installed (make install adds Debian's chromium)"
    argv = [
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",  # as root; the page is our own dashboard on loopback
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "about:blank",
    ]
    child = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, start_new_session=True
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            assert child.returncode is None, f"chromium exited {child.returncode}"
            assert time.monotonic() < deadline, "chromium never opened its DevTools port"
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        async with aiohttp.ClientSession() as session:
            page_url = ""
            while not page_url:
                async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                    targets = await response.json()
                page_url = next((t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page"), "")
                assert page_url or time.monotonic() < deadline, f"no page target: {targets}"
                if not page_url:
                    await asyncio.sleep(0.1)
            ws = await session.ws_connect(page_url, max_msg_size=64 * 1024 * 1024)
            browser = Browser(ws)
            try:
                for domain in ("Runtime", "Log", "Page"):
                    await browser.send(f"{domain}.enable")
                yield browser
            finally:
                await browser.aclose()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(child.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            await child.wait()
        with contextlib.suppress(ProcessLookupError):  # a helper of the browser that outlived it
            os.killpg(child.pid, signal.SIGKILL)


__all__ = ["CHROMIUM", "Browser", "headless_chromium"]
