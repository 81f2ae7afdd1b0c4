"""File modes that do not depend on the umask: the API server's data directory is 0700 and its database files
0600 (state.db holds every Secret), and the node agent's plugin-event socket is 0600 in a directory nobody else may
write to (``/cmdadd`` enrols pods). Each test runs with the most permissive umask, 0o000, to prove it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from tests.integration.apiserver_client import ApiClient, configmap

from ambit.apiserver.server import ApiServer, ApiServerSettings
from ambit.cni.pluginevent import AddEvent, PluginEventServer, PluginEventSocketError


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0o000)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_apiserver_data_directory_and_database_files_are_private_whatever_the_umask(
    tmp_path: Path, permissive_umask: None
) -> None:
    data_dir = tmp_path / "apiserver"
    async with ApiServer(ApiServerSettings(data_dir=data_dir, port=0)) as server:
        async with ApiClient.for_server(server) as api:
            await api.create("/api/v1/namespaces/default/configmaps", configmap("written"))  # the WAL is in use
        files = {p.name: mode(p) for p in data_dir.iterdir() if p.name.startswith("state.db")}
        assert mode(data_dir) == 0o700
        assert set(files) >= {"state.db", "state.db-wal", "state.db-shm"}
        assert files == dict.fromkeys(files, 0o600)


async def test_apiserver_tightens_an_existing_data_directory_and_database_at_start(
    tmp_path: Path, permissive_umask: None
) -> None:
    data_dir = tmp_path / "apiserver"
    data_dir.mkdir(mode=0o777)
    (data_dir / "state.db").touch(mode=0o666)
    assert mode(data_dir) == 0o777 and mode(data_dir / "state.db") == 0o666
    async with ApiServer(ApiServerSettings(data_dir=data_dir, port=0)):
        assert mode(data_dir) == 0o700
        assert mode(data_dir / "state.db") == 0o600


async def _no_add(event: AddEvent) -> None:
    raise AssertionError(f"no enrolment expected, got {event}")


async def test_plugin_event_socket_is_private_whatever_the_umask(tmp_path: Path, permissive_umask: None) -> None:
    socket_path = tmp_path / "run" / "ambit" / "pluginevent.sock"
    server = PluginEventServer(str(socket_path), _no_add)
    await server.start()
    try:
        assert stat.S_ISSOCK(socket_path.stat().st_mode)
        assert mode(socket_path) == 0o600
        assert mode(socket_path.parent) == 0o700
        async with (
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket_path))) as session,
            session.post("http://agent/cmdadd", data=b"not json") as response,
        ):
            assert response.status == 400  # it still serves its owner
    finally:
        await server.aclose()


async def test_plugin_event_socket_directory_writable_by_others_is_tightened(
    tmp_path: Path, permissive_umask: None
) -> None:
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o777)
    server = PluginEventServer(str(directory / "pluginevent.sock"), _no_add)
    await server.start()
    try:
        assert mode(directory) == 0o755
        assert mode(directory / "pluginevent.sock") == 0o600
    finally:
        await server.aclose()


async def test_plugin_event_socket_in_a_directory_others_may_write_and_we_do_not_own_is_refused(
    tmp_path: Path, permissive_umask: None
) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    directory = tmp_path / "foreign"
    directory.mkdir(mode=0o777)
    os.chown(directory, 65534, 65534)  # nobody's
    server = PluginEventServer(str(directory / "pluginevent.sock"), _no_add)
    with pytest.raises(PluginEventSocketError, match="writable by others and not ours"):
        await server.start()
    await server.aclose()
    assert mode(directory) == 0o777
    assert not (directory / "pluginevent.sock").exists()
