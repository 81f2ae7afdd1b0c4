"""aiohttp's record of an unparsable request becomes one INFO line without the request's bytes
(telemetry/unparsed_requests.py); other records pass untouched."""

from __future__ import annotations

import logging
import sys

from aiohttp import http_exceptions

from ambit.telemetry.unparsed_requests import UnparsedRequestFilter


def record(exc: BaseException | None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(
        "aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s", ("10.0.0.9",), exc_info
    )


def test_a_parser_error_is_one_line_without_the_quoted_request() -> None:
    exc = http_exceptions.BadHttpMessage("Missing expected CR:\n\n  b'Authorization: Bearer s3cret\\n'")
    rec = record(exc)
    assert UnparsedRequestFilter().filter(rec)
    assert rec.getMessage() == "refused a malformed request from 10.0.0.9 (BadHttpMessage, 400)"
    assert rec.exc_info is None and rec.levelno == logging.INFO
    assert "s3cret" not in logging.Formatter().format(rec)


def test_other_errors_keep_their_traceback() -> None:
    try:
        raise RuntimeError("a handler bug")
    except RuntimeError:
        rec = logging.LogRecord(
            "aiohttp.server", logging.ERROR, __file__, 1, "Error handling request", (), sys.exc_info()
        )
    assert UnparsedRequestFilter().filter(rec)
    assert rec.exc_info is not None and rec.levelno == logging.ERROR
