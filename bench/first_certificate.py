"""Resident memory of the node proxy's start-up imports and of its first workload certificate, step by step.

Run as any user, no lab needed: ``python -m bench.first_certificate [--runs 5]``.

Theory of operation. This process makes a CA, a key and a signed chain (it may import cryptography: it plays the
CA), then spawns ``--runs`` fresh interpreters that each do what ``ambit nodeproxy`` does with lab flags: import
its modules as :func:`ambit.cli.nodeproxy.start` does, then take the first certificate from a CA the way
:class:`~ambit.identity.istiod.IstiodCaClient` does (the CSR, the answer's chain, both HBONE contexts), judge a
peer (:func:`~ambit.tls.spiffe.check_peer`) and render the ``/config_dump`` entry. After each step the child reads
``VmRSS`` and ``RssAnon`` from ``/proc/self/status`` and notes the modules that step added. The table gives the
median of each figure over the runs and each step's difference from the one before, in MiB, and the top-level
packages a step loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHILD = """
import sys, time
rows, seen = [], set(sys.modules)
def step(name):
    global seen
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    added = set(sys.modules) - seen
    seen = set(sys.modules)
    tops = sorted({m.split(".")[0] for m in added if not m.startswith("_")})
    rows.append([name, int(status["VmRSS"].split()[0]), int(status["RssAnon"].split()[0]), len(added), tops])
step("interpreter")
import ambit.cli.nodeproxy, ambit.cli.process_logging, ambit.inpod.eventloop
from ambit.inpod.allocator import tune_allocator
tune_allocator()
import ambit.inpod.daemon
step("node proxy imports")
from ambit.identity.istiod import _make_csr
from ambit.model.identity import SpiffeId
identity = SpiffeId("cluster.local", "default", "sleep")
_make_csr(identity)
step("CSR")
from ambit.tls.workload import WorkloadCertificate
directory = sys.argv[1]
leaf, root, key = (open(f"{directory}/{name}.pem", "rb").read() for name in ("leaf", "root", "key"))
cert = WorkloadCertificate.from_chain(identity, [leaf, root], key)
step("CA's chain")
cert.client_context(), cert.server_context()
step("HBONE contexts")
import ssl
import ambit.proxy.hbone_client, ambit.proxy.hbone_server
from ambit.tls.spiffe import check_peer
check_peer(ssl.PEM_cert_to_DER_cert(leaf.decode()), trust_domain="cluster.local", expected=None)
step("peer check")
cert.to_dump(time.time())
step("config_dump entry")
import json
print(json.dumps(rows))
"""


@dataclass(frozen=True, slots=True)
class Step:
    """One step's figures in one run: RSS and anonymous RSS after it (KiB), modules it added, their packages."""

    name: str
    rss_kib: int
    anon_kib: int
    modules: int
    packages: list[str]


def make_chain(directory: Path) -> None:
    from ambit.model.identity import SpiffeId
    from ambit.tls.certs import new_ca
    from ambit.tls.issuance import sign_csr
    from ambit.tls.spiffe import make_csr

    now = time.time()
    csr, key = make_csr(SpiffeId("cluster.local", "default", "sleep"))
    leaf, root = sign_csr(new_ca("bench root", now=now), csr, now=now, ttl_seconds=86400)
    for name, pem in (("leaf", leaf), ("root", root), ("key", key)):
        (directory / f"{name}.pem").write_bytes(pem)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.first_certificate", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters measured (medians reported)")
    options = parser.parse_args()
    runs: list[list[Step]] = []
    with tempfile.TemporaryDirectory(prefix="ambit-bench-") as directory:
        make_chain(Path(directory))
        for _ in range(options.runs):
            done = subprocess.run(
                [sys.executable, "-c", CHILD, directory], capture_output=True, text=True, check=True, cwd=directory
            )
            runs.append(
                [
                    Step(str(n), int(rss), int(anon), int(added), list(tops))
                    for n, rss, anon, added, tops in json.loads(done.stdout)
                ]
            )
    print(f"load average {os.getloadavg()[0]:.2f}; {options.runs} runs; medians, MiB")
    print(f"{'step':20} {'RSS':>6} {'+RSS':>6} {'anon':>6} {'+anon':>6} {'+modules':>8}  packages loaded")
    previous = (0.0, 0.0)
    for index, first in enumerate(runs[0]):
        rss = statistics.median(run[index].rss_kib for run in runs) / 1024
        anon = statistics.median(run[index].anon_kib for run in runs) / 1024
        grew = (rss - previous[0], anon - previous[1]) if index else (0.0, 0.0)
        tops = " ".join(first.packages)[:60]
        print(f"{first.name:20} {rss:6.1f} {grew[0]:6.1f} {anon:6.1f} {grew[1]:6.1f} {first.modules:8}  {tops}")
        previous = (rss, anon)


if __name__ == "__main__":
    main()
