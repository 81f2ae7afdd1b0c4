"""bench/hbone_micro.py at tiny sizes: every row moves the bytes it claims, and the native row (the relay's ends with
a ``DataPath`` each, over in-memory stand-ins of the session and transport) sends and receives through C."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
from bench.hbone_micro import (
    RelaySide,
    Side,
    ambit_pair,
    bulk,
    h2_pair,
    relay_pair,
    relay_tunnel_bytes,
    round_trip,
)
from tests.conftest import hbone_data_or_skip


@pytest.fixture
def hbone_data() -> ModuleType:
    return hbone_data_or_skip()


@pytest.mark.parametrize("make", [h2_pair, ambit_pair, relay_pair(None)], ids=["h2", "events", "relay"])
def test_every_pure_python_row_moves_its_bytes_both_ways(make: Callable[[], tuple[Side, Side]]) -> None:
    assert bulk(make, upload=True, mib=1) > 0
    assert bulk(make, upload=False, mib=1) > 0
    assert round_trip(make, 10) > 0


@pytest.mark.parametrize("upload", [True, False], ids=["client-to-server", "server-to-client"])
def test_the_native_row_sends_and_receives_every_byte_through_c(hbone_data: ModuleType, upload: bool) -> None:
    made: list[tuple[RelaySide, RelaySide]] = []

    def make() -> tuple[Side, Side]:
        client, server = relay_pair(hbone_data)()
        assert isinstance(client, RelaySide) and isinstance(server, RelaySide)
        made.append((client, server))
        return client, server

    assert bulk(make, upload=upload, mib=2) > 0
    ((client, server),) = made
    sender, receiver = (client, server) if upload else (server, client)
    total = 2 * 1024 * 1024
    assert receiver.got == total
    assert receiver.path is not None and sender.path is not None
    assert (receiver.path.octets, sender.sent_in_c) == (total, total)
    assert receiver.path.frames >= total // (64 * 1024)
    assert sender.path.octets == 0  # the sender received WINDOW_UPDATEs only: nothing for a sink


def test_the_native_row_echoes_one_byte_through_c_both_ways(hbone_data: ModuleType) -> None:
    client, server = relay_pair(hbone_data)()
    assert isinstance(client, RelaySide) and isinstance(server, RelaySide)
    assert round_trip(lambda: (client, server), 50) > 0
    for side in (client, server):
        assert side.path is not None
        assert (side.path.octets, side.path.frames, side.sent_in_c, side.got) == (50, 50, 50, 50)


def test_a_data_path_holds_no_memory_per_idle_tunnel(hbone_data: ModuleType) -> None:
    with_path = relay_tunnel_bytes(hbone_data)(200)
    without = relay_tunnel_bytes(None)(200)
    assert with_path == pytest.approx(without, abs=16)
