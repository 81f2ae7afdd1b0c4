"""The access sink (ambit.telemetry.access_sink): the same bytes as ``logging``, batched per loop iteration,
bounded, flushed when stopping; and the request line's one-pass formatting against its field-by-field form."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.telemetry.access_sink import AccessSink
from ambit.telemetry.log_format import LogFormatter
from ambit.waypoint import telemetry
from ambit.waypoint.telemetry import RequestLog, RequestRecord, format_request_log

NOW = 1_700_000_123.456


class CountingStream(io.StringIO):
    """A stream that counts its writes and flushes, and can be made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.flushes = 0
        self.broken = False

    def write(self, text: str) -> int:
        if self.broken:
            raise OSError("no space left on device")
        self.writes += 1
        return super().write(text)

    def flush(self) -> None:
        self.flushes += 1


@pytest.fixture
def plain() -> Iterator[tuple[logging.Logger, CountingStream]]:
    """A logger whose records reach one plain stream handler with the process's formatter (as in a process).

    It is made outside the logging manager's tree: pytest attaches its capture handlers to every registered logger
    that does not propagate, and then rule 2 rightly sends lines through ``logging``."""
    logger = logging.Logger("tests.access_sink.plain", logging.INFO)
    stream = CountingStream()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LogFormatter())
    logger.addHandler(handler)
    yield logger, stream


def _through_logging(level: int, line: str, created: float) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LogFormatter())
    record = logging.LogRecord("tests.access_sink.plain", level, __file__, 0, line, (), None)
    record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
    handler.handle(record)
    return stream.getvalue()


def test_a_direct_line_is_byte_for_byte_what_the_handler_writes(plain: tuple[logging.Logger, CountingStream]) -> None:
    logger, stream = plain
    sink = AccessSink(logger, clock=lambda: NOW)
    sink.emit(logging.INFO, "request complete src.addr=1.2.3.4:5")  # no loop: written at once
    sink.emit(logging.WARNING, 'request failed error="x y"')
    assert stream.getvalue() == _through_logging(
        logging.INFO, "request complete src.addr=1.2.3.4:5", NOW
    ) + _through_logging(logging.WARNING, 'request failed error="x y"', NOW)


@pytest.mark.parametrize("created", [1_700_000_000.001, 1_700_000_000.999, 1_700_000_001.5, 1_700_003_600.0])
def test_the_line_prefix_is_what_the_formatter_puts_before_a_message(created: float) -> None:
    formatter = LogFormatter()
    record = logging.LogRecord("access", logging.INFO, __file__, 0, "m", (), None)
    record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
    assert formatter.line_prefix(created, logging.INFO, "access") + "m" == formatter.format(record)


async def test_lines_of_one_loop_iteration_are_written_once_at_its_end(
    plain: tuple[logging.Logger, CountingStream],
) -> None:
    logger, stream = plain
    sink = AccessSink(logger, clock=lambda: NOW)
    for i in range(5):
        sink.emit(logging.INFO, f"line {i}")
    assert stream.getvalue() == ""
    await asyncio.sleep(0)
    assert stream.writes == 1 and stream.flushes == 1
    assert stream.getvalue().splitlines()[-1].endswith("tests.access_sink.plain: line 4")
    assert len(stream.getvalue().splitlines()) == 5


async def test_past_the_bound_lines_are_dropped_counted_and_reported(
    plain: tuple[logging.Logger, CountingStream], caplog: pytest.LogCaptureFixture
) -> None:
    logger, stream = plain
    line = "x" * 40
    one = len(LogFormatter().line_prefix(NOW, logging.INFO, logger.name) + line + "\n")
    sink = AccessSink(logger, max_pending=3 * one, clock=lambda: NOW)
    for _ in range(10):
        sink.emit(logging.INFO, line)
    assert sink.dropped == 7
    with caplog.at_level(logging.WARNING, logger="ambit.telemetry.access_sink"):
        await asyncio.sleep(0)
    assert len(stream.getvalue().splitlines()) == 3
    assert any("7 lines dropped" in r.getMessage() for r in caplog.records)
    sink.emit(logging.INFO, line)  # the next iteration has room again
    await asyncio.sleep(0)
    assert len(stream.getvalue().splitlines()) == 4 and sink.dropped == 7


async def test_flush_writes_what_waits_and_a_finalizer_does_at_exit(
    plain: tuple[logging.Logger, CountingStream],
) -> None:
    logger, stream = plain
    log = RequestLog(logger=logger)
    log.write(RequestRecord(src_addr="1.2.3.4:5", response_code=200))
    log.flush()  # as the process does when it stops
    assert stream.getvalue().endswith(format_request_log(RequestRecord(src_addr="1.2.3.4:5", response_code=200)) + "\n")
    sink = AccessSink(logger, clock=lambda: NOW)
    sink.emit(logging.INFO, "the last line")
    sink.at_exit()  # what the interpreter runs at exit, when the loop is gone before its flush
    assert stream.getvalue().endswith("tests.access_sink.plain: the last line\n")
    writes = stream.writes
    await asyncio.sleep(0)
    assert stream.writes == writes  # nothing twice


