"""HBONE core microbenchmark: throughput and round-trip cost of ``ambit.hbone`` through an in-memory pair.

``.venv/bin/python bench/hbone_micro.py [--mib N]`` prints, for plain h2 4.4 ("before": every received frame pays
h2's ``repr(frame)``, a hex dump of the payload, and every sent byte is copied four times) and for the quiet DATA
paths of ``ambit.hbone.framing`` ("after"):

- MB/s of a client→server and a server→client bulk transfer of N MiB in 64 KiB writes, the receiver consuming
  every event at once (CPU of both ends, one thread: the figure is the per-byte cost of framing + parsing);
- µs per 1-byte round trip (client sends 1 byte, server echoes it, client receives it).

No TLS and no sockets: only the protocol core is measured.
"""

from __future__ import annotations

import argparse
import time

from ambit.hbone import DataReceived, Event, HboneClientConnection, HboneServerConnection

Endpoint = HboneClientConnection | HboneServerConnection


class _LoudClient(HboneClientConnection):
    _quiet = False


class _LoudServer(HboneServerConnection):
    _quiet = False


def _pump(client: HboneClientConnection, server: HboneServerConnection) -> tuple[list[Event], list[Event]]:
    got_client: list[Event] = []
    got_server: list[Event] = []
    while True:
        to_server, to_client = client.data_to_send(), server.data_to_send()
        if not to_server and not to_client:
            return got_client, got_server
        if to_server:
            events = server.receive_data(to_server)
            _consume(server, events)
            got_server += events
        if to_client:
            events = client.receive_data(to_client)
            _consume(client, events)
            got_client += events


def _consume(conn: Endpoint, events: list[Event]) -> None:
    for event in events:
        if isinstance(event, DataReceived):
            conn.consumed(event.stream_id, event.flow_length)


def _pair(quiet: bool) -> tuple[HboneClientConnection, HboneServerConnection, int]:
    client = HboneClientConnection() if quiet else _LoudClient()
    server = HboneServerConnection() if quiet else _LoudServer()
    stream_id = client.open_tunnel("198.18.200.7:8080")
    _pump(client, server)
    server.respond(stream_id, 200)
    _pump(client, server)
    return client, server, stream_id


def bulk(quiet: bool, upload: bool, mib: int) -> float:
    """MB/s moving ``mib`` MiB one way in 64 KiB writes, pumping after every 1 MiB written."""
    client, server, stream_id = _pair(quiet)
    sender: Endpoint = client if upload else server
    block = b"\xa5" * (64 * 1024)
    received = 0
    start = time.perf_counter()
    for _ in range(mib):
        for _ in range(16):
            sender.send_data(stream_id, block)
        got_client, got_server = _pump(client, server)
        received += sum(len(e.data) for e in (got_server if upload else got_client) if isinstance(e, DataReceived))
    elapsed = time.perf_counter() - start
    assert received == mib * 1024 * 1024, received
    return received / elapsed / 1e6


def round_trip(quiet: bool, count: int) -> float:
    """µs per 1-byte echo through the pair."""
    client, server, stream_id = _pair(quiet)
    start = time.perf_counter()
    for _ in range(count):
        client.send_data(stream_id, b"x")
        server_events = server.receive_data(client.data_to_send())
        _consume(server, server_events)
        server.send_data(stream_id, b"x")
        client_events = client.receive_data(server.data_to_send())
        _consume(client, client_events)
    return (time.perf_counter() - start) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=256, help="MiB per bulk transfer (default 256)")
    parser.add_argument("--round-trips", type=int, default=20000)
    args = parser.parse_args()
    print(f"{'h2 path':<32}{'client→server MB/s':>20}{'server→client MB/s':>20}{'1-byte RTT µs':>16}")
    for quiet, label in ((False, "before: plain h2 4.4"), (True, "after: quiet DATA paths")):
        up = max(bulk(quiet, True, args.mib) for _ in range(3))
        down = max(bulk(quiet, False, args.mib) for _ in range(3))
        rtt = min(round_trip(quiet, args.round_trips) for _ in range(3))
        print(f"{label:<32}{up:>20.0f}{down:>20.0f}{rtt:>16.1f}")


if __name__ == "__main__":
    main()
