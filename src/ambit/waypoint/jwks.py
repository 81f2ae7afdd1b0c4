"""Fetching the JSON Web Key Sets of ``jwksUri`` rules for the waypoint or gateway, and keeping them fresh.

Theory of operation: the waypoint (not the control plane) fetches a ``jwksUri``. Who can make a component fetch a
URL is the question: a RequestAuthentication is written by anyone who may write policies in one namespace, and its
``targetRefs`` reach only that namespace's Gateways and Services (a GatewayClass target counts only in the root
namespace). Fetched here, such a user can make only their own namespace's waypoint, a pod in the mesh with no
cluster credentials, fetch a URL; fetched by the control plane (istiod's default, ``PILOT_JWT_ENABLE_REMOTE_JWKS``
off), any namespace user could make the most privileged component fetch any URL from where it runs, which in the
lab is the host's own network (its loopback services, the API server): a server-side request forgery with the
control plane's reach. What the key set says never leaves the waypoint.

:class:`JwksManager` is told the policies in force (:meth:`~JwksManager.update`) and keeps one refresher task per
distinct URI. Rules:

1. Only ``http`` and ``https`` URIs with a host are fetched; HTTPS verifies the server against the system's CAs.
   Redirects are not followed.
2. One fetch (:func:`ambit.httpfetch.fetch_body`) may take the rule's ``timeout`` (Istio's default 5 s) in all,
   and read at most :data:`~ambit.requestauth.MAX_JWKS_BYTES`; a longer body, a status other than 200, or a body
   that is not a key set with a usable key is a failure.
3. After a success the set is fetched again after ``refresh_seconds`` (Istio's 20 minutes); after a failure after
   ``retry_seconds``. A failure keeps the last good set; without one, the URI's tokens are refused ("Jwks remote
   fetch is failed") while requests without a token pass.
4. :meth:`~JwksManager.find_key_sets` answers from memory; :meth:`~JwksManager.fetch_key_sets` first waits for
   the first attempt of every URI, so the first requests after a start or a new policy are not refused only
   because the fetch has not finished (Envoy's remote JWKS waits the same way).
5. A URI no policy names any more has its task cancelled and its keys forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ambit.model.requestauth import MAX_JWKS_BYTES, RequestAuthentication, jwks_uri_problem
from ambit.requestauth import JsonWebKeySet, JwksRejected, KeySets, parse_jwks
from ambit.waypoint.errors import WaypointError

if TYPE_CHECKING:  # aiohttp is imported by the first fetch: a waypoint with no jwksUri never loads it (~20 MiB)
    import aiohttp

__all__ = ["JwksFetchError", "JwksManager", "JwksSettings", "fetch_jwks"]

log = logging.getLogger(__name__)

DEFAULT_REFRESH_SECONDS = 20 * 60.0
DEFAULT_RETRY_SECONDS = 60.0


class JwksFetchError(WaypointError):
    """A ``jwksUri`` could not be fetched or did not hold a usable key set (blame: the key server, or the URI)."""


@dataclass(frozen=True, slots=True)
class JwksSettings:
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS
    """After a successful fetch, when to fetch again (rule 3)."""
    retry_seconds: float = DEFAULT_RETRY_SECONDS
    """After a failed fetch, when to try again."""
    max_bytes: int = MAX_JWKS_BYTES


def check_uri(uri: str) -> None:
    """Rule 1 for the URI alone; raises :class:`JwksFetchError`."""
    problem = jwks_uri_problem(uri)
    if problem is not None:
        raise JwksFetchError(problem)


async def fetch_jwks(
    session: aiohttp.ClientSession, uri: str, *, limit_seconds: float, max_bytes: int = MAX_JWKS_BYTES
) -> JsonWebKeySet:
    """Fetch and parse one key set (rules 1 and 2); raises :class:`JwksFetchError` with a one-line reason."""
    check_uri(uri)
    from ambit.httpfetch import HttpFetchError, fetch_body

    try:
        body = await fetch_body(session, uri, within=limit_seconds, max_bytes=max_bytes)
    except HttpFetchError as exc:
        raise JwksFetchError(str(exc)) from None
    parsed = parse_jwks(body)
    if isinstance(parsed, JwksRejected):
        raise JwksFetchError(f"{uri}: {parsed.reason}")
    return parsed


@dataclass(slots=True)
class _Source:
    uri: str
    timeout: float
    task: asyncio.Task[None] | None = None
    keys: JsonWebKeySet | None = None
    error: str = ""
    tried: asyncio.Event = field(default_factory=asyncio.Event)
    fetches: int = 0


class JwksManager:
    """The remote key sets of the policies in force (rules 1-5). Use ``async with`` or call :meth:`aclose`."""

    def __init__(self, settings: JwksSettings | None = None) -> None:
        self.settings = settings or JwksSettings()
        self._sources: dict[str, _Source] = {}
        self._policies: tuple[RequestAuthentication, ...] = ()
        self._snapshot: KeySets | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> JwksManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def update(self, policies: Iterable[RequestAuthentication]) -> None:
        """Start fetching new URIs, forget the ones no policy names (rule 5); call from the event loop."""
        self._policies = tuple(policies)
        wanted: dict[str, float] = {}
        for policy in self._policies:
            for rule in policy.rules:
                if rule.jwks_uri:
                    wanted[rule.jwks_uri] = min(rule.timeout_seconds, wanted.get(rule.jwks_uri, rule.timeout_seconds))
        for uri in [u for u in self._sources if u not in wanted]:
            source = self._sources.pop(uri)
            if source.task is not None:
                source.task.cancel()
        for uri, timeout in wanted.items():
            known = self._sources.get(uri)
            if known is not None:
                known.timeout = timeout
                continue
            fresh = self._sources[uri] = _Source(uri, timeout)
            fresh.task = asyncio.get_running_loop().create_task(self._refresh(fresh), name=f"jwks {uri}")
        self._snapshot = None
        if self._policies:  # inline key sets (and PyJWT, on first use) parsed now, not by the next request
            self.find_key_sets()

    def find_key_sets(self) -> KeySets:
        """The keys known now (rule 4): inline sets parsed once per :meth:`update`, fetched sets as they stand."""
        if self._snapshot is None:
            remote: dict[str, JsonWebKeySet | JwksRejected] = {}
            for uri, source in self._sources.items():
                if source.keys is not None:
                    remote[uri] = source.keys
            self._snapshot = KeySets.build(self._policies, remote)
        return self._snapshot

    async def fetch_key_sets(self) -> KeySets:
        """The keys, once every URI has had its first attempt (rule 4)."""
        pending = [s for s in self._sources.values() if not s.tried.is_set()]
        if pending:
            waits = [asyncio.wait_for(s.tried.wait(), s.timeout + 1.0) for s in pending]
            await asyncio.gather(*waits, return_exceptions=True)
        return self.find_key_sets()

    def failure(self, uri: str) -> str:
        """The last fetch error of ``uri`` ("" after a success), for config dumps and tests."""
        source = self._sources.get(uri)
        return "" if source is None else source.error

    async def aclose(self) -> None:
        tasks = [s.task for s in self._sources.values() if s.task is not None]
        self._sources.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            import aiohttp

            # No cookies kept between fetches, no proxy from the environment.
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        return self._session

    async def _refresh(self, source: _Source) -> None:
        while True:
            try:
                keys = await fetch_jwks(
                    self._client(), source.uri, limit_seconds=source.timeout, max_bytes=self.settings.max_bytes
                )
            except Exception as exc:  # a JwksFetchError, or a bug: either way this URI keeps being retried
                source.error = str(exc) if isinstance(exc, JwksFetchError) else f"{source.uri}: {exc!r}"
                delay = self.settings.retry_seconds
                kept = "keeping the last good set" if source.keys else "no keys: its tokens are refused"
                log.warning("jwks fetch failed (%s); %s", source.error, kept)
            else:
                source.keys, source.error = keys, ""
                delay = self.settings.refresh_seconds
            source.fetches += 1
            source.tried.set()
            self._snapshot = None
            await asyncio.sleep(delay)
