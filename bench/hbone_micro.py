"""HBONE core microbenchmark: our HTTP/2 engine (``ambit.hbone``) against h2 4.4, through in-memory pairs, and
with the native DATA path (``ambit.native._hbone_data``) against the pure-Python one.

``.venv/bin/python bench/hbone_micro.py [--mib N]`` prints a row for each of:

- ``h2 4.4``: a plain h2 pair doing the same CONNECT tunnel (what ``ambit.hbone`` used before it had its own engine);
- ``ambit.hbone``: our engine driven by events (``send_data``, ``receive_data`` → ``DataReceived``, ``consumed``);
- ``ambit.hbone relay``: our engine driven as the node proxy's relay drives it without the native DATA path (the
  stream attached to a sink, ``core.attach``; each chunk sent with ``send_data_now``, output flushed after each
  read, as ``HboneSession.data_received`` does): the pure-Python path of the next row;
- ``ambit.hbone relay + C DATA``: the same with a ``DataPath`` per end, as ``HboneSession.release`` makes one on a
  native TLS transport: every read goes to its ``feed`` first and only the rest to ``receive_data``, every chunk to
  its ``send`` first and to ``send_data_now`` only when it declines. The transport and session it reads are
  in-memory stand-ins (:class:`MemoryTransport`, :class:`MemorySession`): records that take every write whole
  (nothing held, no TLS), so the row measures the protocol work in C, comparable to the rows above. "not built"
  when the extension is not (``scripts/build_native.py``). Its bulk figures also assert that the frames went
  through C (``DataPath.octets``, and sends the ``DataPath`` took) and moved the same bytes as the other rows.

For each:

- MB/s of a client→server and a server→client bulk transfer of N MiB in 64 KiB writes, the receiver consuming
  every event at once (CPU of both ends, one thread: the figure is the per-byte cost of framing + parsing);
- µs per 1-byte round trip (client sends 1 byte, server echoes it, client receives it);
- bytes of Python heap per open idle tunnel (tracemalloc, 1,000 tunnels on one connection, both ends).

Then, when the extension is built, what the C DATA path costs where it does no DATA work (a cold connection's reads
and writes are mostly that): µs to make a ``DataPath``, per ``feed`` of a read without DATA, per ``send`` it declines
(:func:`data_path_costs`).

The C allocator is tuned as ``ambit nodeproxy`` tunes it (:func:`ambit.inpod.allocator.tune_allocator`): without it
the relay rows' 1 MiB buffers each faulted in fresh pages, and their bulk figures moved tenfold between runs. No TLS
and no sockets: only the protocol core is measured (the TLS records' own path is measured by
``bench/hbone_loopback.py --tls-transport all``).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Callable
from types import ModuleType
from typing import Protocol

import h2.config
import h2.connection
import h2.events
import h2.settings

from ambit import native
from ambit.hbone import DataReceived, Event, HboneClientConnection, HboneServerConnection, HboneSettings
from ambit.inpod.allocator import tune_allocator

_BLOCK = b"\xa5" * (64 * 1024)
NATIVE_ROW = "ambit.hbone relay + C DATA"


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


class MemoryRecords:
    """The TLS records' ``write`` without TLS: every write taken whole, in order, nothing held (returns 0)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.chunks.append(data)
        return 0

    def take(self) -> bytes:
        chunks, self.chunks = self.chunks, []
        return b"".join(chunks)


class MemoryBacklog:
    size = 0
    """Plaintext and ciphertext the transport buffers: none (``DataPath.send`` declines otherwise)."""


class MemoryTransport:
    """What ``DataPath.send`` reads of a ``NativeTlsSocketTransport``: open, nothing buffered, and its records."""

    def __init__(self, records: MemoryRecords) -> None:
        self._closing = False
        self._backlog = MemoryBacklog()
        self._records = records

    def write(self, data: bytes) -> None:  # what DataPath.send falls back to when the records refuse a write
        self._records.write(data)

    def _hold(self, held: int) -> None:
        raise AssertionError(f"the memory records hold nothing, yet {held} bytes were held")


