"""What Ambit's aiohttp servers log about a request they could not parse: one line, never the request's bytes.

aiohttp refuses a malformed request (smuggling attempts, bare LF, folded headers) with 400 and logs the parser's
exception with a traceback, and that exception quotes the offending line of the request, which may be an
``Authorization: Bearer`` header: the caller's token would land in the server's log. :class:`UnparsedRequestFilter`
rewrites such records on the ``aiohttp.server`` logger into one line at INFO naming the peer and the kind of error
(a malformed request is the client's fault, not the server's), without the exception's text or traceback.
"""

from __future__ import annotations

import logging

from aiohttp import http_exceptions

SERVER_LOGGER = "aiohttp.server"


class UnparsedRequestFilter(logging.Filter):
    """Rewrites aiohttp's "Error handling request" records for unparsable requests (module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, http_exceptions.HttpProcessingError):
            peer = record.getMessage().rpartition(" from ")[2] or "unknown peer"
            record.msg, record.args = (
                "refused a malformed request from %s (%s, %s)",
                (
                    peer,
                    type(exc).__name__,
                    exc.code,
                ),
            )
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def install() -> None:
    """Put the filter on aiohttp's server logger once per process."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, UnparsedRequestFilter) for f in logger.filters):
        logger.addFilter(UnparsedRequestFilter())
