"""Fetching a proxy's admin ``/config_dump``: one bounded HTTP GET.

Theory of operation: :func:`fetch_config_dump` is the only I/O of ``ambit proxy-config``. It GETs
``<admin URL>/config_dump`` with aiohttp and returns the body, or raises :class:`AdminFetchError` with one line that
says what went wrong and where. Bounds, because the URL may point at anything:

1. One deadline covers connecting, the headers and the whole body (a server that drips a byte a second is cut off).
2. The body is read in chunks and refused past ``max_bytes`` (64 MiB by default), whatever Content-Length says; a
   Content-Length above the limit is refused before reading.
3. No redirects are followed and no proxy from the environment is used: the admin port is asked directly, and a
   3xx is an error like any other non-200 status.
4. Only ``http`` and ``https`` URLs with a host are accepted.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import aiohttp

from ambit.observe.proxyconfig import ProxyConfigError

DEFAULT_TIMEOUT = 10.0
"""Seconds for the whole request."""
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
ADMIN_PORT = 15000
"""Where a node proxy's admin listens, on 127.0.0.1 of its own network namespace (spec §8.2)."""
_CHUNK = 256 * 1024


class AdminFetchError(ProxyConfigError):
    """The admin endpoint could not be read: unreachable, too slow, too large, or not a 200."""


def config_dump_url(admin_url: str) -> str:
    """``http://host:port[/prefix]`` → the ``/config_dump`` URL under it; :class:`AdminFetchError` if not HTTP(S)."""
    try:
        parts = urlsplit(admin_url)
        _ = parts.port  # raises on a bad port
    except ValueError as exc:
        raise AdminFetchError(f"bad admin URL {admin_url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AdminFetchError(f"bad admin URL {admin_url!r}: expected http://HOST:PORT (e.g. http://127.0.0.1:15000)")
    if parts.query or parts.fragment:
        raise AdminFetchError(f"bad admin URL {admin_url!r}: no query or fragment, please")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/config_dump"


async def fetch_config_dump(
    admin_url: str, *, within: float = DEFAULT_TIMEOUT, max_bytes: int = DEFAULT_MAX_BYTES
) -> bytes:
    """The body of ``GET <admin_url>/config_dump`` within ``within`` seconds and ``max_bytes`` bytes."""
    url = config_dump_url(admin_url)
    try:
        async with asyncio.timeout(within):
            return await _get(url, max_bytes)
    except TimeoutError:
        raise AdminFetchError(f"{url}: no complete answer within {within:g} s") from None
    except aiohttp.ClientError as exc:
        raise AdminFetchError(f"{url}: {_reason(exc)}") from None
    except OSError as exc:
        raise AdminFetchError(f"{url}: {exc.strerror or exc}") from None


async def _get(url: str, max_bytes: int) -> bytes:
    async with (
        aiohttp.ClientSession(trust_env=False) as session,
        session.get(url, allow_redirects=False, headers={"Accept": "application/json"}) as response,
    ):
        if response.status != 200:
            text = (await response.content.read(200)).decode("utf-8", "replace").strip().splitlines()
            detail = f": {text[0]!r}" if text else ""
            raise AdminFetchError(f"{url}: HTTP {response.status} {response.reason or ''}".rstrip() + detail)
        if response.content_length is not None and response.content_length > max_bytes:
            raise AdminFetchError(f"{url}: the answer is {response.content_length} bytes, over {max_bytes}")
        body = bytearray()
        while chunk := await response.content.read(_CHUNK):
            body += chunk
            if len(body) > max_bytes:
                raise AdminFetchError(f"{url}: the answer is over {max_bytes} bytes")
        return bytes(body)


def _reason(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}:{exc.port}: {exc.strerror or exc.os_error}"
    return f"{type(exc).__name__}: {exc}"