class MemorySession:
    """What a ``DataPath`` reads of an ``HboneSession``: released, never paused; ``flush`` writes the core's output."""

    def __init__(self, core: HboneClientConnection | HboneServerConnection, records: MemoryRecords) -> None:
        self.core, self.records = core, records
        self.held = self.write_paused = self.received = False

    def flush(self) -> None:
        if out := self.core.data_to_send():
            self.records.write(out)


class RelaySide:
    """One end driven as the relay drives it: the stream attached to a sink, chunks sent with ``send_data_now``;
    with ``hbone_data`` (``ambit.native._hbone_data``), through a ``DataPath`` first, as on a native transport."""

    def __init__(
        self, conn: HboneClientConnection | HboneServerConnection, stream_id: int, hbone_data: ModuleType | None
    ) -> None:
        self.conn, self.stream_id = conn, stream_id
        self.records = MemoryRecords()
        self.session = MemorySession(conn, self.records)
        self.got = 0
        conn.attach(stream_id, self._sink)
        self.path = (
            None if hbone_data is None else hbone_data.DataPath(conn, self.session, MemoryTransport(self.records))
        )
        self.sent_in_c = 0
        """Octets of the chunks the ``DataPath`` sent (0 without one)."""

    def _sink(self, data: bytes | memoryview) -> None:
        self.got += len(data)

    def send(self, data: bytes) -> None:
        path = self.path
        if path is not None and path.send(self.stream_id, data) is not None:
            self.sent_in_c += len(data)
            return
        out, _ = self.conn.send_data_now(self.stream_id, data)
        if out:
            self.records.write(out)

    def receive(self, wire: bytes) -> int:
        before = self.got
        path = self.path
        if path is not None and (taken := path.feed(wire)):
            wire = wire[taken:]
        if wire:
            for event in self.conn.receive_data(wire):
                assert not isinstance(event, DataReceived), "the stream is attached: its DATA goes to the sink"
            self.session.flush()
        return self.got - before

    def wire(self) -> bytes:
        self.session.flush()
        return self.records.take()


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


def relay_pair(hbone_data: ModuleType | None) -> Callable[[], tuple[Side, Side]]:
    """``ambit_pair``'s tunnel, each end then a :class:`RelaySide` (with a ``DataPath`` when ``hbone_data``)."""

    def make() -> tuple[Side, Side]:
        a, b = ambit_pair()
        assert isinstance(a, AmbitSide) and isinstance(b, AmbitSide)
        return RelaySide(a.conn, a.stream_id, hbone_data), RelaySide(b.conn, b.stream_id, hbone_data)

    return make


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
    receiver = server if upload else client
    if isinstance(sender, RelaySide) and isinstance(receiver, RelaySide) and receiver.path is not None:
        # The native row moved these bytes through C, not through the Python engine beside it.
        assert receiver.path.octets == received and sender.sent_in_c == received, (
            receiver.path.octets,
            sender.sent_in_c,
            received,
        )
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


def relay_tunnel_bytes(hbone_data: ModuleType | None) -> Callable[[int], float]:
    """``ambit_tunnel_bytes`` with each tunnel attached to a sink at both ends, and a ``DataPath`` per end made
    with the connection (as ``HboneSession.release`` does) when ``hbone_data``: what a relayed tunnel holds."""

    def measure(count: int) -> float:
        tracemalloc.start()
        settings = HboneSettings(max_concurrent_streams=count)
        client, server = HboneClientConnection(settings), HboneServerConnection(settings)
        server.receive_data(client.data_to_send())
        client.receive_data(server.data_to_send())
        paths = []  # kept while the tunnels are measured, as a session keeps its own
        if hbone_data is not None:
            for core in (client, server):
                records = MemoryRecords()
                paths.append(hbone_data.DataPath(core, MemorySession(core, records), MemoryTransport(records)))
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(count):
            stream_id = client.open_tunnel("198.18.200.7:8080")
            server.receive_data(client.data_to_send())
            server.respond(stream_id, 200)
            client.receive_data(server.data_to_send())
            server.attach(stream_id, _discard)
            client.attach(stream_id, _discard)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return (after - before) / count

    return measure


