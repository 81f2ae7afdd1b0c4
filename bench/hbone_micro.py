"""HBONE core microbenchmark: our HTTP/2 engine (``ambit.hbone``) against h2 4.4, through in-memory pairs.

``.venv/bin/python bench/hbone_micro.py [--mib N]`` prints, for a plain h2 4.4 pair doing the same CONNECT tunnel
(h2 is what ``ambit.hbone`` used before it had its own engine) and for ``ambit.hbone``:

- MB/s of a client→server and a server→client bulk transfer of N MiB in 64 KiB writes, the receiver consuming
  every event at once (CPU of both ends, one thread: the figure is the per-byte cost of framing + parsing);
- µs per 1-byte round trip (client sends 1 byte, server echoes it, client receives it);
- bytes of Python heap per open idle tunnel (tracemalloc, 1,000 tunnels on one connection, both ends).

No TLS and no sockets: only the protocol core is measured.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from typing import Protocol

import h2.config
import h2.connection
import h2.events
import h2.settings

from ambit.hbone import DataReceived, Event, HboneClientConnection, HboneServerConnection, HboneSettings

_BLOCK = b"\xa5" * (64 * 1024)


class Side(Protocol):
    def send(self, data: bytes) -> None: ...
    def receive(self, wire: bytes) -> int: ...  # returns DATA bytes received, consuming them at once
    def wire(self) -> bytes: ...


class AmbitSide:
    def __init__(self, conn: HboneClientConnection | HboneServerConnection, stream_id: int) -> None:
        self.conn, self.stream_id = conn, stream_id

    def send(self, data: bytes) -> None:
        self.conn.send_data(self.stream_id, data)

    def receive(self, wire: bytes) -> int:
        got = 0
        events: list[Event] = self.conn.receive_data(wire)
        for event in events:
            if isinstance(event, DataReceived):
                got += len(event.data)
                self.conn.consumed(event.stream_id, event.flow_length)
        return got

    def wire(self) -> bytes:
        return self.conn.data_to_send()


class H2Side:
    """A plain h2 connection with the same windows and frame sizes as HboneSettings' defaults."""

    def __init__(self, client: bool) -> None:
        settings = HboneSettings()
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=client, header_encoding=None))
        self.conn.local_settings = h2.settings.Settings(
            client=client,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: settings.stream_window,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: settings.max_frame_size,
            },
        )
        self.conn.max_inbound_frame_size = settings.max_frame_size
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(settings.connection_window - 65535)
        self.stream_id = 1

    def send(self, data: bytes) -> None:
        window = self.conn.local_flow_control_window(self.stream_id)
        size = min(len(data), window, self.conn.max_outbound_frame_size)
        self.conn.send_data(self.stream_id, data[:size])

    def receive(self, wire: bytes) -> int:
        got = 0
        for event in self.conn.receive_data(wire):
            if isinstance(event, h2.events.DataReceived) and event.data:
                got += len(event.data)
                self.conn.acknowledge_received_data(event.flow_controlled_length or 0, self.stream_id)
        return got

    def wire(self) -> bytes:
        return self.conn.data_to_send()


def _pump(a: Side, b: Side) -> tuple[int, int]:
    got_a = got_b = 0
    while True:
        to_b, to_a = a.wire(), b.wire()
        if not to_a and not to_b:
            return got_a, got_b
        if to_b:
            got_b += b.receive(to_b)
        if to_a:
            got_a += a.receive(to_a)


def ambit_pair() -> tuple[Side, Side]:
    client, server = HboneClientConnection(), HboneServerConnection()
    stream_id = client.open_tunnel("198.18.200.7:8080")
    server.receive_data(client.data_to_send())
    server.respond(stream_id, 200)
    a, b = AmbitSide(client, stream_id), AmbitSide(server, stream_id)
    _pump(a, b)
    return a, b


def h2_pair() -> tuple[Side, Side]:
    a, b = H2Side(client=True), H2Side(client=False)
    a.conn.send_headers(1, [(":method", "CONNECT"), (":authority", "198.18.200.7:8080")])
    _pump(a, b)
    b.conn.send_headers(1, [(":status", "200")])
    _pump(a, b)
    return a, b


def bulk(make: Callable[[], tuple[Side, Side]], upload: bool, mib: int) -> float:
    """MB/s moving ``mib`` MiB one way in 64 KiB writes, pumping after every 1 MiB written."""
    client, server = make()
    sender = client if upload else server
    received = 0
    start = time.perf_counter()
    for _ in range(mib):
        for _ in range(16):
            sender.send(_BLOCK)
        got_client, got_server = _pump(client, server)
        received += got_server if upload else got_client
    elapsed = time.perf_counter() - start
    assert received == mib * 1024 * 1024, received
    return received / elapsed / 1e6


def round_trip(make: Callable[[], tuple[Side, Side]], count: int) -> float:
    """µs per 1-byte echo through the pair."""
    client, server = make()
    start = time.perf_counter()
    for _ in range(count):
        client.send(b"x")
        server.receive(client.wire())
        server.send(b"x")
        client.receive(server.wire())
    return (time.perf_counter() - start) / count * 1e6


def ambit_tunnel_bytes(count: int) -> float:
    tracemalloc.start()
    client, server = (
        HboneClientConnection(HboneSettings(max_concurrent_streams=count)),
        HboneServerConnection(HboneSettings(max_concurrent_streams=count)),
    )
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(count):
        stream_id = client.open_tunnel("198.18.200.7:8080")
        server.receive_data(client.data_to_send())
        server.respond(stream_id, 200)
        client.receive_data(server.data_to_send())
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count


def h2_tunnel_bytes(count: int) -> float:
    tracemalloc.start()
    a, b = H2Side(client=True), H2Side(client=False)
    _pump(a, b)
    before = tracemalloc.get_traced_memory()[0]
    assert isinstance(a, H2Side) and isinstance(b, H2Side)
    for index in range(count):
        stream_id = 1 + 2 * index
        a.conn.send_headers(stream_id, [(":method", "CONNECT"), (":authority", "198.18.200.7:8080")])
        b.conn.receive_data(a.conn.data_to_send())
        b.conn.send_headers(stream_id, [(":status", "200")])
        a.conn.receive_data(b.conn.data_to_send())
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=256, help="MiB per bulk transfer (default 256)")
    parser.add_argument("--round-trips", type=int, default=20000)
    parser.add_argument("--tunnels", type=int, default=1000, help="idle tunnels for the memory figure")
    args = parser.parse_args()
    header = f"{'engine':<20}{'client→server MB/s':>20}{'server→client MB/s':>20}{'1-byte RTT µs':>16}"
    print(header + f"{'B/idle tunnel':>16}")
    cases = (("h2 4.4", h2_pair, h2_tunnel_bytes), ("ambit.hbone", ambit_pair, ambit_tunnel_bytes))
    for label, make, tunnel_bytes in cases:
        up = max(bulk(make, True, args.mib) for _ in range(3))
        down = max(bulk(make, False, args.mib) for _ in range(3))
        rtt = min(round_trip(make, args.round_trips) for _ in range(3))
        memory = tunnel_bytes(args.tunnels)
        print(f"{label:<20}{up:>20.0f}{down:>20.0f}{rtt:>16.1f}{memory:>16.0f}")


if __name__ == "__main__":
    main()
