"""``python -m bench.scale [--profile quick|default|full] [--out bench/results]``: the control-plane scale harness.

Profiles: ``quick`` (1,000 pods, 100 Services, 10 clients; under a minute), ``default`` (10,000 pods, 1,000
Services, 100 clients; ``make bench-scale``), ``full`` (100,000 pods, 10,000 Services, 1,000 clients; issue 22's
targets), ``smoke`` (the integration test's). Any size can be overridden (``--pods``, ``--services``, ...).
``--profile-controlplane`` runs the control plane under cProfile and writes ``scale-controlplane-N.prof`` (one
per start; ``python -m pstats``) and its log next to the results. ``--on-demand N`` makes every simulated node
proxy on demand, looking up N pod addresses (``XDS_ON_DEMAND``); ``--restart-rates 0,200`` restarts the control plane
once per xDS admission rate (0: istiod's default, 15 + 5 per CPU). Writes ``scale.md`` and ``scale.json`` to
``--out``.

Figures (2 vCPUs shared with other runs; ``bench/results/scale-stages.md`` has the tables): ``--pods 50000
--services 5000 --clients 500`` syncs all 500 clients in 132 s (344 s before the held versions were shared and the
control plane's own writes stopped causing whole translations) and a restart resends nothing (27,500,000
resources before). ``full`` (``bench/results/scale-full.md``) now loads, syncs all 1,000 clients (465 s on the
loaded machine; the clients of a worker share their held maps) and churns; its restart ran the control plane out
of memory (1,000 reconnects each naming 110,000 held versions). A run that fails writes what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path

from bench.report import Report
from bench.scale.run import PROFILES, Profile, run_async

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def run(
    profile: str | Profile, out: Path | None = None, *, echo: bool = True, profile_controlplane: bool = False
) -> Report:
    chosen = PROFILES[profile] if isinstance(profile, str) else profile
    profiles = (out or RESULTS) if profile_controlplane else None

    def partial(report: Report) -> None:  # a failed run still writes what it measured
        if out is not None:
            md, _ = report.write(out, "scale")
            print(report.markdown(), f"\nwritten (partial): {md}", sep="\n")

    report = asyncio.run(run_async(chosen, profile_controlplane=profiles, partial=partial))
    if echo:
        print(report.markdown())
    if out is not None:
        md, js = report.write(out, "scale")
        if echo:
            print(f"written: {md} and {js}")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="default")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where scale.md and scale.json go")
    for name in ("namespaces", "services", "pods", "policies", "clients"):
        parser.add_argument(f"--{name}", type=int, help=f"override the profile's {name}")
    parser.add_argument("--churn-rate", type=float, help="pod changes per second")
    parser.add_argument("--churn-seconds", type=float)
    parser.add_argument("--load-rate", type=float, help="creates per second while loading (0: unpaced)")
    parser.add_argument("--workers", type=int, help="processes for the simulated node proxies")
    parser.add_argument("--profile-controlplane", action="store_true", help="cProfile the control plane")
    parser.add_argument(
        "--on-demand", type=int, metavar="N", help="each client looks up N pod addresses on demand (0: wildcard)"
    )
    parser.add_argument(
        "--restart-rates",
        type=lambda text: tuple(float(r) for r in text.split(",")),
        metavar="R1,R2",
        help="one restart per rate, with that --max-requests-per-second (0: the default); default: one restart",
    )
    parser.add_argument(
        "--max-requests-per-second",
        type=float,
        metavar="RATE",
        help="the control plane's xDS admission rate (default: istiod's 15 + 5 per CPU)",
    )
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    shape = profile.shape
    sizes = {"namespaces": args.namespaces, "services": args.services, "pods": args.pods, "policies": args.policies}
    sizes["nodes"] = args.clients
    try:
        shape = dataclasses.replace(shape, **{k: v for k, v in sizes.items() if v is not None})
    except ValueError as exc:
        parser.error(str(exc))
    overrides = {"churn_rate": args.churn_rate, "churn_seconds": args.churn_seconds, "load_rate": args.load_rate}
    overrides["workers"] = args.workers
    overrides["on_demand"] = args.on_demand
    overrides["restart_rates"] = args.restart_rates
    if args.max_requests_per_second is not None:
        overrides["controlplane_args"] = ("--max-requests-per-second", f"{args.max_requests_per_second:g}")
    profile = dataclasses.replace(profile, shape=shape, **{k: v for k, v in overrides.items() if v is not None})
    run(profile, args.out, profile_controlplane=args.profile_controlplane)


if __name__ == "__main__":
    main()
