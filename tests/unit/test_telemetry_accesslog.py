"""Access-log formatting (text and JSON) and the logger sink."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.telemetry import accesslog
from ambit.telemetry.accesslog import AccessLog, ConnectionRecord, format_access_log

COMPLETE = ConnectionRecord(
    direction="outbound",
    src_addr="198.18.200.5:43122",
    dst_addr="198.18.201.7:15008",
    dst_hbone_addr="198.18.201.7:8080",
    src_workload="web-0",
    src_namespace="default",
    dst_service="echo.default.svc.cluster.local",
    dst_workload="echo-0",
    dst_namespace="default",
    bytes_sent=11,
    bytes_recv=22,
    duration_seconds=0.013,
)


def test_a_completed_connection_is_one_text_line_with_only_the_fields_we_know() -> None:
    assert format_access_log(COMPLETE) == (
        "connection complete src.addr=198.18.200.5:43122 src.workload=web-0 src.namespace=default"
        " dst.addr=198.18.201.7:15008 dst.hbone_addr=198.18.201.7:8080 dst.service=echo.default.svc.cluster.local"
        ' dst.workload=echo-0 dst.namespace=default direction="outbound" bytes_sent=11 bytes_recv=22'
        ' duration="13ms"'
    )


def test_identities_appear_only_when_set() -> None:
    record = ConnectionRecord(
        direction="inbound",
        src_addr="198.18.200.5:43122",
        dst_addr="198.18.201.7:8080",
        src_identity="spiffe://cluster.local/ns/default/sa/web",
        dst_identity="spiffe://cluster.local/ns/default/sa/echo",
    )
    line = format_access_log(record)
    assert "src.identity=spiffe://cluster.local/ns/default/sa/web" in line
    assert "dst.identity=spiffe://cluster.local/ns/default/sa/echo" in line
    assert "identity" not in format_access_log(COMPLETE)


def test_a_failed_connection_says_so_and_quotes_the_error() -> None:
    record = ConnectionRecord(
        direction="inbound", src_addr="198.18.200.5:1", dst_addr="198.18.201.7:8080", error="connection refused"
    )
    assert format_access_log(record) == (
        'connection failed src.addr=198.18.200.5:1 dst.addr=198.18.201.7:8080 direction="inbound"'
        ' bytes_sent=0 bytes_recv=0 duration="0ms" error="connection refused"'
    )


def test_values_with_spaces_quotes_or_newlines_are_quoted_and_stay_on_one_line() -> None:
    record = ConnectionRecord(
        direction="outbound", src_addr="a", dst_addr="b", src_workload='we b"0', dst_workload="x=y", src_cluster="c\nd"
    )
    line = format_access_log(record)
    assert 'src.workload="we b\\"0"' in line
    assert 'dst.workload="x=y"' in line
    assert 'src.cluster="c\\nd"' in line
    assert "\n" not in line


def test_json_format_is_one_object_with_the_same_dotted_keys() -> None:
    obj = json.loads(format_access_log(COMPLETE, json=True))
    assert obj == {
        "message": "connection complete",
        "src.addr": "198.18.200.5:43122",
        "src.workload": "web-0",
        "src.namespace": "default",
        "dst.addr": "198.18.201.7:15008",
        "dst.hbone_addr": "198.18.201.7:8080",
        "dst.service": "echo.default.svc.cluster.local",
        "dst.workload": "echo-0",
        "dst.namespace": "default",
        "direction": "outbound",
        "bytes_sent": 11,
        "bytes_recv": 22,
        "duration": "13ms",
    }


def test_json_failure_lines_carry_the_error() -> None:
    record = ConnectionRecord(direction="inbound", src_addr="a", dst_addr="b", error="policy denied")
    obj = json.loads(format_access_log(record, json=True))
    assert obj["message"] == "connection failed"
    assert obj["error"] == "policy denied"


def test_access_log_writes_info_for_completed_and_warning_for_failed_to_the_access_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="access"):
        sink = AccessLog()
        sink.write(COMPLETE)
        sink.write(ConnectionRecord(direction="inbound", src_addr="a", dst_addr="b", error="boom"))
    records = [r for r in caplog.records if r.name == "access"]
    assert [r.levelno for r in records] == [logging.INFO, logging.WARNING]
    assert records[0].getMessage() == format_access_log(COMPLETE)
    assert records[1].getMessage().startswith("connection failed")


def test_access_log_writes_json_to_a_given_logger(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("ambit.test.access")
    with caplog.at_level(logging.INFO, logger="ambit.test.access"):
        AccessLog(json=True, logger=logger).write(COMPLETE)
    (record,) = [r for r in caplog.records if r.name == "ambit.test.access"]
    assert json.loads(record.getMessage())["bytes_recv"] == 22


_text = st.text(max_size=30)


@given(
    st.builds(
        ConnectionRecord,
        direction=st.sampled_from(["outbound", "inbound"]),
        src_addr=_text,
        dst_addr=_text,
        src_workload=_text,
        dst_service=_text,
        dst_identity=_text,
        bytes_sent=st.integers(min_value=0, max_value=1 << 40),
        bytes_recv=st.integers(min_value=0, max_value=1 << 40),
        duration_seconds=st.floats(min_value=0, max_value=1e6),
        error=_text,
    )
)
def test_any_record_formats_to_one_line_and_json_round_trips(record: ConnectionRecord) -> None:
    line = format_access_log(record)
    assert len(line.splitlines()) == 1
    assert line.startswith("connection failed" if record.error else "connection complete")
    as_json = format_access_log(record, json=True)
    assert len(as_json.splitlines()) == 1
    obj = json.loads(as_json)
    assert obj["bytes_sent"] == record.bytes_sent
    assert obj["bytes_recv"] == record.bytes_recv
    assert obj.get("src.workload", "") == record.src_workload
    assert obj.get("dst.identity", "") == record.dst_identity
    assert obj.get("error", "") == record.error


def _reference_text(record: ConnectionRecord) -> str:
    """The text line by the module's rules, field by field (:func:`_fields` and :func:`_dumps`)."""
    parts = ["connection failed" if record.error else "connection complete"]
    for key, value in accesslog._fields(record):
        if key in ("direction", "error"):
            parts.append(f"{key}={accesslog._dumps(value)}")
        elif key == "duration":
            parts.append(f'{key}="{value}"')
        elif isinstance(value, str) and (not value.isprintable() or set(value) & set(' \t\r\n"=\\')):
            parts.append(f"{key}={accesslog._dumps(value)}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


_bare = st.text(alphabet="abz-.:019", max_size=10)
_any = st.one_of(
    _bare, st.text(alphabet=st.sampled_from([*'ab=. \t\r\n"\\', "\x85", "\u2028", "\x00", "é"]), max_size=6)
)
_string_fields = [
    "src_addr", "dst_addr", "dst_hbone_addr", "src_workload", "src_namespace", "src_identity", "src_cluster",
    "dst_service", "dst_workload", "dst_namespace", "dst_identity", "dst_cluster",
]  # fmt: skip


@given(
    st.fixed_dictionaries({name: st.one_of(_bare, _bare, _any) for name in _string_fields}),
    st.sampled_from(["outbound", "inbound", "", "sideways \n"]),
    st.sampled_from(["", "reset by peer", 'a "quoted"\nerror']),
)
def test_the_text_line_quotes_each_value_as_the_field_by_field_rules_say(
    strings: dict[str, str], direction: str, error: str
) -> None:
    """Whether every value is bare is asked of them together first (the usual line); the result is the line the
    per-field rules make, whichever values need quotes."""
    record = ConnectionRecord(
        direction=direction, bytes_sent=3, bytes_recv=4, duration_seconds=0.2, error=error, **strings
    )
    assert format_access_log(record) == _reference_text(record)
