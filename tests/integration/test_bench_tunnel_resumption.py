"""The benchmark's stunnel and haproxy pairs resume TLS sessions by default and never with ``resume=False``.

Each test starts the real client-side and server-side processes with the rendered configurations on loopback:
an echo server on 127.0.0.1, the server side accepting on 127.0.0.2, the client side connecting to 127.0.0.1 where
an in-process relay forwards to 127.0.0.2 and reads the cleartext start of every TLS connection between the two
tunnels. A TLS 1.3 handshake resumes a session exactly when the ServerHello carries ``pre_shared_key`` (the server
accepted a ticket the ClientHello offered), so the relay sees, per connection, whether the client side offered a
session and whether the server side took it, whatever either side logs. 20 one-byte echoes go through each pair.

Each side is also checked alone, against the other side left with its defaults: a server side without resumption
must refuse the sessions a resuming client side offers (for stunnel, ``NO_TICKET`` and a tiny session cache are
not enough; this test is what shows it), and a client side without resumption must not offer any to a server
side that would take them. A client that offers its last session straight to the server side (Python's ``ssl``)
shows that server side's answer once more.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from bench.mesh.tunnels import (
    HAPROXY,
    STUNNEL,
    Credentials,
    TunnelKind,
    haproxy_config,
    make_credentials,
    stunnel_config,
)

CONNECTIONS = 20
CLIENT_SIDE_IP, SERVER_SIDE_IP = "127.0.0.1", "127.0.0.2"
HANDSHAKE, CLIENT_HELLO, SERVER_HELLO = 22, 1, 2
PRE_SHARED_KEY, SUPPORTED_VERSIONS, TLS13 = 41, 43, 0x0304
HELLO_RETRY_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")

Render = Callable[..., str]


@dataclass(frozen=True, slots=True)
class Pair:
    kind: TunnelKind
    render: Render
    argv: tuple[str, ...]


PAIRS = {
    "stunnel": Pair(STUNNEL, stunnel_config, ("stunnel",)),
    "haproxy": Pair(HAPROXY, haproxy_config, ("haproxy", "-db", "-f")),
}


# --- reading a TLS hello (sans-IO) -----------------------------------------------------------------------------


class HelloReader:
    """Fed one direction of a TLS connection; finds its first ClientHello or (non-retry) ServerHello."""

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.records = b""
        self.messages = b""
        self.extensions: dict[int, bytes] | None = None

    def feed(self, data: bytes) -> None:
        if self.extensions is not None:
            return
        self.records += data
        while len(self.records) >= 5:
            length = int.from_bytes(self.records[3:5], "big")
            if len(self.records) < 5 + length:
                return
            kind, fragment, self.records = self.records[0], self.records[5 : 5 + length], self.records[5 + length :]
            if kind == HANDSHAKE:
                self.messages += fragment
                self._messages()
                if self.extensions is not None:
                    return

    def _messages(self) -> None:
        while len(self.messages) >= 4:
            length = int.from_bytes(self.messages[1:4], "big")
            if len(self.messages) < 4 + length:
                return
            kind, body, self.messages = self.messages[0], self.messages[4 : 4 + length], self.messages[4 + length :]
            if kind == self.wanted and not (kind == SERVER_HELLO and body[2:34] == HELLO_RETRY_RANDOM):
                self.extensions = _extensions(body, client=kind == CLIENT_HELLO)
                return

    @property
    def has_psk(self) -> bool:
        return self.extensions is not None and PRE_SHARED_KEY in self.extensions


def _extensions(body: bytes, *, client: bool) -> dict[int, bytes]:
    at = 2 + 32  # legacy version, random
    at += 1 + body[at]  # legacy session id
    if client:
        at += 2 + int.from_bytes(body[at : at + 2], "big")  # cipher suites
        at += 1 + body[at]  # compression methods
    else:
        at += 2 + 1  # cipher suite, compression method
    end = at + 2 + int.from_bytes(body[at : at + 2], "big")
    at += 2
    found: dict[int, bytes] = {}
    while at < end:
        kind, length = int.from_bytes(body[at : at + 2], "big"), int.from_bytes(body[at + 2 : at + 4], "big")
        found[kind] = body[at + 4 : at + 4 + length]
        at += 4 + length
    return found


@dataclass(frozen=True, slots=True)
class Handshake:
    offered: bool
    """The client side's ClientHello offered a session (``pre_shared_key``)."""
    resumed: bool
    """The server side's ServerHello accepted it."""
    version: int


