"""The soak benchmark's pure parts and its load client (bench/soak.py, ``bench.mesh.apps soak``): the lifetime
mix, the verdict on memory and open files, the line chart, and the client against a real echo server on
loopback."""

from __future__ import annotations

import asyncio
import collections
import struct
from pathlib import Path

from bench.mesh import apps, chart
from bench.soak import FD_SLACK, Sample, judge


def test_lifetimes_are_89_percent_short_10_percent_medium_and_1_percent_long() -> None:
    kinds = collections.Counter(
        "long" if pause >= 1.0 else "medium" if pause > 0 else "short"
        for pause in (apps.lifetime(i)[1] for i in range(10_000))
    )
    assert kinds == {"short": 9_000, "medium": 900, "long": 100}
    assert all(5 <= apps.lifetime(i)[0] <= 20 for i in range(0, 10_000, apps.LONG_EVERY))
    assert all(apps.lifetime(i) == (1, 0.0) for i in range(1, 10))


def _sample(connections: int, rss: float, fds: int) -> Sample:
    return Sample(float(connections), connections, {"node-1": rss}, {"node-1": fds})


def test_memory_within_ten_percent_of_the_end_of_warm_up_is_flat_and_more_is_not() -> None:
    before, after = _sample(0, 60.0, 30), _sample(1000, 70.0, 31)
    samples = [_sample(50, 64.0, 80), _sample(100, 66.0, 90), _sample(500, 72.0, 95), _sample(900, 72.5, 90)]
    verdict = judge("node-1", before, samples, after, total=1000)
    assert verdict.rss_warm == 66.0 and verdict.rss_peak_after == 72.5
    assert verdict.memory_flat and verdict.fds_flat
    grown = [*samples, _sample(950, 73.0, 90)]
    assert not judge("node-1", before, grown, after, total=1000).memory_flat


def test_descriptors_left_open_after_the_load_are_growth() -> None:
    before = _sample(0, 60.0, 30)
    samples = [_sample(100, 60.0, 500)]
    assert judge("node-1", before, samples, _sample(1000, 60.0, 30 + FD_SLACK), total=1000).fds_flat
    assert not judge("node-1", before, samples, _sample(1000, 60.0, 31 + FD_SLACK), total=1000).fds_flat


def test_the_line_chart_is_a_png_of_the_expected_size(tmp_path: Path) -> None:
    panels = [
        ("rss", {"node-1": [(0.0, 60.0), (500.0, 61.0), (1000.0, 61.5)], "node-2": [(0.0, 58.0), (1000.0, 59.0)]}),
        ("fds", {"node-1": [(0.0, 30.0), (1000.0, 31.0)]}),
        ("empty", {}),
    ]
    data = chart.draw_series(panels, tmp_path / "soak.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (720, 3 * 260)


def test_the_soak_client_carries_every_connection_through_a_real_echo_server() -> None:
    async def scenario() -> dict[str, object]:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await apps._soak("127.0.0.1", port, 100, 8, 60)

    result = asyncio.run(scenario())
    assert result["progress"] == 100 and result["failures"] == 0 and result["final"] is True


def test_a_refused_connection_is_counted_as_a_failure() -> None:
    async def scenario() -> dict[str, object]:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        return await apps._soak("127.0.0.1", port, 5, 2, 30)

    result = asyncio.run(scenario())
    assert result["progress"] == 0 and result["failures"] == 5
