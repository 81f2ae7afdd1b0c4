"""Benchmark of ``ambit apiserver`` run as a real subprocess on loopback HTTPS.

``python -m bench.apiserver [--quick] [--out bench/results]`` measures (see :mod:`bench.apiserver_scenarios`):

1. list latency and size with 10k pods (all namespaces, a 10% label selection, ``limit=500`` pagination);
2. creates per second from 1 and 8 keep-alive clients;
3. watch fan-out: 100 watchers, a burst of 1000 creates, delivery rate and ack-to-delivery latency;
4. restart time with 10k pods after SIGTERM, and after kill -9 mid-burst with a durability check;

plus server RSS and CPU seconds per scenario. The reference for (2) and (3) is a bare aiohttp HTTPS server
(:mod:`bench.bare_server`) measured in the same run; no kube-apiserver or etcd is available here to compare.
``--writes-at N`` runs instead the writes-at-N-stored-pods scenario (:mod:`bench.apiserver_writes`: the scale
harness's churn at a fixed rate against N stored pods, each request timed); its own options, such as
``--data-from`` to start from a loaded data directory, go after ``--``.
Everything lives in a temporary directory that is removed at the end; both servers are ended in ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

from bench.apiserver_scenarios import (
    NAMESPACES,
    PROFILES,
    Lab,
    Profile,
    crash_restart,
    creates_per_second,
    load_and_list,
    restart,
    watch_fanout,
)
from bench.kube_client import Endpoint
from bench.report import Report
from bench.server_process import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
NOTES = [
    "No kube-apiserver or etcd on this machine: the reference is a bare aiohttp HTTPS server on loopback "
    "(decode JSON, stamp a resourceVersion, encode, 201; fan the same bytes out to watch streams) — the cost floor "
    "of HTTP + TLS + JSON in Python, without validation, defaulting, storage or selectors.",
    "Restart references are the first start on an empty data directory (which also creates the PKI).",
    "Server and benchmark client share the machine's CPUs; the client CPU figure shows when the client was the limit. "
    "A load average above 0 at start means other work shared the machine too.",
]


async def run_async(profile: Profile) -> Report:
    report = Report("ambit apiserver", profile.name, notes=list(NOTES))
    with tempfile.TemporaryDirectory(prefix="ambit-bench-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "apiserver"
        api = ServerProcess(
            [sys.executable, "-m", "ambit.cli", "apiserver", "--data-dir", str(data_dir), "--listen", _loopback()],
            log=tmp / "apiserver.log",
            cwd=REPO,
        )
        bare_ca, token = _bare_credentials(tmp)
        cert, key = str(tmp / "bare.crt"), str(tmp / "bare.key")
        bare = ServerProcess(
            [
                sys.executable,
                "-m",
                "bench.bare_server",
                f"--token={token}",  # one argument: a token may start with "-", which argparse would take for an option
                "--cert",
                cert,
                "--key",
                key,
                "--listen",
                _loopback(),
            ],
            log=tmp / "bare.log",
            cwd=REPO,
        )
        try:
            cold_start = await api.start()
            endpoint = Endpoint.from_kubeconfig(data_dir / "kubeconfig")
            await asyncio.sleep(0.5)  # let start-up garbage settle before the idle RSS reading
            idle_rss = api.rss_bytes()
            await _create_namespaces(endpoint)
            await bare.start()
            lab = Lab(profile, report, api, endpoint, bare, Endpoint(bare.url, bare_ca, token), cold_start, idle_rss)
            await load_and_list(lab)
            await restart(lab)
            await creates_per_second(lab)
            await watch_fanout(lab)
            await crash_restart(lab)
            report.env["loadavg_end"] = os.getloadavg()[0]
        except BaseException:
            log = (tmp / "apiserver.log").read_bytes()[-3000:].decode(errors="replace")
            print(f"benchmark failed; the API server's log ends with:\n{log}", file=sys.stderr)
            raise
        finally:
            for server in (api, bare):
                if server.running:
                    await server.terminate(grace=10)
    return report


def run(profile: str | Profile = "quick", out: Path | None = None, *, echo: bool = True) -> Report:
    """Run one profile (``full``, ``quick``, ``smoke`` or a custom :class:`Profile`); write results to ``out``."""
    chosen = PROFILES[profile] if isinstance(profile, str) else profile
    report = asyncio.run(run_async(chosen))
    if echo:
        print(report.markdown())
    if out is not None:
        md, js = report.write(out, "apiserver")
        if echo:
            print(f"written: {md} and {js}")
    return report


def _loopback() -> str:
    return f"127.0.0.1:{free_port()}"


async def _create_namespaces(endpoint: Endpoint) -> None:
    async with endpoint.session(1) as session:
        for name in NAMESPACES:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            async with session.post("/api/v1/namespaces", json=body) as resp:
                if resp.status != 201:
                    raise RuntimeError(f"creating namespace {name}: {resp.status} {await resp.text()}")


def _bare_credentials(directory: Path) -> tuple[bytes, str]:
    """A CA and a serving certificate for 127.0.0.1, written as bare.crt / bare.key; (CA PEM, bearer token)."""
    from ambit.tls.certs import issue_server_cert, new_ca

    now = time.time()
    ca = new_ca("bench-bare-ca", now=now)
    cert = issue_server_cert(ca, common_name="bare", dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now)
    (directory / "bare.crt").write_bytes(cert.cert_pem + ca.cert_pem)
    (directory / "bare.key").write_bytes(cert.key_pem)
    return ca.cert_pem, secrets.token_urlsafe(24)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.apiserver", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small numbers for a CI smoke run (under a minute)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where apiserver.md and apiserver.json go")
    parser.add_argument(
        "--pods", type=int, default=0, help="pods for the list and restart scenarios (issue 22's size: 100000)"
    )
    parser.add_argument(
        "--writes-at", type=int, metavar="N", help="only the writes scenario at N stored pods (bench.apiserver_writes)"
    )
    args, rest = parser.parse_known_args(argv)
    if args.writes_at:
        from bench import apiserver_writes

        apiserver_writes.main(["--pods", str(args.writes_at), "--out", str(args.out), *[a for a in rest if a != "--"]])
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    profile = PROFILES["quick" if args.quick else "full"]
    if args.pods:
        profile = dataclasses.replace(profile, name=f"{profile.name}, {args.pods:,} pods", pods=args.pods)
    run(profile, args.out)


if __name__ == "__main__":
    main()
