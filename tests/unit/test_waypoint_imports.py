"""What the waypoint and the ingress gateway load before any traffic (issue 17's memory goal, 60 MB at 1,000 req/s):
never the control plane's translation (it imported every translator and yaml, ~27 MiB, for one port-name table) and
not aiohttp until a RequestAuthentication's ``jwksUri`` is fetched (~9 MiB more), nor prometheus_client (with the
http.server and wsgiref it loads, ~2-3 MiB) until the first scrape of ``/metrics``, nor PyJWT (with the urllib.request
and http.client its key-set client loads, ~1 MiB) until a RequestAuthentication's keys arrive."""

from __future__ import annotations

import subprocess
import sys

import pytest

NOT_BEFORE_USE = ("aiohttp", "yaml", "yarl", "multidict", "prometheus_client", "wsgiref", "jwt")


@pytest.mark.parametrize("module", ["ambit.waypoint.process", "ambit.waypoint.ingress"])
def test_the_l7_proxies_load_neither_the_translation_nor_an_http_client(module: str) -> None:
    probe = (
        "import sys, importlib\n"
        f"importlib.import_module({module!r})\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {NOT_BEFORE_USE!r} "
        "or m.startswith('ambit.controlplane') or m.startswith('ambit.lab'))\n"
        "print('loaded:', *bad)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "loaded:", done.stdout