def test_the_hello_reader_finds_extensions_across_records_and_skips_a_hello_retry() -> None:
    def hello(kind: int, random_: bytes, extensions: dict[int, bytes]) -> bytes:
        ext = b"".join(k.to_bytes(2, "big") + len(v).to_bytes(2, "big") + v for k, v in extensions.items())
        body = b"\x03\x03" + random_ + b"\x00" + b"\x13\x02\x00" + len(ext).to_bytes(2, "big") + ext
        return bytes([kind]) + len(body).to_bytes(3, "big") + body

    def record(payload: bytes) -> bytes:
        return bytes([HANDSHAKE, 3, 3]) + len(payload).to_bytes(2, "big") + payload

    retry = hello(SERVER_HELLO, HELLO_RETRY_RANDOM, {SUPPORTED_VERSIONS: b"\x03\x04"})
    real = hello(SERVER_HELLO, bytes(32), {SUPPORTED_VERSIONS: b"\x03\x04", PRE_SHARED_KEY: b"\x00\x00"})
    wire = record(retry) + record(real[:10]) + record(real[10:])
    reader = HelloReader(SERVER_HELLO)
    for index in range(0, len(wire), 7):
        reader.feed(wire[index : index + 7])
    assert reader.extensions is not None
    assert reader.has_psk
    assert reader.extensions[SUPPORTED_VERSIONS] == b"\x03\x04"


# --- loopback harness ------------------------------------------------------------------------------------------


def _listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _free_base(kind: TunnelKind) -> int:
    """An echo port P such that P and P + each of the kind's offsets are free on loopback."""
    for _ in range(50):
        base = random.randrange(20000, 30000)
        ports = (base, base + kind.local_offset, base + kind.tls_offset)
        if set(ports) & _listening_ports():
            continue
        try:
            for port in ports:
                with socket.create_server((CLIENT_SIDE_IP, port)):
                    pass
        except OSError:
            continue
        return base
    raise AssertionError("no free loopback ports for the tunnel pair")


async def _wait_listening(ports: set[int], procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + 15
    while not ports <= _listening_ports():
        for proc in procs:
            assert proc.poll() is None, f"{proc.args!r} exited: {_logs(logs)}"
        assert time.monotonic() < deadline, f"nothing listens on {sorted(ports - _listening_ports())}: {_logs(logs)}"
        await asyncio.sleep(0.05)


def _logs(directory: Path) -> str:
    return " | ".join(f"{p.name}: {p.read_text()[-500:]}" for p in sorted(directory.glob("*.log")))


@contextlib.contextmanager
def _started(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


class Connections:
    """The accepted connections of the in-process servers, so teardown ends them instead of cancelling them."""

    def __init__(self) -> None:
        self.writers: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    def track(self, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)

    async def aclose(self) -> None:
        for writer in self.writers:
            writer.close()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=5)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Callable[[bytes], None]) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            seen(data)
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.close()


class Relay:
    """TCP relay from the client side to the server side that reads both hellos of each connection."""

    def __init__(self, upstream: tuple[str, int], connections: Connections) -> None:
        self.upstream = upstream
        self.connections = connections
        self.handshakes: list[Handshake] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.track(writer)
        client_hello, server_hello = HelloReader(CLIENT_HELLO), HelloReader(SERVER_HELLO)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self.connections.writers.add(up_writer)
        await asyncio.gather(_pipe(reader, up_writer, client_hello.feed), _pipe(up_reader, writer, server_hello.feed))
        if server_hello.extensions is not None:
            version = int.from_bytes(server_hello.extensions.get(SUPPORTED_VERSIONS, b"\x03\x03"), "big")
            self.handshakes.append(Handshake(client_hello.has_psk, server_hello.has_psk, version))


@dataclass(frozen=True, slots=True)
class Running:
    creds: Credentials
    local: tuple[str, int]
    """The client side's listener: connect here to go through the pair."""
    server_side: tuple[str, int]
    relay: Relay


@contextlib.asynccontextmanager
async def running_pair(
    pair: Pair, directory: Path, *, client_resume: bool, server_resume: bool
) -> AsyncIterator[Running]:
    creds = make_credentials(directory)
    base = _free_base(pair.kind)
    app_ports = {"echo": base}
    local, tls = pair.kind.local_port("echo", app_ports), pair.kind.tls_port("echo", app_ports)
    connections = Connections()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.track(writer)
        await _pipe(reader, writer, lambda _: None)

    relay = Relay((SERVER_SIDE_IP, tls), connections)
    servers = [
        await asyncio.start_server(echo, CLIENT_SIDE_IP, base),
        await asyncio.start_server(relay.handle, CLIENT_SIDE_IP, tls),
    ]
    configs = {
        "server": pair.render(creds, client=False, server_ip=SERVER_SIDE_IP, resume=server_resume, app_ports=app_ports),
        "client": pair.render(creds, client=True, server_ip=CLIENT_SIDE_IP, resume=client_resume, app_ports=app_ports),
    }
    try:
        with contextlib.ExitStack() as stack:
            procs = []
            for side, text in configs.items():
                config = directory / f"{side}.conf"
                config.write_text(text)
                procs.append(stack.enter_context(_started([*pair.argv, str(config)], directory / f"{side}.log")))
            await _wait_listening({local}, procs, directory)
            await _wait_server_side((SERVER_SIDE_IP, tls), procs, directory)
            yield Running(creds, (CLIENT_SIDE_IP, local), (SERVER_SIDE_IP, tls), relay)
    finally:
        for server in servers:
            server.close()
        await connections.aclose()
        for server in servers:
            await server.wait_closed()


