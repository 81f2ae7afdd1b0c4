"""Fetching a proxy's admin ``/config_dump``: one bounded HTTP GET.

Theory of operation: :func:`fetch_config_dump` is the only I/O of ``ambit proxy-config``. It GETs
``<admin URL>/config_dump`` with :func:`ambit.httpfetch.fetch_body` and returns the body, or raises
:class:`AdminFetchError` with one line that says what went wrong and where. Bounds, because the URL may point at
anything (rules 1-3 are :mod:`ambit.httpfetch`'s):

1. One deadline covers connecting, the headers and the whole body (a server that drips a byte a second is cut off).
2. The body is read in chunks and refused past ``max_bytes`` (64 MiB by default), whatever Content-Length says; a
   Content-Length above the limit is refused before reading.
3. No redirects are followed and no proxy from the environment is used: the admin port is asked directly, and a
   3xx is an error like any other non-200 status.
4. Only ``http`` and ``https`` URLs with a host are accepted.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp

from ambit.httpfetch import HttpFetchError, fetch_body
from ambit.observe.proxyconfig import ProxyConfigError

DEFAULT_TIMEOUT = 10.0
"""Seconds for the whole request."""
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
ADMIN_PORT = 15000
"""Where a node proxy's admin listens, on 127.0.0.1 of its own network namespace (spec §8.2)."""


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
        async with aiohttp.ClientSession(trust_env=False) as session:
            return await fetch_body(
                session, url, within=within, max_bytes=max_bytes, headers={"Accept": "application/json"}
            )
    except HttpFetchError as exc:
        raise AdminFetchError(str(exc)) from None