def _discard(data: bytes | memoryview) -> None:
    pass


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


_PING = bytes.fromhex("000008060000000000") + bytes(8)
"""A read with no DATA frame in it (a PING): what ``feed`` sees on most reads of a cold connection."""


def data_path_costs(hbone_data: ModuleType, count: int) -> dict[str, float]:
    """µs per call of what the native DATA path adds where it does no DATA work (a cold connection's case): making
    a ``DataPath`` (once per connection), ``feed`` of a read without DATA, ``send`` it declines (unknown stream)."""
    _, server = ambit_pair()
    assert isinstance(server, AmbitSide)
    core = server.conn
    records = MemoryRecords()
    session, transport = MemorySession(core, records), MemoryTransport(records)
    make = hbone_data.DataPath
    path = make(core, session, transport)
    feed, send, unknown = path.feed, path.send, server.stream_id + 2
    costs = {}
    for name, call in (
        ("DataPath()", lambda: make(core, session, transport)),
        ("feed(PING)", lambda: feed(_PING)),
        ("send declined", lambda: send(unknown, b"x")),
        ("(empty call)", lambda: None),
    ):
        start = time.perf_counter()
        for _ in range(count):
            call()
        costs[name] = (time.perf_counter() - start) / count * 1e6
    assert path.frames == 0 and not records.chunks, "nothing above was DATA work"
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=256, help="MiB per bulk transfer (default 256)")
    parser.add_argument("--round-trips", type=int, default=20000)
    parser.add_argument("--tunnels", type=int, default=1000, help="idle tunnels for the memory figure")
    parser.add_argument(
        "--costs", type=int, default=200000, metavar="N", help="calls per figure of the C DATA path's own costs"
    )
    args = parser.parse_args()
    tune_allocator()  # as ``ambit nodeproxy`` does at start-up: 1 MiB writes, not page faults, are what is measured
    header = f"{'engine':<28}{'client→server MB/s':>20}{'server→client MB/s':>20}{'1-byte RTT µs':>16}"
    print(header + f"{'B/idle tunnel':>16}")
    hbone_data = native.load_hbone_data()
    cases = [
        ("h2 4.4", h2_pair, h2_tunnel_bytes),
        ("ambit.hbone", ambit_pair, ambit_tunnel_bytes),
        ("ambit.hbone relay", relay_pair(None), relay_tunnel_bytes(None)),
    ]
    if hbone_data is not None:
        cases.append((NATIVE_ROW, relay_pair(hbone_data), relay_tunnel_bytes(hbone_data)))
    for label, make, tunnel_bytes in cases:
        up = max(bulk(make, True, args.mib) for _ in range(3))
        down = max(bulk(make, False, args.mib) for _ in range(3))
        rtt = min(round_trip(make, args.round_trips) for _ in range(3))
        memory = tunnel_bytes(args.tunnels)
        print(f"{label:<28}{up:>20.0f}{down:>20.0f}{rtt:>16.1f}{memory:>16.0f}", flush=True)
    if hbone_data is None:
        print(f"{NATIVE_ROW:<28}not built (scripts/build_native.py)")
        return
    costs = min((data_path_costs(hbone_data, args.costs) for _ in range(3)), key=lambda c: c["feed(PING)"])
    print("C DATA path, µs per call: " + ", ".join(f"{name} {value:.3f}" for name, value in costs.items()))


if __name__ == "__main__":
    main()
