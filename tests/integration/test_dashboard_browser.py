"""The topology page in a real browser (Debian's Chromium, headless, over the DevTools protocol), fed by a real node
proxy's admin port: it loads without console errors, shows the workloads and their edges, draws the denied flow's
edge red, shows a hostile workload name as text, and opens a node's and an edge's details. A screenshot is written to
$AMBIT_SCREENSHOT (``make demo`` sets bench/results/topology.png), else under the test's temporary directory."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path

import pytest
from tests.integration.cdp import CHROMIUM, headless_chromium
from tests.integration.dashboard_rig import HOSTILE, load, running_dashboard

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make install adds it)")

RED = "rgb(229, 62, 62)"


def save_screenshot(target: Path, png: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(png)


def edge(src: str, dst: str) -> str:
    return f"document.querySelector('g[data-src={json.dumps(src)}][data-dst={json.dumps(dst)}] path.edge')"


async def test_the_topology_page_shows_workloads_edges_and_denials_in_a_browser(tmp_path: Path) -> None:
    (tmp_path / "proxy").mkdir()
    async with running_dashboard(tmp_path / "proxy") as dash, headless_chromium(tmp_path / "profile") as browser:
        await browser.send("Page.navigate", {"url": dash.url + "/"})
        await browser.wait_for("Number(document.body?.dataset.ready || 0) >= 1")

        shown = await browser.evaluate("[...document.querySelectorAll('[data-node-id]')].map(e => e.dataset.nodeId)")
        assert {"wl:apps/client", "wl:apps/server", "wl:apps/legacy", "svc:echo.apps.svc.cluster.local"} <= set(shown)
        names = await browser.evaluate("[...document.querySelectorAll('.node text.name')].map(e => e.dataset.name)")
        assert {"client", "server", "legacy"} <= set(names)

        good = edge("wl:apps/client", "wl:apps/server")
        bad = edge("wl:apps/legacy", "wl:apps/server")
        assert await browser.evaluate(f"{good}.classList.contains('mtls') && !{good}.classList.contains('denied')")
        assert await browser.evaluate(f"getComputedStyle({good}).strokeDasharray") == "none"  # solid: mutual TLS
        assert await browser.evaluate(f"getComputedStyle({bad}).stroke") == RED
        assert await browser.evaluate(f"getComputedStyle({bad}).strokeDasharray") != "none"  # dashed: plaintext
        assert await browser.evaluate(f"getComputedStyle({good}).stroke") != RED

        # A workload name full of markup is drawn as its text, and none of it runs.
        assert HOSTILE in names
        wanted = json.dumps("wl:apps/" + HOSTILE)
        hostile = f"[...document.querySelectorAll('[data-node-id]')].find(e => e.dataset.nodeId === {wanted})"
        assert await browser.evaluate(f"{hostile}.querySelector('title').textContent") == "wl:apps/" + HOSTILE
        label = await browser.evaluate(f"{hostile}.querySelector('text').textContent")
        assert label.endswith("…") and HOSTILE.startswith(label[:-1]) and len(label) >= 8  # shortened, as text
        assert await browser.evaluate("window.__pwned === undefined")
        assert await browser.evaluate("document.querySelectorAll('img, script:not([src])').length") == 0

        # Click a node: its identity, waypoint and policies.
        await browser.evaluate(
            "document.querySelector('[data-node-id=\"wl:apps/client\"]')"
            ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
        )
        details = await browser.wait_for("document.getElementById('node-details')?.textContent")
        assert "spiffe://cluster.local/ns/apps/sa/client" in details and "apps/allow-client (ALLOW)" in details

        # Click the red edge: its recent flows, with the verdict.
        await browser.evaluate(f"{bad}.parentNode.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        rows = await browser.wait_for(
            "[...document.querySelectorAll('#edge-flows tr')].slice(1).map(r => r.textContent).join('\\n')"
        )
        assert "denied" in rows and "allow policies exist, but none allowed" in rows

        # The policy view for that pair.
        await browser.evaluate("document.getElementById('explain-port').value = '8080'")
        await browser.evaluate("document.getElementById('explain-form').requestSubmit()")
        verdict = await browser.wait_for("document.querySelector('#explain-result .verdict-DENY')?.textContent")
        assert "apps/legacy" in verdict

        shot = await browser.send("Page.captureScreenshot", {"format": "png"})
        png = base64.b64decode(shot["data"])
        assert png.startswith(b"\x89PNG") and len(png) > 10_000
        target = Path(os.environ.get("AMBIT_SCREENSHOT") or tmp_path / "topology.png")
        save_screenshot(target, png)

        assert browser.errors == []
        # ... and the error watch does see one when there is one.
        await browser.evaluate("setTimeout(() => console.error('probe'), 0), true")
        await browser.wait_for("true")
        deadline = asyncio.get_running_loop().time() + 30
        while not browser.errors:
            assert asyncio.get_running_loop().time() < deadline, "a console error was never seen"
            await asyncio.sleep(0.05)
        assert browser.errors == ["console: probe"]


async def test_a_link_chooses_the_pages_window_and_a_bad_one_leaves_the_default(tmp_path: Path) -> None:
    (tmp_path / "proxy").mkdir()
    async with running_dashboard(tmp_path / "proxy") as dash, headless_chromium(tmp_path / "profile") as browser:
        for query, chosen in (("?window=42", "42"), ("?window=900", "900"), ("?window=0", "300"),
                              ("?window=99999", "300"), ("?window=%3Cb%3E", "300"), ("", "300")):  # fmt: skip
            await browser.send("Page.navigate", {"url": dash.url + "/" + query})
            await browser.wait_for("Number(document.body?.dataset.ready || 0) >= 1")
            assert await browser.evaluate("document.getElementById('window').value") == chosen, query
            options = await browser.evaluate("[...document.getElementById('window').options].map(o => o.value)")
            assert options.count(chosen) == 1
        assert browser.errors == []


async def test_the_page_shows_an_edges_rate_from_the_proxys_metrics_under_load_and_zero_after(tmp_path: Path) -> None:
    (tmp_path / "proxy").mkdir()
    async with running_dashboard(tmp_path / "proxy") as dash, headless_chromium(tmp_path / "profile") as browser:
        await browser.send("Page.navigate", {"url": dash.url + "/?window=2"})  # rates over the last 2 s
        await browser.wait_for("Number(document.body?.dataset.ready || 0) >= 1")
        group = edge("wl:apps/client", "wl:apps/server") + "?.parentNode"
        loading = asyncio.create_task(load(dash.proxy, 4.0))
        try:
            shown = await browser.wait_for(
                f"Number({group}?.dataset.bytesPerSecond || 0) > 0 && {group}.querySelector('text.rate')?.textContent"
            )
        finally:
            await loading
        assert "B/s" in shown and "conn/s" in shown
        await browser.evaluate(f"{group}.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        detail = await browser.wait_for("document.getElementById('edge-rate')?.textContent")
        assert "mutual TLS" in detail and "connections/s" in detail
        zero = await browser.wait_for(
            f"Number({group}?.dataset.bytesPerSecond) === 0 && {group}.querySelector('text.rate')?.textContent"
        )
        assert zero.startswith("0.00 B/s")
        assert browser.errors == []
