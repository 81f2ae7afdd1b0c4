"""``python -m bench.scale.opening_cost``: what one exact reconnect's opening request costs the xDS server, stage by
stage, in one process (issue 22): a wildcard node proxy naming every resource of ``--resources`` Addresses at the
server's versions (~6.7 MB at 110,000). Prints the median microseconds of each stage over ``--rounds``: parsing the
request as the declared map and comparing it (the message path), parsing it with its held versions left encoded
and comparing their digest (the server's path), and the session's whole answer on each path. gRPC's own receive
(TLS, HTTP/2, the message's bytes) is not in here: ``python -m bench.scale.opening_grpc`` measures it, and the same
stages, in a server process."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from ambit.api import discovery_pb2 as dpb
from ambit.xds.opening import Reconnect, parse_request
from ambit.xds.resource_set import ResourceSet
from ambit.xds.session import ServerSession
from ambit.xds.table import AddressTable
from bench.scale.reconnect import _resources, opening_request


def _median_us(step: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        result = step()
        times.append(time.perf_counter() - started)
        del result
    return statistics.median(times) * 1e6


def stages(resources: int, rounds: int) -> dict[str, float]:
    current: ResourceSet = AddressTable(_resources(resources)).current
    data = opening_request(resources)
    current.versions_request()
    current.versions_digest()
    parsed = dpb.DeltaDiscoveryRequest.FromString(data)
    wire = parse_request(data)
    assert isinstance(wire, Reconnect)

    def receive(request: dpb.DeltaDiscoveryRequest | Reconnect) -> Any:
        output = ServerSession().receive(request, current)
        assert not output.deltas[0].resources and not output.deltas[0].removed
        return output

    return {
        "request_bytes": float(len(data)),
        "map: parse (FromString)": _median_us(lambda: dpb.DeltaDiscoveryRequest.FromString(data), rounds),
        "map: compare with the set (holds_exactly)": _median_us(lambda: current.holds_exactly(parsed), rounds),
        "map: the map into Python (dict)": _median_us(lambda: dict(parsed.initial_resource_versions), rounds),
        "map: session answer, parsed request given": _median_us(lambda: receive(parsed), rounds),
        "map: parse + answer": _median_us(lambda: receive(dpb.DeltaDiscoveryRequest.FromString(data)), rounds),
        "entries: parse (parse_request)": _median_us(lambda: parse_request(data), rounds),
        "entries: digest compare (holds_entries)": _median_us(lambda: current.holds_entries(wire.versions), rounds),
        "entries: session answer, parsed request given": _median_us(lambda: receive(wire), rounds),
        "entries: parse + answer": _median_us(lambda: receive(parse_request(data)), rounds),
        "set: its request and digest, once per set": _median_us(
            lambda: ResourceSet(current.by_name, current.by_alias, current.members).versions_digest(), 3
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.opening_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=110_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    for stage, value in stages(args.resources, args.rounds).items():
        print(json.dumps({"stage": stage, "us": round(value)}))


if __name__ == "__main__":
    main()
