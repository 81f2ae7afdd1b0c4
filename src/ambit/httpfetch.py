"""Bounded HTTP GETs: the body of a 200 answer, or one line that says why not.

Theory of operation: a component that fetches a URL someone else chose (a proxy's admin ``/config_dump`` for
``ambit proxy-config``, a ``jwksUri`` for the waypoint) must not let the server decide how long it waits or how
much it keeps. :func:`fetch_body` is that GET; the caller owns the :class:`aiohttp.ClientSession` (its cookie jar,
its TLS trust, whether it is reused) and translates :class:`HttpFetchError` into its own error at its boundary.
Rules:

1. One deadline (``within`` seconds) covers connecting, the headers and the whole body: a server that drips a
   byte a second is cut off when it runs out.
2. A ``Content-Length`` above ``max_bytes`` is refused before any of the body is read; without one (chunked, or
   until close) the body is read in chunks and refused as soon as it passes ``max_bytes``. At most one chunk
   more than ``max_bytes`` is ever held.
3. Redirects are not followed: a 3xx is an error like any other status but 200. The error quotes the first line
   of at most :data:`STATUS_DETAIL_BYTES` of the body, as a Python literal (no terminal escapes reach a screen).
4. Every failure is an :class:`HttpFetchError` whose message starts with the URL; connection errors name the peer
   and the system's reason, never a traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp

from ambit.errors import AmbitError

__all__ = ["STATUS_DETAIL_BYTES", "HttpFetchError", "fetch_body", "read_body"]

STATUS_DETAIL_BYTES = 200
"""How much of a non-200 answer's body is read to quote in the error (rule 3)."""
_CHUNK = 64 * 1024


class HttpFetchError(AmbitError):
    """A bounded GET failed: unreachable, too slow, too large, or not a 200 (blame: the server, or the URL)."""


async def fetch_body(
    session: aiohttp.ClientSession,
    url: str,
    *,
    within: float,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """The body of ``GET url`` within ``within`` seconds and ``max_bytes`` bytes (rules 1-4)."""
    try:
        async with asyncio.timeout(within):
            async with session.get(url, allow_redirects=False, headers=headers) as response:
                if response.status != 200:
                    raise HttpFetchError(await _status_line(url, response))
                return await read_body(response, url=url, max_bytes=max_bytes)
    except TimeoutError:
        raise HttpFetchError(f"{url}: no complete answer within {within:g} s") from None
    except aiohttp.ClientError as exc:
        raise HttpFetchError(f"{url}: {_reason(exc)}") from None
    except OSError as exc:
        raise HttpFetchError(f"{url}: {exc.strerror or exc}") from None
    except ValueError as exc:  # aiohttp's answer to some malformed URLs
        raise HttpFetchError(f"{url}: {exc}") from None


async def read_body(response: aiohttp.ClientResponse, *, url: str, max_bytes: int) -> bytes:
    """The whole body of ``response``, refused past ``max_bytes`` (rule 2); the caller bounds the time."""
    if response.content_length is not None and response.content_length > max_bytes:
        raise HttpFetchError(f"{url}: the answer is {response.content_length} bytes, over {max_bytes}")
    body = bytearray()
    while chunk := await response.content.read(min(_CHUNK, max_bytes + 1)):
        body += chunk
        if len(body) > max_bytes:
            raise HttpFetchError(f"{url}: the answer is over {max_bytes} bytes")
    return bytes(body)


async def _status_line(url: str, response: aiohttp.ClientResponse) -> str:
    text = (await response.content.read(STATUS_DETAIL_BYTES)).decode("utf-8", "replace").strip().splitlines()
    detail = f": {text[0]!r}" if text else ""
    return f"{url}: HTTP {response.status} {response.reason or ''}".rstrip() + detail


def _reason(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}:{exc.port}: {exc.strerror or exc.os_error}"
    return f"{type(exc).__name__}: {exc}"
