"""The node proxy process wires its CRL file in (``--crl-path`` / ``CRL_PATH``): read before the listeners start,
watched afterwards, shown in ``/config_dump``, its counters on the metrics port. The verdicts themselves are tested
on real TLS in tests/integration/test_hbone_crl.py."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

from tests import crl_pki
from tests.proxyconfig_rig import loopback_node_proxy_settings

from ambit.inpod.daemon import NodeProxy


async def test_the_node_proxy_loads_its_crl_file_when_it_appears_and_dumps_it(tmp_path: Path) -> None:
    crl_file = tmp_path / "crl" / "ca-crl.pem"
    settings = dataclasses.replace(
        loopback_node_proxy_settings(tmp_path, "workloads: []\nservices: []\n"),
        crl_path=crl_file,
        crl_poll_interval=0.05,
    )
    proxy = NodeProxy(settings)
    await proxy.start()
    try:
        assert proxy.config_dump()["crl"]["loaded"] is False  # no file: no checks, no error
        root = crl_pki.root(now=time.time())
        crl_file.parent.mkdir()
        crl_file.write_bytes(crl_pki.crl(root, [1, 2, 3], now=time.time()))
        deadline = time.monotonic() + 10
        while not proxy.config_dump()["crl"]["loaded"]:
            assert time.monotonic() < deadline, "the CRL file was not picked up"
            await asyncio.sleep(0.02)
        dump = proxy.config_dump()["crl"]
        assert dump["path"] == str(crl_file) and dump["error"] == ""
        assert [(c["issuer"], c["revokedCertificates"]) for c in dump["crls"]] == [("CN=Test root,O=cluster.local", 3)]
        text = proxy.metrics.render().decode()
        assert "# TYPE istio_crl_policy_rejections_total counter" in text
        assert "# TYPE istio_crl_untracked_connections_total counter" in text
    finally:
        await proxy.aclose()


def test_crl_path_comes_from_the_environment_as_ztunnel_reads_it(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "ambit.cli", "nodeproxy", "--node", "node-1", "--lab-dir", str(tmp_path)]
    env = os.environ | {"COLUMNS": "300", "CRL_PATH": str(tmp_path / "ca-crl.pem")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
    # The CRL path is accepted; the next check (there is no lab) is what stops it.
    assert (done.returncode, done.stderr.strip()) == (1, f"ambit: no lab in {tmp_path}")