def test_a_failed_write_drops_the_batch_and_never_raises(plain: tuple[logging.Logger, CountingStream]) -> None:
    logger, stream = plain
    stream.broken = True
    sink = AccessSink(logger, clock=lambda: NOW)
    sink.emit(logging.INFO, "lost")
    assert sink.dropped == 1


def test_a_disabled_level_formats_nothing(plain: tuple[logging.Logger, CountingStream]) -> None:
    logger, stream = plain
    logger.setLevel(logging.WARNING)
    log = RequestLog(logger=logger)
    assert not log.sink.enabled(logging.INFO)
    log.write(RequestRecord(src_addr="1.2.3.4:5", response_code=200))
    log.flush()
    assert stream.getvalue() == ""


async def test_with_another_handler_listening_lines_go_through_logging(
    plain: tuple[logging.Logger, CountingStream], caplog: pytest.LogCaptureFixture
) -> None:
    logger, stream = plain
    sink = AccessSink(logger, clock=lambda: NOW)
    sink.emit(logging.INFO, "batched")  # direct, waiting for the iteration's end
    logger.addHandler(caplog.handler)  # a second listener: rule 2's direct way no longer holds
    try:
        sink.emit(logging.INFO, "through logging")
    finally:
        logger.removeHandler(caplog.handler)
    assert [r.getMessage() for r in caplog.records] == ["through logging"]
    lines = stream.getvalue().splitlines()  # the batch went first: the order holds
    assert lines[0].endswith(": batched") and lines[1].endswith(": through logging")


# --- the request line in one pass, against RequestRecord.fields ---------------------------------------------

_PLAIN = re.compile(r"[a-zA-Z0-9.:/_\-\[\]@,+*~%]+")


def _reference(record: RequestRecord) -> str:
    def value(v: str | int) -> str:
        if isinstance(v, int):
            return str(v)
        if _PLAIN.fullmatch(v):
            return v
        text = json.dumps(v, ensure_ascii=False)
        return text if text.isprintable() else json.dumps(v)

    failed = record.response_flags != "-" or record.error
    message = "request failed" if failed else "request complete"
    return " ".join([message, *(f"{key}={value(v)}" for key, v in record.fields())])


_TEXTS = st.one_of(
    st.just(""), st.sampled_from(["web-0", "a b", "x=y", '"q"', "\u2028", "/p?q=1"]), st.text(max_size=12)
)


@given(
    st.builds(
        RequestRecord,
        src_addr=_TEXTS,
        src_workload=_TEXTS,
        src_namespace=_TEXTS,
        src_identity=_TEXTS,
        dst_addr=_TEXTS,
        dst_hbone_addr=_TEXTS,
        dst_service=_TEXTS,
        dst_workload=_TEXTS,
        dst_namespace=_TEXTS,
        dst_identity=_TEXTS,
        method=_TEXTS,
        path=_TEXTS,
        protocol=_TEXTS,
        response_code=st.integers(0, 599),
        response_flags=st.one_of(st.just("-"), _TEXTS),
        request_id=_TEXTS,
        route=_TEXTS,
        bytes_sent=st.integers(0, 10**9),
        duration_seconds=st.floats(-1.0, 1e6, allow_nan=False),
        error=_TEXTS,
        attempts=st.integers(0, 5),
    )
)
def test_the_request_line_in_one_pass_equals_its_field_by_field_form(record: RequestRecord) -> None:
    assert format_request_log(record) == _reference(record)


def test_the_source_fields_are_rendered_once_per_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered: list[str] = []
    real = telemetry._text

    def counted(value: str) -> str:
        rendered.append(value)
        return real(value)

    monkeypatch.setattr(telemetry, "_text", counted)
    telemetry._source_text.cache_clear()
    telemetry._recurring_text.cache_clear()
    source = {"src_addr": "10.0.0.1:40000", "src_workload": "web-0", "src_namespace": "app", "src_identity": "id"}
    lines = [
        format_request_log(RequestRecord(**source, path=f"/{i}", request_id=str(i), response_code=200))
        for i in range(3)
    ]
    assert [rendered.count(v) for v in source.values()] == [1, 1, 1, 1]
    assert all(line.startswith("request complete src.addr=10.0.0.1:40000 src.workload=web-0 ") for line in lines)
    other = format_request_log(RequestRecord(src_addr="10.0.0.1:40001", src_workload="web-0", response_code=200))
    assert other.startswith("request complete src.addr=10.0.0.1:40001 src.workload=web-0 protocol=HTTP/1.1 ")
