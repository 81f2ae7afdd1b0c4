"""``python -m bench.scale.node_state [--sizes 1000,10000,100000] [--out bench/results]``: what a node proxy pays to
hold the mesh (issue 22): memory per known workload, to plan node sizes, and the time to apply a full wildcard
snapshot.

The harness's cluster (:mod:`bench.scale.cluster`, as :mod:`bench.scale.stages` builds it: a Service per ten pods
with its EndpointSlice, a policy per twenty) is translated by the control plane's own translation and encoded as
the Address resources it serves; one wildcard answer (``ServerSession`` opening a type) is serialised to a file, as
it would arrive on the wire. For each size a fresh child process then does what the node proxy's xDS client does
with it (:class:`~ambit.xds.client.XdsClient`): parse the ``DeltaDiscoveryResponse``, decode every resource
(:class:`~ambit.xds.client_session.ClientSession`), and put each Workload and Service into a
:class:`~ambit.model.state.WorkloadState`; the parsed message is then dropped. Reported per size: the wall and
CPU time of the apply, the child's RSS before and after (``/proc/self/statm`` after a full collection), and the
RSS per workload. The per-workload figure to plan with is the slope between the two largest sizes (it leaves out
the interpreter and imports). No root, no lab, no network; the children share the machine with whatever runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ambit.api import discovery_pb2 as dpb
from ambit.controlplane.addresses import addresses
from ambit.controlplane.translate import translate_all
from ambit.model.state import WorkloadState
from ambit.model.workload import Service, Workload
from ambit.xds.client_session import ClientSession
from ambit.xds.convert import ADDRESS_TYPE_URL, decode_address
from ambit.xds.session import ServerSession
from ambit.xds.table import AddressTable
from bench.scale.stages import Stages

PAGE = os.sysconf("SC_PAGE_SIZE")


def snapshot_file(pods: int, directory: Path) -> tuple[Path, int, int]:
    """The serialised wildcard answer for a cluster of ``pods`` pods: (file, workloads, services)."""
    stages = Stages(pods, by_changes=False)
    translation = translate_all(
        list(stages.pods.values()),
        stages.services,
        list(stages.slices.values()),
        stages.namespaces,
        authorization_policies=stages.policies,
    )
    table = AddressTable(addresses(translation.config))
    (response,) = ServerSession().receive(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL), table.current).responses
    path = directory / f"snapshot-{pods}.bin"
    path.write_bytes(response.SerializeToString())
    return path, len(translation.config.workloads), len(translation.config.services)


def _rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def child(path: Path) -> dict[str, Any]:
    """Apply the snapshot at ``path`` as the node proxy's xDS client does; the figures as a dict."""
    before = _rss()
    data = path.read_bytes()
    wall, cpu = time.perf_counter(), time.process_time()
    response = dpb.DeltaDiscoveryResponse.FromString(data)
    session = ClientSession({ADDRESS_TYPE_URL: decode_address})
    update = session.apply(response)
    state = WorkloadState()
    for _, value in update.upserts:
        if isinstance(value, Workload):
            state.upsert_workload(value)
        elif isinstance(value, Service):
            state.upsert_service(value)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del response, update, data
    after = _rss()
    workloads = len(state.workloads())
    return {
        "workloads": workloads,
        "services": len(state.services()),
        "errors": len(session.held(ADDRESS_TYPE_URL)) - workloads - len(state.services()),
        "apply_wall_s": wall,
        "apply_cpu_s": cpu,
        "rss_before": before,
        "rss_after": after,
    }


def measure(sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="ambit-node-state-") as tmp:
        for pods in sizes:
            path, workloads, services = snapshot_file(pods, Path(tmp))
            done = subprocess.run(
                [sys.executable, "-m", "bench.scale.node_state", "--child", str(path)],
                capture_output=True,
                text=True,
                check=True,
                timeout=1800,
            )
            row = json.loads(done.stdout)
            row.update(pods=pods, snapshot_bytes=path.stat().st_size, translated=(workloads, services))
            rows.append(row)
            print(
                f"{pods:>7,} pods: apply {row['apply_wall_s']:.2f} s ({row['apply_cpu_s']:.2f} s CPU), "
                f"RSS {row['rss_before'] / 2**20:.1f} -> {row['rss_after'] / 2**20:.1f} MiB",
                flush=True,
            )
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    load = os.getloadavg()
    lines = [
        "## node proxy state at scale (issue 22): memory per known workload, time to apply a full snapshot",
        "",
        f"{os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}; load average "
        f"{load[0]:.2f} at the end; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| pods (Services) | snapshot on the wire | apply (wall) | apply (CPU) | RSS before | RSS after "
        "| per workload |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        grown = row["rss_after"] - row["rss_before"]
        lines.append(
            f"| {row['pods']:,} ({row['services']:,}) | {row['snapshot_bytes'] / 2**20:.1f} MiB "
            f"| {row['apply_wall_s']:.2f} s | {row['apply_cpu_s']:.2f} s | {row['rss_before'] / 2**20:.1f} MiB "
            f"| {row['rss_after'] / 2**20:.1f} MiB | {grown / max(1, row['workloads']) / 1024:.2f} KiB |"
        )
    if len(rows) >= 2:
        small, large = rows[-2], rows[-1]
        slope = (large["rss_after"] - small["rss_after"]) / max(1, large["workloads"] - small["workloads"])
        lines += [
            "",
            f"- Slope between {small['pods']:,} and {large['pods']:,} pods: **{slope / 1024:.2f} KiB per known "
            f"workload** (Services included in proportion: one per ten pods); a node proxy holding the whole mesh "
            f"of 100,000 workloads needs about {slope * 100_000 / 2**20:.0f} MiB above its start.",
        ]
    lines += [
        "- Apply = parse the DeltaDiscoveryResponse, decode every Address (ClientSession), upsert into the "
        "WorkloadState, in a fresh child process per size; RSS from /proc/self/statm after gc.collect(), the parsed "
        "message dropped.",
        "- In on-demand mode (`--xds-on-demand`) a node proxy holds only what its pods talk to: multiply the per-"
        "workload figure by that number instead.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.node_state", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="pods per run, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return
    rows = measure([int(size) for size in args.sizes.split(",") if size.strip()])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "node-state.md").write_text(report(rows))
    (args.out / "node-state.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(report(rows))


if __name__ == "__main__":
    main()
