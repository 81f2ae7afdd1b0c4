"""The socketpair between a node proxy and a worker (ambit.inpod.worker_channel), and the group's private ZDS."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import stat
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.inpod.settings import NodeProxySettings
from ambit.inpod.worker_channel import CUT, DRAIN, MAX_FRAME, ChannelError, frame, read_frame, read_settings, say
from ambit.inpod.workers import WorkerGroup
from ambit.telemetry.metrics import ProxyMetrics


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def frames(data: bytes) -> list[object]:
    reader, out = reader_of(data), []
    while (report := await read_frame(reader)) is not None:
        out.append(report)
    return out


async def test_reports_are_read_frame_by_frame_until_the_end() -> None:
    data = frame(json.dumps({"a": 1}).encode()) + frame(b"[]")
    assert await frames(data) == [{"a": 1}, []]
    assert await frames(b"") == []


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x00\x00", "inside a frame's length"),
        (frame(b"[1,2]")[:-1], "inside a frame of 5 bytes"),
        (struct.pack(">I", MAX_FRAME + 1), "over"),
        (frame(b"{nope"), "no JSON"),
        (frame(b"[" * 100_000 + b"]" * 100_000), "no JSON"),
    ],
)
async def test_what_is_no_frame_is_a_channel_error(data: bytes, words: str) -> None:
    with pytest.raises(ChannelError, match=words):
        await frames(data)


@given(st.binary(max_size=64))
def test_any_bytes_are_frames_or_a_channel_error(data: bytes) -> None:
    with contextlib.suppress(ChannelError):
        asyncio.run(frames(data))


def test_the_settings_frame_must_hold_settings() -> None:
    import pickle

    settings = NodeProxySettings(node="n", zds_socket=Path("/x/zds"), workers=1, worker=True)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(frame(pickle.dumps(settings)))
        assert read_settings(theirs) == settings
        ours.sendall(frame(pickle.dumps({"not": "settings"})))
        with pytest.raises(ChannelError, match="holds a dict"):
            read_settings(theirs)
        ours.sendall(frame(b"garbage"))
        with pytest.raises(ChannelError, match="does not load"):
            read_settings(theirs)
        ours.sendall(b"\x00\x00\x00\x09abc")
        ours.shutdown(socket.SHUT_WR)
        with pytest.raises(ChannelError, match="short"):
            read_settings(theirs)


async def test_the_groups_zds_socket_is_root_only_and_goes_with_the_group(tmp_path: Path) -> None:
    settings = NodeProxySettings(node="n", zds_socket=tmp_path / "zds", workers=1)
    group = WorkerGroup(settings, ProxyMetrics(), asyncio.get_running_loop().time)
    await group.start()
    assert group.directory is not None and group.server is not None
    assert stat.S_IMODE(group.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(group.server.socket_path.stat().st_mode) == 0o600
    worker = group.worker_settings(group.server.socket_path)
    assert worker.worker and worker.workers == 1 and worker.notify_fd is None and worker.own_pod is None
    await group.aclose(1.0)
    assert not group.directory.exists()


async def test_without_a_writable_tmp_the_groups_socket_goes_beside_the_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))
    settings = NodeProxySettings(node="n", zds_socket=tmp_path / "zds", workers=1)
    group = WorkerGroup(settings, ProxyMetrics(), asyncio.get_running_loop().time)
    await group.start()
    assert group.directory is not None and group.directory.parent == tmp_path
    await group.aclose(1.0)


async def test_with_nowhere_to_put_its_socket_the_group_starts_no_worker_and_the_node_proxy_serves_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from ambit.zds.protocol import WorkloadInfo

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))
    settings = NodeProxySettings(node="n", zds_socket=tmp_path / "missing" / "zds", workers=3)
    group = WorkerGroup(settings, ProxyMetrics(), asyncio.get_running_loop().time)
    await group.start()
    assert group.server is None and all(slot.task is None for slot in group.slots)
    await group.add("uid", WorkloadInfo("a", "b", "c"), 0)  # nothing to hand on to: no error
    await group.delete("uid")
    await group.aclose(1.0)


async def test_the_node_proxys_words_go_down_as_single_bytes_and_nothing_else_is_said() -> None:
    ours, theirs = socket.socketpair()
    try:
        _, writer = await asyncio.open_unix_connection(sock=ours)
        say(writer, DRAIN)
        say(writer, CUT)
        await writer.drain()
        assert theirs.recv(16) == b"dc"
        with pytest.raises(ChannelError, match="not a word"):
            say(writer, b"x")
        writer.close()
        await writer.wait_closed()
        say(writer, DRAIN)  # to a worker gone: nothing, no error
    finally:
        theirs.close()
