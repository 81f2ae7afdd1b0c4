"""A headless Chromium driven over the Chrome DevTools protocol (a websocket of JSON commands and events), for the
dashboard's browser test. No driver beyond aiohttp's client websocket.

:func:`headless_chromium` starts Debian's ``chromium`` with ``--remote-debugging-port=0`` in a fresh profile, reads
the port it chose from the profile's ``DevToolsActivePort`` file, and yields a :class:`Browser` attached to its first
page with the Runtime, Log and Page domains enabled. Every console error, uncaught exception and log entry of level
error is kept in :attr:`Browser.errors`. The browser's process group is ended with SIGTERM (then SIGKILL after 10 s).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
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
    # Chromium's own temporary directories (its sockets among them: a short path) go here and with it at the end.
    scratch = tempfile.mkdtemp(prefix="cr-")
    child = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "TMPDIR": scratch},
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
        shutil.rmtree(scratch, ignore_errors=True)


def _edge(src: str, dst: str) -> str:
    return (
        "[...document.querySelectorAll('g[data-src]')]"
        f".find(g => g.dataset.src === {json.dumps(src)} && g.dataset.dst === {json.dumps(dst)})"
        "?.querySelector('path.edge')"
    )


async def lab_page_check(
    url: str,
    profile: Path,
    screenshot: Path,
    *,
    allowed: tuple[str, str],
    denied: tuple[str, str],
    within: float = 180,
    stop_load: Callable[[], None] | None = None,
) -> list[str]:
    """Open the dashboard at ``url``; wait until the ``allowed`` edge is drawn solid (mutual TLS) and not red and the
    ``denied`` one red; write a screenshot; then, with ``stop_load``, wait until the ``allowed`` edge shows a byte rate
    from the proxies' metrics, call it, and wait until that rate is zero; the page's console errors."""
    red = "rgb(229, 62, 62)"
    async with headless_chromium(profile) as browser:
        await browser.send("Page.navigate", {"url": url})
        await browser.wait_for("Number(document.body?.dataset.ready || 0) >= 1", within=within)
        bad, good = _edge(*denied), _edge(*allowed)
        await browser.wait_for(f"{bad} && getComputedStyle({bad}).stroke === {json.dumps(red)}", within=within)
        await browser.wait_for(f"{good} && getComputedStyle({good}).strokeDasharray === 'none'", within=within)
        assert await browser.evaluate(f"getComputedStyle({good}).stroke") != red
        shot = await browser.send("Page.captureScreenshot", {"format": "png"})
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(screenshot.write_bytes, base64.b64decode(shot["data"]))
        if stop_load is not None:
            rate = f"Number({good}?.parentNode.dataset.bytesPerSecond || 0)"
            await browser.wait_for(f"{rate} > 0", within=within)
            await asyncio.to_thread(stop_load)
            await browser.wait_for(f"{good} && {rate} === 0", within=within)
        return list(browser.errors)


async def _screenshot(url: str, out: Path, within: float) -> None:
    """For ``make demo``: the page once it drew an edge (or after ``within`` seconds), as a PNG at ``out``."""
    with tempfile.TemporaryDirectory(prefix="ambit-chromium-") as profile:
        async with headless_chromium(Path(profile)) as browser:
            await browser.send("Page.navigate", {"url": url})
            with contextlib.suppress(AssertionError):
                await browser.wait_for("document.querySelectorAll('g[data-src]').length > 0", within=within)
            await asyncio.sleep(0.5)  # let the last refresh paint: this is a picture for people, not a proof
            shot = await browser.send("Page.captureScreenshot", {"format": "png"})
            out.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(out.write_bytes, base64.b64decode(shot["data"]))
            for error in browser.errors:
                print(f"page error: {error}", file=sys.stderr)


if __name__ == "__main__":  # python -m tests.integration.cdp URL OUT.png
    asyncio.run(_screenshot(sys.argv[1], Path(sys.argv[2]), 60))
    print(f"screenshot of {sys.argv[1]} written to {sys.argv[2]}")


__all__ = ["CHROMIUM", "Browser", "headless_chromium", "lab_page_check"]
