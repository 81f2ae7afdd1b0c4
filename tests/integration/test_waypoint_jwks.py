"""The waypoint's JWKS fetching (ambit.waypoint.jwks) against a real HTTP server on loopback: keys fetched and used,
refreshed, kept on failure; a slow server, a huge body, a redirect and a non-HTTP URI all fail safely."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from tests.harness import free_port
from tests.unit.jwt_keys import claims, rsa_signer

from ambit.model.requestauth import MAX_JWKS_BYTES, JwtRule, RequestAuthentication
from ambit.requestauth import Authenticated, Rejected, authenticate
from ambit.requestauth import keys as keys_module
from ambit.requestauth.reasons import JWKS_FETCH_FAILED
from ambit.waypoint.jwks import JwksFetchError, JwksManager, JwksSettings, fetch_jwks

ISS = "https://issuer.example"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class KeyServer:
    """An aiohttp server on 127.0.0.1 whose ``/jwks`` answer a test can change."""

    def __init__(self) -> None:
        self.port = free_port()
        self.body = ""
        self.status = 200
        self.hits = 0
        self.routes: dict[str, Handler] = {}
        self._runner: web.AppRunner | None = None

    def url(self, path: str = "/jwks") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        handler = self.routes.get(request.path)
        if handler is not None:
            return await handler(request)
        return web.Response(status=self.status, text=self.body, content_type="application/json")


@pytest.fixture
async def server() -> AsyncIterator[KeyServer]:
    s = KeyServer()
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


async def wait_for(condition: Callable[[], bool], bound: float = 10.0) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def policy(uri: str, timeout: float = 5.0) -> RequestAuthentication:
    return RequestAuthentication("jwt", "app", (JwtRule(ISS, jwks_uri=uri, timeout_seconds=timeout),))


async def test_fetched_keys_verify_tokens_and_tokenless_requests_pass(server: KeyServer) -> None:
    signer = rsa_signer()
    server.body = signer.jwks()
    policies = (policy(server.url()),)
    async with JwksManager() as manager:
        manager.update(policies)
        keys = await manager.fetch_key_sets()
        now = time.time()
        token = signer.sign(claims(ISS, now=now))
        outcome = authenticate("GET", "/", (("authorization", f"Bearer {token}"),), policies, keys, now)
        assert isinstance(outcome, Authenticated) and outcome.identity is not None
        assert outcome.identity.subject == "alice"


async def test_rotated_keys_are_picked_up_on_refresh_and_kept_when_the_server_fails(server: KeyServer) -> None:
    old, new = rsa_signer(), rsa_signer()
    server.body = old.jwks()
    policies = (policy(server.url()),)
    now = time.time()

    def verdict(manager: JwksManager, token: str) -> Authenticated | Rejected:
        headers = (("authorization", f"Bearer {token}"),)
        return authenticate("GET", "/", headers, policies, manager.find_key_sets(), now)

    async with JwksManager(JwksSettings(refresh_seconds=0.2, retry_seconds=0.2)) as manager:
        manager.update(policies)
        await manager.fetch_key_sets()
        assert isinstance(verdict(manager, old.sign(claims(ISS, now=now))), Authenticated)
        server.body = new.jwks()
        await wait_for(lambda: isinstance(verdict(manager, new.sign(claims(ISS, now=now))), Authenticated))
        assert isinstance(verdict(manager, old.sign(claims(ISS, now=now))), Rejected)
        server.status, hits = 500, server.hits
        await wait_for(lambda: server.hits >= hits + 2 and "500" in manager.failure(server.url()))
        assert isinstance(verdict(manager, new.sign(claims(ISS, now=now))), Authenticated)


async def test_a_slow_server_times_out_and_its_tokens_are_refused(server: KeyServer) -> None:
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="{}")

    server.routes["/slow"] = slow
    policies = (policy(server.url("/slow"), timeout=0.5),)
    signer = rsa_signer()
    try:
        async with JwksManager() as manager:
            manager.update(policies)
            started = time.monotonic()
            keys = await manager.fetch_key_sets()
            assert time.monotonic() - started < 3.0
            assert "within 0.5 s" in manager.failure(server.url("/slow"))
            now = time.time()
            token = signer.sign(claims(ISS, now=now))
            headers = (("authorization", f"Bearer {token}"),)
            assert authenticate("GET", "/", headers, policies, keys, now) == Rejected(JWKS_FETCH_FAILED)
            assert authenticate("GET", "/", (), policies, keys, now) == Authenticated(None)
    finally:
        release.set()


async def test_a_huge_body_is_cut_off_at_the_cap(server: KeyServer) -> None:
    sent = 0

    async def huge(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b" " * 65536
        try:
            for _ in range(1024):  # 64 MiB if nobody stops reading
                await response.write(chunk)
                sent += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return response

    server.routes["/huge"] = huge
    async with aiohttp.ClientSession() as session:
        with pytest.raises(JwksFetchError, match=r"over \d+"):
            await fetch_jwks(session, server.url("/huge"), limit_seconds=10.0)
    assert sent < 16 * 1024 * 1024


async def test_a_declared_oversize_body_is_refused_before_reading(server: KeyServer) -> None:
    server.body = " " * (MAX_JWKS_BYTES + 1)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(JwksFetchError, match=r"over \d+"):
            await fetch_jwks(session, server.url(), limit_seconds=5.0)


async def test_redirects_are_not_followed(server: KeyServer) -> None:
    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(server.url())

    server.routes["/moved"] = redirect
    server.body = rsa_signer().jwks()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(JwksFetchError, match="HTTP 302"):
            await fetch_jwks(session, server.url("/moved"), limit_seconds=5.0)


@pytest.mark.parametrize("uri", ["file:///etc/passwd", "ftp://127.0.0.1/jwks", "http:///nohost", "gopher://x"])
async def test_only_http_and_https_uris_are_fetched(uri: str) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(JwksFetchError, match="not an http or https URL"):
            await fetch_jwks(session, uri, limit_seconds=1.0)


async def test_a_body_that_is_not_a_key_set_is_a_failure(server: KeyServer) -> None:
    server.body = '{"keys": []}'
    async with aiohttp.ClientSession() as session:
        with pytest.raises(JwksFetchError, match="any valid public key"):
            await fetch_jwks(session, server.url(), limit_seconds=5.0)


async def test_a_uri_no_policy_names_is_forgotten(server: KeyServer) -> None:
    server.body = rsa_signer().jwks()
    async with JwksManager() as manager:
        manager.update((policy(server.url()),))
        keys = await manager.fetch_key_sets()
        assert server.url() in keys.remote
        manager.update(())
        assert manager.find_key_sets().remote == {}


async def test_inline_key_sets_are_parsed_when_the_policies_arrive_not_by_the_first_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signer = rsa_signer()
    policies = (RequestAuthentication("jwt", "app", (JwtRule(ISS, jwks=signer.jwks()),)),)
    async with JwksManager() as manager:
        manager.update(policies)

        def parsed_late(text: str) -> object:
            raise AssertionError("a key set was parsed on the request path")

        monkeypatch.setattr(keys_module, "parse_jwks", parsed_late)
        keys = manager.find_key_sets()
        now = time.time()
        token = signer.sign(claims(ISS, now=now))
        outcome = authenticate("GET", "/", (("authorization", f"Bearer {token}"),), policies, keys, now)
        assert isinstance(outcome, Authenticated) and outcome.identity is not None
