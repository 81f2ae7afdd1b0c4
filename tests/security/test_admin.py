"""The node proxy's admin port: host-network pods reach it, so its mutating requests need the admin token.

Replayed from the review of issue 14: ``POST /quitquitquit`` and ``POST /logging`` from anyone on the host stopped
or reconfigured the proxy. Now: no credential is 401, a wrong one 403, and nothing happens; with the token (a file
the proxy writes 0600 at start-up) they work; the GETs answer as before. The node proxy is the real one
(:class:`~ambit.inpod.daemon.NodeProxy` with a local CA and config), on loopback ports picked by the kernel, set up
as tests/proxyconfig_rig.py sets up the one ``ambit proxy-config`` reads.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from tests.proxyconfig_rig import loopback_node_proxy_settings

from ambit.inpod.daemon import NodeProxy
from ambit.telemetry.endpoints import read_admin_token, write_admin_token

MUTATING = [("POST", "/quitquitquit"), ("POST", "/logging?level=debug")]
READING = ["/", "/config_dump", "/logging"]


@pytest.fixture
def restore_log_levels() -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in ("ambit", "access")}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture
async def proxy(tmp_path: Path, restore_log_levels: None) -> AsyncIterator[NodeProxy]:
    settings = loopback_node_proxy_settings(tmp_path, "workloads: []\nservices: []\n")
    node_proxy = NodeProxy(settings)
    old_umask = os.umask(0)  # the token file's mode must not depend on it
    try:
        await node_proxy.start()
    finally:
        os.umask(old_umask)
    try:
        yield node_proxy
    finally:
        await node_proxy.aclose()


def admin_url(proxy: NodeProxy, path: str) -> str:
    return f"http://127.0.0.1:{proxy.endpoints.ports['admin']}{path}"


async def test_the_admin_token_is_written_at_start_up_for_its_owner_only(proxy: NodeProxy) -> None:
    path = proxy.settings.zds_socket.parent / "admin-token"
    assert proxy.admin_token_file == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.getuid()
    assert read_admin_token(path) == proxy.admin_token and len(proxy.admin_token) >= 40


@pytest.mark.parametrize(("method", "path"), MUTATING)
async def test_mutating_admin_requests_without_a_credential_are_401_and_change_nothing(
    proxy: NodeProxy, method: str, path: str
) -> None:
    before = logging.getLogger("ambit").level
    async with aiohttp.ClientSession() as session, session.request(method, admin_url(proxy, path)) as response:
        assert response.status == 401 and response.headers["WWW-Authenticate"] == "Bearer"
    assert not proxy.stopped.is_set() and logging.getLogger("ambit").level == before


@pytest.mark.parametrize(("method", "path"), MUTATING)
@pytest.mark.parametrize(
    "authorization", ["Bearer wrong", "Bearer ", "Basic YWRtaW46YWRtaW4=", "bearer {token}", "Bearer {token}x"]
)
async def test_mutating_admin_requests_with_a_wrong_credential_are_403_and_change_nothing(
    proxy: NodeProxy, method: str, path: str, authorization: str
) -> None:
    before = logging.getLogger("ambit").level
    headers = {"Authorization": authorization.format(token=proxy.admin_token)}
    url = admin_url(proxy, path)
    async with aiohttp.ClientSession() as session, session.request(method, url, headers=headers) as response:
        assert response.status == 403
    assert not proxy.stopped.is_set() and logging.getLogger("ambit").level == before


async def test_with_the_token_from_the_file_logging_is_set_and_quitquitquit_stops_the_proxy(proxy: NodeProxy) -> None:
    token = read_admin_token(proxy.admin_token_file)
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(admin_url(proxy, "/logging?level=ambit:error")) as response:
            assert response.status == 200 and "ambit: error" in await response.text()
        assert logging.getLogger("ambit").level == logging.ERROR
        async with session.post(admin_url(proxy, "/quitquitquit")) as response:
            assert (response.status, await response.text()) == (200, "OK\n")
    assert proxy.stopped.is_set()


@pytest.mark.parametrize("path", READING)
async def test_reading_admin_requests_need_no_credential(proxy: NodeProxy, path: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(admin_url(proxy, path)) as response:
        assert response.status == 200


async def test_metrics_and_readiness_need_no_credential(proxy: NodeProxy) -> None:
    ports = proxy.endpoints.ports
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{ports['stats']}/metrics") as response:
            assert response.status == 200
        async with session.get(f"http://127.0.0.1:{ports['readiness']}/healthz/ready") as response:
            assert response.status in (200, 500)  # ready or not, it answers


def test_the_token_file_replaces_an_open_old_one_and_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "admin-token"
    path.write_text("old\n")
    path.chmod(0o644)
    old_umask = os.umask(0)
    try:
        write_admin_token(path, "new-token-0123456789")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_admin_token(path) == "new-token-0123456789"
    assert [p.name for p in tmp_path.iterdir()] == ["admin-token"]


def test_the_token_file_does_not_follow_a_planted_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    path = tmp_path / "admin-token"
    (tmp_path / f".admin-token.{os.getpid()}.tmp").symlink_to(target)
    write_admin_token(path, "new-token-0123456789")
    assert target.read_text() == "keep\n" and not path.is_symlink()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
