"""The fault suite's load generator (tests/faults/load.py): its target and number syntax, how failures are classified,
and its streams against real servers on loopback (an end of their own, a reset, bytes after the end)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import socket
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.faults.load import PAYLOAD, Recorder, Target, bounded, classify, long_lived, payload

NAMES = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="="), min_size=1, max_size=20)


@given(NAMES, st.ip_addresses(v=4).map(str), st.integers(1, 65535))
def test_a_target_round_trips(name: str, host: str, port: int) -> None:
    assert Target.parse(f"{name}={host}:{port}") == Target(name, host, port)


@given(st.text(max_size=40) | st.sampled_from(["a=b:\u00b2", "a=b:0", "a=b:65536", "a=:80", "=b:80", "a=b:x"]))
def test_any_text_is_a_target_or_a_clear_argument_error(text: str) -> None:
    try:
        target = Target.parse(text)
    except argparse.ArgumentTypeError as exc:
        assert "NAME=HOST:PORT" in str(exc)
    else:
        assert target.name and target.host and 0 < target.port < 65536


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (ConnectionRefusedError(), "refused"),
        (ConnectionResetError(), "reset"),
        (BrokenPipeError(), "reset"),
        (asyncio.IncompleteReadError(b"", 10), "eof"),
        (TimeoutError(), "timeout"),
        (OSError("no route"), "error"),
    ],
)
def test_failures_are_classified_as_the_application_sees_them(exc: BaseException, outcome: str) -> None:
    assert classify(exc) == outcome


def test_every_payload_starts_with_the_marker_and_has_the_set_size() -> None:
    data = payload("MARK", Target("a>b", "198.18.1.2", 9000), 7, PAYLOAD)
    assert data.startswith(b"MARK a>b 7 ") and len(data) == PAYLOAD and data.endswith(b"\n")


@given(st.text(max_size=20) | st.sampled_from(["nan", "inf", "-1", "1e400", "0", "20", "20.5"]))
def test_any_number_argument_is_within_its_bounds_or_a_clear_argument_error(text: str) -> None:
    parse = bounded(0, 100)
    try:
        value = parse(text)
    except argparse.ArgumentTypeError as exc:
        assert "expected a number" in str(exc)
    else:
        assert 0 <= value <= 100


async def _serve(handler: Any) -> tuple[asyncio.Server, Target]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, Target("t", "127.0.0.1", port)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


class _StopAt(Recorder):
    """Records, and sets ``stop`` once ``kind`` has been recorded ``count`` times: the tests end on what happened,
    not on a timer a loaded machine can beat."""

    def __init__(self, out: io.StringIO, stop: asyncio.Event, kind: str, count: int) -> None:
        super().__init__(out)
        self.stop, self.kind, self.left = stop, kind, count

    def record(self, kind: str, target: Target, start: float, outcome: str, echoed: int, detail: str = "") -> None:
        super().record(kind, target, start, outcome, echoed, detail)
        if kind == self.kind:
            self.left -= 1
            if self.left == 0:
                self.stop.set()


async def _run_streams(handler: Any, lifetime: float, stop_at: tuple[str, int]) -> list[dict[str, Any]]:
    server, target = await _serve(handler)
    out = io.StringIO()
    stop = asyncio.Event()
    async with server:
        await asyncio.wait_for(long_lived(target, "MARK", 5.0, lifetime, stop, _StopAt(out, stop, *stop_at)), 30)
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def test_a_stream_with_a_lifetime_closes_on_its_own_cleanly_and_the_next_one_opens() -> None:
    # Stopped once the third stream is up: the first two ended on their own, the third was stopped.
    records = await _run_streams(_echo, lifetime=0.5, stop_at=("stream-up", 3))
    streams = [r for r in records if r["kind"] == "stream"]
    assert [r["outcome"] for r in streams] == ["ended", "ended", "ok"], streams
    assert all(r["echoed"] > 0 for r in streams)
    assert 0.45 < streams[0]["end"] - streams[0]["start"] < 5.0


async def test_a_server_that_resets_a_stream_is_recorded_as_a_reset_not_as_an_end() -> None:
    async def reset_after_a_line(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        await asyncio.sleep(0.2)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    records = await _run_streams(reset_after_a_line, lifetime=0.0, stop_at=("stream", 1))
    first = next(r for r in records if r["kind"] == "stream")
    assert first["outcome"] == "reset" and first["echoed"] == 64, first


async def test_a_server_that_talks_after_the_end_is_a_mismatch() -> None:
    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
        writer.write(b"surprise")
        await writer.drain()
        writer.close()

    records = await _run_streams(chatty, lifetime=0.3, stop_at=("stream", 1))
    first = next(r for r in records if r["kind"] == "stream")
    assert first["outcome"] == "mismatch" and "unexpected" in first["detail"], first