async def _wait_server_side(address: tuple[str, int], procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    """/proc/net/tcp lists ports, not addresses: the server side's port is the relay's too, so probe 127.0.0.2."""
    deadline = time.monotonic() + 15
    while True:
        try:
            _, writer = await asyncio.open_connection(*address)
        except OSError:
            for proc in procs:
                assert proc.poll() is None, f"{proc.args!r} exited: {_logs(logs)}"
            assert time.monotonic() < deadline, f"the server side does not listen on {address}: {_logs(logs)}"
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


async def _one_byte_echoes(address: tuple[str, int], count: int) -> None:
    for index in range(count):
        reader, writer = await asyncio.open_connection(*address)
        payload = bytes([65 + index % 26])
        writer.write(payload)
        assert await asyncio.wait_for(reader.readexactly(1), 10) == payload
        writer.close()
        await writer.wait_closed()


async def _handshakes(relay: Relay, count: int) -> list[Handshake]:
    deadline = time.monotonic() + 10
    while len(relay.handshakes) < count:  # the relay records a connection once both sides closed it
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    return list(relay.handshakes)


def _direct_resumption(creds: Credentials, address: tuple[str, int]) -> list[bool]:
    """Connect straight to the server side twice, offering the first connection's session the second time."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(creds.ca))
    context.check_hostname = False
    context.load_cert_chain(str(creds.client_pem))
    reused, session = [], None
    for _ in range(2):
        with (
            socket.create_connection(address, timeout=10) as raw,
            context.wrap_socket(raw, session=session) as tls,
        ):
            tls.sendall(b"x")
            assert tls.recv(1) == b"x"  # the tickets (TLS 1.3) came before the echo
            reused.append(bool(tls.session_reused))
            session = tls.session
    return reused


# --- the tests ---------------------------------------------------------------------------------------------------


def _required(name: str) -> Pair:
    pair = PAIRS[name]
    if shutil.which(pair.argv[0]) is None:
        pytest.skip(f"{pair.argv[0]} is not installed (CI installs it)")
    return pair


@pytest.mark.parametrize("name", sorted(PAIRS))
async def test_with_the_defaults_the_pair_resumes_sessions_between_its_connections(name: str, tmp_path: Path) -> None:
    pair = _required(name)
    async with running_pair(pair, tmp_path, client_resume=True, server_resume=True) as running:
        await _one_byte_echoes(running.local, CONNECTIONS)
        handshakes = await _handshakes(running.relay, CONNECTIONS)
        direct = await asyncio.to_thread(_direct_resumption, running.creds, running.server_side)
    assert len(handshakes) == CONNECTIONS
    assert {h.version for h in handshakes} == {TLS13}
    resumed = sum(h.resumed for h in handshakes)
    assert resumed >= CONNECTIONS // 2, f"{name}: only {resumed} of {CONNECTIONS} connections resumed"
    assert direct == [False, True]


@pytest.mark.parametrize("name", sorted(PAIRS))
async def test_without_resumption_every_connection_is_a_full_handshake(name: str, tmp_path: Path) -> None:
    pair = _required(name)
    async with running_pair(pair, tmp_path, client_resume=False, server_resume=False) as running:
        await _one_byte_echoes(running.local, CONNECTIONS)
        handshakes = await _handshakes(running.relay, CONNECTIONS)
        direct = await asyncio.to_thread(_direct_resumption, running.creds, running.server_side)
    assert len(handshakes) == CONNECTIONS
    assert {h.version for h in handshakes} == {TLS13}
    assert not any(h.offered for h in handshakes), f"{name}: the client side offered a session"
    assert not any(h.resumed for h in handshakes), f"{name}: the server side resumed a session"
    assert direct == [False, False], f"{name}: the server side resumed a session a client offered"


@pytest.mark.parametrize("name", sorted(PAIRS))
async def test_a_server_side_without_resumption_refuses_a_client_side_that_offers_sessions(
    name: str, tmp_path: Path
) -> None:
    pair = _required(name)
    async with running_pair(pair, tmp_path, client_resume=True, server_resume=False) as running:
        await _one_byte_echoes(running.local, CONNECTIONS)
        handshakes = await _handshakes(running.relay, CONNECTIONS)
    assert len(handshakes) == CONNECTIONS
    assert not any(h.resumed for h in handshakes), f"{name}: the server side resumed a session"


@pytest.mark.parametrize("name", sorted(PAIRS))
async def test_a_client_side_without_resumption_never_offers_a_session_to_a_server_that_would_take_it(
    name: str, tmp_path: Path
) -> None:
    pair = _required(name)
    async with running_pair(pair, tmp_path, client_resume=False, server_resume=True) as running:
        await _one_byte_echoes(running.local, CONNECTIONS)
        handshakes = await _handshakes(running.relay, CONNECTIONS)
        direct = await asyncio.to_thread(_direct_resumption, running.creds, running.server_side)
    assert len(handshakes) == CONNECTIONS
    assert not any(h.offered for h in handshakes), f"{name}: the client side offered a session"
    assert direct == [False, True]  # the server side would have resumed one
